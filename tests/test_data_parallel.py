"""DDP <-> FSDP2 what-ifs (``passes.data_parallel``, ``whatif --data-parallel``) on real recordings of one model:
``tests/data/fsdp/ddp`` (DDP) and ``tests/data/fsdp/reshard`` (fully_shard per block and the root, each given
``reshard_after_forward=True``), and ``tests/data/lora`` (the same under fully_shard's default, which keeps the root gathered)."""
from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.cli.main import main
from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.fsdp_costs import FSDP_HOST, StepFit, dtensor_step_ratio
from dagprof.costmodel.topology import Topology
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import check_fsdp_edges, fsdp_collectives, step_size
from dagprof.passes.data_parallel import HELD_OUT, Conversion, _call_load, _stretch, ddp_to_fsdp, to_data_parallel, user_units
from dagprof.passes.fsdp_mesh import step_scale
from dagprof.passes.fsdp_to_ddp import fsdp_to_ddp
from dagprof.passes.link_fit import find_collectives
from dagprof.search.fsdp_memory import ddp_peak_of_fsdp, fsdp_peak
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.traces.run_schema import LOSS_BACKWARD, MODEL_OUTPUT

DDP, FSDP, HSDP = DATA / "fsdp" / "ddp", DATA / "fsdp" / "reshard", DATA / "fsdp" / "hsdp"


def _bare_ratio(g, world):
    """FSDP2's step over DDP's without a calibration: DTENSOR_STEP's ratio for ``g``'s torch version (DDP's tensors and
    gradient bytes, or an FSDP profile's units'), else 1/N."""
    if g.meta.fsdp is not None:
        tensors, nbytes = step_size(g.meta.fsdp.units)
    else:
        tensors, nbytes = len({p for b in g.meta.buckets for p in b.params}), sum(g.meta.layer_grad_bytes.values())
    return dtensor_step_ratio(g.meta.torch_minor, tensors, nbytes, world) or 1 / world


@pytest.fixture(scope="module")
def ddp():
    return build_graph(read_run(DDP))


@pytest.fixture(scope="module")
def fsdp():
    return build_graph(read_run(FSDP))


def _colls(g):
    return [(c.kind.label, c.unit, int(g.step[c.node]), int(g.nbytes[c.node])) for c in fsdp_collectives(g)]


def _buckets(g):
    idx = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0))
    return [(int(g.step[v]), int(g.bucket[v]), int(g.nbytes[v])) for v in idx]


def test_units_are_what_a_user_wraps():
    grad = {"embed": 8, "blocks.0.up": 4, "blocks.0.act": 0, "blocks.1.up": 4, "blocks.1.norm": 2, "head": 8, "drop": 0}
    layers = ["embed", "blocks.0.up", "blocks.0.act", "blocks.1.up", "blocks.1.norm", "drop", "head"]
    assert user_units(layers, grad) == [("<root>", ["embed", "drop", "head"]), ("blocks.0", ["blocks.0.up", "blocks.0.act"]),
                                        ("blocks.1", ["blocks.1.up", "blocks.1.norm"])]
    # an nn.Sequential's numbered children are units; a child without parameters stays in the root
    assert user_units(["0", "1", "2"], {"0": 4, "2": 4}) == [("<root>", ["1"]), ("0", ["0"]), ("2", ["2"])]
    # beside blocks, a numbered child that is one layer (a stem's conv and norm) is the root's: a user wraps the blocks
    layers = ["stem.0", "stem.1", "stem.2", "blocks.0.conv", "blocks.0.norm", "blocks.1.conv", "fc"]
    grad = {"stem.0": 4, "stem.1": 2, "blocks.0.conv": 4, "blocks.0.norm": 2, "blocks.1.conv": 4, "fc": 4}
    assert user_units(layers, grad) == [("<root>", ["stem.0", "stem.1", "stem.2", "fc"]), ("blocks.0", ["blocks.0.conv", "blocks.0.norm"]),
                                        ("blocks.1", ["blocks.1.conv"])]
    # no numbered container: fully_shard(model) alone
    assert user_units(["fc1", "fc2"], {"fc1": 4, "fc2": 4}) == [("<root>", ["fc1", "fc2"])]


def test_ddp_to_fsdp_has_fsdps_collectives_and_orderings(ddp, fsdp):
    """The DDP profile as FSDP with reshard_after_forward=True on every unit: the same units, collectives, bytes and orderings
    as the real recording of the model so wrapped."""
    g = ddp_to_fsdp(ddp, reshard=True)
    g.lint()
    assert not _buckets(g)
    assert [(u.name, u.numel, u.layers) for u in g.meta.fsdp.units] == [(u.name, u.numel, u.layers) for u in fsdp.meta.fsdp.units]
    counts = check_fsdp_edges(g)
    steps, units = len(g.meta.steps), len(g.meta.fsdp.units)
    assert counts["forward_waits_all_gather"] == counts["backward_all_gather_after_reshard"] == 2 * steps * units  # per rank
    assert counts["reduce_scatter_after_backward"] == counts["optimizer_waits_reduce_scatter"] == 2 * steps * units
    # per step and unit: a forward and a backward all-gather and a reduce-scatter, each of the unit's full bytes,
    # which add up to the parameters' (the DDP buckets' bytes)
    colls = _colls(g)
    assert sorted((k, u) for k, u, s, _ in colls if s == g.meta.steps[0]) == sorted((k, u) for k, u, s, _ in _colls(fsdp) if s == fsdp.meta.steps[0])
    total = sum(nb for _, _, nb in _buckets(ddp)) / len(ddp.meta.steps)
    for kind in ("all_gather", "reduce_scatter"):
        assert sum(nb for k, _, _, nb in colls if k == kind) / len(g.meta.steps) == total * (2 if kind == "all_gather" else 1)
    # the optimizer steps half the parameters on each of the 2 ranks, on DTensor shards (DTENSOR_STEP's ratio)
    upd = g.kind == Kind.UPDATE
    assert np.allclose(g.dur[upd] / _bare_ratio(ddp, 2), ddp.dur[ddp.kind == Kind.UPDATE])


def test_fsdp_keep_gathers_once_per_step(ddp):
    g = ddp_to_fsdp(ddp, reshard=False)
    counts = check_fsdp_edges(g)
    assert counts["backward_all_gather_after_reshard"] == 0 and counts["forward_waits_all_gather"] > 0
    assert job_iteration_us(g) < job_iteration_us(ddp_to_fsdp(ddp))
    assert not any(u.resharded_after_forward for u in g.meta.fsdp.units)


def _gathers(g):
    return sorted(c.unit for c in fsdp_collectives(g) if c.kind.label == "all_gather" and int(g.step[c.node]) == g.meta.steps[0])


@pytest.mark.parametrize("frozen_blocks", [0, 1])
def test_fsdp_by_default_keeps_the_root_gathered(frozen_blocks):
    """fully_shard's default (reshard_after_forward=None) keeps the root gathered after forward: the conversion gathers it
    once a step, as the real default job did (``tests/data/lora``); ``--reshard-after-forward on`` passes True to every
    unit, the root too: a second all-gather of the root at backward's start, and a dearer step."""
    ddp, real = (build_graph(read_run(DATA / "lora" / f"{w}-{frozen_blocks}")) for w in ("ddp", "fsdp"))
    c = Cluster(optimizer_state="adam")
    default = apply(ddp, Scenario(data_parallel="fsdp"), c, base_topology(ddp, c))
    on = apply(ddp, Scenario(data_parallel="fsdp", reshard_after_forward=True), c, base_topology(ddp, c))
    assert _gathers(default).count("<root>") == _gathers(real).count("<root>") == 1 and _gathers(on).count("<root>") == 2
    assert [(u.name, u.resharded_after_forward) for u in default.meta.fsdp.units] == \
        [(u.name, u.resharded_after_forward) for u in real.meta.fsdp.units] == [("<root>", False), ("blocks.0", True), ("blocks.1", True)]
    assert all(u.resharded_after_forward for u in on.meta.fsdp.units)
    # the collector reads reshard_after_forward after lazy init: the default root's as it ran
    assert [u.reshard_after_forward for u in real.meta.fsdp.units] == [False, True, True]
    assert job_iteration_us(default) < job_iteration_us(on)
    assert job_iteration_us(to_data_parallel(real, "fsdp")) == pytest.approx(job_iteration_us(real))  # the default job as it ran
    # blocks.0 frozen whole runs no backward, but blocks.1's pre-backward prefetches it all the same: gathered twice
    assert _gathers(default) == _gathers(real) == ["<root>", "blocks.0", "blocks.0", "blocks.1", "blocks.1"]
    assert check_fsdp_edges(default)["backward_all_gather_after_reshard"] == check_fsdp_edges(real)["backward_all_gather_after_reshard"]
    prefetched = sorted((c.unit, c.prefetched_by) for c in fsdp_collectives(default) if c.prefetched and int(default.step[c.node]) == default.meta.steps[0])
    assert prefetched == ([("blocks.0", "blocks.1")] if frozen_blocks else [])
    # nothing to reduce-scatter for the frozen unit, in the conversion as in the job
    scatters = sorted(c.unit for c in fsdp_collectives(default) if c.kind.label == "reduce_scatter" and int(default.step[c.node]) == default.meta.steps[0])
    assert scatters == sorted(c.unit for c in fsdp_collectives(real) if c.kind.label == "reduce_scatter" and int(real.step[c.node]) == real.meta.steps[0])


def _copy_outs(g, rank=0):
    return [float(g.dur[v]) for v in np.flatnonzero(g.rank == rank) if "fsdp copy-out" in g.node_name(int(v))]


def test_copy_out_costs_a_ddp_enqueue_call_and_its_bytes():
    """Uncalibrated, a copy-out costs what DDP's bucket enqueue costs per call and per byte on a core of its own (each
    bucket's fastest instance over ranks and steps), stretched by the rank's waits for a core: the LoRA job's 1 MiB and
    79 KB buckets took about as long, a call's cost, so each unit's copy-out is about one call whatever its bytes, near what
    the FSDP job's took (the enqueues' sum per byte priced them 10x that). Enqueues a loaded rank was descheduled inside
    (10-40x the fastest at load 13-22) do not move the price. A profile whose buckets are all of one size prices per byte."""
    from dagprof.passes.data_parallel import _stretch

    ddp, real = (build_graph(read_run(DATA / "lora" / f"{w}-0")) for w in ("ddp", "fsdp"))
    conv = ddp_to_fsdp(ddp)
    stretch = _stretch(ddp)
    enq = np.flatnonzero((ddp.kind == Kind.COMM_ENQUEUE) & (ddp.bucket >= 0))
    fastest = [(1, int(ddp.nbytes[e[0]]), float(ddp.dur[e].min())) for k in np.unique(ddp.bucket[enq]) for e in [enq[ddp.bucket[enq] == k]]]
    fit, size = StepFit.fit(fastest), {u.name: u.numel * 4 for u in conv.meta.fsdp.units}
    copy_outs = [v for v in np.flatnonzero(conv.rank >= 0) if "fsdp copy-out" in conv.node_name(int(v))]
    assert len(fastest) == 2 and copy_outs and min(stretch.values()) > 1.0
    assert all(float(conv.dur[v]) == pytest.approx(fit.us(1, size[conv.node_name(int(v)).split("copy-out ")[1].rpartition(" (")[0]])
                                                   * stretch[int(conv.rank[v])]) for v in copy_outs)
    copies = _copy_outs(conv)
    assert 0.5 < sum(copies) / sum(_copy_outs(real)) * len(real.meta.steps) / len(ddp.meta.steps) < 2
    slow = ddp.dur.copy()
    for k in np.unique(ddp.bucket[enq]):
        e = enq[ddp.bucket[enq] == k]
        slow[e[ddp.dur[e] > ddp.dur[e].min()]] *= 20  # every instance but the fastest descheduled
    assert _copy_outs(ddp_to_fsdp(ddp.replace(dur=slow))) == pytest.approx(copies)
    one = build_graph(read_run(DDP))  # one bucket, no waits for a core recorded
    enq = np.flatnonzero((one.kind == Kind.COMM_ENQUEUE) & (one.bucket >= 0))
    per_byte = float(one.dur[enq].min()) / float(one.nbytes[np.flatnonzero((one.kind == Kind.COMM) & (one.bucket >= 0))[0]])
    conv = ddp_to_fsdp(one)
    size = {u.name: u.numel * 4 for u in conv.meta.fsdp.units}
    assert all(float(conv.dur[v]) == pytest.approx(size[conv.node_name(int(v)).split("copy-out ")[1].rpartition(" (")[0]] * per_byte)
               for v in np.flatnonzero(conv.rank >= 0) if "fsdp copy-out" in conv.node_name(int(v)))


def test_fsdp_to_ddp_buckets_every_gradient_once(fsdp):
    g = fsdp_to_ddp(fsdp)
    g.lint()
    assert g.meta.fsdp is None and not fsdp_collectives(g)
    assert not any("fsdp " in g.node_name(v) for v in range(len(g)))
    params = sum(u.numel * 4 for u in fsdp.meta.fsdp.units)
    buckets = _buckets(g)
    assert [nb for _, _, nb in buckets] == [params] * len(g.meta.steps)  # under 25 MiB: one bucket per step
    # 64 KiB buckets, in reverse registration order: the head (65 KiB) closes the first, the embedding the last
    small = _buckets(fsdp_to_ddp(fsdp, bucket_mb=64 / 1024))
    per_step = [nb for s, _, nb in small if s == g.meta.steps[0]]
    assert sum(per_step) == params and per_step[0] == fsdp.meta.fsdp.layer_grad_bytes["head"] and len(per_step) == 4
    # DDP's finalize waits for every bucket, then copies them into the gradients, before the optimizer, which steps
    # every parameter on every rank
    for v in np.flatnonzero(g.kind == Kind.UPDATE).tolist():
        (copy,) = [p for p in g.predecessors(v).tolist() if "ddp copy buckets to grads" in g.node_name(p)]
        (fin,) = [p for p in g.predecessors(copy).tolist() if "ddp finalize" in g.node_name(p)]
        assert [int(g.bucket[p]) for p in g.predecessors(fin).tolist() if g.kind[p] == Kind.COMM] == [0]
        assert g.dur[copy] > 0
    assert np.allclose(g.dur[g.kind == Kind.UPDATE], fsdp.dur[fsdp.kind == Kind.UPDATE] / _bare_ratio(fsdp, 2))


def _lane(g, step, rank):
    """(name, dur) of rank's main-lane nodes in ``step``, in order."""
    sel = np.flatnonzero((g.step == step) & (g.rank == rank) & (g.device == g.meta.main_device[rank]))
    return [(g.node_name(v).partition(".")[2], float(g.dur[v])) for v in sel[np.argsort(g.order[sel], kind="stable")].tolist()]


def test_fsdp_to_ddp_drops_fsdps_hook_spans(fsdp):
    """FSDP's pre- and post-forward and -backward hooks run in the untraced spans around each unit's all-gather, copy-out
    and reshard; DDP has none of them. The layers, the spans between two layers of one unit and a unit's ops between
    its last layer and its reshard stay."""
    g = fsdp_to_ddp(fsdp)
    unit = {x: u.name for u in fsdp.meta.fsdp.units for x in u.layers}
    for step in g.meta.steps:
        for r in (0, 1):
            before, after = _lane(fsdp, step, r), _lane(g, step, r)
            assert [(n, d) for n, d in after if n.endswith((" forward", " backward")) or n == "other:loss"] == \
                [(n, d) for n, d in before if n.endswith((" forward", " backward")) or n == "other:loss"]
            stay = [d for (n, _), (m, d), (o, _) in zip(before, before[1:], before[2:])  # between two layers of one unit, or before a reshard
                    if m.startswith("other:") and n.endswith(" forward") and (o.startswith("fsdp reshard") or
                                                                               o.endswith(" forward") and unit[n[:-8]] == unit[o[:-8]])]
            kept = [d for n, d in after if n.startswith("other:") and "(the root's" not in n]
            assert stay and set(stay) <= set(kept) and sum(kept) < sum(d for n, d in before if n.startswith("other:"))
            hooks = [m for (n, _), (m, _) in zip(before, before[1:]) if m.startswith("other:") and n.startswith(("fsdp copy-out", "fsdp reshard"))]
            assert hooks and len([n for n, _ in after if n.startswith("other:")]) <= len([n for n, _ in before if n.startswith("other:")]) - len(hooks) + 1


def test_fsdp_to_ddp_keeps_the_roots_backward_beside_its_prefetch(fsdp):
    """The root's backward runs untraced while the all-gather it prefetched (the last block's) is in flight, so the wait
    on that all-gather holds it: what the wait measured beyond the rank's median all-gather gap stays, where it was."""
    g = fsdp_to_ddp(fsdp)
    gathers = [c for c in fsdp_collectives(fsdp) if c.kind.label == "all_gather"]
    waits = {c.node: [v for v in fsdp.successors(c.node).tolist() if fsdp.kind[v] == Kind.COMM_WAIT] for c in gathers}
    for r in (0, 1):
        mine = [v for vs in waits.values() for v in vs if fsdp.rank[v] == r]
        lag = float(np.median(fsdp.gap[mine]))
        root = sorted((int(fsdp.step[v]), max(0.0, float(fsdp.gap[v]) - lag)) for c in gathers if c.prefetched_by == "<root>"
                      for v in waits[c.node] if fsdp.rank[v] == r)
        got = sorted((int(g.step[v]), float(g.dur[v])) for v in range(len(g)) if g.node_name(v).startswith(f"rank{r}.other:backward (the root's"))
        assert len(root) == len(g.meta.steps) and [s for s, _ in got] == [s for s, _ in root]
        assert np.allclose([d for _, d in got], [d for _, d in root]) and max(d for _, d in got) > 0


def test_fsdp_to_ddp_finalize_lags_as_the_reduce_scatters():
    """gloo's all-gather releases one rank about half its transfer after the other, its reduce-scatter (an all-reduce)
    both together, as DDP's all-reduce does: DDP's finalize waits with each rank's median lag on the reduce-scatters
    (a 200 Mbit/s testbed profile: 0.6 and 1.2 ms, where the all-gathers' are 1.5 and 3.2 ms)."""
    f = build_graph(read_run(DATA / "fsdp" / "testbed-200mbit"))
    rs = {c.node for c in fsdp_collectives(f) if c.kind.label == "reduce_scatter"}
    waits = {r: [v for c in find_collectives(f) if c.comm in rs for v in c.consumers if f.kind[v] == Kind.COMM_WAIT and f.rank[v] == r]
             for r in (0, 1)}
    g = fsdp_to_ddp(f)
    for r in (0, 1):
        fin = [v for v in range(len(g)) if g.node_name(v) == f"rank{r}.ddp finalize (wait for buckets)"]
        assert np.allclose(g.gap[fin], np.median(f.gap[waits[r]]))


def test_round_trip_keeps_the_ddp_job(ddp):
    """DDP -> FSDP -> DDP: the same compute, one bucket of the same bytes per step, and the iteration between the
    original less what DDP's finalize measured beyond the transfer (its wait's gap, which the copy back into the
    gradients stands in for) and the original plus gloo's reduce-scatter tail (``FsdpHost.scatter_us``: priced on each
    reduce-scatter's wait, it comes back as the finalize's lag)."""
    back = fsdp_to_ddp(ddp_to_fsdp(ddp))
    assert [nb for _, _, nb in _buckets(back)] == [nb for _, _, nb in _buckets(ddp)]
    for kind in (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE):
        assert np.allclose(np.sort(back.dur[back.kind == kind]), np.sort(ddp.dur[ddp.kind == kind]))
    gap = ddp.gap.copy()
    gap[[v for v in range(len(ddp)) if "ddp finalize" in ddp.node_name(v)]] = 0.0
    tail = FSDP_HOST[ddp.meta.torch_minor].scatter_us * _call_load(ddp, _stretch(ddp))
    assert job_iteration_us(ddp.replace(gap=gap)) < job_iteration_us(back) < job_iteration_us(ddp) + tail


def test_as_profiled_is_unchanged(ddp, fsdp):
    assert to_data_parallel(ddp, "ddp") is ddp
    assert job_iteration_us(to_data_parallel(fsdp, "fsdp", reshard=True)) == pytest.approx(job_iteration_us(fsdp))
    # fsdp is fully_shard's default: this job passed True to its root too, which the default keeps gathered after forward
    assert job_iteration_us(to_data_parallel(fsdp, "fsdp")) < job_iteration_us(fsdp)


def test_memory_of_each_wrapper(ddp, fsdp):
    """Each prediction holds the other wrapper's parameters, gradients and optimizer state as it would; against the
    same configuration run with ``bench/fsdp_train.py --memory`` (steps 1-5 of 6, either rank): within 11 %."""
    params = sum(u.numel * 4 for u in fsdp.meta.fsdp.units)
    d = ddp_peak_of_fsdp(fsdp)[0]
    assert d.params == d.grads == d.buckets == params and d.optimizer == 2 * params  # AdamW, as the FSDP profile measured
    assert d.total == pytest.approx(1545376, rel=0.11)  # --ddp --memory
    g = apply(ddp, Scenario(data_parallel="fsdp", reshard_after_forward=True), Cluster(optimizer_state="adam"), base_topology(ddp, Cluster()))
    f = fsdp_peak(g)[0]
    assert f.params == params / 2 and f.optimizer == params  # Adam's two copies of half the parameters
    assert f.total == pytest.approx(1085872, rel=0.11)  # the fully_shard run (tests/test_fsdp_whatif.py)


def test_adams_step_can_be_the_ddp_peak(fsdp):
    """With Adam's state (2 per parameter, as the FSDP profile measured) the DDP peak is the larger of backward's start
    and the optimizer step, which holds every gradient and two temporaries of the largest layer's parameters (AdamW's
    square root and division, one parameter at a time) but no activation; with another optimizer's state, backward's start."""
    fs = fsdp.meta.fsdp
    params = sum(u.numel * 4 for u in fs.units)
    largest = max(fs.layer_grad_bytes.values())
    big = fsdp.replace(meta=fsdp.meta.replace(fsdp=dataclasses.replace(fs, layer_saved_bytes={k: 1 for k in fs.layer_saved_bytes})))
    d = ddp_peak_of_fsdp(big)[0]  # activations too small to matter: the step is the peak
    assert (d.activations, d.step) == (0.0, 2.0 * largest) and d.total == pytest.approx(5 * params + 2 * largest)
    assert ddp_peak_of_fsdp(fsdp)[0].total >= d.total - 2 * largest  # and never below backward's start
    sgd = {r: dataclasses.replace(m, optim_state_bytes=m.param_shard_bytes) for r, m in fs.memory.items()}  # momentum: 1 per parameter
    m = ddp_peak_of_fsdp(big.replace(meta=big.meta.replace(fsdp=dataclasses.replace(big.meta.fsdp, memory=sgd))))[0]
    assert m.step == 0.0 and m.activations > 0


def test_whatif_rows_carry_time_and_memory(ddp, fsdp):
    for g, targets in ((ddp, ["ddp", "fsdp", "fsdp:keep"]), (fsdp, ["ddp", "fsdp", "fsdp:keep"])):
        rows = evaluate(g, [Scenario(data_parallel=t) for t in targets], tolerance_pct=None)["scenarios"]
        assert [r.scenario.data_parallel for r in rows] == targets
        for r in rows:
            assert r.interval.lo_us <= r.interval.point_us <= r.interval.hi_us
            if r.scenario.data_parallel != "ddp" or g is fsdp:
                assert r.peak_memory_mb > 0 and r.memory_per_rank.keys() == {0, 1}


@pytest.mark.parametrize("path, argv, message", [
    (DDP, ["--data-parallel", "fsdp", "--bucket-mb", "1"], "--data-parallel fsdp makes this DDP job FSDP; --bucket-mb"),
    (FSDP, ["--data-parallel", "ddp", "--reduce-dtype", "bf16"], "--data-parallel ddp makes this FSDP job DDP"),
    (HSDP, ["--data-parallel", "ddp"], "this profile is an HSDP job"),
    (DATA / "hybrid-dp-tp-dagprof", ["--data-parallel", "fsdp"], "this profile is a hybrid job"),
    (DATA / "horovod" / "fused", ["--data-parallel", "fsdp"], "needs a dagprof profile of a PyTorch DDP or FSDP2 job"),
    (DDP, ["--data-parallel", "zero3"], "expected ddp, fsdp or fsdp:keep"),
    (DDP, ["--data-parallel", "ddp,fsdp", "--reshard-after-forward", "on"], "--reshard-after-forward: is an FSDP what-if"),
])
def test_refused_in_one_line(path, argv, message, capsys):
    assert main(["whatif", str(path), *argv, "--no-trace", "--allow-model-error"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_json(capsys, tmp_path):
    assert main(["whatif", str(DDP), "--data-parallel", "fsdp", "--optimizer-state", "adam", "--json", "--allow-model-error",
                 "-o", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    row = r["scenarios"][0]
    assert row["data_parallel"] == "fsdp" and row["memory_per_rank"]["0"]["optimizer_mb"] == pytest.approx(row["memory_per_rank"]["0"]["params_mb"] * 2)
    # never a silent answer: what the conversion cannot see, and its measured miss, come with it: in a few lines beside the
    # rows, and in full (each cost's price, every held-out figure) in conversion_detail
    (note,) = [n for n in r["notes"] if n.startswith("--data-parallel fsdp from a DDP profile")]
    held = HELD_OUT[Conversion.DDP_TO_FSDP]  # the held-out figures, said from their one table in both texts
    assert "unpriced: clip_grad_norm_ (not recorded)" in note and held.off in note and len(note) < 560
    detail = r["conversion_detail"]["fsdp"]
    assert held.off in detail and held.source in detail and "clip_grad_norm_ not recorded in this profile" in detail


def test_every_conversion_has_its_held_out_figures():
    """``HELD_OUT`` is keyed by ``Conversion`` members (five strings before: a misspelt key failed only where it was read)."""
    assert set(HELD_OUT) == set(Conversion) and all(isinstance(k, Conversion) for k in HELD_OUT)


def test_cli_reshard_beside_the_conversion(capsys):
    """--reshard-after-forward on|off beside --data-parallel fsdp on a DDP profile: the flag passed to every unit, the root
    too (on: the dearest step; off: fsdp:keep's), and fully_shard's default between them, as the note says."""
    assert main(["whatif", str(DDP), "--data-parallel", "fsdp,fsdp:keep", "--reshard-after-forward", "on,off", "--optimizer-state", "adam",
                 "--json", "--allow-model-error", "--no-trace"]) == 0
    rows = {(r["data_parallel"], r["reshard_after_forward"]): r["predicted_iter_ms"] for r in json.loads(capsys.readouterr().out)["scenarios"]}
    assert rows[("fsdp", "on")] == rows[("fsdp:keep", "on")] and rows[("fsdp", "off")] == rows[("fsdp:keep", "off")]
    assert main(["whatif", str(DDP), "--data-parallel", "fsdp", "--json", "--allow-model-error", "--no-trace"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert rows[("fsdp", "off")] < r["scenarios"][0]["predicted_iter_ms"] < rows[("fsdp", "on")]
    assert any("fully_shard's default" in n and "the root kept gathered" in n for n in r["notes"])


def test_no_conversion_no_note(capsys):
    assert main(["whatif", str(DDP), "--data-parallel", "ddp", "--json", "--allow-model-error", "--no-trace"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("--data-parallel")]


def test_a_profile_without_layers_is_refused():
    g = build_graph(read_run(DDP))
    g = g.replace(meta=g.meta.replace(layer_grad_bytes={}))
    with pytest.raises(DagprofError, match="does not say which layer owns which parameters"):
        ddp_to_fsdp(g)


def test_with_more_workers(ddp, fsdp):
    """--workers 4 beside --data-parallel: FSDP shards over the 4 ranks; DDP keeps every parameter and steps all of them."""
    c = Cluster(optimizer_state="adam")
    g = apply(ddp, Scenario(workers=4, data_parallel="fsdp"), c, base_topology(ddp, c))
    params = sum(u.numel * 4 for u in fsdp.meta.fsdp.units)
    assert g.meta.fsdp.world_size == 4 and fsdp_peak(g)[0].params == params / 4
    assert np.allclose(g.dur[g.kind == Kind.UPDATE][:4] / _bare_ratio(ddp, 4), ddp.dur[ddp.kind == Kind.UPDATE][:4])
    d = apply(fsdp, Scenario(workers=4, data_parallel="ddp"), c, base_topology(fsdp, c))
    assert d.meta.world_size == 4 and d.meta.fsdp is None
    # --workers 4 first steps the shards of 4 ranks (as torch's DTensor step splits the profiled one: step_scale), then DDP
    # the whole over DTensor's ratio at 4: DDP's whole step, whatever the workers
    upd = np.unique(fsdp.dur[fsdp.kind == Kind.UPDATE])
    assert np.allclose(np.unique(d.dur[d.kind == Kind.UPDATE]), upd * step_scale(fsdp, 2, 4, None) / _bare_ratio(fsdp, 4))
    assert np.allclose(np.unique(d.dur[d.kind == Kind.UPDATE]), upd / _bare_ratio(fsdp, 2))


@pytest.mark.parametrize("wrapper", [[], ["--ddp"]], ids=["fully_shard", "ddp"])
def test_the_model_output_is_recorded_and_held_through_the_step(tmp_path, wrapper):
    """A live zero-code run of ``bench/fsdp_train.py`` (which keeps the logits until its step ends, as most scripts do):
    the collector records what the model's forward returned (the logits: batch x seq x vocab fp32), which no saved-tensor
    hook sees, and each memory model holds it at every moment after forward (with Adam, the step's temporaries too)."""
    pytest.importorskip("torch")
    script = DATA.parent.parent / "bench" / "fsdp_train.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *wrapper,
           "--blocks", "2", "--width", "64", "--vocab", "256", "--batch", "4", "--seq", "16", "--steps", "5"]
    assert main(["profile", "-o", str(tmp_path), "--steps", "2:4", "--no-kineto", "--"] + cmd) == 0
    run = read_run(tmp_path)
    logits = 4 * 16 * 256 * 4
    assert run.ranks[0].meta.layer_saved_bytes[MODEL_OUTPUT] == logits
    assert run.ranks[0].meta.layer_saved_bytes[LOSS_BACKWARD] == 3 * logits  # the cross-entropy's log-softmax and two gradients
    g = build_graph(run)
    if wrapper:
        plain = g.replace(meta=g.meta.replace(layer_saved_bytes={k: v for k, v in g.meta.layer_saved_bytes.items() if k != MODEL_OUTPUT}))
        link = Topology.flat(2, AlphaBeta(50.0, 1e-3))  # memory needs no link: not one fitted to this tiny job's few collectives
        g = apply(g, Scenario(data_parallel="fsdp"), Cluster(optimizer_state="adam"), link)
        older = apply(plain, Scenario(data_parallel="fsdp"), Cluster(optimizer_state="adam"), link)
    else:
        fs = g.meta.fsdp
        older = g.replace(meta=g.meta.replace(fsdp=dataclasses.replace(fs, layer_saved_bytes={k: v for k, v in fs.layer_saved_bytes.items()
                                                                                                if k != MODEL_OUTPUT})))
        d, d0 = ddp_peak_of_fsdp(g)[0], ddp_peak_of_fsdp(older)[0]
        assert d.total == pytest.approx(d0.total + logits)  # held at backward's start and through the step alike
    f, f0 = fsdp_peak(g)[0], fsdp_peak(older)[0]
    assert f.activations >= logits and f.total <= f0.total + logits  # at most once more than before (in place of a stand-in, in part)


def test_fsdp2s_plan_is_typed_and_names_its_collectives_kinds():
    """``_plan``'s points carry their kind as ``PlanKind`` (a collective's ``CommKind``, or a reshard with none): a unit that
    reshards after forward is gathered again in backward, every unit reduce-scattered and resharded after its backward."""
    from dagprof.passes.data_parallel import PlanKind, _plan
    from dagprof.traces.events import CommKind

    plan = _plan(["root", "a"], {"root": False, "a": True})
    assert [(p.kind, p.unit, p.phase) for p in plan] == [
        (PlanKind.ALL_GATHER, "root", "forward"), (PlanKind.ALL_GATHER, "a", "forward"), (PlanKind.RESHARD, "a", "forward"),
        (PlanKind.ALL_GATHER, "a", "backward"), (PlanKind.REDUCE_SCATTER, "a", "backward"), (PlanKind.RESHARD, "a", "backward"),
        (PlanKind.REDUCE_SCATTER, "root", "backward"), (PlanKind.RESHARD, "root", "backward")]
    assert [k.comm for k in PlanKind] == [CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER, None]
    assert [k.label for k in PlanKind] == ["all_gather", "reduce_scatter", "reshard"]
