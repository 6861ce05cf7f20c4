"""Events of a parameter-server job (``traces.mxnet``) -> one global graph with server lanes.

Per worker, each engine thread's depth-0 ops form a chain (program order) with step boundaries
on the main one, as in ``graph.build``. Per worker and step, the push/pull exchange is:

    last op before the first push -> issue(key k)   (no push starts before the exchange's first)
    backward op of key k's layer  -> issue(key k)   (the engine pushes a gradient once it is ready:
                                                     without ``waitall`` before ``trainer.step`` the
                                                     pushes overlap the rest of the backward pass)
    issue(key k) -> push (worker's port out, then port psS in) -> psS sum+update
                 -> pull (port psS out, then the worker's port in) -> done(worker, step)
    done(worker, step) -> the first op that started after both the first push and the last backward
                          op (the pulled weights' copies, then the next step)

for every part of every key, keys placed on servers as ps-lite does (``traces.mxnet.pslite_placement``).
The server's sum waits for every worker's push, so a late worker delays everyone's pull, and the
workers' and servers' ports and the server CPUs are capacity-1 devices, so keys queue behind each
other there (a message crosses both ends' ports, in pipelined chunks). The
sub-graph is ``graph.collectives.add_ps_part``, the same one the ``ps:K`` what-if builds, so a
measured PS job and a predicted one are the same model. Push, pull and server times come from the
graph's link model (``meta.topology``, gamma = server work per byte received); ``rebuild_ps``
re-places keys for another server count or link, and ``passes.comm.fit_ps_link`` fits the link's rate to
the measured exchanges (``meta.ps.exchange_us``; mx.profiler does not say which push
carries which key, so single messages cannot be timed).
"""
from __future__ import annotations

import msgspec
import numpy as np

from ..costmodel.alphabeta import AlphaBeta
from ..costmodel.topology import CollectiveSpec, Scheme, Topology
from ..errors import DagprofError
from ..traces.events import Kind, LaneKind, Run
from ..traces.mxnet import pslite_placement
from .build import common_steps, host_cpus, loop_steps, measured_iter_us
from .collectives import add_ps_part, ps_devices
from .dag import DeviceKind, Graph, GraphBuilder

ISSUE = "ps issue"
DONE = "ps done"


def build_ps_graph(run: Run, steps: range | None = None, link: AlphaBeta | None = None) -> Graph:
    ps = run.meta.ps
    if ps is None:
        raise DagprofError("not a parameter-server run (no server information)", run.source)
    chosen = common_steps(run, steps)
    n = run.world_size
    b = GraphBuilder()
    mstart: list[float] = []  # measured times on the shared clock (us), for the gaps
    mend: list[float] = []

    def node(name: str, kind: Kind, s: float, e: float, **kw) -> int:
        v = b.add_node(name, kind, dur=max(e - s, 0.0), order=s, **kw)
        mstart.append(s)
        mend.append(e)
        return v

    exchanges = []  # (step, worker, ready node, head node, issue offsets, first push, last pull)
    edges: list[tuple[int, int]] = []
    first_marks = {}
    for t in run.ranks:
        ev, r, base = t.events, t.rank, t.base_ns / 1e3
        in_steps = np.isin(ev.step, chosen)
        spans = t.step_spans()
        spans = spans[np.isin(spans[:, 0].astype(int), chosen)]
        main = next(i for i, lane in enumerate(t.lanes) if lane.main)
        node_of: dict[int, int] = {}  # event -> node
        main_chain: list[tuple[float, float, int]] = []
        lane_chains: list[list[tuple[float, float, int]]] = []
        for lane_id, lane in enumerate(t.lanes):
            if lane.kind != LaneKind.CPU_THREAD or not lane.name.startswith("engine"):
                continue
            dev = b.device(f"rank{r}/{lane.name}", DeviceKind.COMPUTE, rank=r)
            sel = np.flatnonzero(in_steps & (ev.lane == lane_id) & (ev.depth == 0) & (ev.kind != Kind.STEP))
            items = [(float(ev.start[i]), 1, int(i)) for i in sel]
            if lane_id == main:
                items += [(float(st), 0, -2 - int(k)) for k, st, _ in spans]
                items.append((float(spans[:, 2].max()), 2, -1))
            items.sort()
            chain, prev, mine_lane = [], -np.inf, []
            lane_chains.append(mine_lane)
            if lane_id == main:
                main_chain = mine_lane
            for s, _, i in items:
                s = max(s, prev)
                if i < 0:
                    step = max(chosen) + 1 if i == -1 else -2 - i
                    v = node(f"rank{r}.step{step}", Kind.STEP, base + s, base + s, rank=r, device=dev, step=step)
                    if step == chosen[0]:
                        first_marks[v] = base + s
                    e = s
                else:
                    e = max(s, float(ev.start[i] + ev.dur[i]))
                    layer = int(ev.layer[i])
                    v = node(f"rank{r}.{ev.name_of(i)}", Kind(int(ev.kind[i])), base + s, base + e, rank=r, device=dev, step=int(ev.step[i]),
                             layer=b.layer(t.layers[layer]) if layer >= 0 else -1)
                    node_of[int(i)] = v
                chain.append(v)
                mine_lane.append((base + s, base + e, v))
                prev = e
            edges += list(zip(chain[:-1], chain[1:]))
            if lane_id == main:
                b.meta.main_device[r] = dev
        comm = in_steps & (ev.kind == Kind.COMM)
        calls = in_steps & (ev.kind == Kind.COMM_ENQUEUE)
        for step in chosen:
            mine = np.flatnonzero(comm & (ev.step == step))
            if not len(mine):
                raise DagprofError(f"worker {r} step {step} has no push/pull", t.source)
            first = base + float(ev.start[mine].min())
            last = base + float((ev.start[mine] + ev.dur[mine]).max())
            issued = np.sort(base + ev.start[np.flatnonzero(calls & (ev.step == step))]) if calls.any() else np.sort(base + ev.start[mine])
            ready = max((v for s, e, v in main_chain if e <= first + 1.0), key=lambda v: mend[v], default=None)
            # each layer's gradient is ready when its (last) backward op ends; the ops that wait for the pulls come after all of them
            grads: dict[str, int] = {}
            backward = [int(i) for i in np.flatnonzero(in_steps & (ev.step == step) & (ev.kind == Kind.BACKWARD)) if int(i) in node_of]
            for i in sorted(backward, key=lambda i: mend[node_of[i]]):
                if ev.layer[i] >= 0:
                    grads[t.layers[int(ev.layer[i])]] = node_of[i]
            after = max([first] + [mend[node_of[i]] for i in backward])
            segment = _segment_of_keys(run.meta.ps.keys, grads, t.layers, [node_of[i] for i in backward if ev.layer[i] < 0],
                                       base + ev.start[mine], mend)
            # what the pushes wait for (and what ran before it on its thread) never waits for the pulls, even an op of no
            # duration that began within the 1 us tolerance after the first push (else the graph has a cycle)
            feeds = {ready, *grads.values(), *segment.values()}
            later = [lane[max((j + 1 for j, (_, _, v) in enumerate(lane) if v in feeds), default=0):] for lane in lane_chains]
            heads = [min((v for s, e, v in lane if s >= after - 1.0), key=lambda v: mstart[v], default=None) for lane in later]
            head = heads[lane_chains.index(main_chain)]
            if ready is None or head is None:
                raise DagprofError(f"worker {r} step {step}: the exchange is not inside the profiled step", t.source)
            # on every engine thread, what ran during the exchange (the pulled weights' copies) and the op after it wait for the pulls
            head = [h for h in heads if h is not None]
            head += [v for lane in later for s, e, v in lane if after - 1.0 <= s <= last + 1.0]
            head += [v for v in (min((v for s, e, v in lane if s > last + 1.0), key=lambda v: mstart[v], default=None) for lane in later)
                     if v is not None]
            exchanges.append((step, r, ready, grads | segment, head, issued, first, last))
    keys = ps.keys
    spans = []  # measured exchange per worker and step: its first push issued -> its last pull in
    for step, r, ready, grads, head, issued, first, last in exchanges:
        t0 = mend[ready]
        spans.append((int(step), int(r), float(last - first)))
        calls = np.maximum(issued[: len(keys)] - t0, 0.0)
        if len(calls) < len(keys):
            calls = np.concatenate([calls, np.full(len(keys) - len(calls), calls[-1] if len(calls) else 0.0)])
        for k, off in zip(keys, np.maximum.accumulate(calls)):
            grad = grads.get(k.layer)
            at = max(t0 + off, mend[grad] if grad is not None else -np.inf)
            v = node(ISSUE, Kind.COMM_ENQUEUE, at, at, rank=r, step=step, bucket=k.key)
            edges += [(ready, v)] + ([(grad, v)] if grad is not None else [])
        done = node(DONE, Kind.SYNC, last, last, rank=r, step=step)
        edges += [(done, h) for h in set(head)]
    b.add_edges([u for u, _ in edges], [v for _, v in edges])
    g = b.build()
    gap = _gaps(g, np.asarray(mstart), np.asarray(mend), first_marks)
    servers = ps.num_servers
    link = link or initial_link(run)
    g = g.replace(gap=gap)
    g.meta = g.meta.replace(
        world_size=n, ranks=[t.rank for t in run.ranks], steps=chosen, backend="ps-lite", framework=ps.framework, source=run.source,
        measured_iter_us={t.rank: measured_iter_us(t, chosen) for t in run.ranks},
        ps=msgspec.structs.replace(ps, exchange_us=spans),
        scheme=CollectiveSpec(Scheme.PS, servers), topology=Topology.flat(n, link), buckets=(), host_cpus=host_cpus(run), loop_steps=loop_steps(run),
    )
    return rebuild_ps(g, servers, link)


def _segment_of_keys(keys, grads: dict, layers: list[str], segments: list[int], push_starts: np.ndarray, mend: list[float]) -> dict:
    """key's layer -> the backward segment its gradient waits for, for keys no layer's own backward op gives.

    A hybridized block's backward runs as engine bulks without layers (``traces.mxnet.BULK``), in reverse model order,
    and the engine pushes a gradient once the bulk that made it is done: the first pushes follow the first bulk, the
    keys of the first layers wait for the last one. mx.profiler does not name a push's key, so the measured pushes say
    how many keys each bulk released (each push begins after the last bulk done by then); the keys, in reverse model
    order, take them in turn.
    """
    pending = [k for k in keys if k.layer not in grads]
    if not segments or not pending:
        return {}
    segments = sorted(segments, key=lambda v: mend[v])
    ends = np.array([mend[v] for v in segments])
    released = np.searchsorted(ends, np.sort(push_starts) + 1.0, side="right") - 1  # per push, in start order: its bulk (-1: none)
    position = {name: i for i, name in enumerate(layers)}
    pending.sort(key=lambda k: -position.get(k.layer, -1))
    out = {}
    for i, k in enumerate(pending):
        j = int(released[min(i, len(released) - 1)]) if len(released) else len(segments) - 1
        if j >= 0:
            out.setdefault(k.layer, segments[j])
    return out


def _gaps(g: Graph, mstart: np.ndarray, mend: np.ndarray, first_marks: dict[int, float]) -> np.ndarray:
    """Measured start minus the latest measured end of a node's predecessors (framework overhead)."""
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    latest = np.full(len(g), -np.inf)
    np.maximum.at(latest, g.succ, mend[src])
    gap = np.where(np.isfinite(latest), np.maximum(mstart - latest, 0.0), 0.0)
    gap[g.kind == Kind.COMM_ENQUEUE] = 0.0  # issue pacing is the nodes' own spacing
    gap[g.kind == Kind.SYNC] = 0.0
    first = min(first_marks.values(), default=0.0)
    for v, t in first_marks.items():  # workers start as skewed as they were measured
        gap[v] = t - first
    return gap


def initial_link(run: Run) -> AlphaBeta:
    """A first link model before fitting (``passes.comm.fit_ps_link``): the shortest push/pull is one small
    round trip (alpha per message); the mean exchange moves every byte in and out of one server port;
    gamma is the servers' measured busy time per byte received."""
    ps = run.meta.ps
    durs = np.concatenate([t.events.dur[t.events.kind == Kind.COMM] for t in run.ranks])
    alpha = float(durs.min()) / 2 if len(durs) else 0.0
    total = sum(k.nbytes for k in ps.keys) * run.world_size * 2 / max(ps.num_servers, 1)
    beta = max(float(np.median(durs)) - 2 * alpha, 1.0) / max(total, 1.0) if len(durs) else 1e-3
    busy = ps.server_busy
    handled = sum(k.nbytes for k in ps.keys) * run.world_size * len({s.step for s in busy})
    gamma = sum(s.busy_us for s in busy) / handled if busy and handled else 0.0
    return AlphaBeta(alpha, beta, gamma)


def is_ps_graph(g: Graph) -> bool:
    return g.meta.ps is not None


def exchange_nodes(g: Graph) -> np.ndarray:
    """Mask of the push/sum/pull sub-graphs (``add_ps_part``): nodes on ports and server CPUs, and the
    device-less latency of each message; the workers' own ops, issues and dones are not."""
    ps_dev = np.array([_is_ps_device(d.name) for d in g.devices] + [False])
    return ps_dev[g.device] | ((g.kind == Kind.COMM) & (g.device < 0))


def rebuild_ps(g: Graph, servers: int, link: AlphaBeta) -> Graph:
    """The graph with every key's push/sum/pull placed on ``servers`` servers and priced by ``link``."""
    ps = g.meta.ps
    keep = ~exchange_nodes(g)
    b, remap = GraphBuilder.from_graph(g, keep)
    issue, issue_order, done = {}, {}, {}
    for v in np.flatnonzero(keep):
        name = g.node_name(v)
        if name == ISSUE:
            issue[(int(g.step[v]), int(g.bucket[v]), int(g.rank[v]))] = int(remap[v])
            issue_order[(int(g.step[v]), int(g.bucket[v]))] = min(issue_order.get((int(g.step[v]), int(g.bucket[v])), np.inf), float(g.order[v]))
        elif name == DONE:
            done[(int(g.step[v]), int(g.rank[v]))] = int(remap[v])
    n = int(g.meta.world_size)
    for step in g.meta.steps:
        for k in ps.keys:
            key = k.key
            ready = [[issue[(step, key, w)]] for w in range(n)]
            order = issue_order[(step, key)]
            for server, elems in pslite_placement(key, k.elements, servers, ps.bigarray_bound):
                part = 4.0 * elems
                pulls = add_ps_part(b, ready, server, part, link, part * n * link.gamma_us_per_byte, tag=f"key{key} s{step}", order=order,
                                    step=step, bucket=key)
                b.add_edges(pulls, [done[(step, w)] for w in range(n)])
    out = b.build()
    out.meta.scheme, out.meta.topology = CollectiveSpec(Scheme.PS, servers), Topology.flat(n, link)
    return out


def _is_ps_device(name: str) -> bool:
    return name.startswith(("port ps", "port w")) or (name.startswith("ps") and name.endswith(" cpu"))


__all__ = ["build_ps_graph", "rebuild_ps", "is_ps_graph", "initial_link", "ps_devices", "exchange_nodes"]
