"""DDP -> FSDP: what a DDP profile says of FSDP2's blocking collectives and of ``clip_grad_norm_``.

Under FSDP2 on gloo every collective blocks the rank (two wake-ups each: the hand-off to gloo's worker, the rank's own
after it), and ``clip_grad_norm_`` all-reduces the norm of DTensor gradients. Where gloo's cost per call is measured for
the profile's torch (``FSDP_HOST``: from a barrier to the slowest rank's return) the wake-ups are in it; else the
conversion prices each wake-up at the median lag of the DDP profile's own waits that blocked (its finalize behind the
last bucket), else at its thread's run-queue wait per time it got a core (``passes.data_parallel.wake_up``), and adds
the clip's all-reduce where the collector recorded the calls (``collect.hooks.grad_clip``); what is unpriced is said
with counts. The wake-up price's sampling error widens the prediction's interval (``search.whatif``).
``tests/data/lora`` (``bench/fsdp_fresh/lora_finetune.py``) predates the run-queue and clip records;
``tests/data/lora-clip`` records them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis.interval import PredictionInterval, predict_interval, student_halfwidth
from dagprof.costmodel.fsdp_costs import DTENSOR_STEP, FSDP_HOST
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import fsdp_collectives
from dagprof.passes.data_parallel import (
    CLIP_NORM_BYTES,
    WakeFrom,
    _call_load,
    _stretch,
    blocking_note,
    ddp_to_fsdp,
    dtensor_note,
    final_callback_units,
    final_scatter_note,
    wake_up,
    wake_ups_per_step,
)
from dagprof.replay import replay
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology
from dagprof.search.whatif import _wake_up_spread, evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.run_schema import Rec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_fresh"))
from pair_units import kinds  # noqa: E402


def _graph(path):
    return build_graph(read_run(path))


def _rebuilt(g):
    """``g`` as a pass that rebuilt its nodes leaves it: no measured intervals to tell which waits blocked."""
    return g.replace(meta=g.meta.replace(provenance=None))


def _mine(out, r, kind):
    """The conversion's issues (``kind`` COMM_ENQUEUE) or waits of its collectives on rank ``r``."""
    return [v for v in range(len(out)) if out.rank[v] == r and out.kind[v] == kind and
            (kind == Kind.COMM_ENQUEUE or out.node_name(v).partition(".")[2].startswith("wait "))]


def _unhosted(g):
    """``g`` as profiled under a torch whose gloo calls ``FSDP_HOST`` has not measured: the conversion prices wake-ups."""
    assert "2.12" not in FSDP_HOST
    return g.replace(meta=g.meta.replace(torch="2.12.0"))


def _scatter_lag(g) -> float:
    return FSDP_HOST[g.meta.torch_minor].scatter_us * _call_load(g, _stretch(g))


@pytest.mark.parametrize("run", ["ddp-0", "ddp-1"])
def test_each_reduce_scatter_returns_gloos_measured_tail_after_its_transfer(run):
    """Gloo's reduce-scatter returns about 4 ms late in about a third of its calls at any size (``bench/fsdp_call_sizes.py``,
    quiet, two runs): its mean fixed cost per call is 1.48 ms where an all-gather's is 0.55. Every FSDP collective carries the
    all-gather's as the link's overhead per call; each reduce-scatter's wait, on every rank, carries the rest as its lag
    beyond its transfer (the LoRA's trained units and the final callback's alike), stretched as the call's cost is; the
    wake-ups are in those measured costs, so no issue nor wait carries one more."""
    g = _graph(DATA / "lora" / run)
    host = FSDP_HOST[g.meta.torch_minor]
    assert host.scatter_us == pytest.approx(1483.0 - host.call_us) and host.call_us == pytest.approx(546.5)
    out = ddp_to_fsdp(g)
    for r in (0, 1):
        waits = _mine(out, r, Kind.COMM_WAIT)
        scatter = [v for v in waits if "reduce_scatter" in out.node_name(v)]
        others = [v for v in waits if v not in set(scatter)]  # the all-gathers': their later rank's release alone
        assert len(scatter) == sum(c.kind == CommKind.REDUCE_SCATTER for c in fsdp_collectives(out)) > 0 and others
        assert np.allclose(out.gap[scatter], _scatter_lag(g))
        assert np.allclose(out.gap[others], [_release(g, out, v) if _later(out, v) == r else 0.0 for v in others])
        assert np.allclose(out.dur[_mine(out, r, Kind.COMM_ENQUEUE)], 0.0)
    assert _scatter_lag(g) >= host.scatter_us


def test_wake_up_is_the_median_lag_of_the_waits_that_blocked():
    """ddp-0 of the LoRA job: of each rank's 3 finalize waits, rank 0's last and rank 1's last two waited on a bucket
    that had not ended (as its rank saw it), the others found theirs done; the price is the median measured gap of those 3,
    on every rank, carried by every inserted issue and wait where gloo's cost per call is not measured for the torch."""
    g = _graph(DATA / "lora" / "ddp-0")
    p = g.meta.provenance
    blocked = []
    for v in np.flatnonzero((g.kind == Kind.COMM_WAIT) & (g.rank >= 0)):
        e = p.dst == v
        comm = g.kind[p.src[e]] == Kind.COMM
        if p.seen_end[e][comm].max() > p.seen_end[e][~comm].max():
            blocked.append(v)
    assert [int(g.rank[v]) for v in blocked] == [0, 1, 1]
    wake = wake_up(g)
    assert wake.source == WakeFrom.BLOCKED_WAITS and wake.count == 3
    assert wake.us == {0: pytest.approx(np.median(g.gap[blocked])), 1: pytest.approx(np.median(g.gap[blocked]))}
    out = ddp_to_fsdp(_unhosted(g))
    for r in (0, 1):
        enq, waits = _mine(out, r, Kind.COMM_ENQUEUE), _mine(out, r, Kind.COMM_WAIT)
        assert len(enq) == len(waits) == 8 * len(g.meta.steps)
        assert np.allclose(out.dur[enq], wake.us[r]) and np.allclose(out.gap[waits], wake.us[r])
    lags = g.gap[blocked]
    assert wake.dof == 2 and wake.stderr_us == pytest.approx(lags.std(ddof=1) / np.sqrt(3))  # the mean's sampling error
    assert f"8 blocking collectives a step, each with 2 wake-ups (the hand-off to gloo's worker, the rank's own after it) at " \
           f"{wake.us[0] / 1e3:.2f} +- {wake.stderr_us / 1e3:.2f} ms (the median lag, both ranks, of this profile's 3 waits that blocked" \
           in blocking_note(_unhosted(g), measured=False)
    assert "8 blocking collectives a step, their wake-ups in gloo's measured cost per call" in blocking_note(g, measured=False)


def test_the_wake_ups_sampling_error_widens_the_conversions_interval():
    """whatif --data-parallel fsdp on a DDP profile: the interval carries the wake-up price's sampling error over every
    wake-up of a step (2 per collective: 8 a step on the trained LoRA job), at Student-t's quantile for its samples, in
    quadrature; below, no more than the wake-ups the point holds. With calibrate --fsdp's file, or ``FSDP_HOST``'s cost per
    call for the profile's torch, no wake-up is priced, and none widens the interval."""
    g0 = _graph(DATA / "lora" / "ddp-0")
    c = Cluster()
    s = Scenario(data_parallel="fsdp")
    assert _wake_up_spread(g0, apply(g0, s, c, base_topology(g0, c)), s, c) == (0.0, 0.0)
    g = _unhosted(g0)
    out = apply(g, s, c, base_topology(g, c))
    assert wake_ups_per_step(out) == 16
    wake = wake_up(g)
    half, held = _wake_up_spread(g, out, s, c)
    assert half == pytest.approx(16 * student_halfwidth(wake.stderr_us, 2)) and held == pytest.approx(16 * wake.us[0])
    assert _wake_up_spread(g, out, Scenario(bandwidth=1e9), c) == (0.0, 0.0)
    row = evaluate(g, [s], c, tolerance_pct=None)["scenarios"][0]
    assert "wake_up" in row.interval.terms
    # the compute floor's replay holds the wake-ups at the point's price: it gives way by as much as they may cost less
    res = replay(out)
    point = predict_interval(out, res).point_us
    low = predict_interval(out, res, wake_up=(1e9, point / 2))  # wake-ups half the step, their price unknown
    assert "compute_floor" not in low.terms and low.lo_us < low.compute_share * point
    base = PredictionInterval(100.0, 90.0, 110.0)
    w = base.with_stall(20.0, held_us=5.0, term="wake_up")
    assert w.terms == ("wake_up",) and w.lo_us == pytest.approx(100 - 100 * np.hypot(0.1, 0.05))
    assert w.hi_us == pytest.approx(100 + 100 * np.hypot(0.1, 0.2))


@pytest.mark.parametrize("frozen, colls", [(0, 8), (1, 7)])
def test_no_blocked_wait_nor_run_count_prices_no_wake_up_and_says_so(frozen, colls):
    """Rebuilt (no measured intervals) and older than thread_runs, without clip records: every inserted collective's
    issue and wait cost nothing beyond the transfer (a reduce-scatter's wait: gloo's measured tail alone; an all-gather's
    later rank: its release), and the note
    counts the blocking collectives a step (the first block frozen: no reduce-scatter for it)."""
    g = _rebuilt(_graph(DATA / "lora" / f"ddp-{frozen}"))
    assert wake_up(g) is None and not g.meta.grad_clips
    out = ddp_to_fsdp(g)
    mine = [v for r in (0, 1) for kind in (Kind.COMM_ENQUEUE, Kind.COMM_WAIT) for v in _mine(out, r, kind)]
    tail = [_scatter_lag(g) if "wait reduce_scatter" in out.node_name(v) else
            _release(g, out, v) if "wait all_gather" in out.node_name(v) and _later(out, v) == out.rank[v] else 0.0 for v in mine]
    assert mine and all(out.dur[v] == 0 and out.gap[v] == pytest.approx(t) for v, t in zip(mine, tail))
    assert not any("clip_grad_norm_" in out.node_name(v) for v in range(len(out)))
    note = blocking_note(_unhosted(g), measured=False)
    assert f"the wake-ups of {colls} blocking collectives a step (2 each, on every rank) unpriced" in note
    assert "clip_grad_norm_ not recorded in this profile" in note


def test_run_queue_wake_ups_and_clip_from_a_recording_that_has_them():
    """Where no wait tells (rebuilt here), each rank's wake-up is its profiled steps' run-queue wait over the times its
    thread got a core, read from the rank files; every FSDP collective's issue and wait carry one each on every rank, and
    each step gets one all-reduce of the norm (4 bytes) before every rank's optimizer step."""
    path = DATA / "lora-clip" / "ddp-0"
    g = _rebuilt(_graph(path))
    wake = wake_up(g)
    assert wake.source == WakeFrom.RUN_QUEUE and wake_up(_unhosted(g)).us == wake.us
    ratios = []
    for r in (0, 1):
        f = json.loads((path / f"rank{r}.json").read_text())
        prof = set(f["steps_profiled"])
        runs = dict(f["thread_runs"])
        waits = {s: w for s, _, w in f["thread_sched_ns"] if s in prof}
        assert wake.us[r] == pytest.approx(sum(waits.values()) / 1e3 / sum(runs[s] for s in waits))
        ratios += [w / 1e3 / runs[s] for s, w in waits.items()]
        clips = [x for x in f["records"] if x[0] == Rec.GRAD_CLIP]
        assert len(clips) == len(prof)  # one clip_grad_norm_ call a profiled step
    # its sampling error: the spread of the profiled steps' own ratios, both ranks
    assert wake.dof == len(ratios) - 1 and wake.stderr_us == pytest.approx(np.std(ratios, ddof=1) / np.sqrt(len(ratios)))
    assert all(c.calls == 1 and c.tensors == 19 for c in g.meta.grad_clips.values())  # the adapters, norms and head
    out = ddp_to_fsdp(_unhosted(g))
    steps = len(g.meta.steps)
    clip = [v for v in range(len(out)) if out.kind[v] == Kind.COMM and out.node_name(v).startswith("all_reduce clip_grad_norm_")]
    assert len(clip) == steps and all(out.nbytes[v] == CLIP_NORM_BYTES for v in clip)
    for r in (0, 1):
        enq, waits = _mine(out, r, Kind.COMM_ENQUEUE), _mine(out, r, Kind.COMM_WAIT)
        assert len(enq) == len(waits) == 9 * steps  # 5 all-gathers, 3 reduce-scatters and the clip's all-reduce a step
        assert np.allclose(out.dur[enq], wake.us[r]) and np.allclose(out.gap[waits], wake.us[r])
        for s in g.meta.steps:  # the clip's wait comes right before the optimizer step
            lane = sorted((v for v in range(len(out)) if out.rank[v] == r and out.step[v] == s and out.device[v] == out.meta.main_device[r]),
                          key=lambda v: out.order[v])
            up = next(k for k, v in enumerate(lane) if out.kind[v] == Kind.UPDATE)
            assert out.node_name(lane[up - 1]) == f"rank{r}.wait all_reduce clip_grad_norm_"
    note = blocking_note(g, measured=False)
    assert "9 blocking collectives a step, their wake-ups in gloo's measured cost per call" in note
    assert "9 blocking collectives a step, each with 2 wake-ups" in (unhosted := blocking_note(_unhosted(g), measured=False))
    assert "no blocked wait measured in this graph" in unhosted
    assert "clip_grad_norm_ (1 call(s) a step on 19 gradients)" in note and "dispatch on its gradients at the optimizer's measured" in note
    old = _rebuilt(g.replace(meta=g.meta.replace(torch="1.9.0")))  # a torch version bench/dtensor_optimizer.py has not measured
    assert "dispatch on its 19 gradients unpriced" in blocking_note(old, measured=False)


def _updates(g, r):
    return np.array([g.dur[v] for v in range(len(g)) if g.kind[v] == Kind.UPDATE and g.rank[v] == r])


@pytest.mark.parametrize("torch, priced", [("2.13.0+cpu", True), ("1.9.0", False), ("", False)])
def test_dtensor_optimizer_step_at_the_measured_ratio_of_the_profiles_torch(torch, priced):
    """Without calibrate --fsdp, FSDP2's optimizer step is the profile's own step times DTENSOR_STEP's DTensor-to-plain ratio
    for the profile's torch version at its tensors and bytes (the clip's DTensor dispatch at the same ratio for its
    gradients); a version not measured keeps 1/N and says it is unpriced."""
    g = _rebuilt(_graph(DATA / "lora-clip" / "ddp-0"))
    g = g.replace(meta=g.meta.replace(torch=torch))
    tensors = len({p for bk in g.meta.buckets for p in bk.params})
    nbytes = sum(g.meta.layer_grad_bytes.values())
    plain, dtensor = DTENSOR_STEP["2.13"]
    ratio = dtensor.us(tensors, nbytes / 2) / plain.us(tensors, nbytes)
    assert ratio > 1  # LoRA's 19 small trained tensors among 47: DTensor's dispatch per tensor outweighs the halved bytes
    out = ddp_to_fsdp(g)
    for r in (0, 1):
        assert np.allclose(_updates(out, r), _updates(g, r) * (ratio if priced else 0.5))
    clip = [v for v in range(len(out)) if out.node_name(v).endswith("fsdp clip_grad_norm_ (DTensor)")]
    if priced:
        want = [c.us * (dtensor.us(c.tensors, nbytes / 2) / plain.us(c.tensors, nbytes) - 1) for c in g.meta.grad_clips.values()]
        assert np.allclose(sorted(out.dur[clip]), sorted(2 * want))  # each step's on both ranks
    else:
        assert not clip
    note = dtensor_note(g)
    assert ("times DTensor's measured ratio for torch 2.13" in note) == priced
    assert ("unpriced (1/N of the profile's)" in note) != priced
    assert priced or f"not measured for torch {torch or '(not recorded)'}" in note


def test_grad_clip_records_each_call_in_the_window_only():
    """``clip_grad_norm_`` patched for the window records its gradient tensors and time, and the patch is undone."""
    import torch

    from dagprof.collect.hooks.grad_clip import patch_grad_clip

    class Fake:
        recording, records, _restore = True, [], []

        def _fail(self, err, where):  # pragma: no cover - only on a failure
            raise err

    c = Fake()
    original = torch.nn.utils.clip_grad_norm_
    patch_grad_clip(c)
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(3)]
    for p in ps[:2]:
        p.grad = torch.ones(3)
    torch.nn.utils.clip_grad_norm_(ps, 1.0)
    c.recording = False
    torch.nn.utils.clip_grad_norm_(ps, 1.0)
    assert [(r[0], r[1]) for r in c.records] == [(Rec.GRAD_CLIP, 2)] and c.records[0][4] > 0
    for undo in c._restore:
        undo()
    assert torch.nn.utils.clip_grad_norm_ is original


@pytest.mark.parametrize("workers", [1, 4])
def test_more_or_fewer_workers_keep_the_profiles_wake_up(workers):
    """--data-parallel fsdp --workers N from a DDP profile: ``passes.workers`` rebuilds the ranks (no provenance, no
    loop records for a copy), so the conversion after it priced every wake-up at 0 on 3+ ranks (the DANN review: 4
    workers predicted faster than 2) and at rank 0's run queue on 1; the profile's own price is kept for every rank."""
    g = _unhosted(_graph(DATA / "lora" / "ddp-0"))
    wake = wake_up(g)
    c = Cluster()
    out = apply(g, Scenario(workers=workers, data_parallel="fsdp"), c, base_topology(g, c))
    assert out.meta.world_size == workers
    for r in range(workers):
        enq = _mine(out, r, Kind.COMM_ENQUEUE)
        assert enq and np.allclose(out.dur[enq], wake.us[0])


@pytest.mark.parametrize("frozen_blocks, late", [(0, "blocks.0"), (1, "blocks.1")])
def test_the_unit_without_an_input_that_needs_a_gradient_is_reduce_scattered_after_the_root(frozen_blocks, late):
    """The LoRA's embedding is frozen (and its first block too in ``*-1``), so the first trained block's post-backward hook
    never fires: FSDP2 reduce-scatters it from its final backward callback, after the root, as its own FSDP2 job did,
    and the conversion says that call's lag is unpriced; the ResNet-like ``tests/data/fsdp/ddp`` trains from its stem."""
    ddp, fsdp = (_graph(DATA / "lora" / f"{w}-{frozen_blocks}") for w in ("ddp", "fsdp"))
    assert final_callback_units(ddp) == [late]
    step = int(fsdp.meta.steps[0])
    scatters = sorted((c for c in fsdp_collectives(fsdp) if c.kind == CommKind.REDUCE_SCATTER and fsdp.step[c.node] == step),
                      key=lambda c: fsdp.order[c.node])
    assert [c.unit for c in scatters][-2:] == ["<root>", late]
    out = ddp_to_fsdp(ddp)  # the conversion issues them in the FSDP2 job's order: that unit after the root, on every rank
    step = int(out.meta.steps[0])
    mine = sorted((c for c in fsdp_collectives(out) if c.kind == CommKind.REDUCE_SCATTER and out.step[c.node] == step),
                  key=lambda c: out.order[c.node])
    assert [c.unit for c in mine] == [c.unit for c in scatters]
    for r in (0, 1):
        waits = [out.node_name(v) for v in sorted(_mine(out, r, Kind.COMM_WAIT), key=lambda v: out.order[v])
                 if out.step[v] == step and "reduce_scatter" in out.node_name(v)]
        assert waits[-2:] == [f"rank{r}.wait reduce_scatter <root>", f"rank{r}.wait reduce_scatter {late}"]
    assert f"{late} has no input that needs a gradient" in final_scatter_note(ddp)
    plain = _graph(DATA / "fsdp" / "ddp")
    assert final_callback_units(plain) == [] and final_scatter_note(plain) == ""


@pytest.mark.parametrize("k", [0, 1])
def test_all_gathers_carry_no_wake_up_beyond_gloos_measured_call(k, monkeypatch):
    """Gloo's cost per call (``FSDP_HOST``, 0.55 ms an all-gather) was timed from a barrier to the slowest rank's return,
    the hand-off to its worker and the rank's wake-up inside: the DDP -> FSDP conversion priced two wake-ups on top, so
    its all-gathers held the ranks longer than the FSDP2 job's own did (``ddp-0``: 14.0 ms a step, the job 12.2; quiet
    held-out pairs a median 1.4 ms a step over). Each all-gather now holds its rank for the call's price alone (and its
    later rank for gloo's release of it: ``test_each_all_gather_releases_one_rank_later_by_its_bytes_alternating``), and
    on both vendored pairs, that release left out, no longer than the FSDP2 job's did."""
    g = _graph(DATA / "lora" / f"ddp-{k}")
    out = ddp_to_fsdp(g)
    for r in (0, 1):
        enq = [v for v in _mine(out, r, Kind.COMM_ENQUEUE) if "all_gather" in out.node_name(v)]
        waits = [v for v in _mine(out, r, Kind.COMM_WAIT) if "all_gather" in out.node_name(v)]
        assert len(enq) == len(waits) == 5 * len(g.meta.steps) and not out.dur[enq].any()
        assert np.allclose(out.gap[waits], [_release(g, out, v) if _later(out, v) == r else 0.0 for v in waits])
    host = FSDP_HOST[g.meta.torch_minor]
    monkeypatch.setitem(FSDP_HOST, g.meta.torch_minor, dataclasses.replace(host, release_us=0.0, release_us_per_byte=0.0))
    unreleased = kinds(ddp_to_fsdp(g))["all_gather"]["blocked_sum"]
    assert unreleased < kinds(out)["all_gather"]["blocked_sum"]
    assert unreleased <= kinds(_graph(DATA / "lora" / f"fsdp-{k}"))["all_gather"]["blocked_sum"]


def _release(g, out, wait) -> float:
    """The later rank's release the conversion prices after the all-gather ``wait`` waits for (``FsdpHost.release_us_per_byte``)."""
    comm = next(u for u in out.predecessors(wait).tolist() if out.kind[u] == Kind.COMM)
    host = FSDP_HOST[g.meta.torch_minor]
    return (host.release_us + host.release_us_per_byte * float(out.nbytes[comm])) * _call_load(g, _stretch(g))


def _later(out, wait) -> int | None:
    """The rank whose wait on the same all-gather as ``wait`` carries a lag (None: neither)."""
    comm = next(u for u in out.predecessors(wait).tolist() if out.kind[u] == Kind.COMM)
    lagged = [int(out.rank[w]) for w in out.successors(comm).tolist() if out.kind[w] == Kind.COMM_WAIT and out.gap[w] > 0]
    return lagged[0] if len(lagged) == 1 else None


@pytest.mark.parametrize("k", [0, 1])
def test_each_all_gather_releases_one_rank_later_by_its_bytes_alternating(k):
    """Gloo's all-gather releases one of two ranks after the other: on a quiet machine, with compute between the calls as
    a job runs, a mean 0.31 ms + 0.16 ms per MiB gathered, 0.20 ms more than from a barrier, where gloo's cost per call was
    timed (``bench/fsdp_release.py``: each call's later return less the first, 16 KiB-4 MiB), which rank alternating call
    by call (the kept FSDP2 jobs' rank 0 came out later in 0.04-0.93 of their calls, median 0.50). Each converted
    all-gather's wait on exactly one rank carries it at the gathered bytes, stretched as gloo's cost per call is; the
    later rank alternates from one all-gather to the next; the other rank's wait and the reduce-scatters carry none of it."""
    g = _graph(DATA / "lora" / f"ddp-{k}")
    host = FSDP_HOST[g.meta.torch_minor]
    assert host.release_us == pytest.approx(204.0) and host.release_us_per_byte * 2**20 == pytest.approx(159.0)
    out = ddp_to_fsdp(g)
    comms = [v for v in range(len(out)) if out.kind[v] == Kind.COMM and out.comm_kind[v] == int(CommKind.ALL_GATHER)]
    comms.sort(key=lambda v: (int(out.step[v]), float(out.order[v])))
    later = []
    for v in comms:
        waits = [w for w in out.successors(v).tolist() if out.kind[w] == Kind.COMM_WAIT]
        lagged = [w for w in waits if out.gap[w] > 0]
        assert len(waits) == 2 and len(lagged) == 1 and out.nbytes[v] > 0
        assert out.gap[lagged[0]] == pytest.approx(_release(g, out, lagged[0]))
        later.append(int(out.rank[lagged[0]]))
    assert len(later) == 5 * len(g.meta.steps) and all(a != b for a, b in zip(later, later[1:]))
    for r in (0, 1):
        scatter = [v for v in _mine(out, r, Kind.COMM_WAIT) if "reduce_scatter" in out.node_name(v)]
        assert np.allclose(out.gap[scatter], _scatter_lag(g))
