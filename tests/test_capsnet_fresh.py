"""A fresh DDP CapsNet (``bench/ddp_fresh/capsnet_scaler.py``, stop 62): what two of its habits did to the reading.

``caps-orphan``: its routing weights are a parameter of the root module, which no timed layer owns, so the bucket that
holds them is short of its layers' bytes; spread over that bucket's layers by each rank's own backward times, re-bucketing
at 1 MiB closed 3 buckets on one rank and 2 on the other and ``whatif --bucket-mb 1`` refused the run.
``caps-skip``: a ``GradScaler`` skipped optimizer steps (``--growth-interval 1``); dagprof counts optimizer steps, so
step 5 holds three iterations where steps 3 and 4 hold one."""
from __future__ import annotations

from collections import Counter

import numpy as np
from testdata import DATA, cli_json

from dagprof.graph.build import build_graph
from dagprof.passes.buckets import set_buckets
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.units import MB


def test_a_bucket_of_root_owned_bytes_rebuckets_alike_on_every_rank():
    g = set_buckets(build_graph(read_run(DATA / "ddp-fresh" / "caps-orphan")), 1 * MB)
    enq = np.flatnonzero((g.kind == Kind.COMM_ENQUEUE) & (g.rank >= 0))
    per = Counter((int(g.step[v]), int(g.rank[v])) for v in enq)
    for step in {s for s, _ in per}:
        assert per[(step, 0)] == per[(step, 1)] == 3  # the 2.3 MiB bucket splits in two, the 0.6 MiB one stays


def test_a_step_holding_skipped_optimizer_steps_is_left_out_and_said(capsys):
    folder = str(DATA / "ddp-fresh" / "caps-skip")
    rc, doc, err = cli_json(capsys, "analyze", "--json", folder)
    said = [w for w in doc["warnings"] if "all-reduced DDP's gradient buckets more often" in w]
    assert rc == 0 and doc["steps"] == [3, 4] and len(said) == 1, err
    assert "step 5 (3x)" in said[0] and "left out of the window: steps 3..4 kept" in said[0]
    rc, doc, err = cli_json(capsys, "analyze", "--json", "--steps", "3:6", folder)
    said = [w for w in doc["warnings"] if "all-reduced DDP's gradient buckets more often" in w]
    assert rc == 0 and doc["steps"] == [3, 4, 5] and len(said) == 1 and "kept as --steps named them" in said[0], err


def test_rebucketing_a_stock_trace_is_refused_naming_it(capsys):
    """The user's own profiler trace of the same job (``cut-steps/epoch-end``) records DDP's all-reduces but not their
    buckets: the refusal names the folder and says why (it read as if the job had no gradient all-reduce)."""
    folder = str(DATA / "cut-steps" / "epoch-end")
    rc, _, err = cli_json(capsys, "whatif", "--json", "--bucket-mb", "1", folder)
    assert rc == 2 and "epoch-end: the trace has no gradient-bucket all-reduce to re-bucket (a stock torch.profiler" in err


def test_rebucketing_a_step_of_skipped_optimizer_steps_says_it_may_be_one(capsys):
    """Named by ``--steps``, the step of three iterations stays; re-bucketing it is refused naming the run and the
    habit that makes such a step (it named only two losses or a GAN's two models)."""
    folder = str(DATA / "ddp-fresh" / "caps-skip")
    rc, _, err = cli_json(capsys, "whatif", "--json", "--steps", "3:6", "--bucket-mb", "1", folder)
    assert rc == 2 and "caps-skip: step 5 all-reduces a gradient bucket more than once" in err and "GradScaler" in err
