"""The CPU a rank spends off its training thread (or its thread pools' lanes) on its host's cores, queued per collective
for ``--cores`` (``passes.compute.share_cores``). One mechanism, ``queue_comm_cpu``: per (shared collective, rank) a node
of the rank's CPU on the rank's shared cores, from a ``CpuBudget`` that each framework measures its own way and a
``Placement`` that says where the node waits. Without it the shared cores queue only the ranks' ops, and more ranks than
cores come out short: those threads wait for a core too.

torch on gloo (``gloo_budget``, FSDP only): gloo's threads (the ring's sends, receives and reductions, with the kernel's
network stack that runs in them), priced per byte the rank sends. dagprof's collector records per step the training
thread's CPU and its process's (``traces.meta.StepSched``); the rest is the process's other threads. On the tiedlm FSDP2
job (``bench/bench_fsdp.py --part 12``, hooks only, 1 Gbit/s testbed) they took 11-22 ms a step per rank on 2 ranks (8
kept profiles) and 17-26 ms on 4 (2 profiles): about the ring's bytes sent per rank, (N-1)/N of each gathered or reduced
tensor, 1.5x from 2 to 4 ranks (this prices 19.4 ms on 4 where a sampled 4-rank job's threads took 17.1). Queuing only
the ranks' compute, 4 ranks on 2 cores were predicted 7-14 % short in change (kept rounds). A sampled hold (``/proc``
every 0.25 s, 2026-12-06): on 4 ranks each rank's gloo threads waited 59 ms a step for a core (20 on 2 ranks), its
training thread 69 (12), while the 2 cores sat idle 37 % of the step (softirq 2 %, ksoftirqd and other processes 1 %,
steal 0): no foreign CPU, the ranks' own threads waking together after each collective; the FIFO queue gives these
nodes 11 of those 59 ms a step. Those waits are wake-ups: a rank's gloo threads got a core 311-316 times a step on 2
ranks, 885-918 on 4 (11-12 a ring step: the ring's steps 27 -> 81 a step), each waiting 0.065-0.070 ms on 2 and 4 ranks
alike (``bench/fsdp_fresh/core_use.py``). The collector records them per step (``traces.meta.OtherThreads``): on more
ranks than cores each extra ring step's wake-ups, each waiting the profile's wait a wake-up, lengthen the collective
(``GlooWake``, ``CpuBudget.wait_us``).

TF/JAX (``off_lane_budget``): each rank's recorded process CPU a step less its lanes' CPU (``lane_cpu``): the collective
executor's, gRPC's and the runtime's threads, a per-step amount (not per byte) shared over the rank's collectives of the
step by bytes. The lanes' CPU is their threads' own where the collector recorded it by thread name (the training thread
and the pools whose threads carry the lanes, ``tf_Compute``; JAX's client lanes, whose threads bear the process's name, by
the thread whose CPU a step follows the lane's op time: ``lane_threads``), else a stand-in: the lanes' op time scaled by the
training thread's CPU over its runnable time. JAX's off-lane CPU is gloo's polling thread's, runnable through a share of
each collective's in-flight time and on a core for its rank's share of the cores (``spin_share``): priced per collective
from its transfer, not per ring step (that carried the VAE's 2-worker CPU x3 where the 4 workers spent x1.4,
``bench/jax_workers_categories.py --per-call``). Its waits for a core inside the transfer (a wake-up a ring step) are
priced at the load of the N ranks' own replayed step (``core_wait``, ``passes.compute.share_cores``).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..graph.build_fsdp import allreduce_equivalent_bytes, is_fsdp_graph, issuers
from ..graph.dag import DeviceKind, Graph, GraphBuilder
from ..graph.meta import WARMUP_STEPS, CommCpu, GlooWake, LoopSteps
from ..traces.comm_kind import CommKind
from ..traces.events import Kind
from ..traces.meta import THREAD_NAME_CHARS, OtherThreads, StepSched, is_unnamed_thread, runnable_stretch
from .ring_pace import RingPace, paced_us

XPLANE_FRAMEWORKS = ("tensorflow", "jax")  # their ranks run ops on thread pools' lanes, collectives on threads off them


class Placement(Enum):
    """Where a collective's CPU node waits; the two differ on purpose (each is what its framework's threads do).

    JOIN (torch FSDP on gloo): from the collective's join (every rank's enqueue), and the rest of the transfer (less the most
    of its ranks' CPU, which it held as profiled) waits for every rank's node: the ring moves no faster than its ranks'
    gloo threads get a core (``gloo_budget`` caps it at the transfer where the ranks fit the cores); queued just after the
    rank's enqueue in program order. FSDP's calls block the training thread, small and many (tiedlm: 20 a step, 1.4 ms at
    4 ranks); a DDP bucket's all-reduce moves its CPU beside the wire (the DDP testbed's kept 4-rank 25 MB cells, 1 Gbit/s,
    went +0.0 -> +5.8 and +5.3 -> +10.4 % with it), so DDP has no budget.

    ISSUE (TF/JAX): after the rank's issue of the collective and before the rank's consumers of it, beside its wire: on
    free cores it runs within the transfer, on busy ones the consumers wait for a core. These threads are not the ring's
    steps (gRPC, the runtime), so the transfer does not wait for them."""

    JOIN = "join"
    ISSUE = "issue"


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """A framework's CPU off its ranks' training threads, one row per (shared collective, rank), and where it waits."""

    placement: Placement
    label: str  # the nodes' names: ``rank{r}.{label} {collective}``
    kind: Kind  # the nodes' (``passes.overlap`` slows compute kinds beside collectives; the shared-cores bounds read it)
    comm: np.ndarray  # each row's collective
    anchor: np.ndarray  # each row's op of its rank: JOIN its first op waiting for the collective, ISSUE its issue of it
    cpu_us: np.ndarray  # each row's CPU
    # each row's waits for a core off the cores, in the collective's transfer: JOIN its wake-ups, in series after its CPU
    # before the rest of the transfer; ISSUE its threads' waits at the host's load (``core_wait``), the most of a
    # collective's rows between it and its consumers (the ring moves at its slowest thread)
    wait_us: np.ndarray | None = None


def queue_comm_cpu(g: Graph, budget: CpuBudget | None, host_device: np.ndarray, onto: Graph | None = None) -> Graph:
    """``onto`` (default ``g``; ``g``'s nodes keep their ids in it) with a node per ``budget`` row on its rank's shared
    cores (``host_device``: rank -> device), placed as ``budget.placement`` says on ``g``'s edges. Unchanged without a
    budget."""
    out = g if onto is None else onto
    if budget is None or not len(budget.comm):
        return out
    comm, at = budget.comm, budget.anchor
    rank = g.rank[at]
    join = budget.placement is Placement.JOIN
    b, _ = GraphBuilder.from_graph(out)
    name = np.array([b.intern(f"rank{int(r)}.{budget.label} {g.node_name(int(c))}") for r, c in zip(rank.tolist(), comm.tolist())], np.int32)
    cpu = b.add_nodes(name=name, kind=np.full(len(comm), int(budget.kind)), rank=rank, device=host_device[rank], dur=budget.cpu_us,
                      order=_issued(g, comm, at) if join else g.order[at], step=g.step[at], layer=g.layer[at])
    if join:
        _join(b, g, comm, cpu, budget.cpu_us, budget.label, budget.wait_us, rank)
    else:
        b.add_edges(at, cpu)
        mine = [[int(v) for v in g.succ[g.indptr[c]:g.indptr[c + 1]] if g.rank[v] == g.rank[p]] for c, p in zip(comm.tolist(), at.tolist())]
        b.add_edges(np.repeat(cpu, [len(v) for v in mine]), np.array([v for x in mine for v in x], np.int64))
        if budget.wait_us is not None:
            _stretch(b, g, comm, budget.wait_us, budget.label)
    return b.build()


def _stretch(b: GraphBuilder, g: Graph, comm: np.ndarray, wait_us: np.ndarray, label: str) -> None:
    """``Placement.ISSUE``'s waits: a resource-free node per collective, its rows' most, after the collective and before
    every consumer of it."""
    colls, of = np.unique(comm, return_inverse=True)
    most = np.zeros(len(colls))
    np.maximum.at(most, of, wait_us)
    w = b.add_nodes(name=np.array([b.intern(f"{g.node_name(int(c))} ({label} waits for a core)") for c in colls.tolist()], np.int32),
                    kind=np.full(len(colls), int(Kind.SYNC)), rank=g.rank[colls], device=np.full(len(colls), -1), gap=most,
                    order=g.order[colls], step=g.step[colls], layer=g.layer[colls])
    b.add_edges(colls, w)
    out = np.diff(g.indptr)[colls]
    b.add_edges(np.repeat(w, out), np.concatenate([g.succ[g.indptr[c]:g.indptr[c + 1]] for c in colls.tolist()]))


def _join(b: GraphBuilder, g: Graph, comm: np.ndarray, cpu: np.ndarray, cpu_us: np.ndarray, label: str,
          wait_us: np.ndarray | None, rank: np.ndarray) -> None:
    """``Placement.JOIN``'s edges: the collective's predecessors -> each rank's node (-> its wake-ups' waits, a resource-free
    node where ``wait_us`` has some) -> a resource-free node per collective for the rest of its transfer -> the collective's
    consumers."""
    colls, of = np.unique(comm, return_inverse=True)
    most = np.zeros(len(colls))
    np.maximum.at(most, of, cpu_us)
    rest = b.add_nodes(name=np.array([b.intern(f"{g.node_name(int(c))} (after its {label})") for c in colls.tolist()], np.int32),
                       kind=np.full(len(colls), int(Kind.SYNC)), rank=g.rank[colls], device=np.full(len(colls), -1),
                       gap=np.maximum(g.dur[colls] - most, 0.0), order=g.order[colls], step=g.step[colls], layer=g.layer[colls])
    indptr, pred = g.pred_csr
    count = indptr[comm + 1] - indptr[comm]
    b.add_edges(np.concatenate([pred[indptr[c]:indptr[c + 1]] for c in comm.tolist()]), np.repeat(cpu, count))
    waits = np.flatnonzero(wait_us > 0) if wait_us is not None else np.empty(0, np.int64)
    if len(waits):
        w = b.add_nodes(name=np.array([b.intern(f"rank{int(rank[i])}.{label} wake-ups {g.node_name(int(comm[i]))}") for i in waits.tolist()], np.int32),
                        kind=np.full(len(waits), int(Kind.SYNC)), rank=rank[waits], device=np.full(len(waits), -1),
                        gap=wait_us[waits], order=g.order[comm[waits]], step=g.step[comm[waits]], layer=g.layer[comm[waits]])
        b.add_edges(cpu[waits], w)
        b.add_edges(w, rest[of[waits]])
    direct = np.setdiff1d(np.arange(len(comm)), waits)
    b.add_edges(cpu[direct], rest[of[direct]])
    out = np.diff(g.indptr)[colls]
    b.add_edges(np.repeat(rest, out), np.concatenate([g.succ[g.indptr[c]:g.indptr[c + 1]] for c in colls.tolist()]))


def _issued(g: Graph, comm: np.ndarray, wait: np.ndarray) -> np.ndarray:
    """Each (collective, rank)'s place in the rank's program order: just after the rank's enqueue of it, so its CPU is
    queued ahead of the compute the rank runs while the collective is in flight (gloo's threads run beside it); just
    before the rank's op that waits for it where no enqueue of the rank joins it."""
    order = np.empty(len(comm))
    for i, (c, w) in enumerate(zip(comm.tolist(), wait.tolist())):
        e = issuers(g, c).get(int(g.rank[w]))
        order[i] = np.nextafter(g.order[e], np.inf) if e is not None else np.nextafter(g.order[w], -np.inf)
    return order


# --- torch on gloo: gloo's threads' CPU per byte sent


@dataclass(frozen=True, slots=True)
class Sent:
    """Each (shared collective, issuing rank) of a graph (``_sent``)."""

    comm: np.ndarray  # the collective
    wait: np.ndarray  # the rank's op that waited for it (its first consumer on the rank, by program order)
    nbytes: np.ndarray  # the bytes the rank sends in it
    ring_steps: np.ndarray  # the ring's steps: N-1 for an all-gather, 2(N-1) otherwise (gloo's reduce-scatter an all-reduce)


def _sent(g: Graph) -> Sent:
    """``Sent`` of ``g``: a ring all-reduce of a collective's all-reduce equivalent on its N ranks sends 2(N-1)/N of it."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    if not len(comm):
        return Sent(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0))
    equiv = allreduce_equivalent_bytes(g, comm)
    out_c, out_w, out_b, out_s = [], [], [], []
    for c, b, k in zip(comm.tolist(), equiv.tolist(), g.comm_kind[comm].tolist()):
        first: dict[int, int] = {}
        for v in g.successors(c).tolist():
            r = int(g.rank[v])
            if r >= 0 and (r not in first or g.order[v] < g.order[first[r]]):
                first[r] = int(v)
        n = len(first)
        if n < 2:
            continue
        for w in first.values():
            out_c.append(c)
            out_w.append(w)
            out_b.append(2.0 * (n - 1) / n * b)
            out_s.append((n - 1) * (1 if k == CommKind.ALL_GATHER else 2))
    return Sent(np.asarray(out_c, np.int64), np.asarray(out_w, np.int64), np.asarray(out_b, np.float64), np.asarray(out_s, np.float64))


def _per_step(g: Graph, sent: Sent, values: np.ndarray) -> dict[int, float]:
    """Rank -> ``values`` (one per ``sent`` row) summed over the rank's rows, per step of the graph."""
    steps = len({int(s) for s in g.step[sent.wait].tolist()}) if len(sent.wait) else 0
    ranks = g.rank[sent.wait]
    return {int(r): float(values[ranks == r].sum()) / steps for r in np.unique(ranks).tolist()} if steps else {}


def comm_cpu(g: Graph) -> CommCpu | None:
    """The profile's price of its collectives' CPU off the training thread: per rank, the median over its profiled steps of
    its process's CPU less its training thread's, over the bytes it sent a step (``_sent``). None where the profile did
    not record its process's CPU (on any rank: ``passes.compute.gloo_cpu_note`` says so under ``--cores``), ``g`` is not
    the profile's own ranks (a pass rebuilt them: ``keep_comm_cpu`` first), or not a PyTorch job on gloo: the price was
    measured there (Horovod's background loop, MXNet's engine threads and TF's pools are other threads too, not per
    byte)."""
    if g.meta.comm_cpu is not None:
        return g.meta.comm_cpu
    loop = _gloo_loop(g)
    if loop is None:
        return None
    sent = _sent(g)
    nbytes, ring = _per_step(g, sent, sent.nbytes), _per_step(g, sent, sent.ring_steps)
    price, wake = {}, {}
    for r in loop.profiled:
        got = _off_thread(loop, r)
        if not got or nbytes.get(r, 0.0) <= 0:
            return None
        price[r] = max(statistics.median(c for _, c in got), 0.0) / nbytes[r]
        others = [x.others for x, _ in got if x.others is not None]
        if len(others) == len(got) and (runs := sum(o.runs for o in others)) > 0:
            wake[r] = GlooWake(statistics.median(o.runs for o in others) / ring[r], sum(o.wait_us for o in others) / runs, ring[r])
    return CommCpu(us_per_byte=price, wake=wake if len(wake) == len(price) else {})


def _gloo_loop(g: Graph) -> LoopSteps | None:
    """The loop's steps of a PyTorch job on gloo that timed every rank's profiled steps (where ``comm_cpu`` prices); None
    elsewhere."""
    loop = g.meta.loop_steps
    if g.meta.framework is not None or g.meta.backend != "gloo":
        return None
    return loop if loop is not None and loop.profiled and sorted(loop.profiled) == list(range(g.world_size)) else None


def _off_thread(loop: LoopSteps, rank: int) -> list[tuple[StepSched, float]]:
    """``rank``'s profiled steps that recorded its process's CPU, each with its CPU off the training thread."""
    steps = loop.sched.get(rank, {})
    return [(x, c) for s in loop.profiled[rank] if (x := steps.get(s)) is not None and (c := x.off_thread_cpu_us) is not None]


def unrecorded_cpu_ranks(g: Graph) -> list[int]:
    """The ranks of a PyTorch profile on gloo whose profiled steps recorded no process CPU: ``comm_cpu`` then has no price
    and ``--cores`` queues no gloo CPU and no wake-ups (``passes.compute.gloo_cpu_note`` says so); [] elsewhere."""
    loop = _gloo_loop(g) if g.meta.comm_cpu is None else None
    return [] if loop is None else [r for r in sorted(loop.profiled) if not _off_thread(loop, r)]


def unrecorded_wake_ranks(g: Graph) -> list[int]:
    """The ranks of a PyTorch profile on gloo, its gloo CPU priced, whose profiled steps did not record the other threads'
    runs (files before 2026-12-06): ``GlooWake`` then has no price, so more ranks than cores queue no wake-ups (FSDP's
    ``gloo_budget``, DDP's ``ddp_wake_waits``; ``passes.compute.gloo_cpu_note`` says so); [] elsewhere."""
    loop = _gloo_loop(g) if comm_cpu(g) is not None else None
    return [] if loop is None else [r for r in sorted(loop.profiled) if any(x.others is None for x, _ in _off_thread(loop, r))]


def keep_comm_cpu(g: Graph) -> Graph:
    """``g`` with its collectives' CPU price in its meta (torch's ``comm_cpu``, JAX's ``spin_share``), read while its ranks
    and collectives are the profile's (``--workers`` and ``--mesh`` rebuild the ranks as copies and re-price the
    collectives)."""
    return g.replace(meta=g.meta.replace(comm_cpu=comm_cpu(g), spin_share=spin_share(g)))


def gloo_budget(g: Graph, beyond_cores: bool = False) -> CpuBudget | None:
    """An FSDP job's ``CpuBudget`` (``Placement.JOIN``): per (collective, rank) the bytes the rank sends times its price
    (``comm_cpu``, of a profiled rank for its copies). None without a price or off FSDP.

    ``beyond_cores`` (more ranks on a host than its cores): each row's extra wake-ups also wait, as the profile's gloo
    threads waited a wake-up (``GlooWake``). A rank's extra ring steps a step (its collectives' here less its profiled
    rank's) times the wake-ups a ring step are shared over its rows by their ring steps (``--workers`` from 2 to 4: two
    thirds of each call's; an HSDP mesh's new replica all-reduces spread over every call). Where the cores suffice, or the
    profile did not record its other threads, none.

    Each row's CPU is capped at its collective's transfer where the ranks fit the cores: what a call's threads ran beyond
    it (a small call's fixed part, priced per byte) was not in it, and the rank's own core ran it beside its other work.
    Beyond the cores it is not capped: a rank's gloo CPU, wherever in the step it ran, holds a core the other ranks wait
    for. On two-root FSDP2 jobs (a GAN, an actor-critic: 24-35 small collectives a step) the cap kept 12 of a rank's 37 ms
    a step of priced gloo CPU on the cores at 4 ranks (the rest ran in the profile's exit lags, which ``share_cores``
    moves off the cores), and ``--workers 4 --cores 2`` came out 23.9 % short (median of 18 kept cells)."""
    if not is_fsdp_graph(g) or (price := comm_cpu(g)) is None:  # off FSDP first: the price walks every collective
        return None
    sent = _sent(g)
    n0 = len(price.us_per_byte)
    of = np.array([int(r) % n0 for r in g.rank[sent.wait].tolist()], np.int64)
    wait = _wake_waits(g, sent, price) if beyond_cores else None
    # a copy's kind (Horovod's copies on its background thread alike): the collective's own sends and sums, not compute
    # that collectives slow (``passes.overlap``)
    cpu_us = sent.nbytes * np.array([price.us_per_byte[p] for p in of.tolist()])
    return CpuBudget(Placement.JOIN, "gloo cpu", Kind.MEMCPY, sent.comm, sent.wait,
                     cpu_us if beyond_cores else np.minimum(cpu_us, g.dur[sent.comm]), wait)


def _wake_waits(g: Graph, sent: Sent, price: CommCpu) -> np.ndarray | None:
    """Per ``sent`` row, its extra wake-ups' waits for a core (``gloo_budget``'s ``beyond_cores``): the rank's extra ring
    steps a step (its collectives' here less its profiled rank's) times the wake-ups a ring step and the wait a wake-up
    its profiled rank's gloo threads had, shared over its rows by their ring steps. None without the record."""
    if not price.wake or not len(sent.wait):
        return None
    ring = _per_step(g, sent, sent.ring_steps)
    n0 = len(price.us_per_byte)
    wake = [price.wake[int(r) % n0] for r in g.rank[sent.wait].tolist()]
    extra = np.array([max(1.0 - w.ring_steps / ring[int(r)], 0.0) for w, r in zip(wake, g.rank[sent.wait].tolist())])
    return sent.ring_steps * extra * np.array([w.runs_per_ring_step * w.wait_us_per_run for w in wake])


def ddp_wake_waits(g: Graph) -> Graph:
    """A DDP job on gloo beyond its host's cores (``share_cores``; FSDP's are in ``gloo_budget``): each collective's ring
    moves no faster than its ranks' gloo threads get a core at each ring step, and the ring steps a rank makes grow
    2 -> 2(N-1) an all-reduce, so each collective waits, after its transfer and before its consumers, the most over its
    ranks of their extra wake-ups' waits (``_wake_waits``, at the profiled rank's wait a wake-up). Their CPU is left off
    the cores (a bucket's all-reduce runs it beside the wire: ``Placement.JOIN``). Unchanged without the record, or on
    FSDP. The BiLSTM-CRF tagger's 2-rank loopback profiles (kept rounds, ``bench/fresh_rounds.py``): 5.3-7.5 wake-ups a
    ring step, 0.13-0.42 ms each; its 4 ranks on 2 cores were predicted 14-23 % short in change without them (-8 to -19
    with them). Seven other DDP scripts held out (14 cells, 2026-12-07): median |change error| 6.6 -> 2.2 %, 13 closer;
    the step's own error 3.5 -> 4.1 %, where a profiled job ran 16-33 % over its unprofiled twin (the profile's level)."""
    if is_fsdp_graph(g) or (price := comm_cpu(g)) is None:
        return g
    sent = _sent(g)
    wait = _wake_waits(g, sent, price)
    if wait is None or not (wait > 0).any():
        return g
    b, _ = GraphBuilder.from_graph(g)
    _stretch(b, g, sent.comm, wait, "gloo")
    return b.build()


# --- TF/JAX: each rank's recorded process CPU off its lanes, per step


@dataclass(frozen=True, slots=True)
class RankCpu:
    """A profiled rank's CPU a step (``LoopSteps.sched``: the steps outside the window past the warm-up, else the window's):
    its process's, every thread's, median; its training thread's CPU over its CPU and waits for a core (the share of its
    runnable time it held a core, ``runnable_stretch``); and its lanes' threads' CPU, median (None: not recorded by name)."""

    process_us: float
    on_core: float
    lanes_us: float | None = None
    step_us: float = 0.0  # the loop's step over the same steps, median (the profiled job's load: ``profiled_load``)


_LINE_ID = re.compile(r"/-?\d+$")  # a pool lane's name ends in xplane's line id (a hash of the thread, not its id)
_IDLE = OtherThreads(0.0, 0.0, 0)  # a recorded thread absent from a step: it neither ran nor waited in it


def lane_threads(g: Graph, rank: int) -> set[str]:
    """The thread names (as ``/proc``'s comm keeps them) of ``rank``'s pool lanes that carry work, its main lane (the
    training thread, recorded apart) not among them: a device ``rank0/tf_Compute/-7664...`` is thread name ``tf_Compute``.
    A lane whose name no recorded thread bears (JAX's ``tf_XLAPjRtCpuClient``: the kernel refused the name) is the
    thread recorded under the process's own name whose CPU a step follows the lane's op time (``_unnamed_lanes``)."""
    main, work = g.meta.main_device.get(rank), lane_work(g)
    busy = set(np.unique(g.device[work & (g.rank == rank)]).tolist())
    head = f"rank{rank}/"
    lanes = {i: _LINE_ID.sub("", d.name[len(head):])[:THREAD_NAME_CHARS] for i, d in enumerate(g.devices)
             if i in busy and i != main and d.name.startswith(head)}
    return set((lanes | _unnamed_lanes(g, rank, lanes)).values())


MATCH_R = 0.5  # the least Pearson correlation over the profiled steps of a thread's CPU with a lane's op time that joins them
MATCH_SCALE = 4.0  # and its CPU over the steps within this factor of the op time either way (TF's pool lanes: 0.46-1.26)


def _unnamed_lanes(g: Graph, rank: int, lanes: dict[int, str]) -> dict[int, str]:
    """Each of ``lanes`` (device -> name) that no thread of ``rank`` was recorded by, joined to the thread recorded apart
    under the process's own name (``traces.meta.is_unnamed_thread``) whose CPU over the profiled steps rises and falls with the
    lane's op time (Pearson ``MATCH_R`` or more; the best first, a thread one lane's at most) and sums to about it (within
    ``MATCH_SCALE``: the thread that ran the ops was on a core about their time, while a busy thread can follow a lane
    busy in one step only by chance). A lane that none joins keeps its name: the stand-in prices it (``_lanes_cpu``)."""
    loop = g.meta.loop_steps
    sched = loop.sched.get(rank, {}) if loop is not None else {}
    prof = sorted(s for s in (loop.profiled.get(rank, {}) if loop is not None else {}) if s in sched)
    recorded = {n for x in sched.values() for n in (x.named or {})}
    todo = [i for i, n in lanes.items() if n not in recorded]
    unnamed = sorted(n for n in recorded if is_unnamed_thread(n))
    if not todo or not unnamed or len(prof) < 3:
        return {}
    work = lane_work(g) & (g.rank == rank)
    at = {s: k for k, s in enumerate(prof)}
    ops = np.zeros((len(todo), len(prof)))
    for row, i in enumerate(todo):
        m = work & (g.device == i) & np.isin(g.step, prof)
        np.add.at(ops[row], [at[int(s)] for s in g.step[m]], g.dur[m])
    cpu = np.array([[(sched[s].named or {}).get(n, _IDLE).cpu_us for s in prof] for n in unnamed])
    scale = cpu.sum(axis=1)[None, :] / np.maximum(ops.sum(axis=1), 1e-9)[:, None]
    pairs = sorted(((float(np.corrcoef(ops[a], cpu[b])[0, 1]), a, b) for a in range(len(todo)) for b in range(len(unnamed))
                    if ops[a].std() > 0 and cpu[b].std() > 0 and 1.0 / MATCH_SCALE <= scale[a, b] <= MATCH_SCALE), reverse=True)
    out: dict[int, str] = {}
    for r, a, b in pairs:
        if r >= MATCH_R and todo[a] not in out and unnamed[b] not in out.values():
            out[todo[a]] = unnamed[b]
    return out


def _lanes_cpu(got: list[StepSched], names: set[str]) -> float | None:
    """The median over ``got`` of the training thread's CPU and the ``names`` threads' a step; None where a step was not
    recorded by name, or a lane's name is no recorded thread's (a pool whose threads the kernel names otherwise: the
    stand-in then, not a lane left out)."""
    named = [(x.cpu_us, x.named) for x in got if x.named is not None]
    if len(named) < len(got) or not names <= {n for _, by in named for n in by}:
        return None
    return float(np.median([cpu + sum(c.cpu_us for n, c in by.items() if n in names) for cpu, by in named]))


def rank_cpu(g: Graph) -> dict[int, RankCpu] | None:
    """Each profiled rank's ``RankCpu`` for a TF/JAX run that recorded every rank's process CPU; None elsewhere."""
    loop = g.meta.loop_steps
    if g.meta.framework not in XPLANE_FRAMEWORKS or loop is None:
        return None
    out = {}
    for r, steps in loop.sched.items():
        got = [x for s, x in steps.items() if x.process_cpu_us is not None and s >= WARMUP_STEPS and s not in loop.profiled.get(r, {})]
        got = got or [x for x in steps.values() if x.process_cpu_us is not None]
        if got:
            stretch = runnable_stretch(got)
            lanes = _lanes_cpu(got, lane_threads(g, r))
            took = loop.unprofiled.get(r, {}) | loop.profiled.get(r, {})
            step = [took[x.step] for x in got if x.step in took]
            out[r] = RankCpu(float(np.median([x.process_cpu_us for x in got])), 1.0 / stretch if stretch >= 1.0 else 1.0, lanes,
                             float(np.median(step)) if step else 0.0)
    return out if out and sorted(out) == list(range(len(out))) else None


def lane_work(g: Graph) -> np.ndarray:
    """The nodes ``share_cores`` queues that are work: ops on a rank's compute and host lanes, not step marks or waits."""
    lanes = np.array([d.rank >= 0 and d.kind in (DeviceKind.COMPUTE, DeviceKind.HOST) for d in g.devices])
    return (g.device >= 0) & lanes[np.maximum(g.device, 0)] & ~np.isin(g.kind, [int(Kind.STEP), int(Kind.COMM_WAIT)])


@dataclass(frozen=True, slots=True)
class LaneCpu:
    """A TF/JAX rank's price on shared cores: the scale of its lanes' op times to their CPU, its off-lane CPU a step (TF's),
    and its off-lane CPU per unit of each collective's transfer (JAX's gloo thread: ``spin_share``'s share at its cores)."""

    on_core: float
    off_lane_us: float
    in_flight: float = 0.0


def lane_cpu(g: Graph, per: int, cores: int) -> dict[int, LaneCpu] | None:
    """Per rank (copies of a profiled rank, ``passes.workers``, read as it), for TF/JAX ranks sharing fewer cores than
    they are: its ``LaneCpu``. The lanes' op times hold the sharing they met when profiled, so each is scaled to the
    lanes' CPU and the queue adds the sharing of the ranks asked for: their threads' recorded CPU a step over their op
    time (``RankCpu.lanes_us``), else the rank's CPU over wall (``RankCpu.on_core``, a stand-in). The rest of the
    process's CPU (TF's collective executor's, gRPC's and the runtime's threads, off the lanes) is its budget a step
    (``off_lane_budget``); JAX's (gloo's polling thread) is priced per unit of each collective's transfer instead: the
    share of the in-flight time it was runnable when profiled (``spin_share``), of which it holds a core for its rank's
    share of the cores, ``cores / per`` (the profile's own per step where that share was not read). None where not
    priced: not such a run, the ranks within the cores, or a rank's CPU not recorded (``passes.compute.process_cpu_note``
    says so)."""
    cpu = rank_cpu(g)
    if cpu is None or per <= cores:
        return None
    n0, steps, work = len(cpu), max(len(g.meta.steps), 1), lane_work(g)
    lane_us = np.bincount(g.rank[work], weights=g.dur[work], minlength=int(g.world_size)) / steps
    spin = spin_share(g) if g.meta.framework == "jax" else None
    out = {}
    for r in range(int(g.world_size)):
        c, ops = cpu[r % n0], float(lane_us[r])
        on_core = c.lanes_us / ops if c.lanes_us is not None and ops > 0 else c.on_core
        off = max(c.process_us - on_core * ops, 0.0)
        out[r] = LaneCpu(on_core, off) if spin is None else LaneCpu(on_core, 0.0, spin[r % n0] * cores / per)
    return out


def spin_share(g: Graph) -> dict[int, float] | None:
    """JAX on gloo: per profiled rank, the share of its collectives' in-flight time (issue to done, summed a step) that its
    threads off the lanes (gloo's polling thread: the rest of the process took 0.2 ms a step at most) were runnable, their
    CPU and their waits for a core (where recorded by thread name), over the profiled steps. The thread polls its socket
    while a call is in flight, so its CPU follows the in-flight time, not the ring's steps or bytes: over the window's
    steps of ``bench_workers_testbed.py --hosts`` rounds (jaxring67's, 2026-12-07) it was runnable 0.65-0.73 of it at 2
    workers and 0.47-0.60 at 4 on 2 cores (VAE, mixer, GAT), holding a core 0.76-0.86 of that at 2 and 0.43-0.49 at 4
    (their cores over their ranks, 0.5). Its CPU per ring step so fell from 0.62 ms at 2 workers to 0.29 at 4 (the VAE;
    the ring steps' in-flight time 1.05 -> 0.84 ms), which pricing it per ring step carried x3. Held out over eleven
    2 -> 4 worker cells on 2 cores (jax68's five, jax69's six; jaxspin69 in docs/evidence.md) median |error| 39.2 ->
    37.5 %, 5 closer and 6 further: on loaded hosts the rings run slower than priced, which the surplus CPU had stood in
    for (open, ``passes.ring_pace``). Lanes whose threads were not recorded by name count their op time at the rank's
    ``RankCpu.on_core``. None where not JAX on gloo, no collective
    ran in a step, a profiled step did not record its process CPU, or ``g``'s ranks are not the profile's (``keep_comm_cpu``
    first)."""
    if g.meta.spin_share is not None:
        return g.meta.spin_share
    loop, cpu = g.meta.loop_steps, rank_cpu(g)
    if g.meta.framework != "jax" or g.meta.backend != "gloo" or loop is None or cpu is None or len(cpu) != int(g.world_size):
        return None
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.step >= 0))
    if not len(comm):
        return None
    flight = np.bincount(g.step[comm], weights=g.dur[comm])
    work = lane_work(g)
    out = {}
    for r in range(int(g.world_size)):
        steps, lanes, run, took = loop.sched.get(r, {}), lane_threads(g, r), 0.0, 0.0
        for s in g.meta.steps:
            x = steps.get(s)
            if x is None or x.process_cpu_us is None or s >= len(flight) or flight[s] <= 0:
                return None
            if x.named is not None and cpu[r].lanes_us is not None:  # every lane's thread recorded by name
                off = x.process_cpu_us - x.cpu_us - sum(c.cpu_us for n, c in x.named.items() if n in lanes)
                off += sum(c.wait_us for n, c in x.named.items() if n not in lanes)
            else:
                off = x.process_cpu_us - cpu[r].on_core * float(g.dur[work & (g.rank == r) & (g.step == s)].sum())
            run += max(off, 0.0)
            took += float(flight[s])
        out[r] = run / took
    return out


def scale_lanes(onto: Graph, g: Graph, priced: dict[int, LaneCpu]) -> Graph:
    """``onto`` (``g``'s nodes keep their ids in it) with each rank's lanes' op times scaled to their CPU (``lane_cpu``)."""
    work = np.flatnonzero(lane_work(g))
    dur = onto.dur.copy()
    dur[work] *= np.array([priced[int(r)].on_core for r in g.rank[work]])
    return onto.replace(dur=dur)


def off_lane_budget(g: Graph, priced: dict[int, LaneCpu], remap: np.ndarray, wait_per_cpu: float = 0.0,
                    pace: RingPace | None = None) -> CpuBudget | None:
    """A TF/JAX job's ``CpuBudget`` (``Placement.ISSUE``): per collective and rank whose issue of it is on a lane moved to
    the cores (``remap``: device -> its shared device), the rank's off-lane CPU a step shared over its collectives of that
    step by bytes (1 B each: a step of empty collectives still shares) and its off-lane CPU through the collective's
    transfer (``LaneCpu.in_flight``: JAX's), and where ``wait_per_cpu`` > 0 its waits for a core in the transfer, that
    many times its CPU (``core_wait``). With a ``pace`` (JAX's communication threads beyond the cores,
    ``passes.ring_pace``) each collective's transfer waits at least what its ring steps take at the pace (the waits for
    a core and the pace are one delay, the most of them counts); no waits where none is above zero. None where no rank
    issues one."""
    indptr, pred = g.pred_csr
    comm, issue = [], []
    for c in np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)):
        ups = [int(p) for p in pred[indptr[c]:indptr[c + 1]]]
        ups += [int(q) for p in ups if g.rank[p] < 0 for q in pred[indptr[p]:indptr[p + 1]]]
        for p in ups:
            if g.rank[p] >= 0 and g.device[p] >= 0 and remap[g.device[p]] != g.device[p]:
                comm.append(int(c))
                issue.append(p)
    if not comm:
        return None
    at = np.array(issue)
    weight = g.nbytes[comm].astype(np.float64) + 1.0
    key = g.rank[at].astype(np.int64) * (int(g.step.max()) + 1) + g.step[at]
    _, of = np.unique(key, return_inverse=True)
    share = weight / np.bincount(of, weights=weight)[of]
    comm_at = np.array(comm, np.int64)
    floor = np.zeros(len(comm_at)) if pace is None else paced_us(g, comm_at, pace)
    transfer = np.maximum(g.dur[comm_at], floor)
    # host work (the runtime's and gRPC's threads with the collective executor's; JAX's gloo thread through the transfer),
    # slowed beside collectives as the lanes' ops
    rows = [priced[int(r)] for r in g.rank[at]]
    _, pair, issues = np.unique(comm_at * int(g.world_size) + g.rank[at], return_inverse=True, return_counts=True)
    through = transfer / issues[pair]  # a rank's transfer once, over its ops that issue the collective
    cpu_us = share * np.array([p.off_lane_us for p in rows]) + through * np.array([p.in_flight for p in rows])
    wait = np.maximum(cpu_us * wait_per_cpu, floor - g.dur[comm_at])
    return CpuBudget(Placement.ISSUE, "off-lane cpu", Kind.OTHER, comm_at, at, cpu_us, wait if (wait > 0).any() else None)


MAX_LOAD = 0.95  # ``core_wait``'s cap: the queue's wait diverges at a load of 1, where the cores bound the step instead


def core_wait(load: float, cores: int) -> float:
    """A thread's mean wait for one of ``cores`` per unit of its CPU at the cores' ``load`` (busy share): M/M/c's (Erlang C).
    gloo's busy thread in a JAX rank runs a ring step at a time, each a wake-up that queues for a core; on 2 cores its
    measured waits over its CPU (``bench/jax_workers_categories.py``) were 0.57-0.94 where the cores' load was 0.62-0.68,
    Erlang C's 0.62-0.86 (2026-12-06)."""
    rho = min(max(load, 0.0), MAX_LOAD)
    a, blocked = cores * rho, 1.0
    for k in range(1, cores + 1):  # Erlang B by its recursion, then C
        blocked = a * blocked / (k + a * blocked)
    waiting = blocked / (1.0 - rho * (1.0 - blocked))
    return waiting / (cores * (1.0 - rho))


def profiled_load(g: Graph, cores: int) -> float | None:
    """The profiled job's load on ``cores``: its ranks' process CPU a step over the cores' time in its step (``rank_cpu``'s
    steps, medians); None where not recorded."""
    cpu = rank_cpu(g)
    if cpu is None or not all(c.step_us > 0 for c in cpu.values()):
        return None
    return sum(c.process_us for c in cpu.values()) / (cores * float(np.mean([c.step_us for c in cpu.values()])))
