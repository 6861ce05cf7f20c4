"""The CPU a rank's collectives spend on its host's cores beside its training thread (gloo's threads: the ring's sends,
receives and reductions, with the kernel's network stack that runs in them), priced per byte the rank sends, for
``--cores``.

dagprof's collector records per step the training thread's CPU and its process's (``traces.meta.StepSched``); the rest is
the process's other threads. On the tiedlm FSDP2 job (``bench/bench_fsdp.py --part 12``, hooks only, 1 Gbit/s testbed)
they took 11-22 ms a step per rank on 2 ranks (8 kept profiles) and 17-26 ms on 4 (2 profiles): about the ring's bytes
sent per rank, (N-1)/N of each gathered or reduced tensor, 1.5x from 2 to 4 ranks (this prices 19.4 ms on 4 where a
sampled 4-rank job's threads took 17.1). ``share_cores`` queued only the ranks' compute on the shared cores, so 4 ranks
on 2 cores were predicted 7-14 % short in change (kept rounds). A sampled hold (``/proc`` every 0.25 s, 2026-12-06):
on 4 ranks each rank's gloo threads waited 59 ms a step for a core (20 on 2 ranks), its training thread 69 (12), while
the 2 cores sat idle 37 % of the step (softirq 2 %, ksoftirqd and other processes 1 %, steal 0): no foreign CPU, the
ranks' own threads waking together after each collective. Each FSDP collective now holds a core per rank for its share
of that CPU between its join and the rest of its transfer; the FIFO queue gives it 11 of those 59 ms a step.
"""
from __future__ import annotations

import statistics

import numpy as np

from ..graph.build_fsdp import allreduce_equivalent_bytes, is_fsdp_graph, issuers
from ..graph.dag import Graph, GraphBuilder
from ..graph.meta import CommCpu
from ..traces.events import Kind


def _sent(g: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each (shared collective, issuing rank): the collective, the rank's op that waited for it (its first consumer on the
    rank, by program order) and the bytes the rank sends in it: a ring all-reduce of the collective's all-reduce
    equivalent on its N ranks sends 2(N-1)/N of them."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    if not len(comm):
        return (np.empty(0, np.int64),) * 2 + (np.empty(0),)
    equiv = allreduce_equivalent_bytes(g, comm)
    out_c, out_w, out_b = [], [], []
    for c, b in zip(comm.tolist(), equiv.tolist()):
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
    return np.asarray(out_c, np.int64), np.asarray(out_w, np.int64), np.asarray(out_b, np.float64)


def _issued(g: Graph, comm: np.ndarray, wait: np.ndarray) -> np.ndarray:
    """Each (collective, rank)'s place in the rank's program order: just after the rank's enqueue of it, so its CPU is
    queued ahead of the compute the rank runs while the collective is in flight (gloo's threads run beside it); just
    before the rank's op that waits for it where no enqueue of the rank joins it."""
    order = np.empty(len(comm))
    for i, (c, w) in enumerate(zip(comm.tolist(), wait.tolist())):
        e = issuers(g, c).get(int(g.rank[w]))
        order[i] = np.nextafter(g.order[e], np.inf) if e is not None else np.nextafter(g.order[w], -np.inf)
    return order


def comm_cpu(g: Graph) -> CommCpu | None:
    """The profile's price of its collectives' CPU off the training thread: per rank, the median over its profiled steps of
    its process's CPU less its training thread's, over the bytes it sent a step (``_sent``). None where the profile did
    not record its process's CPU, ``g`` is not the profile's own ranks (a pass rebuilt them: ``keep_comm_cpu`` first), or
    not a PyTorch job on gloo: the price was measured there (Horovod's background loop, MXNet's engine threads and TF's
    pools are other threads too, not per byte)."""
    if g.meta.comm_cpu is not None:
        return g.meta.comm_cpu
    loop = g.meta.loop_steps
    if g.meta.framework is not None or g.meta.backend != "gloo":
        return None
    if loop is None or not loop.profiled or sorted(loop.profiled) != list(range(g.world_size)):
        return None
    _, w, sent = _sent(g)
    steps = len({int(s) for s in g.step[w].tolist()}) if len(w) else 0
    price = {}
    for r, profiled in loop.profiled.items():
        other = [x.process_cpu_us - x.cpu_us for s in profiled if (x := loop.sched.get(r, {}).get(s)) is not None and x.process_cpu_us is not None]
        nbytes = float(sent[g.rank[w] == r].sum()) / steps if steps else 0.0
        if not other or nbytes <= 0:
            return None
        price[r] = max(statistics.median(other), 0.0) / nbytes
    return CommCpu(us_per_byte=price)


def keep_comm_cpu(g: Graph) -> Graph:
    """``g`` with its collectives' CPU price in its meta, read while its ranks are the profile's (``--workers`` and
    ``--mesh`` rebuild them as copies)."""
    return g.replace(meta=g.meta.replace(comm_cpu=comm_cpu(g)))


def with_comm_cpu(g: Graph, host_device: np.ndarray) -> Graph:
    """``g`` with a node per (collective, rank) on the rank's shared cores (``host_device``: rank -> device) for the CPU
    its collective spends off the training thread (``comm_cpu``), from the collective's join, queued just after the
    rank's enqueue of it in program order; and a resource-free node per collective for the rest of its transfer after
    its slowest rank's CPU (the transfer less the most of its ranks', which it held as profiled) that its consumers wait
    for too: the ring moves no faster than its ranks' gloo threads get a core. On free cores the collective ends as before;
    the transfer keeps its link's device. FSDP only: its calls block the training thread, small and many (tiedlm: 20 a
    step, 1.4 ms at 4 ranks), so each ring step waits for its ranks' gloo threads to get a core; a DDP bucket's
    all-reduce moves its CPU beside the wire (the DDP testbed's kept 4-rank 25 MB cells, 1 Gbit/s, went +0.0 -> +5.8 and
    +5.3 -> +10.4 % with it, its 1 and 5 MB cells unmoved). Unchanged without a price."""
    price = comm_cpu(g)
    if price is None or not is_fsdp_graph(g):
        return g
    comm, wait, sent = _sent(g)
    if not len(comm):
        return g
    n0 = len(price.us_per_byte)
    rank = g.rank[wait]
    # at most its transfer: what a call's threads ran beyond it (a small call's fixed part, priced per byte) was not in it
    cpu_us = np.minimum(sent * np.array([price.us_per_byte[int(r) % n0] for r in rank.tolist()]), g.dur[comm])
    colls, of = np.unique(comm, return_inverse=True)
    most = np.zeros(len(colls))
    np.maximum.at(most, of, cpu_us)
    b, _ = GraphBuilder.from_graph(g)
    name = np.array([b.intern(f"rank{int(r)}.gloo cpu {g.node_name(int(c))}") for r, c in zip(rank.tolist(), comm.tolist())], np.int32)
    # a copy's kind (Horovod's copies on its background thread alike): not compute that collectives slow (``passes.overlap``)
    cpu = b.add_nodes(name=name, kind=np.full(len(comm), int(Kind.MEMCPY)), rank=rank, device=host_device[rank], dur=cpu_us,
                      order=_issued(g, comm, wait), step=g.step[wait], layer=g.layer[wait])
    rest = b.add_nodes(name=np.array([b.intern(f"{g.node_name(int(c))} (after its gloo cpu)") for c in colls.tolist()], np.int32),
                       kind=np.full(len(colls), int(Kind.SYNC)), rank=g.rank[colls], device=np.full(len(colls), -1), gap=np.maximum(g.dur[colls] - most, 0.0),
                       order=g.order[colls], step=g.step[colls], layer=g.layer[colls])
    indptr, pred = g.pred_csr
    count = indptr[comm + 1] - indptr[comm]
    b.add_edges(np.concatenate([pred[indptr[c]:indptr[c + 1]] for c in comm.tolist()]), np.repeat(cpu, count))
    b.add_edges(cpu, rest[of])
    out = np.diff(g.indptr)[colls]
    b.add_edges(np.repeat(rest, out), np.concatenate([g.succ[g.indptr[c]:g.indptr[c + 1]] for c in colls.tolist()]))
    return b.build()
