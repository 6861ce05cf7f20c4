"""FSDP2's measured costs (``dagprof calibrate --fsdp``, ``costmodel.fsdp_costs``): measured on a real gloo group, kept in
the link-model file (version 3), and inserted by DDP -> FSDP (``passes.data_parallel.ddp_to_fsdp``) into the recorded DDP
job ``tests/data/fsdp/ddp``; a version-3 file also prices each collective kind at its measured sizes; older link-model
files convert and price as before."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.collect.measure.calibrate import slowest_each
from dagprof.costmodel.alphabeta import AlphaBeta, ring_allreduce_us
from dagprof.costmodel.fsdp_costs import DTENSOR_STEP, FSDP_HOST, FsdpCosts, StepFit, step_ratio
from dagprof.costmodel.topology import read_link_model, save_link_model
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import allreduce_equivalent_bytes, fsdp_collectives
from dagprof.passes.comm import set_topology
from dagprof.passes.data_parallel import HELD_OUT, Conversion, _stretch, ddp_to_fsdp, host_note
from dagprof.passes.fsdp_mesh import scale_fsdp_workers, step_scale
from dagprof.passes.fsdp_to_ddp import fsdp_to_ddp
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind

DDP, FSDP = DATA / "fsdp" / "ddp", DATA / "fsdp" / "reshard"
LINK = AlphaBeta(50.0, 1e-3)
# far from the profile's own rules (1/N of the step, DDP's enqueue per byte): a converted node shows which it took
COSTS = FsdpCosts(2, StepFit(10.0, 1e-3), StepFit(500.0, 3e-3), 7e-3, 321.0, 654.0)


@pytest.fixture(scope="module")
def ddp():
    return build_graph(read_run(DDP))


def _per_rank0(g, what):
    steps = len(set(g.step[g.rank == 0].tolist()))
    return sum(float(g.dur[v]) for v in np.flatnonzero(g.rank == 0) if what(v)) / steps


def test_step_fit_keeps_each_term_non_negative():
    f = StepFit.fit([(10, 0, 100.0), (1, 1000, 20.0)])
    assert (f.us_per_tensor, f.us_per_byte) == pytest.approx((10.0, 0.01))
    # noise that would give the per-tensor term a negative cost: the better one-term fit instead
    f = StepFit.fit([(32, 1 << 17, 130.0), (2, 1 << 23, 8300.0), (8, 1 << 21, 2000.0)])
    assert f.us_per_tensor >= 0 and f.us_per_byte >= 0
    with pytest.raises(DagprofError, match="optimizer timings"):
        StepFit.fit([(1, 1, 0.0)])


def test_conversion_inserts_the_measured_costs(ddp):
    tensors = len({p for b in ddp.meta.buckets for p in b.params})
    params = sum(ddp.meta.layer_grad_bytes.values())
    assert tensors > 0
    plain, measured = ddp_to_fsdp(ddp), ddp_to_fsdp(ddp, costs=COSTS)
    profiled = ddp.dur[ddp.kind == Kind.UPDATE]
    ratio = COSTS.dtensor_step.us(tensors, params / 2) / COSTS.plain_step.us(tensors, params)
    # no calibration: DTensor's ratio for the profile's torch version (DTENSOR_STEP), else 1/N of DDP's step
    bare = step_ratio(*DTENSOR_STEP[ddp.meta.torch_minor], tensors, params, 2) if ddp.meta.torch_minor in DTENSOR_STEP else 0.5
    assert np.allclose(plain.dur[plain.kind == Kind.UPDATE], profiled * bare)
    assert np.allclose(measured.dur[measured.kind == Kind.UPDATE], profiled * ratio)
    copy = [v for v in np.flatnonzero(measured.rank >= 0) if "fsdp copy-out" in measured.node_name(v)]
    size = {u.name: u.numel * 4 for u in measured.meta.fsdp.units}
    assert copy and all(measured.dur[v] == pytest.approx(size[measured.node_name(v).split("copy-out ")[1].rpartition(" (")[0]] * 7e-3)
                        for v in copy)
    # every unit's hooks once per pass and step, and nowhere without a measurement
    units, steps = len(measured.meta.fsdp.units), len(ddp.meta.steps)
    for phase, us in (("forward", 321.0), ("backward", 654.0)):
        hooks = [v for v in np.flatnonzero(measured.rank >= 0) if measured.node_name(v).endswith(f"({phase})")
                 and "fsdp hooks" in measured.node_name(v)]
        assert len(hooks) == units * steps * 2 and np.allclose(measured.dur[hooks], us)  # 2 ranks
    # the same collectives either way: only what was measured changed
    assert (measured.kind == Kind.COMM).sum() == (plain.kind == Kind.COMM).sum()


def test_measured_costs_leave_out_the_profiles_overhead_per_collective(ddp):
    """The fixed cost per collective a DDP profile's link fit holds (fitted on its all-reduces) is charged on no FSDP
    collective where FSDP2's costs were measured (each kind's swept call and each unit's hooks and wake-ups hold it); the
    uncalibrated conversion charges gloo's measured fixed cost per call for the profile's torch version instead
    (``FSDP_HOST``), and keeps the profile's where the version is not measured."""
    from dagprof.costmodel.topology import Topology
    topo = Topology(2, 1, LINK, LINK, overhead_us=4000.0)
    on = set_topology(ddp, topo)
    bare = set_topology(ddp, dataclasses.replace(topo, overhead_us=0.0))

    def gathers(g):
        return sum(float(g.dur[c.node]) for c in fsdp_collectives(g))
    assert gathers(ddp_to_fsdp(on, costs=COSTS)) == pytest.approx(gathers(ddp_to_fsdp(bare, costs=COSTS)))
    plain = ddp_to_fsdp(on)
    call = FSDP_HOST[ddp.meta.torch_minor].call_us
    assert gathers(plain) == pytest.approx(gathers(ddp_to_fsdp(bare)))  # the profile's 4 ms went: each call's measured cost
    assert gathers(plain) == pytest.approx(gathers(ddp_to_fsdp(set_topology(ddp, dataclasses.replace(topo, overhead_us=call)))))
    old = _torch(on, "1.9.0")
    kept = ddp_to_fsdp(old)
    assert gathers(kept) == pytest.approx(gathers(ddp_to_fsdp(_torch(bare, "1.9.0"))) + 4000.0 * len(fsdp_collectives(kept)))


def test_each_calls_fixed_cost_is_stretched_by_the_slowest_ranks_waits_for_a_core_where_the_fit_held_the_load():
    """Gloo's fixed cost per call (``FSDP_HOST``, timed on a quiet machine) is hand-offs between threads. Where the profile's
    fit put the slower instances' excess in its overhead per collective (one bucket size), the load went with it: the
    conversion charges the call's cost times the slowest rank's stretch, as measured; where the fit has none (two gloo
    lanes: total time over bytes, the load in the bytes' price), unstretched; a profile that does not record its waits
    for a core, unstretched."""
    from dagprof.costmodel.topology import Topology
    g = build_graph(read_run(DATA / "lora-clip" / "ddp-0"))
    unrecorded = g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(g.meta.loop_steps, sched={})))
    stretch, call = max(_stretch(g).values()), FSDP_HOST[g.meta.torch_minor].call_us
    assert stretch > 1.0 and _stretch(unrecorded) == dict.fromkeys(_stretch(g), 1.0)
    for fitted, grown in ((4000.0, stretch - 1.0), (0.0, 0.0)):
        topo = Topology(2, 1, LINK, LINK, overhead_us=fitted)
        loaded, alone = ddp_to_fsdp(set_topology(g, topo)), ddp_to_fsdp(set_topology(unrecorded, topo))
        colls, bare = fsdp_collectives(loaded), fsdp_collectives(alone)
        assert colls and len(colls) == len(bare)
        extra = sum(float(loaded.dur[c.node]) for c in colls) - sum(float(alone.dur[c.node]) for c in bare)
        assert extra == pytest.approx(call * grown * len(colls))


def test_bytes_of_a_fit_without_bandwidth_cost_gloos_measured_price_per_byte():
    """Where the DDP profile's fit saw no bandwidth (its all-reduces' time did not grow with their size: all of it in the
    overhead per collective, which the conversion replaces by gloo's cost per call), FSDP's bytes cost ``FSDP_HOST``'s
    measured time per all-reduce-equivalent byte, stretched as the call's, and the note says so; a fit with bandwidth keeps
    its own (the LM/GRU pairs of docs/evidence.md, branch ddpfsdp57: 12 of 28 DDP profiles fitted so)."""
    from dagprof.costmodel.topology import Topology
    from dagprof.passes.data_parallel import no_bandwidth
    g = build_graph(read_run(DATA / "lora-clip" / "ddp-0"))
    host, stretch = FSDP_HOST[g.meta.torch_minor], max(_stretch(g).values())
    flat = Topology(2, 1, AlphaBeta(0.0, 0.0), AlphaBeta(0.0, 0.0), overhead_us=4000.0)
    assert no_bandwidth(flat) and not no_bandwidth(Topology(2, 1, LINK, LINK, overhead_us=4000.0))
    priced = ddp_to_fsdp(set_topology(g, flat))
    link = AlphaBeta(0.0, host.call_us_per_byte * stretch)
    assert [float(priced.dur[c.node]) for c in fsdp_collectives(priced)] == pytest.approx(
        [float(x.dur[c.node]) for x in [ddp_to_fsdp(set_topology(g, dataclasses.replace(flat, intra=link, inter=link)))]
         for c in fsdp_collectives(x)])
    colls = np.array([c.node for c in fsdp_collectives(priced)])
    assert host.call_us_per_byte > 0 and priced.dur[colls] == pytest.approx(
        host.call_us * stretch + allreduce_equivalent_bytes(priced, colls) * host.call_us_per_byte * stretch)
    assert "showed no bandwidth" in host_note(set_topology(g, flat)) and "showed no bandwidth" not in host_note(
        set_topology(g, Topology(2, 1, LINK, LINK, overhead_us=4000.0)))


def test_bytes_of_two_lanes_beside_the_backward_on_one_host_cost_a_blocking_calls_price():
    """Where the DDP profile's all-reduces ran on two gloo lanes beside its backward, every rank on one host and no wire
    named (the vendored LoRA clip profile: fitted at 9.3 ns a byte, total time over bytes), FSDP's blocking calls' bytes
    cost ``FSDP_HOST``'s measured price per all-reduce-equivalent byte, stretched as the call's, and the note says so
    (``beside_compute``; 95 kept pairs, docs/evidence.md, branch ddpfsdp58); a named wire, one lane, or a fit already
    cheaper keep the profile's own."""
    from dagprof.passes.comm import current_topology
    from dagprof.passes.data_parallel import _call_load, beside_compute
    g = build_graph(read_run(DATA / "lora-clip" / "ddp-0"))
    host, load = FSDP_HOST[g.meta.torch_minor], _call_load(g, _stretch(g))
    blocking = AlphaBeta(0.0, host.call_us_per_byte * load)
    topo = current_topology(g)
    assert g.meta.comm_lanes > 1 and topo.intra.beta_us_per_byte > blocking.beta_us_per_byte and beside_compute(g, topo, blocking)
    priced = ddp_to_fsdp(g)
    colls = np.array([c.node for c in fsdp_collectives(priced)])
    assert len(colls) and priced.dur[colls] == pytest.approx(
        host.call_us * load + allreduce_equivalent_bytes(priced, colls) * host.call_us_per_byte * load)
    assert "ran on two gloo lanes beside the backward" in host_note(g)
    cheaper = dataclasses.replace(topo, intra=AlphaBeta(0.0, 1e-4), inter=AlphaBeta(0.0, 1e-4))
    for other in (g.replace(meta=g.meta.replace(wire_bytes_per_s=125e6)), g.replace(meta=g.meta.replace(comm_lanes=1)),
                  set_topology(g, cheaper)):
        assert not beside_compute(other, current_topology(other), blocking) and "two gloo lanes" not in host_note(other)
    own = ddp_to_fsdp(g.replace(meta=g.meta.replace(wire_bytes_per_s=125e6)))
    assert (own.dur[[c.node for c in fsdp_collectives(own)]] > priced.dur[colls]).all()  # the fit's 9.3 ns a byte


def _torch(g, version):
    return g.replace(meta=g.meta.replace(torch=version))


@pytest.mark.parametrize("path, torch", [(DDP, "2.13.0+cpu"), (DATA / "lora-clip" / "ddp-0", "2.13.0+cpu"), (DDP, "1.9.0")])
def test_fsdp_hooks_per_unit_at_the_measured_host_work_of_the_profiles_torch(path, torch):
    """Without calibrate --fsdp, each unit gets FSDP2's hooks once a pass (forward: before its all-gather; backward: after its
    reduce-scatter) at ``FSDP_HOST``'s CPU time for the profile's torch version at the unit's trained tensors and bytes,
    stretched by the rank's waits for a core as profiled (1 where not recorded: ``tests/data/fsdp``); a version not measured
    gets none and the note says so. Peak memory does not move."""
    g = _torch(build_graph(read_run(path)), torch)
    out = ddp_to_fsdp(g)
    hooks = [v for v in np.flatnonzero(out.rank >= 0) if "fsdp hooks" in out.node_name(v)]
    host = FSDP_HOST.get(g.meta.torch_minor)
    if host is None:
        note = host_note(g)
        assert not hooks and "hooks per unit unpriced and each collective's fixed cost per call at the profile's fitted" in note
        assert "not measured for torch 1.9" in note
        return
    stretch = _stretch(g)
    assert (min(stretch.values()) > 1.0) == (path != DDP)  # lora-clip records its thread's waits for a core
    units = {u.name: u for u in out.meta.fsdp.units}
    trained = [u for u in units.values() if u.numel > u.frozen_numel]
    assert len(hooks) == (len(units) + len(trained)) * len(g.meta.steps) * 2  # forward: each unit, backward: each trained; 2 ranks
    for v in hooks:
        unit, phase = out.node_name(v).split("fsdp hooks ")[1].rpartition(" (")[::2]
        fit = host.forward if phase == "forward)" else host.backward
        u = units[unit]
        assert out.dur[v] == pytest.approx(fit.at(u.tensors, u.numel * 4) * stretch[int(out.rank[v])])
    assert "FSDP2's hooks per unit at the CPU time measured for torch 2.13" in host_note(g)
    assert ("not stretched by the job's load" in host_note(g)) == (path == DDP)
    if path != DDP:  # a profile with each layer's saved bytes: its peak as without the hooks (host time, no memory)
        assert fsdp_peak(out) == fsdp_peak(ddp_to_fsdp(_torch(g, "1.9.0")))


def test_each_unit_costs_more_the_more_bytes_it_gathers(ddp):
    """With the growth the calibration's units of MBs measured, each unit's hooks cost the small unit's plus the growth
    times the unit's parameter bytes (the root's embedding and head make it the largest); without it (an older file), as before."""
    grown = dataclasses.replace(COSTS, unit_forward_us_per_byte=2e-4, unit_backward_us_per_byte=5e-4)
    g = ddp_to_fsdp(ddp, costs=grown)
    size = {u.name: u.numel * 4 for u in g.meta.fsdp.units}
    assert len(set(size.values())) > 1
    hooks = [v for v in np.flatnonzero(g.rank >= 0) if "fsdp hooks" in g.node_name(v)]
    for v in hooks:
        unit, phase = g.node_name(v).split("fsdp hooks ")[1].rpartition(" (")[::2]
        want = 321.0 + 2e-4 * size[unit] if phase == "forward)" else 654.0 + 5e-4 * size[unit]
        assert g.dur[v] == pytest.approx(want)
    assert grown.unit_us("forward", 0) == COSTS.unit_us("forward", 1 << 30) == 321.0


def test_link_model_files_old_and_new(ddp, tmp_path):
    v1 = save_link_model(tmp_path / "v1.json", LINK, method="test")
    v2 = save_link_model(tmp_path / "v2.json", LINK, kinds={"all_gather": (LINK, {})}, method="test")
    v3 = save_link_model(tmp_path / "v3.json", LINK, kinds={"all_gather": (LINK, {})}, fsdp=COSTS, fsdp_record={"copy_out_points": [[1, 2.0]]})
    doc = json.loads(open(v3).read())
    assert doc["version"] == 3 and doc["fsdp"]["copy_out_points"] == [[1, 2.0]]
    assert read_link_model(v3).fsdp == COSTS and read_link_model(v3).kinds == read_link_model(v2).kinds
    assert read_link_model(v1).fsdp is None and read_link_model(v2).fsdp is None
    s = Scenario(data_parallel="fsdp")
    for old in (v1, v2):  # priced as before this version: the profile's own rules, on the file's links
        c = Cluster(link_model=str(old))
        g = apply(ddp, s, c, base_topology(ddp, c))
        tensors, nbytes = len({p for b in ddp.meta.buckets for p in b.params}), sum(ddp.meta.layer_grad_bytes.values())
        assert np.allclose(g.dur[g.kind == Kind.UPDATE], ddp.dur[ddp.kind == Kind.UPDATE] * step_ratio(*DTENSOR_STEP["2.13"], tensors, nbytes, 2))
    c = Cluster(link_model=str(v3))
    g = apply(ddp, s, c, base_topology(ddp, c))
    assert _per_rank0(g, lambda v: "fsdp copy-out" in g.node_name(v)) > 0
    assert not np.allclose(g.dur[g.kind == Kind.UPDATE], ddp.dur[ddp.kind == Kind.UPDATE] / 2)
    said = {str(p): evaluate(ddp, [s], Cluster(link_model=str(p)), tolerance_pct=None) for p in (v1, v3)}
    notes = {p: r["notes"] for p, r in said.items()}
    assert [n for n in notes[str(v3)] if n.startswith("--data-parallel fsdp") and "as calibrate --fsdp measured" in n
            and "unpriced: clip_grad_norm_ (not recorded)" in n]
    assert [n for n in notes[str(v1)] if n.startswith("--data-parallel fsdp") and "held 81 of 95" in n]
    detail = {p: r["conversion_detail"]["fsdp"] for p, r in said.items()}  # the full account, every figure
    assert "as dagprof calibrate --fsdp measured" in detail[str(v3)] and "clip_grad_norm_ not recorded in this profile" in detail[str(v3)]
    assert HELD_OUT[Conversion.DDP_TO_FSDP].off in detail[str(v1)] and HELD_OUT[Conversion.DDP_TO_FSDP_MEASURED].off in detail[str(v3)]
    older = tmp_path / "v3-before-growth.json"  # a version-3 file written before the units of MBs were measured: no growth
    older.write_text(json.dumps({**doc, "fsdp": {k: v for k, v in doc["fsdp"].items() if not k.endswith("_per_byte") or k.startswith("copy")}}))
    assert read_link_model(older).fsdp == COSTS and COSTS.unit_forward_us_per_byte == COSTS.unit_backward_us_per_byte == 0.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**doc, "fsdp": {"world": 2}}))
    with pytest.raises(DagprofError, match="bad fsdp entry"):
        read_link_model(bad)


def test_calibrate_measures_fsdp_on_a_live_gloo_group(capsys, tmp_path):
    out = tmp_path / "link.json"
    assert main(["calibrate", "--world", "2", "--max-mb", "0.0625", "--iters", "2", "--kinds", "all_gather", "--fsdp",
                 "-o", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["fsdp"]
    costs = read_link_model(out).fsdp
    assert costs.world == 2 and costs.copy_out_us_per_byte > 0
    for fit in (costs.plain_step, costs.dtensor_step):
        assert fit.us_per_tensor >= 0 and fit.us_per_byte >= 0 and fit.us(8, 1 << 20) > 0
    assert len(r["optimizer_points"]["dtensor"]) == 3 and len(r["copy_out_points"]) == 3
    assert len(r["bucket_in_points"]) == len(r["bucket_out_points"]) == 3
    assert costs.bucket_in_us_per_byte > 0 and costs.bucket_out_us_per_byte > 0
    # a small unit and a unit of MBs, and how much more the larger cost per byte beyond its copy-out (never below 0), in CPU time
    assert [p["unit_bytes"] for p in r["unit_points"]] == [64 * 64 * 4, 724 * 724 * 4]
    assert all(len(p["cpu_us"]) == 2 for p in r["unit_points"])
    assert costs.unit_forward_us_per_byte >= 0 and costs.unit_backward_us_per_byte >= 0
    assert costs.unit_us("backward", 1 << 20) >= costs.unit_backward_us >= 0


def test_a_version_3_file_prices_each_kind_at_its_measured_sizes(tmp_path):
    """Each kind's price is its link's scaled to what the sweep measured at the nearest sizes (interpolated in log
    size, the end's beyond them); the same sweep in a version-2 file prices on the link alone, as before."""
    g = build_graph(read_run(DATA / "fsdp" / "reshard"))
    link = AlphaBeta(100.0, 2e-3)
    equiv = sorted({float(m) for m in allreduce_equivalent_bytes(g, np.array([c.node for c in fsdp_collectives(g) if c.kind.label == "all_gather"]))})
    lo, hi = equiv[0] / 2, equiv[-1] * 2  # whole-tensor bytes of the sweep: twice the all-reduce-equivalent
    points = [[2 * lo, 3.0 * float(ring_allreduce_us(lo, 2, link))], [2 * hi, 1.5 * float(ring_allreduce_us(hi, 2, link))]]
    kinds = {"all_gather": (link, {"points": points})}
    v2 = save_link_model(tmp_path / "v2.json", LINK, kinds=kinds, workers=2, backend="gloo")
    v3 = save_link_model(tmp_path / "v3.json", LINK, kinds=kinds, fsdp=COSTS, workers=2, backend="gloo")
    t2, t3 = (base_topology(g, Cluster(link_model=str(p))) for p in (v2, v3))
    assert t2.kind_scale == () and t3.kind_factor("all_gather", lo) == pytest.approx(3.0) and t3.kind_factor("all_gather", hi * 4) == pytest.approx(1.5)
    assert t3.kind_factor("reduce_scatter", lo) == 1.0
    mid = np.sqrt(lo * hi)  # halfway in log size
    assert t3.kind_factor("all_gather", mid) == pytest.approx(2.25)
    p2, p3 = set_topology(g, t2), set_topology(g, t3)
    for c in fsdp_collectives(g):
        m = float(allreduce_equivalent_bytes(g, np.array([c.node]))[0])
        f = t3.kind_factor(c.kind.label, m)
        assert p3.dur[c.node] == pytest.approx(t3.overhead_us + (p2.dur[c.node] - t2.overhead_us) * f)
        assert (f > 1.5) if c.kind.label == "all_gather" else (f == 1.0)


def test_fsdp_kinds_are_priced_at_each_repetitions_slowest_rank():
    """Where the rank that gets out of an all-gather last alternates (gloo on 2 ranks), each rank's median can miss the
    lag that a job of back-to-back collectives waits for every time; the median of each repetition's slowest rank has it."""
    per = np.array([[60.0, 90.0, 60.0, 90.0], [90.0, 60.0, 90.0, 60.0]])  # ranks x repetitions, us
    assert float(np.median(per, axis=1).max()) == 75.0  # the slowest rank's median: half the lag
    assert slowest_each(per) == 90.0


def test_fsdp_to_ddp_steps_the_optimizer_as_measured():
    """FSDP -> DDP on the recorded FSDP2 job (tests/data/fsdp/reshard: 3 units of 3, 4 and 4 parameter tensors): the
    profiled DTensor step on the shards over the measured ratio of the two steps (DTensor's fixed cost per tensor is
    no DDP cost); without measured costs, the profiled step times the ranks."""
    fsdp = build_graph(read_run(FSDP))
    assert [u.tensors for u in fsdp.meta.fsdp.units] == [3, 4, 4]
    nbytes = sum(u.numel * 4 for u in fsdp.meta.fsdp.units)
    upd = fsdp.dur[fsdp.kind == Kind.UPDATE]
    ratio = COSTS.step_ratio(11, nbytes, 2)
    assert ratio == pytest.approx((500 * 11 + 3e-3 * nbytes / 2) / (10 * 11 + 1e-3 * nbytes))
    measured = fsdp_to_ddp(fsdp, costs=COSTS)
    assert np.allclose(measured.dur[measured.kind == Kind.UPDATE], upd / ratio)
    plain = fsdp_to_ddp(fsdp)
    assert np.allclose(plain.dur[plain.kind == Kind.UPDATE], upd / step_ratio(*DTENSOR_STEP["2.13"], 11, nbytes, 2))  # torch 2.13's
    c = Cluster(optimizer_state="adam")
    as_ddp = apply(fsdp, Scenario(data_parallel="ddp"), c, base_topology(fsdp, c))
    assert np.allclose(as_ddp.dur[as_ddp.kind == Kind.UPDATE], plain.dur[plain.kind == Kind.UPDATE])  # whatif without --link-model



def test_more_workers_step_the_shards_as_measured(tmp_path):
    """--workers 4 on the recorded 2-rank FSDP2 job: with the measured DTensor step (a file from calibrate --fsdp), the
    optimizer takes the step on a quarter of every parameter over the step on a half (DTensor's fixed cost per tensor
    does not shrink with the shards); without measured costs, as torch 2.13's measured DTensor step splits it (hooks only:
    no Kineto ops split the profile's own), not the half the shards' bytes alone gave."""
    fsdp = build_graph(read_run(FSDP))
    nbytes = sum(u.numel * 4 for u in fsdp.meta.fsdp.units)
    upd = fsdp.dur[fsdp.kind == Kind.UPDATE]
    ratio = (500 * 11 + 3e-3 * nbytes / 4) / (500 * 11 + 3e-3 * nbytes / 2)
    assert 0.5 < ratio < 1
    four = scale_fsdp_workers(fsdp, 4, COSTS)
    assert np.allclose(four.dur[four.kind == Kind.UPDATE], np.tile(upd, 2) * ratio)
    plain = scale_fsdp_workers(fsdp, 4)
    bare = step_scale(fsdp, 2, 4, None)
    assert 0.5 < bare < 1 and fsdp.meta.fsdp.step_fit is None
    assert np.allclose(plain.dur[plain.kind == Kind.UPDATE], np.tile(upd, 2) * bare)
    assert np.allclose(scale_fsdp_workers(fsdp, 2, COSTS).dur[fsdp.kind == Kind.UPDATE], upd)  # the profiled degree: as profiled
    v3 = save_link_model(tmp_path / "v3.json", LINK, fsdp=COSTS, workers=2, backend="gloo")
    for path, want in ((v3, ratio), (save_link_model(tmp_path / "v1.json", LINK, method="test"), bare)):
        c = Cluster(link_model=str(path))
        g = apply(fsdp, Scenario(workers=4), c, base_topology(fsdp, c))
        assert np.allclose(g.dur[g.kind == Kind.UPDATE], np.tile(upd, 2) * want)

def test_fsdp_to_ddp_prices_ddps_bucket_passes_as_measured():
    """DDP's scaled copy into each bucket (its enqueue) and its copy back into the gradients write storage allocated
    long before: with rates ``calibrate --fsdp`` measured, at those; from an older file or none, at the FSDP profile's
    copy-out per byte."""
    fsdp = build_graph(read_run(FSDP))
    params = sum(u.numel * 4 for u in fsdp.meta.fsdp.units)

    def passes(g):
        enq = [v for v in np.flatnonzero(g.kind == Kind.COMM_ENQUEUE).tolist() if "allreduce bucket" in g.node_name(v)]
        back = [v for v in range(len(g)) if "ddp copy buckets to grads" in g.node_name(v)]
        return float(g.dur[enq].sum()) / float(g.nbytes[enq].sum()), float(g.dur[back].mean()) / params

    old = passes(fsdp_to_ddp(fsdp, costs=COSTS))
    assert old[0] == pytest.approx(old[1]) and old[0] > 0
    measured = passes(fsdp_to_ddp(fsdp, costs=dataclasses.replace(COSTS, bucket_in_us_per_byte=2e-5, bucket_out_us_per_byte=3e-5)))
    assert measured == pytest.approx((2e-5, 3e-5))
