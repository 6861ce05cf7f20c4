"""JAX's lanes priced from their threads' own CPU (``passes.comm_cpu.lane_threads``): XLA's PjRt client pool names its
threads ``tf_XLAPjRtCpuClient``, longer than the kernel keeps, so they bear the process's name (``python``) beside gloo's
and gRPC's; the collector keeps each such thread apart (``python#TID``) and the reader joins a client lane to the one
whose CPU a step follows the lane's op time. Recording: ``tf-jax/shardmap-threads`` (fixed)."""
from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest

from dagprof.graph.meta import WARMUP_STEPS
from dagprof.passes.comm_cpu import MAX_LOAD, core_wait, keep_comm_cpu, lane_cpu, lane_threads, off_lane_budget, profiled_load, rank_cpu, spin_share
from dagprof.passes.compute import replayed_load, share_cores
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind
from dagprof.traces.meta import OtherThreads, is_unnamed_thread

RUN = "tests/data/tf-jax/shardmap-threads"


@pytest.fixture(scope="module")
def graph():
    return open_run(RUN).graph


def _unprofiled(g, r):
    loop = g.meta.loop_steps
    return [x for s, x in loop.sched[r].items() if s >= WARMUP_STEPS and s not in loop.profiled[r]]


def test_each_client_lane_is_joined_to_one_unnamed_thread_and_the_busiest_is_not_it(graph):
    """Every rank's client lane has a ``python#TID`` thread for it; gloo's (the unnamed thread with the most CPU, which
    follows no lane) is not it."""
    for r in (0, 1):
        names = lane_threads(graph, r)
        joined = {n for n in names if is_unnamed_thread(n)}
        assert "tf_XLAEigen" in names and len(joined) == 1 and not any(n.startswith("tf_XLAPjRtCpu") for n in names)
        cpu = {}
        for x in _unprofiled(graph, r):
            for n, c in x.named.items():
                if is_unnamed_thread(n):
                    cpu[n] = cpu.get(n, 0.0) + c.cpu_us
        assert max(cpu, key=cpu.get) not in joined


def test_the_lanes_are_priced_at_the_training_eigen_and_client_threads_cpu(graph):
    """Each rank's lanes' CPU is the median over its unprofiled steps of the training thread's, the Eigen pool's and the
    joined client thread's (no stand-in), under the process's CPU; the rest (gloo's) is priced through the transfers,
    nothing a step."""
    cpu = rank_cpu(graph)
    for r in (0, 1):
        names = lane_threads(graph, r)
        want = np.median([x.cpu_us + sum(c.cpu_us for n, c in x.named.items() if n in names) for x in _unprofiled(graph, r)])
        assert cpu[r].lanes_us == pytest.approx(want) and 0 < cpu[r].lanes_us < cpu[r].process_us
    priced = lane_cpu(graph, 4, 2)
    assert priced is not None and all(p.off_lane_us == 0.0 and p.in_flight > 0 for p in priced.values())
    tf = graph.replace(meta=graph.meta.replace(framework="tensorflow"))  # TF's executor and gRPC threads: a step's CPU
    assert all(p.off_lane_us == pytest.approx(cpu[r % 2].process_us - cpu[r % 2].lanes_us) and p.in_flight == 0.0
               for r, p in lane_cpu(tf, 4, 2).items())


def _merged(g):
    """``g`` as the collector recorded it before (every thread bearing the process's name summed under that name)."""
    loop = g.meta.loop_steps
    sched = {}
    for r, steps in loop.sched.items():
        sched[r] = {}
        for s, x in steps.items():
            by: dict[str, OtherThreads] = {}
            for n, c in x.named.items():
                key = n.split("#")[0]  # the file's form, traces.meta.unnamed_thread_key
                was = by.get(key, OtherThreads(0.0, 0.0, 0))
                by[key] = OtherThreads(was.cpu_us + c.cpu_us, was.wait_us + c.wait_us, was.runs + c.runs)
            sched[r][s] = msgspec.structs.replace(x, named=by)
    return g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(loop, sched=sched)))


def test_the_threads_summed_under_one_name_keep_the_stand_in(graph):
    """Recorded as before (the unnamed threads summed), no thread bears the client lane's name: the stand-in prices it."""
    before = _merged(graph)
    assert all(not is_unnamed_thread(n) for r in (0, 1) for n in lane_threads(before, r))
    assert all(c.lanes_us is None for c in rank_cpu(before).values())


def test_a_thread_that_does_not_follow_the_lane_is_not_joined(graph):
    """The joined threads' CPU shuffled over the profiled steps (the same sum, no longer with the lane's ops): joined to
    no lane, so the rank keeps the stand-in."""
    loop = graph.meta.loop_steps
    sched = {}
    for r, steps in loop.sched.items():
        joined = next(n for n in lane_threads(graph, r) if is_unnamed_thread(n))
        prof = sorted(loop.profiled[r])
        vals = [steps[s].named.get(joined, OtherThreads(0.0, 0.0, 0)) for s in prof]
        order = np.argsort([v.cpu_us for v in vals])  # the lane's busiest step gets the thread's idlest, and so on
        lane = _lane_ops(graph, r, prof)
        ranked = np.argsort(-lane)
        moved = {prof[int(ranked[k])]: vals[int(order[k])] for k in range(len(prof))}
        sched[r] = {s: (msgspec.structs.replace(x, named={**x.named, joined: moved[s]}) if s in moved else x) for s, x in steps.items()}
    g = graph.replace(meta=graph.meta.replace(loop_steps=dataclasses.replace(loop, sched=sched)))
    assert all(not is_unnamed_thread(n) for r in (0, 1) for n in lane_threads(g, r))
    assert all(c.lanes_us is None for c in rank_cpu(g).values())


def _lane_ops(g, r, prof):
    """The client lane's op time per profiled step of rank ``r``."""
    dev = next(i for i, d in enumerate(g.devices) if d.name.startswith(f"rank{r}/tf_XLAPjRtCpuClient"))
    return np.array([g.dur[(g.device == dev) & (g.step == s)].sum() for s in prof])


def test_gloo_cpu_is_its_runnable_share_of_the_in_flight_time_at_the_ranks_share_of_the_cores(graph):
    """JAX's off-lane CPU is gloo's polling thread's, runnable through a share of each collective's in-flight time: per
    profiled rank, its off-lane CPU and waits for a core over the profiled steps' collectives' issue to done. Copied to 4
    workers on 2 cores (kept before the copy, as ``apply`` does) each rank holds a core for 2/4 of it, priced through each
    collective's transfer (once per rank however many of its ops issue it), nothing a step; the lanes' scale as recorded."""
    loop = graph.meta.loop_steps
    comm = np.flatnonzero((graph.kind == Kind.COMM) & (graph.rank < 0))
    flight = sum(float(graph.dur[comm][graph.step[comm] == s].sum()) for s in graph.meta.steps)
    share = spin_share(graph)
    for r in (0, 1):
        lanes, run = lane_threads(graph, r), 0.0
        for s in graph.meta.steps:
            x = loop.sched[r][s]
            run += (x.process_cpu_us - x.cpu_us - sum(c.cpu_us for n, c in x.named.items() if n in lanes)
                    + sum(c.wait_us for n, c in x.named.items() if n not in lanes))
        assert share[r] == pytest.approx(run / flight) and 0.0 < share[r] < 2.0
    kept = keep_comm_cpu(graph)
    four = scale_workers(kept, 4)
    assert four.meta.spin_share == share and spin_share(scale_workers(graph, 4)) is None  # read on the profile's own ranks
    own, priced = lane_cpu(kept, 4, 2), lane_cpu(four, 4, 2)
    assert sorted(priced) == [0, 1, 2, 3]
    for r, p in priced.items():
        assert p.off_lane_us == 0.0 and p.in_flight == pytest.approx(share[r % 2] * 2 / 4)
        assert p.on_core == pytest.approx(own[r % 2].on_core, rel=1e-6)
    moved = np.arange(len(four.devices)) + len(four.devices)  # every lane moved to the cores
    budget = off_lane_budget(four, priced, moved)
    for c in np.unique(budget.comm).tolist():
        for r in range(4):
            rows = (budget.comm == c) & (four.rank[budget.anchor] == r)
            assert budget.cpu_us[rows].sum() == pytest.approx(priced[r].in_flight * float(four.dur[c]))


def test_core_wait_is_erlang_c_per_unit_of_cpu():
    """M/M/c's mean wait over the service time: rho/(1-rho) on one core, rho^2/(1-rho^2) on two; none idle; capped."""
    for rho in (0.1, 0.5, 0.8):
        assert core_wait(rho, 1) == pytest.approx(rho / (1 - rho))
        assert core_wait(rho, 2) == pytest.approx(rho * rho / (1 - rho * rho))
    assert core_wait(0.0, 2) == 0.0 and core_wait(3.0, 2) == core_wait(MAX_LOAD, 2)


def test_four_workers_on_two_cores_stretch_their_collectives_at_the_load_of_their_own_replayed_step(graph):
    """``--workers 4 --cores 2``: each collective's consumers wait for gloo's thread's waits for a core, its rows' CPU times
    Erlang C at the load the 4 ranks' replayed step puts on the cores (a fixed point), less what the 2-worker profile
    already held at its own load; the waits lengthen the step, so the load is below the unstretched replay's."""
    four = scale_workers(keep_comm_cpu(graph), 4)
    plain, stretched = share_cores(four, 2), share_cores(four, 2, replayer=replay)
    names = [stretched.node_name(i) for i in range(len(stretched))]
    waits = {n.removesuffix(" (off-lane cpu waits for a core)"): i for i, n in enumerate(names) if n.endswith("waits for a core)")}
    assert waits and len(stretched) == len(plain) + len(waits)
    cpu: dict[str, float] = {}
    for i, n in enumerate(names):
        if ".off-lane cpu " in n:
            c = n.split(".off-lane cpu ", 1)[1]
            cpu[c] = max(cpu.get(c, 0.0), float(stretched.dur[i]))
    ratio = {round(float(stretched.gap[i]) / cpu[c], 9) for c, i in waits.items()}
    assert len(ratio) == 1
    cores = np.array([i for i, d in enumerate(stretched.devices) if d.name.startswith("host")])
    load = replayed_load(stretched, replay(stretched), cores)
    held = core_wait(profiled_load(graph, 2), 2)
    assert 0.0 < held < ratio.pop() == pytest.approx(core_wait(load, 2) - held, abs=0.03)
    assert load < replayed_load(plain, replay(plain), cores)
