"""One rank's nodes and edges: its pieces (``graph.pieces``) as nodes chained along each lane, its flows as edges, its
step marks, and its side of every shared collective (``CollectiveEnd``: its ready points and what waits for it).
"""
from __future__ import annotations

import numpy as np

from ..traces.events import CLOCK_JITTER_US, Kind, LaneKind, RankTrace
from .assemble import Assembler, CollectiveEnd
from .dag import NODE_COLUMNS, DeviceKind
from .measured import GraphRule
from .pieces import Anchors, Pieces, Selection, anchors, pieces, select

_LANE_DEVICE = {LaneKind.CPU_THREAD: DeviceKind.HOST, LaneKind.GPU_STREAM: DeviceKind.COMPUTE, LaneKind.COMM_THREAD: DeviceKind.COMM}


def add_rank(asm: Assembler, trace: RankTrace, steps: list[int], instance: np.ndarray, dims: np.ndarray,
             p2p: tuple[int, ...] = (), host_waits: bool = True) -> None:
    """The rank's nodes and edges: select -> anchors -> pieces -> nodes -> edges (``host_waits``: ``pieces.anchors``)."""
    asm.base_ns[trace.rank] = int(trace.base_ns)
    sel = select(trace, steps, instance, p2p)
    anc = anchors(trace, sel, host_waits)
    cut = pieces(trace, sel, anc, steps)
    node_of = _nodes(asm, trace, cut, steps, sel.main)
    _flow_edges(asm, trace, sel, anc, cut, node_of, instance, dims)
    _window_start(asm, cut, node_of, steps)
    _pool_steps(asm, trace, cut, node_of)
    _window_end(asm, trace, cut, node_of)


def _nodes(asm: Assembler, trace: RankTrace, cut: Pieces, steps: list[int], main: int) -> np.ndarray:
    """One node per piece, chained along each lane; returns the node id of every piece."""
    ev, r = trace.events, trace.rank
    devices = [asm.b.device(f"rank{r}/{lane.name}", _LANE_DEVICE[lane.kind], rank=r) for lane in trace.lanes]
    # (each column built and its temporaries dropped before the next: 5M pieces are 40 MB a column)
    o, w = np.asarray(cut.owner, np.int64), np.asarray(cut.wait, np.int64)
    mark = o < 0
    oo = np.maximum(o, 0)
    a, z = np.asarray(cut.start, np.float64), np.asarray(cut.end, np.float64)
    # names, steps and layers interned in the order the pieces first use them (as one add_node per piece would)
    key = np.where(mark, -2 - cut.mark.astype(np.int64), ev.name[np.where(w >= 0, w, oo)].astype(np.int64))
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    del key
    ids = np.empty(len(uniq), dtype=np.int64)
    for j in np.argsort(first, kind="stable").tolist():
        k = int(uniq[j])
        ids[j] = asm.b.intern(f"rank{r}.step{-2 - k}" if k < 0 else f"rank{r}.{ev.names[k]}")
    name = ids[inv.reshape(-1)].astype(NODE_COLUMNS["name"])  # each column in its graph dtype at once: 5 bytes a node less
    del uniq, first, inv
    step = np.where(mark, cut.mark, ev.step[oo]).astype(NODE_COLUMNS["step"])
    layer = np.where(mark, -1, ev.layer[oo]).astype(np.int64)
    lu, lfirst, linv = np.unique(layer, return_index=True, return_inverse=True)
    del layer
    lid = np.full(len(lu), -1, dtype=np.int64)
    for j in np.argsort(lfirst, kind="stable").tolist():
        if lu[j] >= 0:
            lid[j] = asm.b.layer(trace.layers[int(lu[j])])
    layer = lid[linv.reshape(-1)].astype(NODE_COLUMNS["layer"])
    del linv
    kind = np.where(w >= 0, int(Kind.COMM_WAIT), ev.kind[oo]).astype(NODE_COLUMNS["kind"])
    kind[mark] = int(Kind.STEP)
    mstart = np.where(~mark & (kind == int(Kind.COMM_WAIT)), z, a)  # a wait depends on its end
    mend = np.where(mark, a, z)
    order = np.where(mark & ~np.isfinite(a), 0.0, a)
    device = np.array(devices, dtype=NODE_COLUMNS["device"])[cut.lane] if len(devices) else np.zeros(len(cut), NODE_COLUMNS["device"])
    named = np.where(w >= 0, w, oo)

    def col(c: str, of: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Column ``c`` from the events' ``of`` at ``at``; a step mark's is add_node's default."""
        return np.where(mark, -1 if c == "bucket" else 0, of[at]).astype(NODE_COLUMNS[c])

    node_of = asm.b.add_nodes(
        name=name, kind=kind, rank=np.full(len(cut), r, dtype=NODE_COLUMNS["rank"]), device=device, dur=mend - mstart,
        order=order, step=step, layer=layer, bucket=col("bucket", ev.bucket, oo), nbytes=col("nbytes", ev.nbytes, oo),
        role=col("role", ev.role, named), comm_kind=col("comm_kind", ev.comm_kind, named),
        group_size=col("group_size", ev.group_size, named))  # the named event's
    del name, kind, device, order, step, layer, oo, named
    asm.mstart.frombytes(memoryview(np.ascontiguousarray(mstart, np.float64)).cast("B"))
    asm.mend.frombytes(memoryview(np.ascontiguousarray(mend, np.float64)).cast("B"))
    for k in np.flatnonzero(mark & (cut.mark == steps[0])).tolist():
        asm.first_marks[int(node_of[k])] = trace.base_ns / 1e3 + float(a[k])  # us on the shared (aligned) clock
    same_lane = cut.lane[1:] == cut.lane[:-1]
    asm.edges(node_of[:-1][same_lane], node_of[1:][same_lane], GraphRule.PROGRAM_ORDER)
    if len(cut):
        asm.b.meta.main_device[r] = devices[main]
    return node_of


def _flow_edges(asm: Assembler, trace: RankTrace, sel: Selection, anc: Anchors, cut: Pieces, node_of: np.ndarray, instance: np.ndarray,
                dims: np.ndarray) -> None:
    """Flows between pieces; flows into or out of a shared collective become its ready points and needs."""
    ev = trace.events
    src_local, dst_local = ~sel.shared[anc.src], ~sel.shared[anc.dst]
    waits = np.isfinite(anc.until)
    u = np.full(len(anc.src), -1, dtype=np.int64)
    v = np.full(len(anc.src), -1, dtype=np.int64)
    q = np.flatnonzero(src_local)
    u[q] = cut.progress(ev.lane[anc.src[q]].astype(np.int64), anc.src_at[q], sel.owner[anc.src[q]])
    q = np.flatnonzero(dst_local & ~waits)
    v[q] = cut.entry(ev.lane[anc.dst[q]].astype(np.int64), anc.dst_at[q], sel.owner[anc.dst[q]])
    q = np.flatnonzero(dst_local & waits)
    v[q] = cut.release(ev.lane[anc.dst[q]].astype(np.int64), anc.until[q], sel.owner[anc.dst[q]])
    u_node = np.where(u >= 0, node_of[np.maximum(u, 0)], -1)
    v_node = np.where(v >= 0, node_of[np.maximum(v, 0)], -1)
    local = src_local & dst_local
    asm.edges(u_node[local], v_node[local], anc.rule[local])
    ends = _collective_ends(asm, trace, sel, instance, dims)
    for k in np.flatnonzero(~local).tolist():
        s, d, rule = int(anc.src[k]), int(anc.dst[k]), int(anc.rule[k])
        if d in ends and s in ends:  # one collective straight after another on the lane (XLA's all-gathers)
            ends[d].after.append((int(instance[s]), rule))
        elif d in ends and u_node[k] >= 0:
            ends[d].ready.append((int(u_node[k]), rule))
        elif s in ends and v_node[k] >= 0:
            ends[s].needs.append((int(v_node[k]), rule))


def _collective_ends(asm: Assembler, trace: RankTrace, sel: Selection, instance: np.ndarray, dims: np.ndarray) -> dict[int, CollectiveEnd]:
    """This rank's view of each shared collective, registered with its instance."""
    ev = trace.events
    coll = np.flatnonzero(sel.shared)
    own = coll[ev.depth[coll] == 0]  # gloo runs collectives on a pool of threads (a send/recv on the calling one)
    comm_lanes = most_at_once(ev.start[own], ev.start[own] + ev.dur[own])
    ends: dict[int, CollectiveEnd] = {}
    prev_group: dict[str, float] = {}
    for i in sorted(coll.tolist(), key=lambda i: ev.start[i] + ev.dur[i]):
        group = trace.groups[int(ev.group[i])] if ev.group[i] >= 0 else "0"
        ce = CollectiveEnd(
            rank=trace.rank, base_ns=int(trace.base_ns), start=float(ev.start[i]), end=float(ev.start[i] + ev.dur[i]),
            prev_end_group=prev_group.get(group, -np.inf), name=ev.name_of(i), nbytes=int(ev.nbytes[i]),
            bucket=int(ev.bucket[i]), step=int(ev.step[i]), lanes=comm_lanes, group=group, dim=int(dims[i]), role=int(ev.role[i]),
            comm_kind=int(ev.comm_kind[i]),
        )
        prev_group[group] = ce.end
        ends[i] = ce
        asm.instances.setdefault(int(instance[i]), []).append(ce)
    return ends


def _window_start(asm: Assembler, cut: Pieces, node_of: np.ndarray, steps: list[int]) -> None:
    """Every other lane's first op follows the first step mark, so it replays at its measured offset from it."""
    opening = np.flatnonzero(cut.mark == steps[0])
    if not len(opening):
        return
    t = float(cut.start[opening[0]])
    first = cut.lane_at[:-1]
    first = first[(first < cut.lane_at[1:]) & (cut.owner[np.minimum(first, len(cut) - 1)] >= 0)]
    first = first[cut.start[first] >= t]
    asm.edges(np.full(len(first), node_of[opening[0]]), node_of[first], GraphRule.WINDOW_START)


def _pool_steps(asm: Assembler, trace: RankTrace, cut: Pieces, node_of: np.ndarray) -> None:
    """A pool thread's first op of each step also follows that step's mark. Its previous op on the thread may be the
    previous step's, ended long before: measured from it alone, the op's overhead held the thread's idle time, which
    averaged over steps delayed every step (Keras ``fit``: a 25 ms gap before the input iterator in one step of four
    put 6 ms into each averaged one)."""
    marks = np.flatnonzero(cut.mark >= 0)
    at = dict(zip(cut.mark[marks].tolist(), marks.tolist()))
    for lane in np.flatnonzero([ln.pool for ln in trace.lanes]).tolist():
        k = np.arange(cut.lane_at[lane], cut.lane_at[lane + 1])
        k = k[cut.owner[k] >= 0]
        if len(k) < 2:
            continue
        step = trace.events.step[cut.owner[k]].astype(np.int64)
        new = k[1:][step[1:] > step[:-1]]
        mark = np.array([at.get(int(s), -1) for s in trace.events.step[cut.owner[new]].tolist()], dtype=np.int64)
        ok = mark >= 0
        ok[ok] = cut.start[mark[ok]] <= cut.start[new[ok]]
        asm.edges(node_of[mark[ok]], node_of[new[ok]], GraphRule.STEP_START)


def _window_end(asm: Assembler, trace: RankTrace, cut: Pieces, node_of: np.ndarray) -> None:
    """The closing step mark follows every lane's last op that ended before it."""
    closing = np.flatnonzero(cut.mark == (cut.mark.max() if len(cut.mark) else -1))
    if not len(closing) or cut.mark.max() < 0:
        return
    t = float(cut.start[closing[-1]])
    last = cut.lane_at[1:] - 1
    last = last[(last >= cut.lane_at[:-1]) & (cut.owner[np.maximum(last, 0)] >= 0)]
    last = last[cut.end[last] <= t + CLOCK_JITTER_US]
    asm.edges(node_of[last], np.full(len(last), node_of[closing[-1]]), GraphRule.WINDOW_END)


def most_at_once(start: np.ndarray, end: np.ndarray) -> int:
    """The most intervals open at one time (at least 1); one that ends as another starts does not overlap it.

    Collectives of one rank that overlap share the link, so their spans are not their transfer
    times; a pool of threads taking turns (JAX, TensorFlow) is not that."""
    if not len(start):
        return 1
    t = np.concatenate([start, end])
    delta = np.concatenate([np.ones(len(start), np.int64), -np.ones(len(end), np.int64)])
    order = np.lexsort((delta, t))  # at a tie the end comes first
    return max(int(np.cumsum(delta[order]).max()), 1)
