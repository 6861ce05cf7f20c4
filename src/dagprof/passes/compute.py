"""Compute what-ifs: faster or slower per-rank compute (a new GPU, more cores, contention)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.build_ps import engine_idle, server_lanes
from ..graph.dag import Device, DeviceKind, Graph, GraphBuilder, gaps_apart
from ..graph.replay_result import ReplayResult
from ..traces.events import Kind
from ..units import count
from .comm import exit_lags
from .comm_cpu import (
    XPLANE_FRAMEWORKS,
    core_wait,
    ddp_wake_waits,
    gloo_budget,
    lane_cpu,
    lane_work,
    off_lane_budget,
    profiled_load,
    queue_comm_cpu,
    rank_cpu,
    scale_lanes,
    unrecorded_cpu_ranks,
    unrecorded_wake_ranks,
)
from .ring_pace import THREADS_PER_RANK, ring_pace

COMPUTE_KINDS = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.KERNEL, Kind.OTHER)


def scale_compute(g: Graph, speed: float, kinds: tuple[Kind, ...] = COMPUTE_KINDS) -> Graph:
    """Divide the duration of every per-rank compute node by ``speed`` (2.0 = twice as fast).
    Framework gaps and communication are left as measured."""
    if not speed > 0:
        raise DagprofError(f"compute speed factor must be positive, got {speed}")
    mask = (g.rank >= 0) & np.isin(g.kind, [int(k) for k in kinds])
    dur = g.dur.copy()
    dur[mask] /= speed
    return g.replace(dur=dur)


def share_cores(g: Graph, cores: int, ranks_per_host: int | None = None,
                replayer: Callable[[Graph], ReplayResult] | None = None) -> Graph:
    """What if ranks shared a host's ``cores`` (more ranks than cores, as on a small machine)?

    Every rank's compute lanes on one host are mapped onto one device of capacity ``cores``:
    a rank still runs its lane in order, but at most ``cores`` ranks compute at once (a FIFO
    stand-in for the OS's time sharing). ``ranks_per_host`` None: all ranks on one host.

    A rank's exit lag behind a collective is wire time (``passes.comm``: its last bytes still arrive after
    the first rank out has left), not compute, so it leaves the cores: it becomes a resource-free wait between
    the collective and its consumer, whose overhead on the cores keeps the rest (the wake-up). The lag is the
    consumer's gap less the first rank's wake-up (``wire_in_gaps``): the rank's lag behind the first rank out
    (``comm.exit_lags``), and in an averaged graph the wire its consumer carries (``Graph.exit_lag``: its share as
    measured plus what link changes added). Left in the consumer's gap on the shared device, the
    4-rank FSDP what-if at 200 Mbit/s held a core through about 5 ms of wire per collective and rank while the
    other ranks queued: the core sharing added 14-17 % to the step where the testbed measured 8 %.

    Each collective also holds a core per rank for the CPU the rank spends off its training thread or lanes
    (``passes.comm_cpu.queue_comm_cpu``): torch FSDP on gloo, its gloo threads' priced per byte sent; TF/JAX ranks beyond
    the cores, the process's recorded CPU less its lanes' (whose op times are scaled to their CPU).

    Only a rank's main lane's gaps are the framework's work on the cores (``_idle_off_cores``); its other threads'
    (MXNet's engine workers, TF's thread pools) are those threads waiting for work.

    What a rank holds is not bounded by its process's CPU time per step (``PsRecord.cpu_us``), though under other jobs'
    load it exceeds it (``mx_attn_accum.py``, 14 kept testbed profiles at load 1.8-9.9: by a median -5..+68 ms a step):
    the time an op spent descheduled is the host's load, which the measured jobs met too. Tried (scaled down to the
    CPU time), ``--cores 2`` on 4 workers moved away from the measured step in 12 of those 14 rounds (from -48..+38 %
    to -68..-18 %), and a loaded profile's own configuration, which the queue leaves alone, came out up to 74 % fast.

    DDP ranks on gloo beyond the cores: each collective also waits its rings' extra wake-ups (``comm_cpu.ddp_wake_waits``).

    JAX ranks beyond the cores, with a ``replayer`` (``dagprof.replay.replay``; passes sit below the replay layer): gloo's
    thread also waits for a core inside each transfer, a wake-up a ring step, at the load the N ranks put on the cores
    (``_stretched``).
    """
    if cores < 1:
        raise DagprofError(f"cores must be >= 1, got {cores}")
    ranks = int(g.world_size)
    per = ranks if ranks_per_host is None else ranks_per_host
    if per < 1:
        raise DagprofError(f"ranks per host must be >= 1, got {per}")
    devices = list(g.devices)
    shared: dict[int, int] = {}
    remap = np.arange(len(devices))
    for i, d in enumerate(g.devices):
        if d.rank >= 0 and d.kind in (DeviceKind.COMPUTE, DeviceKind.HOST):
            host = d.rank // per
            if host not in shared:
                shared[host] = len(devices)
                devices.append(Device(f"host{host}/cpu ({cores} cores)", DeviceKind.COMPUTE, -1, cores))
            remap[i] = shared[host]
    host_device = np.array([shared.get(r // per, -1) for r in range(ranks)], np.int64)
    main = set(g.meta.main_device.values())
    others = [i for i, d in enumerate(g.devices) if d.rank in g.meta.main_device and i not in main and remap[i] != i]
    idle = np.isin(g.device, others) & (g.gap > 0)
    device = np.where(g.device >= 0, remap[np.maximum(g.device, 0)], -1)
    waits = np.flatnonzero(engine_idle(g))  # MXNet's main engine gaps waiting off the thread still hold a core
    device[waits] = host_device[g.rank[waits]]
    on_cores = np.array(list(shared.values()), np.int64)
    priced = lane_cpu(g, per, cores)
    moved = _idle_off_cores(_lags_off_cores(g.replace(device=device, devices=devices), on_cores), idle)
    if priced is not None:  # TF/JAX: each rank's lanes at their CPU, its recorded CPU off them beside its collectives
        scaled = scale_lanes(moved, g, priced)

        pace = ring_pace(g, per, cores)

        def queued(wait_per_cpu: float) -> Graph:
            return queue_comm_cpu(g, off_lane_budget(g, priced, remap, wait_per_cpu, pace), host_device, onto=scaled)
        held = profiled_load(g, cores) if g.meta.framework == "jax" and replayer is not None else None
        return queued(0.0) if held is None else _stretched(queued, replayer, on_cores, cores, core_wait(held, cores))
    if not (host_device >= 0).all():
        return moved
    if per > cores:  # torch DDP on gloo beyond the cores: its rings' extra wake-ups wait for a core
        moved = ddp_wake_waits(moved)
    return queue_comm_cpu(moved, gloo_budget(moved, per > cores), host_device)  # torch FSDP on gloo: per byte


FIXED_POINT_STEPS = 8  # bisections of the load: within 1/256 of the first replay's


def _stretched(queued: Callable[[float], Graph], replayer: Callable[[Graph], ReplayResult], on_cores: np.ndarray, cores: int,
               held: float) -> Graph:
    """``queued`` (wait per CPU -> the graph on the cores) at the load of its own replayed step: a fixed point. The waits
    lengthen the step, which lowers the load they come from, so the load is bisected between 0 and the unstretched
    replay's. The profiled job's collectives already hold its waits at its load (``held``, per CPU), so each is stretched
    by the rest. The load from the 2-worker profile's step (its idle time plus the N ranks' CPU) read 0.8-0.95 where the
    measured 4-worker jobs' was 0.62-0.68 (the wire and the waits for slower ranks grow too; jaxstretch59, 2026-12-06)."""
    def load(wait_per_cpu: float) -> float:
        out = queued(wait_per_cpu)
        return replayed_load(out, replayer(out), on_cores)

    lo, hi = 0.0, load(0.0)
    for _ in range(FIXED_POINT_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if load(max(core_wait(mid, cores) - held, 0.0)) > mid else (lo, mid)
    return queued(max(core_wait((lo + hi) / 2, cores) - held, 0.0))


def replayed_load(g: Graph, res: ReplayResult, on_cores: np.ndarray) -> float:
    """The shared cores' busy share between the first and last step marks of a replay of ``g`` (0 without two marks)."""
    marks = np.flatnonzero(g.kind == Kind.STEP)
    if len(marks) < 2:
        return 0.0
    lo, hi = float(res.start[marks].min()), float(res.start[marks].max())
    busy = np.isin(g.device, on_cores) & (res.start >= lo) & (res.start < hi)
    cap = sum(g.devices[int(d)].capacity for d in on_cores)
    return float(g.dur[busy].sum()) / (cap * (hi - lo)) if hi > lo else 0.0


def wire_in_gaps(g: Graph, pairs: np.ndarray) -> np.ndarray:
    """Per (collective, consumer) pair (``comm.exit_lags``), the time in the consumer's gap that is not its rank's
    wake-up: the gap less the first rank's wake-up, the least over the collective's consumers of a gap less the wire it
    carries (``Graph.exit_lag``). Without carried lags, the rank's exit lag behind the first rank out."""
    gap = g.gap[pairs[:, 1]]
    colls, of = np.unique(pairs[:, 0], return_inverse=True)
    wake = np.full(len(colls), np.inf)
    np.minimum.at(wake, of, np.maximum(gap - g.exit_lag[pairs[:, 1]], 0.0))
    return gap - wake[of]


def _idle_off_cores(g: Graph, idle: np.ndarray) -> Graph:
    """The gap of each ``idle`` node (one on a rank's thread other than its main lane) moved into a resource-free wait
    before it: such a thread's gap is the thread waiting for work, not work. On ``mx_attn_accum.py``'s 6 kept testbed
    profiles a worker's main engine lane (its ops and gaps) and its second engine thread's ops summed to its process's
    CPU time per step within 0.7 ms (17.8-24.8 against 18.4-24.4 ms), while that thread's gaps, 6-10 ms a step, held
    one of the 2 shared cores in the queue with nothing to run (``--cores 2`` on 4 workers +15 % over the testbed)."""
    return gaps_apart(g, np.flatnonzero(idle), "thread idle")


def _lags_off_cores(g: Graph, shared: np.ndarray) -> Graph:
    """Each exit lag of a consumer on a ``shared`` device moved into a resource-free wait before it."""
    pairs, _ = exit_lags(g, np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)))
    lag = wire_in_gaps(g, pairs)
    moved = (lag > 0) & np.isin(g.device[pairs[:, 1]], shared)
    if not moved.any():
        return g
    comm, cons, lag = pairs[moved, 0], pairs[moved, 1], lag[moved]
    most = np.zeros(len(g))
    np.maximum.at(most, cons, lag)  # a consumer of two collectives waits on the later one's
    b, _ = GraphBuilder.from_graph(g.replace(gap=g.gap - most))
    wait = b.add_nodes(name=np.array([b.intern(f"{g.node_name(int(v))} (exit lag)") for v in cons], np.int32),
                       kind=g.kind[cons], rank=g.rank[cons], device=np.full(len(cons), -1), gap=lag,
                       order=g.order[cons], step=g.step[cons], layer=g.layer[cons])
    b.add_edges(comm, wait)
    b.add_edges(wait, cons)
    return b.build()


def server_cores_note(g: Graph, servers: int) -> str | None:
    """A ``ps:K`` answer whose servers share the profiled host's cores with its workers, more processes than cores
    (``graph.build_ps.server_lanes``, the rule it is priced by): said in one line, since the servers' work is then priced
    on the profile's servers' CPUs, no faster than profiled (the server's busy time is wall time, its waits for a core in
    it), and only their ports split."""
    ps = g.meta.ps
    if ps is None or server_lanes(g.meta, servers) == servers:
        return None
    host, group = next(iter(g.meta.host_cpus.items()))
    busy = sum(b.busy_us for b in ps.server_busy) / max(len({b.step for b in ps.server_busy}), 1) / max(ps.num_servers, 1)
    step = float(np.mean(list(g.meta.measured_iter_us.values())))
    return (f"ps:{servers}: {group.ranks} workers were profiled on the {group.cores} cores of one host ({host}), fewer than they and "
            f"{servers} servers, so the servers' work is priced on the CPU{'s' if ps.num_servers > 1 else ''} of the profile's "
            f"{count(ps.num_servers, 'server')}, no faster "
            f"than profiled (a profiled server was busy {busy / 1e3:.1f} ms of each {step / 1e3:.1f} ms step, wall time, its waits "
            "for a core in it): a split onto more processes adds no cores; only the servers' ports split")


def own_cores_note(g: Graph, workers: int, step_us: float | None = None) -> str | None:
    """A parameter-server ``--workers`` answer keeps each worker's compute as profiled: it assumes every worker keeps its
    own cores. Said in one line with what the profile measured of the cores, so a user can judge whether more workers on
    the profiled host would crowd them (``share_cores`` queues them FIFO when asked with ``--cores``). Against the
    answer's own step (``step_us``, the shortest predicted for ``workers``) it says how much of the cores their CPU per
    step would need, and where more than all, that the cores are oversubscribed and the step they bound: ``mx_attn_accum.py``'s
    4 workers on the testbed's 2 cores, predicted 34 ms a step with cores of their own, ran 55 ms (``--cores 2``: 56 ms)."""
    ps, n0 = g.meta.ps, int(g.world_size)
    if ps is None or workers <= n0:
        return None
    head = f"--workers {workers}: the prediction assumes each worker keeps its own cores (its compute as profiled)"
    if len(g.meta.host_cpus) != 1:
        return f"{head}; the run did not record its workers' cores (profile again to have them said)"
    host, group = next(iter(g.meta.host_cpus.items()))
    ranks, cores = group.ranks, group.cores
    if workers <= cores:
        return None
    step = float(np.mean(list(g.meta.measured_iter_us.values())))
    busy = sum(b.busy_us for b in ps.server_busy) / max(len({b.step for b in ps.server_busy}), 1)
    cpu = float(np.median([c for _, _, c in ps.cpu_us])) if ps.cpu_us else 0.0
    used = (f"a worker's process used {cpu / 1e3:.0f} ms of CPU per {step / 1e3:.0f} ms step when profiled ({workers} of them: "
            f"{workers * cpu / step / cores:.0%} of the {cores} cores at that step)" if cpu else "the run did not record its workers' CPU time")
    over = ""
    if cpu and step_us:
        over = f"; at the {step_us / 1e3:.1f} ms step predicted for {workers} workers they would need {workers * cpu / step_us / cores:.0%} of the cores"
        if workers * cpu > cores * step_us:
            over += f": on {host} the cores are oversubscribed and bound the step (at least {workers * cpu / cores / 1e3:.0f} ms)"
    return (f"{head}: {ranks} workers were profiled on the {cores} cores of one host ({host}), where {workers} would share them; {used}, the servers "
            f"busy {busy / 1e3:.1f} ms per step{over}; --cores {cores} queues their compute on the cores instead (FIFO, the copies "
            "computing in lockstep)")


def process_cpu_note(g: Graph, workers: int, step_us: float | None, cores: int | None) -> str | None:
    """A TF/JAX ``--workers`` answer for more ranks than the profiled host's cores, said in one line where it is not priced
    for ranks that share the cores. ``--cores`` prices it where the run recorded each rank's process CPU (``share_cores``:
    the lanes' op times scaled to the lanes' threads' CPU where recorded by thread name, else by the rank's CPU over wall,
    the threads off the lanes queued beside the collectives; 4 TF workers on the testbed's 2 cores,
    ``bench/bench_workers_testbed.py --hosts``, 2026-12-06: -23..-20 % -> -4..-0 % for ``tf_mlp_fit.py``, +12..+29 % ->
    -2..+9 % for ``tf_siamese_loop.py`` against the unprofiled 4-worker step, both priced by the stand-in); without
    ``--cores`` each rank keeps cores of its own, said with the rank's CPU and the share of the cores N ranks need at the
    predicted step ``step_us``. A run that did not record the CPU (before 2026-12-06) is said not priced either way:
    ``--cores`` then queues only the lanes' ops at their profiled times, and the collective executor's, gRPC's and the
    runtime's threads stay off the cores (``tf_mlp_fit.py``: 13-16 ms of its ranks' 17-22 ms of CPU a step)."""
    loop, n0 = g.meta.loop_steps, int(g.world_size)
    if g.meta.framework not in XPLANE_FRAMEWORKS or loop is None or workers <= n0 or len(g.meta.host_cpus) != 1:
        return None
    host, group = next(iter(g.meta.host_cpus.items()))
    if workers <= group.cores:
        return None
    cpu = rank_cpu(g)
    if cpu is None:
        how = (f"--cores {cores} queues only the ops on the lanes, at their profiled times, and leaves the collective executor's, "
               "gRPC's and the runtime's threads off the cores" if cores else "each rank is priced on cores of its own")
        return (f"--workers {workers} on the {group.cores} cores of one host ({host}) is not priced for ranks that share them: the run did not record "
                f"its ranks' process CPU a step (profile again with this dagprof to have --cores price it); {how}")
    if cores:
        return None
    most = max(c.process_us for c in cpu.values())
    work = lane_work(g)
    lane_us = float(g.dur[work].sum()) / n0 / max(len(g.meta.steps), 1)
    need = (f", {workers} of them {workers * most / step_us / group.cores:.0%} of the {group.cores} cores at the {step_us / 1e3:.1f} ms "
            "step predicted" if step_us else "")
    return (f"--workers {workers}: each rank is priced on cores of its own, where on the {group.cores} cores of their host ({host}) they would share them: "
            f"each {g.meta.framework} rank's process used {most / 1e3:.1f} ms of CPU a step when profiled, its lanes {lane_us / 1e3:.1f} ms "
            f"of op time{need}; --cores {group.cores} queues each rank's CPU on them (the step at least "
            f"{workers * most / group.cores / 1e3:.0f} ms where the cores bound it)")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def gloo_cpu_note(g: Graph, cores: int | None) -> str | None:
    """A ``--cores`` answer for a PyTorch job on gloo prices gloo's threads from every rank's recorded process CPU: FSDP's
    CPU queued on the cores (``gloo_budget``), and both FSDP's and DDP's wake-ups beyond the cores (``GlooWake``,
    ``ddp_wake_waits``). Where a rank's profiled steps recorded no process CPU (a file from before 2026-12-06, or a rank
    file edited or cut), nothing is priced and the cores queue the ranks' ops only: said in one line naming the ranks.
    Where the CPU is priced but a rank's steps did not record its other threads' runs (files before 2026-12-06 10:00 UTC),
    the wake-ups are not: said too, with what leaving them out missed on this machine's rounds."""
    if not cores:
        return None
    fsdp = is_fsdp_graph(g)
    what = "FSDP" if fsdp else g.meta.ddp_label  # the job as its outputs name it; the figures below were measured on DDP
    missed = "8.6-12.0 % short in change (5 of 6 kept rounds)" if fsdp else "6.6 % off in change (median of 14 held-out cells; 2.2 % with them)"
    missing = unrecorded_cpu_ranks(g)
    if not missing:
        unwoken = unrecorded_wake_ranks(g)
        return None if not unwoken else (
            f"--cores {cores}: gloo's wake-ups are not priced beyond the cores: {_ranks(unwoken)} of "
            f"{count(int(g.world_size), 'rank')} recorded no other threads' runs in the profiled steps (profile again with this "
            f"dagprof to have them priced); without them 4 {what} ranks on 2 cores were predicted {missed}")
    unpriced = "gloo's threads' CPU is not queued on the cores" if fsdp else "gloo's wake-ups are not priced beyond the cores"
    return (f"--cores {cores}: {unpriced}: {_ranks(missing)} of {count(int(g.world_size), 'rank')} "
            "recorded no process CPU in the profiled steps, so the collectives' CPU off the training thread has no price "
            "(profile again with this dagprof to have it priced); the cores queue the ranks' ops only, which predicted 4 "
            + ("FSDP ranks on 2 cores 7-14 % short in change" if fsdp else f"{what} ranks on 2 cores {missed}"))


def ring_pace_note(g: Graph, workers: int, cores: int | None, ranks_per_host: int | None = None) -> str | None:
    """A JAX ``--workers N --cores C`` answer whose ranks on a host outnumber its cores, said in one line: ``share_cores``
    prices each gloo call's ring steps at least at the scheduler's pace (``passes.ring_pace``), and the other processes'
    load the profile recorded. None where that is not priced (no --cores, no process CPU recorded, or ``ring_pace``'s rule:
    the ranks within the cores, not JAX on gloo with its arrays read)."""
    pace = ring_pace(g, ranks_per_host or workers, cores) if cores and rank_cpu(g) is not None else None
    if pace is None:
        return None
    calls, steps = float(g.meta.collective_operands_per_step or 0.0), 2 * (workers - 1)
    tick = f"the {pace.tick_us / 1e3:.3g} ms tick" + (" of the profiled host's kernel" if pace.tick_recorded else
                                                      " assumed (the profile did not record the host's)")
    shared = count(cores, 'core')
    return (f"--workers {workers} --cores {cores}: {pace.ranks} JAX ranks ({THREADS_PER_RANK} gloo threads each) outnumber the {shared}, "
            f"so each gloo call's ring step is priced at least {pace.step_us / 1e3:.2f} ms, the scheduler's pace (half the tick over {shared}, from "
            f"{tick}; bench/ring_probe.py measures it), whatever its bytes: {calls:.0f} calls a step x {steps} ring steps an all-reduce, "
            f"at least {calls * steps * pace.step_us / 1e3:.0f} ms of collectives a step (a profile with its ranks within the cores "
            "holds none of it: its ring ran at its own pace)" + _other_load(g))


def _other_load(g: Graph) -> str:
    """The other processes' CPU the profiled hosts recorded beside the job (``GraphMeta.host_other_cores``), said, not priced
    (``passes.ring_pace``: priced on the cores it leaves, it moved 4 of 5 cells away)."""
    other = max(g.meta.host_other_cores.values(), default=None)
    return "" if other is None else (f"; other processes took {other:.2f} of a core beside the profiled window, which the "
                                     "pace does not price (a loaded host's rings ran slower than it)")
