"""Horovod what-ifs: another ``HOROVOD_FUSION_THRESHOLD`` or ``HOROVOD_CYCLE_TIME``.

Horovod's background thread runs a loop (horovod/common/operations.cc, ``RunLoopOnce``): it
sleeps until ``cycle time`` after the previous cycle began (or not at all when that cycle's work
ran longer), agrees with the other ranks on which requested tensors every rank has ready (a
small coordination all-reduce each cycle), fuses those, in its response-cache order, into
responses of at most ``fusion threshold`` bytes (a larger tensor goes alone), and executes them
one after another: copy into the fusion buffer, transfer, copy out. Which tensors share a
response therefore depends on when backward produced them and on the cycle grid, not on a
static bucket layout.

``set_horovod`` re-plays that loop on the graph: it replays the graph to get every request's
time on every rank, runs the loop over them with the new settings (lock-step cycles across
ranks; each response costs the fitted memcpy-in + all-reduce + memcpy-out of its bytes; each
cycle the measured coordination cost), rebuilds the background-thread nodes, joins and
transfers from that plan, and repeats until the plan stops changing (a later step's requests
move with an earlier step's communication). Costs come from the profile: memcpy lines fitted to
the measured copies, the all-reduce from the graph's link model (``passes.comm``), the
coordination from the measured ``horovod negotiate`` spans. The cycle grid starts at the
window's first step (Horovod's real phase is arbitrary: a single step can land up to a cycle
earlier or later; averaged over steps it washes out).

Not modelled: CPU contention between Horovod's threads (background loop, gloo, the busy-waiting
``synchronize``) and compute on hosts with fewer cores than busy threads: the graph runs
communication beside compute, so on such hosts (2 ranks on 2 cores here) more, smaller responses
cost more than predicted when they fall inside backward, and the per-response cost is estimated
from the few responses the profiled setting made. Grouped all-reduce, Adasum, autotune, NCCL. A link what-if scales the
part of a ``horovod negotiate`` span that waited for a peer still receiving the previous response's tail (each rank's own
response ends, from Horovod's trace log: ``traces.horovod_log``, ``passes.comm``) and keeps the rest as measured; in a
run without that log (recorded before 2026-12-05, or with ``HOROVOD_LOG_LEVEL`` set by the job), and in the averaged
model (``passes.average_steps`` does not carry it), the whole span, as rank 0's timeline cannot tell the wire from a
descheduled peer (``bench/horovod/loop_gaps.py``). This pass's own cycles keep
the measured coordination.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import msgspec
import numpy as np

from ..costmodel.collectives import allreduce_us
from ..costmodel.topology import CollectiveSpec, allreduce_equivalent_factor
from ..errors import DagprofError
from ..graph.dag import DeviceKind, Graph, GraphBuilder
from ..graph.replay_result import ReplayResult
from ..traces.events import CommKind, CommRole, Kind
from ..traces.horovod import GROUP, LANE, REQUEST, tensor_collective
from .comm import current_scheme, current_topology
from .link_fit import find_collectives, fit_topology, graph_world_size

_MAX_ROUNDS = 6
_CYCLE = "horovod negotiate (cycle)"


@dataclass
class _Layout:
    """Where a Horovod graph keeps its pieces."""

    requests: dict[tuple[int, int, str], int]  # (step, rank, tensor) -> request node
    sinks: dict[tuple[int, int], list[int]]  # (step, rank) -> nodes that wait for the step's responses
    lanes: dict[int, int]  # rank -> background-thread device
    channel: int  # the transfers' device
    drop: np.ndarray  # background-thread nodes, joins and transfers: rebuilt by the pass
    ranks: list[int]
    tensor_bytes: dict[str, int]
    order: dict[str, int]  # response-cache position
    fuse_key: dict[str, tuple[str, str]]  # tensor -> (collective, dtype): Horovod fuses a response with others of the same only


@dataclass
class _Costs:
    negotiate_us: float
    copy_in: dict[bool, tuple[float, float]]  # fused? -> (us, us per byte)
    copy_out: dict[bool, tuple[float, float]]

    def copy(self, which: dict[bool, tuple[float, float]], nbytes: int, fused: bool) -> float:
        a, b = which[fused]
        return a + b * nbytes


@dataclass
class _Cycle:
    start: float
    gap: float  # start minus the later of its requests' readiness and the previous busy cycle's end
    responses: list[list[str]] = field(default_factory=list)
    step: int = -1


def crowded_hosts(g: Graph) -> list[str]:
    """Hosts of a Horovod job where the ranks' main and background threads outnumber the cores they share
    (``GraphMeta.crowded_groups``). Horovod's ``synchronize()`` spins a core while it waits (a 2-rank gloo job's waiting
    rank burned 2.0 s of CPU in a 3 s wait), so there a rank's wait takes cores from the other ranks' compute, and a
    what-if that lengthens the waits slows that compute too. A rank pinned alone to its cores takes them from no other
    rank (its own compute has ended when it waits), so only groups of ranks that share cores count."""
    if g.meta.horovod is None:
        return []
    return g.meta.crowded_hosts(2, among_ranks=True)


def set_horovod(g: Graph, replayer: Callable[[Graph], ReplayResult], fusion_bytes: float | None = None,
                cycle_ms: float | None = None) -> Graph:
    """The run's graph as Horovod would execute it with this fusion threshold (bytes) and cycle time (ms).

    ``replayer`` is ``dagprof.replay.replay`` (passes sit below the replay layer, so the caller hands it in).
    """
    hv = g.meta.horovod
    if hv is None:
        raise DagprofError("are Horovod settings; this run was not profiled with "
                           "dagprof.collect.horovod (no Horovod requests or timeline in it)", "--fusion-mb/--cycle-ms")
    threshold = float(hv.fusion_threshold_bytes or 0) if fusion_bytes is None else float(fusion_bytes)
    cycle_us = 1e3 * float(hv.cycle_time_ms or 0) if cycle_ms is None else 1e3 * float(cycle_ms)
    if threshold < 0 or cycle_us < 0:
        raise DagprofError(f"fusion threshold and cycle time must be >= 0, got {threshold} B and {cycle_us / 1e3} ms")
    grouped = sum(t.startswith("grouped_") for t in hv.tensor_bytes)
    if grouped:  # Horovod negotiates and fuses a group as one, which the cycle simulation does not do
        raise DagprofError(f"not modelled: {grouped} gradients were all-reduced in explicit groups (DistributedOptimizer(groups=...)), "
                           "which Horovod negotiates and fuses as units; profile without groups to simulate other fusion thresholds "
                           "and cycle times", "--fusion-mb/--cycle-ms")
    lay = _layout(g)
    costs = _fit_costs(g, lay)
    topo, spec = current_topology(g), current_scheme(g)
    price = _transfer_price(g, lay, topo, spec)
    cur, plan = g, None
    for _ in range(_MAX_ROUNDS):
        res = replayer(cur)
        origin = float(res.start[cur.kind == Kind.STEP].min())
        new = _simulate(_ready(cur, res), lay, threshold, cycle_us, costs, price, origin)
        if plan is not None and _same(plan, new):
            break
        plan = new
        cur = _rebuild(g, lay, plan, costs, price)
    out = cur  # transfers keep the prices above (retime_collectives would re-price them by the link model alone)
    out.meta.horovod = msgspec.structs.replace(hv, fusion_threshold_bytes=int(threshold), cycle_time_ms=cycle_us / 1e3, predicted=True)
    return out


def _layout(g: Graph) -> _Layout:
    lanes = {d.rank: i for i, d in enumerate(g.devices) if d.name.endswith("/" + LANE) and d.rank >= 0}
    channel = next((i for i, d in enumerate(g.devices) if d.kind == DeviceKind.COMM and d.name == f"group {GROUP}"), -1)
    if not lanes or channel < 0:
        raise DagprofError("the run has no Horovod responses to regroup (was the Horovod timeline recorded?)")
    drop = np.isin(g.device, list(lanes.values())) | (g.role == CommRole.NEGOTIATION)  # the negotiations' joins, an earlier regrouping's cycles
    for c in find_collectives(g):
        if g.device[c.comm] == channel:
            drop[c.comm] = True
            if c.sync >= 0:
                drop[c.sync] = True
    requests: dict[tuple[int, int, str], int] = {}
    sizes: dict[str, int] = dict(g.meta.horovod.tensor_bytes)
    for v in np.flatnonzero(g.kind == Kind.COMM_ENQUEUE).tolist():
        _, _, name = g.node_name(v).partition(".")
        if name.startswith(REQUEST):
            t = name[len(REQUEST):]
            requests[(int(g.step[v]), int(g.rank[v]), t)] = v
            sizes.setdefault(t, int(g.nbytes[v]))
    if not requests:
        raise DagprofError("the run's graph has no Horovod requests (COMM_ENQUEUE 'horovod request ...' nodes)")
    sinks: dict[tuple[int, int], list[int]] = defaultdict(list)
    for u in np.flatnonzero(drop).tolist():
        for v in g.successors(u).tolist():
            if not drop[v] and g.rank[v] >= 0 and v not in sinks[(int(g.step[v]), int(g.rank[v]))]:
                sinks[(int(g.step[v]), int(g.rank[v]))].append(v)
    order = {t: k for k, t in enumerate(g.meta.horovod.tensor_order)}
    for (_, _, t), _v in sorted(requests.items(), key=lambda kv: g.order[kv[1]]):
        order.setdefault(t, len(order))
    dtypes = g.meta.horovod.tensor_dtypes
    fuse_key = {t: (tensor_collective(t), dtypes.get(t, "")) for t in sizes}
    return _Layout(requests, dict(sinks), lanes, channel, drop, sorted(lanes), sizes, order, fuse_key)


def _equivalent_bytes(tensors: list[str], sizes: dict[str, int]) -> float:
    """The bytes of the ring all-reduce that costs what this response costs (an all-gather: half its gathered bytes)."""
    return sum(sizes.get(t, 0) for t in tensors) * allreduce_equivalent_factor(CommKind.of(tensor_collective(tensors[0])))


def _measured(g: Graph) -> np.ndarray:
    """Rank 0's measured responses in the graph's steps: rows (step, position, bytes, transfer us, coordination us or -1)."""
    steps = set(g.meta.steps)
    rows = [r for r in g.meta.horovod.measured if r[0] in steps]
    return np.asarray(rows, dtype=float).reshape(-1, 5)


def _transfer_price(g: Graph, lay: _Layout, topo, spec: CollectiveSpec):
    """us for a fused all-reduce of ``nbytes`` (all-reduce-equivalent: ``_equivalent_bytes``): the profile's own
    transfers, fitted to reproduce their total.

    A profile's transfers on a busy host have a heavy tail (a rank's thread waits to be scheduled):
    a fit that reproduces their sum, not their typical value, is what predicts the time of many
    more (no fusion) or fewer (more fusion) of them. Other what-ifs (link, scheme, workers) act
    through the ratio of the graph's link model now to the one the profiled transfers fit.
    """
    m = _measured(g)
    if len(m) < 2:
        return lambda nbytes: allreduce_us(nbytes, topo, spec)
    factor = {(int(g.step[c.comm]), int(g.bucket[c.comm])): allreduce_equivalent_factor(CommKind(int(g.comm_kind[c.comm])))
              for c in find_collectives(g) if g.device[c.comm] == lay.channel}
    a, b = _line(m[:, 2] * np.array([factor.get((int(s), int(k)), 1.0) for s, k in m[:, :2]]), m[:, 3])
    n0 = int(g.meta.horovod.world_size or graph_world_size(g))
    profiled = fit_topology(g.replace(dur=_restore_transfers(g, lay, m), meta=g.meta.replace(world_size=n0)))

    def price(nbytes: float) -> float:
        ref = allreduce_us(nbytes, profiled, CollectiveSpec())
        return (a + b * nbytes) * (allreduce_us(nbytes, topo, spec) / ref if ref > 0 else 1.0)

    return price


def _restore_transfers(g: Graph, lay: _Layout, m: np.ndarray) -> np.ndarray:
    """The graph's durations with its Horovod transfers back at their measured values."""
    dur = g.dur.copy()
    measured = {(int(s), int(k)): us for s, k, _, us, _ in m}
    for c in find_collectives(g):
        key = (int(g.step[c.comm]), int(g.bucket[c.comm]))
        if g.device[c.comm] == lay.channel and key in measured:
            dur[c.comm] = measured[key]
    return dur


def _line(nbytes: np.ndarray, dur: np.ndarray) -> tuple[float, float]:
    """us = a + b * bytes by least squares (which reproduces the measured total); never negative.

    Few samples, one size or a negative slope (noise swamps the size effect): the mean, flat.
    """
    if not len(dur):
        return 0.0, 0.0
    if len(dur) < 3 or np.ptp(nbytes) == 0:
        return float(np.mean(dur)), 0.0
    b, a = np.polyfit(nbytes.astype(float), dur, 1)
    if b < 0:
        return float(np.mean(dur)), 0.0
    if a < 0:
        return 0.0, float(dur.sum() / max(nbytes.sum(), 1))
    return float(a), float(b)


def _fit_costs(g: Graph, lay: _Layout) -> _Costs:
    names = np.array([g.names[i] for i in g.name])
    ref = lay.lanes[min(lay.lanes)]  # rank 0's lane holds the timeline's own measurements
    mine = g.device == ref

    def fit(label_fused: str, label_single: str) -> dict[bool, tuple[float, float]]:
        out = {}
        for fused, label in ((True, label_fused), (False, label_single)):
            m = mine & np.char.endswith(names, label)
            out[fused] = _line(g.nbytes[m], g.dur[m])
        if not np.any(mine & np.char.endswith(names, label_fused)):
            out[True] = out[False]
        if not np.any(mine & np.char.endswith(names, label_single)):
            out[False] = out[True]
        return out

    coordination = _measured(g)[:, 4]
    coordination = coordination[coordination >= 0]
    return _Costs(float(coordination.mean()) if len(coordination) else 0.0,
                  fit("horovod memcpy in", "horovod copy in"), fit("horovod memcpy out", "horovod copy out"))


def _ready(g: Graph, res) -> dict[tuple[int, int, str], float]:
    out = {}
    for v in np.flatnonzero(g.kind == Kind.COMM_ENQUEUE).tolist():
        _, _, name = g.node_name(v).partition(".")
        if name.startswith(REQUEST):
            out[(int(g.step[v]), int(g.rank[v]), name[len(REQUEST):])] = float(res.end[v])
    return out


def _simulate(ready: dict[tuple[int, int, str], float], lay: _Layout, threshold: float, cycle_us: float, costs: _Costs,
              price, origin: float) -> list[_Cycle]:
    """Horovod's loop over the requests: the busy cycles, each with the responses it executed."""
    per_step: dict[int, dict[str, float]] = defaultdict(dict)
    for (s, r, t), x in ready.items():
        if r in lay.lanes:
            per_step[s][t] = max(per_step[s].get(t, -math.inf), x)
    cycles: list[_Cycle] = []
    t_c = origin
    period = max(cycle_us, costs.negotiate_us, 1.0)
    busy_end = -math.inf  # end of the previous busy cycle's work
    for s in sorted(per_step):
        # the step's requests can only follow the previous step's last response (synchronize -> update -> backward)
        pending = {t: max(x, busy_end) for t, x in per_step[s].items()}
        while pending:
            first = min(pending.values())
            if first > t_c:
                t_c += math.ceil((first - t_c) / period) * period  # idle cycles (coordination only)
            now = sorted((t for t, x in pending.items() if x <= t_c), key=lambda t: lay.order.get(t, 0))
            responses = _fuse(now, lay.tensor_bytes, threshold, lay.fuse_key)
            latest = max(max(pending[t] for t in now), busy_end)
            cyc = _Cycle(t_c, max(t_c - latest, 0.0), responses, s)
            work = costs.negotiate_us
            for resp in responses:
                nb = sum(lay.tensor_bytes.get(t, 0) for t in resp)
                fused = len(resp) > 1
                work += costs.copy(costs.copy_in, nb, fused) + price(_equivalent_bytes(resp, lay.tensor_bytes)) + costs.copy(costs.copy_out, nb, fused)
            cycles.append(cyc)
            busy_end = t_c + work
            for t in now:
                del pending[t]
            t_c = max(t_c + cycle_us, busy_end) if cycle_us > 0 else busy_end
    return cycles


def _fuse(tensors: list[str], sizes: dict[str, int], threshold: float, key: dict[str, tuple[str, str]] | None = None) -> list[list[str]]:
    """Horovod's FuseResponses: tensors in order, each joining the latest response of its collective and dtype (``key``;
    none: all alike) while that response's total stays <= threshold."""
    out: list[list[str]] = []
    latest: dict[tuple[str, str], tuple[int, float]] = {}  # key -> (its latest response, that response's bytes)
    for t in tensors:
        k, nb = (key or {}).get(t, ("", "")), sizes.get(t, 0)
        at, total = latest.get(k, (-1, 0.0))
        if at >= 0 and total + nb <= threshold:
            out[at].append(t)
            latest[k] = (at, total + nb)
        else:
            latest[k] = (len(out), nb)
            out.append([t])
    return out


def _same(a: list[_Cycle], b: list[_Cycle]) -> bool:
    return [(c.step, c.responses) for c in a] == [(c.step, c.responses) for c in b] and \
        all(abs(x.start - y.start) < 1.0 for x, y in zip(a, b))


def _rebuild(g: Graph, lay: _Layout, plan: list[_Cycle], costs: _Costs, price) -> Graph:
    b, remap = GraphBuilder.from_graph(g, ~lay.drop)
    last_post: dict[int, int] = {}  # rank -> the previous response's memcpy out (lane order, lock-step cycles)
    position: dict[int, int] = defaultdict(int)
    for cyc in plan:
        s = cyc.step
        neg = b.add_node(_CYCLE, Kind.OTHER, dur=costs.negotiate_us, gap=cyc.gap, order=cyc.start, step=s, role=CommRole.NEGOTIATION)
        for t in (t for resp in cyc.responses for t in resp):
            for r in lay.ranks:
                v = lay.requests.get((s, r, t))
                if v is not None:
                    b.add_edge(int(remap[v]), neg)
        for u in last_post.values():
            b.add_edge(u, neg)
        t = cyc.start + costs.negotiate_us
        for k, resp in enumerate(cyc.responses):
            nb = sum(lay.tensor_bytes.get(x, 0) for x in resp)
            fused = len(resp) > 1
            d_in, d_out = costs.copy(costs.copy_in, nb, fused), costs.copy(costs.copy_out, nb, fused)
            d_ar = price(_equivalent_bytes(resp, lay.tensor_bytes))
            pos = position[s]
            position[s] += 1
            op = tensor_collective(resp[0])
            sync = b.add_node(f"sync.horovod {op}", Kind.SYNC, order=t + d_in, step=s, bucket=pos)
            label = resp[0].partition(".")[2] + (f" +{len(resp) - 1}" if fused else "")
            comm = b.add_node(f"horovod {op} {label}", Kind.COMM, device=lay.channel, dur=d_ar, order=t + d_in, step=s,
                              bucket=pos, nbytes=nb, comm_kind=CommKind.of(op))
            b.add_edge(sync, comm)
            for r in lay.ranks:
                prep = b.add_node(f"rank{r}.horovod {'memcpy' if fused else 'copy'} in", Kind.MEMCPY, rank=r, device=lay.lanes[r],
                                  dur=d_in, order=t, step=s, bucket=pos, nbytes=nb)
                b.add_edge(neg if k == 0 else last_post[r], prep)
                if k == 0 and r in last_post:
                    b.add_edge(last_post[r], prep)
                b.add_edge(prep, sync)
                post = b.add_node(f"rank{r}.horovod {'memcpy' if fused else 'copy'} out", Kind.MEMCPY, rank=r, device=lay.lanes[r],
                                  dur=d_out, order=t + d_in + d_ar, step=s, bucket=pos, nbytes=nb)
                b.add_edge(comm, post)
                for v in lay.sinks.get((s, r), []):
                    b.add_edge(post, int(remap[v]))
                last_post[r] = post
            t += d_in + d_ar + d_out
    return b.build()
