"""Data parallelism a script writes itself (no DDP, no FSDP): its ``async_op=True`` collectives sized without
``record_shapes``, from what the collector records at each call (``collect.hooks.own_collectives``), so link what-ifs
price them.

Two real recordings (torch 2.13 CPU, gloo, the Python API, no ``record_shapes``), each also recorded with
``record_shapes=True``, whose Kineto sizes gave the same bytes for every transfer:
- ``tp-fresh/vit-tp-api-sized``: the DP x TP ViT of ``tests/test_vit_tp_api.py`` recorded again: 24 per-parameter
  all-reduces a step per rank over ``mesh["dp"]``, issued after ``backward()`` and then each waited for;
- ``hand-dp/convnet-buckets``: ``bench/hand_dp/convnet_buckets.py``, a ResNet whose gradients are packed into 4 buckets
  by hand, one async all-reduce each, and an async ``all_gather_into_tensor`` of the batch's hits waited for after
  the optimizer step.

And ``hand-dp/gru-last-gather`` (``bench/hand_dp/gru_sharded_adam.py --steps 6 --seq 8 --vocab 1000 --record-shapes``): a
hand-sharded Adam whose all-gather of the updated shard is issued at the end of each step and waited for before the
next forward; the window's last one, waited for after it, was on rank 1's trace and not rank 0's (their gloo threads
had got that far or not when the profiler stopped), and the run was refused."""
from __future__ import annotations

import numpy as np
import torch
from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.passes.link_fit import profiled_comm
from dagprof.traces.comm_kind import CommKind
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.traces.run_schema import OWN_KINDS, Rec

VIT = DATA / "tp-fresh" / "vit-tp-api-sized"
CONV = DATA / "hand-dp" / "convnet-buckets"
GRU = DATA / "hand-dp" / "gru-last-gather"
# the ViT's local gradients, one all-reduce each, in the order the script calls them (model.parameters()); record_shapes agrees
VIT_DP = [512, 33280, 24576, 512, 512, 512, 32768, 256, 32768, 256, 32768, 256, 32768, 512, 512, 512, 131072, 1024, 131072,
          512, 512, 512, 5120, 40]


def _transfers(trace) -> list[int]:
    ev = trace.events
    return [int(b) for b, k, s in zip(ev.nbytes, ev.kind, ev.seq) if k == Kind.COMM and s >= 0]


def test_the_vits_own_data_parallel_all_reduces_carry_their_bytes():
    run = read_run(VIT)
    assert all(_transfers(t) == VIT_DP for t in run.ranks)  # one step: 24 sized where they were 0
    said = [str(w) for w in run.meta.warnings]
    assert any(w.startswith("no DDP or FSDP model: the 30 collectives a step per rank") for w in said)  # pieces not counted twice


def test_the_vits_groups_stay_and_a_link_model_is_fitted():
    g = build_graph(read_run(VIT))
    par = g.meta.parallel
    assert par.dp_size == 2 and sorted(par.dp_groups) == [(0, 2), (1, 3)]
    assert {(x.group, x.dim) for x in par.in_op_groups} == {("0,1", "TP"), ("2,3", "TP")}
    assert len(profiled_comm(g)) > 0  # was refused: "... dagprof.profile(DIR, ..., record_shapes=True)"


def test_hand_made_buckets_carry_the_models_gradient_bytes():
    run = read_run(CONV)
    for t in run.ranks:
        sizes = _transfers(t)
        assert len(sizes) == 4 * len(t.meta.steps_profiled)
        assert sum(sizes[:4]) == sum(t.meta.layer_grad_bytes.values()) == 701032  # each bucket packs its gradients


def test_a_call_after_the_steps_last_layer_is_the_loops_own():
    """An async call the latest layer record precedes is the loop's own (host, sized); one a layer's forward or backward
    follows in its step is the model's (paired and cut at its wait)."""
    from dagprof.traces.run_comm import _waited_later
    from dagprof.traces.run_schema import Col

    def rec(code: int, t: int, a: int = 0, x: int = 0) -> list[int]:
        row = [0] * len(Col)
        row[Col.CODE], row[Col.A], row[Col.T_NS], row[Col.X] = code, a, t, x
        return row

    ar = OWN_KINDS.index(CommKind.ALL_REDUCE)
    records = np.array([rec(Rec.STEP_BEGIN, 0), rec(Rec.OWN_ASYNC, 10, ar, 8), rec(Rec.OWN_WAIT, 30, ar, 10),
                        rec(Rec.BWD_END, 40), rec(Rec.OWN_ASYNC, 50, ar, 8), rec(Rec.OWN_WAIT, 60, ar, 50),
                        rec(Rec.STEP_END, 70), rec(Rec.STEP_BEGIN, 80), rec(Rec.FWD_BEGIN, 90)], dtype=np.int64)
    assert _waited_later(records, CommKind.ALL_REDUCE, 11)
    assert not _waited_later(records, CommKind.ALL_REDUCE, 51)  # the next step's forward does not count


def test_the_collector_sizes_a_jobs_own_async_calls_without_ddp(tmp_path, one_rank_group):
    """No DDP or FSDP model: the script's ``async_op=True`` all-reduce, all-gather and reduce-scatter are recorded with
    their bytes (a reduce-scatter as the all-reduce of the whole input that gloo runs), each with its first wait."""
    import warnings

    import torch.distributed as dist

    import dagprof

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dagprof.profile(tmp_path / "run", steps=range(1, 2), model=model) as prof:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 8)).sum().backward()
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])  # 36 floats
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                works = [dist.all_reduce(flat, async_op=True), dist.reduce_scatter_tensor(torch.empty(36), flat, async_op=True),
                         dist.all_gather_into_tensor(torch.empty(36), flat, async_op=True)]
            for w in works:
                w.wait()
            opt.step()
            prof.step()
    recs = prof._collector.records
    own = [(r[1], r[4]) for r in recs if r[0] == Rec.OWN_ASYNC]
    ar, ag = OWN_KINDS.index(CommKind.ALL_REDUCE), OWN_KINDS.index(CommKind.ALL_GATHER)
    assert own == [(ar, 144), (ar, 144), (ag, 144)]
    assert sum(r[0] == Rec.OWN_WAIT for r in recs) == 3


def test_a_call_waited_for_after_the_window_is_left_out_on_every_rank():
    """The window's last all-gather, waited for in the step after it, is read on no rank (it was on one rank's trace and
    the run was refused: "collective #5 (all_gather) of group 0 is missing on rank(s) [0]"), and said; the others match."""
    run = read_run(GRU)
    seen = [[(int(k), int(b)) for k, b, kind, s in zip(t.events.comm_kind, t.events.nbytes, t.events.kind, t.events.seq)
             if kind == Kind.COMM and s >= 0] for t in run.ranks]
    ag = (int(CommKind.ALL_GATHER), 1305600)  # the whole flat fp32 copy gathered; the reduce-scatter as its all-reduce
    assert seen[0] == seen[1] and len(seen[0]) == 3 * 2 - 1 and seen[0].count(ag) == 1  # step 3's all-gather, not step 4's
    said = [str(w) for w in run.meta.warnings]
    assert [w[:8] for w in said if "1 collective(s) the script issued asynchronously in the window and waited for after it left out"
            in w] == ["rank 0: ", "rank 1: "]  # alike on every rank: said once (``rank_warnings``)
    assert len(profiled_comm(build_graph(run))) == 5  # matched across the ranks
