"""A training loop's habits beside its gradients (``bench/ddp_fresh/habits_loop.py``, tests/data/habits): a logging
all-reduce every step, rank 0's checkpoint ahead of a barrier, an evaluation pass under ``torch.no_grad`` with a metric
all-reduce. Its evaluation's forwards are counted in a warning, and the waits at its own collectives are not a straggler's."""
from __future__ import annotations

import json
import shutil

import numpy as np
from testdata import DATA

from dagprof.analysis.breakdown import own_collectives
from dagprof.analysis.diff import diff_profiles
from dagprof.analysis.findings import findings
from dagprof.cli.main import main
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind

HABITS = DATA / "habits"


def test_evaluation_forwards_are_counted():
    p = open_run(HABITS)
    (said,) = [w for w in p.warnings if "under torch.no_grad" in w]  # once for both ranks, each ran it in step 3 of 3-4
    assert said.startswith("ranks 0-1: 1 of 2 profiled steps (step 3) ran 33 layer forwards")
    assert [w.split(":")[0] for w in p.rank_warnings[said]] == ["rank0.json", "rank1.json"]


def test_own_collectives_are_the_ones_beside_the_buckets():
    g = open_run(HABITS).graph
    own = np.flatnonzero(own_collectives(g))
    names = sorted(g.node_name(int(c)).rsplit(".", 1)[0] for c in own)
    assert names == ["all_reduce"] * 3 + ["barrier"]  # logging x2, the metric's, the checkpoint's barrier
    buckets = (g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0)
    assert buckets.sum() == 2 and not (own_collectives(g) & buckets).any()


def test_checkpoint_barrier_is_no_straggler():
    """Rank 0 saved the checkpoint while rank 1 sat in the barrier (28 ms): that wait is named as the job's own, and
    the straggler finding keeps only the waits at the gradient all-reduces."""
    p = open_run(HABITS)
    by_rank = {b.rank: b for b in p.analysis.ranks}
    assert by_rank[1].own_wait_us > 20e3 and "barrier x1" in by_rank[1].own_names
    found = {f.title: f for f in findings(p.analysis)}
    own = found["ranks wait at the job's own collectives"]
    assert own.detail.startswith("rank 0 arrives last") and "checkpoint" in own.detail
    straggler = found.get("ranks wait for a straggler")
    assert straggler is None or straggler.ms_per_iter < own.ms_per_iter


def test_diff_says_which_waits_are_the_jobs_own():
    p = open_run(HABITS)
    d = diff_profiles(p, p)
    rows = {name.strip(): (a, b) for name, a, b in d.category_rows()}
    waits, own = rows["waits for stragglers (replayed)"], rows["at the job's own collectives"]
    assert 0 < own[0] == own[1] < waits[0]


def test_link_whatif_counts_the_unsized_own_collectives(tmp_path, capsys):
    """gloo's collectives carry no size in Kineto without shapes: the job's own are priced as 0-byte messages, said."""
    run = tmp_path / "habits"
    shutil.copytree(HABITS, run)
    assert main(["whatif", str(run), "--bandwidth", "200Mbit", "--no-trace", "--allow-model-error", "--json"]) == 0
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if "no recorded size" in n]
    assert len(notes) == 1 and notes[0].startswith("4 profiled collectives") and "all_reduce x3, barrier x1" in notes[0]


def test_optimize_gives_the_run_s_warnings_too(capsys, tmp_path):
    """optimize searched the evaluation step's op times without a word of it: the run's warnings come first, as in
    every other command that reads the run."""
    assert main(["optimize", str(HABITS), "--budget", "1", "-o", str(tmp_path / "opt"), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert sum("under torch.no_grad" in w for w in warnings) == 1  # once for both ranks, before the search's own
    assert "under torch.no_grad" in warnings[0]
