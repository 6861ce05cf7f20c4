"""FSDP -> DDP (``whatif --data-parallel ddp``) on a real pair: ``bench/fsdp_fresh/fsdp1_sgo_frozen.py`` profiled under
FSDP1 (``tests/data/fsdp/fsdp1-sgo-frozen``) and the same job under DDP (``fsdp1-sgo-frozen-ddp``, ``--wrap ddp``).

The conversion's buckets are the ones the DDP job ran: DDP's 1 MiB first bucket, whose all-reduce runs beside the rest
of the backward, and none of the frozen embedding that FSDP1's flat parameter reduce-scatters whole (one bucket of
3.54 MiB after the whole backward before). The compute DDP's all-reduces slow beside them is no part of the FSDP
profile (its collectives block the ranks): without a measured slowdown the interval's high end holds the step with
that compute at the most the host's cores allow, and says so."""
from __future__ import annotations

import numpy as np
from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.passes.fsdp_to_ddp import fsdp_to_ddp
from dagprof.passes.overlap import comm_overlap, core_bound_slowdown, slowed_nodes
from dagprof.replay import replay
from dagprof.search.scenario import Cluster, Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind

FSDP1 = DATA / "fsdp" / "fsdp1-sgo-frozen"
DDP = DATA / "fsdp" / "fsdp1-sgo-frozen-ddp"


def _buckets(g):
    idx = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0))
    return [(int(g.step[v]), int(g.nbytes[v])) for v in idx[np.argsort(g.bucket[idx], kind="stable")]]


def test_buckets_are_the_ddp_jobs():
    f, d = build_graph(read_run(FSDP1)), build_graph(read_run(DDP))
    ran = [nb for s, nb in _buckets(d) if s == d.meta.steps[0]]
    assert len(ran) == 2 and ran[0] > 2**20 > ran[0] - 2**20 // 4  # the first closes just past 1 MiB
    conv = fsdp_to_ddp(f)
    for step in conv.meta.steps:
        assert [nb for s, nb in _buckets(conv) if s == step] == ran
    assert sum(ran) == sum(f.meta.fsdp.layer_grad_bytes.values()) - f.meta.fsdp.layer_grad_bytes["tok"]
    # the first bucket's all-reduce runs beside the backward of the layers before it; a cap given is every bucket's
    res = replay(conv)
    bw = slowed_nodes(conv)
    bw = bw[conv.kind[bw] == Kind.BACKWARD]
    assert float((comm_overlap(conv, res, bw) * conv.dur[bw]).sum()) > 0
    assert [nb for s, nb in _buckets(fsdp_to_ddp(f, bucket_mb=25.0)) if s == conv.meta.steps[0]] == [sum(ran)]


def test_unmeasured_overlap_raises_the_high_end_only():
    f = build_graph(read_run(FSDP1))
    assert core_bound_slowdown(f) == 1.0  # 2 ranks on 2 cores: compute beside gloo's thread at half speed at most
    out = evaluate(f, [Scenario(data_parallel="ddp")], tolerance_pct=None)
    (row,) = out["scenarios"]
    assert "overlap" in row.interval.terms and any("high end holds it" in n for n in out["notes"])
    # priced with a measured slowdown (calibrate --overlap's, here the bound itself): in the point, the high end not
    # raised for it; the unmeasured row's high end reaches that point (the same replays' median step)
    measured = evaluate(f, [Scenario(data_parallel="ddp")], Cluster(slowdown=1.0), tolerance_pct=None)
    (priced,) = measured["scenarios"]
    assert "overlap" not in priced.interval.terms and not any("high end holds it" in n for n in measured["notes"])
    assert priced.interval.point_us > row.interval.point_us and row.interval.hi_us >= priced.interval.point_us - 1e-6
    # other rows of an FSDP profile: nothing raised
    (same,) = evaluate(f, [Scenario(compute_speed=1.0)], tolerance_pct=None)["scenarios"]
    assert "overlap" not in same.interval.terms
