"""Events of a parameter-server job (``traces.mxnet``) -> one global graph with server lanes.

Per worker, each engine thread's depth-0 ops form a chain (program order) with step boundaries
on the main one, as in ``graph.build``. Per worker and step, the push/pull exchange is:

    last op before the first push -> issue(key k)   (no push starts before the exchange's first)
    backward op of key k's layer  -> issue(key k)   (the engine pushes a gradient once it is ready:
                                                     without ``waitall`` before ``trainer.step`` the
                                                     pushes overlap the rest of the backward pass)
    QuantizeCPU of key k          -> issue(key k)   (2-bit compression: the push sends the quantized
                                                     gradient; ``_quantize_of_keys``)
    issue(key k) -> push (worker's port out, then port psS in) -> psS sum+update
                 -> pull (port psS out, then the worker's port in) -> done(worker, step)
                    (where the pulls are ops of their own, ``PsRecord.pull_after_ack``: the push's acknowledgement
                    the same way, the pull op on the worker's main engine thread, its request back into psS,
                    then the pull: ``graph.collectives._pull_request``)
    done(worker, step) -> the first op that started after both the first push and the last backward
                          op (the pulled weights' copies, then the next step)
    pull of key k -> key in(worker, step, k) -> an op that began before the last pull was in (key k's
                          copy into the weights; off its thread's chain: ``_key_waits``, ``_thread_edges``)

for every part of every key, keys placed on servers as ps-lite does (``traces.mxnet.pslite_bytes``).
A row_sparse key (a ``SparseEmbedding``) pushes only its gradient's rows and is answered by an acknowledgement
(``add_ps_part(pull=False)``); its rows come back in the next forward, per worker and step:

    the Python thread's call before the pull call -> row pull issue -> request, rows (``add_ps_pull``) -> rows in -> the table's forward op

(the worker's Python thread chains from each step's mark through its calls that hand the engine work, points at their
starts, up to its last row pull call: the thread's own time is its gaps, not the engine's; an array's ``WaitForVar``
waits for the call it ran in: ``_front_plan``). A server answers a key's row pull only once it has applied the previous
step's pushes of that key; no edge of its own says so: that update's acknowledgement ends the worker's exchange, which
the next step's mark and so the pull wait for (measured, the pulls came 0.7 ms or more after the server's last update).

priced at the step's rows (``PsRecord.rows``) x (row width x dtype + an 8-byte key), a big table cut over the servers
by row-id range as ps-lite cuts it.
The server's sum waits for every worker's push, so a late worker delays everyone's pull, and the
workers' and servers' ports and the server CPUs are capacity-1 devices, so keys queue behind each
other there (a message crosses both ends' ports, in pipelined chunks). The
sub-graph is ``graph.collectives.add_ps_part``, the same one the ``ps:K`` what-if builds, so a
measured PS job and a predicted one are the same model. Push, pull and server times come from the
graph's link model (``meta.topology``, gamma = server work per byte received) and the server's time per key part
(``update_us``: its updater's Python); ``rebuild_ps``
re-places keys for another server count or link, and ``passes.comm.fit_ps_link`` fits the link's rate to
the measured exchanges (``meta.ps.exchange_us``; mx.profiler does not say which push
carries which key, so single messages cannot be timed).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec
import numpy as np

from ..costmodel.alphabeta import AlphaBeta
from ..costmodel.topology import CollectiveSpec, Scheme, Topology
from ..errors import DagprofError
from ..traces.events import CommKind, CommRole, Kind, LaneKind, RankTrace, Run
from ..traces.meta import PsKey, PsRecord, RowPull
from ..traces.mxnet import PS_INDEX_BYTES, QUANTIZE, pslite_bytes
from .build import chosen_steps, host_cpus, loop_steps, measured_iter_us, pinned_groups
from .collectives import add_ps_part, add_ps_pull, ps_devices
from .dag import DeviceKind, Graph, GraphBuilder, gaps_apart

ISSUE = "ps issue"
DONE = "ps done"
PULL_ISSUE = "ps row pull issue"  # a forward's row_sparse_pull of a key, per worker and step
PULLED = "ps rows in"  # its rows arrived: the key's forward op waits for it
KEY_IN = "ps key in"  # a key's pull arrived on a worker: what ran on it before the exchange's last pull (its copy) waits for it
ENGINE_IDLE = "engine idle"  # a main engine op's gap, waiting off the thread where the pulls are ops of their own


def build_ps_graph(run: Run, steps: range | None = None, link: AlphaBeta | None = None) -> Graph:
    ps = run.meta.ps
    if ps is None:
        raise DagprofError("not a parameter-server run (no server information)", run.source)
    chosen, said = chosen_steps(run, steps)
    n = run.world_size
    b = GraphBuilder()
    mstart: list[float] = []  # measured times on the shared clock (us), for the gaps
    mend: list[float] = []

    names: list[str] = []  # per node

    def node(name: str, kind: Kind, s: float, e: float, **kw) -> int:
        v = b.add_node(name, kind, dur=max(e - s, 0.0), order=s, **kw)
        mstart.append(s)
        mend.append(e)
        names.append(name)
        return v

    def front_lane(t: RankTrace, step: int, mark: int, calls: np.ndarray, pulls: list[_PullIn], engine: list[int]) -> list[tuple[int, int]]:
        """A worker's Python thread in a step as a chain of its own from the step's mark (``_front_plan``): its calls (points
        at their starts) and its row_sparse pull calls (``PULL_ISSUE`` nodes, whose time is the thread's since the call
        before); an array's ``WaitForVar`` after the call it ran in."""
        ev, base, r = t.events, t.base_ns / 1e3, t.rank
        spans = sorted((base + float(ev.start[i]), base + float(ev.start[i] + ev.dur[i]), ev.name_of(i)) for i in calls)
        plan, waits = _front_plan(spans, [p.issued for p in pulls], [(mstart[u], names[u]) for u in engine])
        out, nodes, prev = [], [], mark
        for is_pull, i in plan:
            if is_pull:
                p = pulls[i]
                v = node(PULL_ISSUE, Kind.COMM_ENQUEUE, min(mend[prev], p.issued), p.issued, rank=r, step=step, bucket=p.key)
                got = node(PULLED, Kind.SYNC, p.arrived, p.arrived, rank=r, step=step, bucket=p.key)
                out.append((got, p.consumer))
            else:  # the call's start (what it hands the engine may run before it returns), on no device: the thread's time
                # is its chain's gaps, and it holds no core a ``--cores`` what-if shares (its engine ops do)
                v = node(f"rank{r}.{spans[i][2]}", Kind.OTHER, spans[i][0], spans[i][0], rank=r, step=step)
            out.append((prev, v))
            nodes.append(v)
            prev = v
        return out + [(nodes[k], engine[j]) for k, j in waits]

    exchanges = []  # (step, worker, ready node, head node, issue offsets, first push, last pull)
    apart = False  # some worker's pulls are ops of their own
    row_pulls_in: list[_PullIn] = []
    edges: list[tuple[int, int]] = []
    first_marks = {}
    chains: list[list[int]] = []  # per worker and engine thread, its ops in measured order
    for t in run.ranks:
        ev, r, base = t.events, t.rank, t.base_ns / 1e3
        in_steps = np.isin(ev.step, chosen)
        spans = t.step_spans()
        spans = spans[np.isin(spans[:, 0].astype(int), chosen)]
        main = next(i for i, lane in enumerate(t.lanes) if lane.main)
        node_of: dict[int, int] = {}  # event -> node
        marks: dict[int, int] = {}  # step -> its opening mark: the Python thread at the step's start
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
                    marks[step] = v
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
            chains.append(chain)
            if lane_id == main:
                b.meta.main_device[r] = dev
        rows = ev.role == CommRole.ROWS
        row_pulls, pull_calls = (ev.kind == Kind.COMM) & rows, (ev.kind == Kind.COMM_ENQUEUE) & rows
        comm = in_steps & (ev.kind == Kind.COMM) & ~row_pulls
        calls = in_steps & (ev.kind == Kind.COMM_ENQUEUE) & ~pull_calls
        python = next((i for i, lane in enumerate(t.lanes) if lane.name == "python"), -1)
        front = in_steps & (ev.lane == python) & (ev.kind == Kind.OTHER)
        for step in chosen:
            at_step = in_steps & (ev.step == step)
            pulls_now = _row_pulls(t, ps.keys, np.flatnonzero(at_step & pull_calls), np.flatnonzero(at_step & row_pulls), step, node_of)
            row_pulls_in += pulls_now
            engine_now = sorted((node_of[int(i)] for i in np.flatnonzero(at_step) if int(i) in node_of), key=lambda v: mstart[v])
            edges += front_lane(t, step, marks[step], np.flatnonzero(at_step & front), pulls_now, engine_now)
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
            # a push and its pull are one op (``PUSH_PULL``), or two (a hand-written ``kv.push``/``kv.pull``, a compressed push)
            kinds = ev.comm_kind[mine]
            split = not (kinds == CommKind.PUSH_PULL).any() and (kinds == CommKind.PULL).any()
            sends = mine[kinds != CommKind.PULL]
            segment = _segment_of_keys(run.meta.ps.keys, grads, t.layers, [node_of[i] for i in backward if ev.layer[i] < 0],
                                       base + ev.start[sends], mend)
            quantized = _quantized(t, np.flatnonzero(at_step), node_of, mstart)
            # what the pushes wait for (and what ran before it on its thread) never waits for the pulls, even an op of no
            # duration that began within the 1 us tolerance after the first push (else the graph has a cycle)
            feeds = {ready, *grads.values(), *segment.values(), *quantized}
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
            # what ``_key_waits`` matches to keys by gradient ready: the pushes in start order, each carrying its pull; where the
            # pulls are ops of their own, the pulls in arrival order (a pull op begins when called: a list ``kv.pull`` calls
            # every key's at once, and the pushes are none of the ends the worker's ops wait for)
            answers = mine[kinds == CommKind.PULL] if split else mine
            arrived = base + ev.start[answers] + ev.dur[answers]
            exchanges.append((step, r, ready, grads | segment, quantized, sorted(set(head)), issued, first, last,
                              arrived if split else base + ev.start[answers], arrived))
            apart |= bool(split)
    keys = ps.keys
    spans = []  # measured exchange per worker and step: its first push issued -> its last pull in
    key_in: dict[tuple[int, int, int], int] = {}
    floating: set[int] = set()  # ops that wait for one key's pull: off their thread's chain (``_thread_edges``)
    for step, r, ready, grads, quantized, head, issued, first, last, push_starts, pull_ends in exchanges:
        t0 = mend[ready]
        spans.append((int(step), int(r), float(last - first)))
        calls = np.maximum(issued[: len(keys)] - t0, 0.0)
        if len(calls) < len(keys):
            calls = np.concatenate([calls, np.full(len(keys) - len(calls), calls[-1] if len(calls) else 0.0)])
        ready_at = [max(t0 + off, mend[grads[k.layer]] if k.layer in grads else -np.inf) for k, off in zip(keys, np.maximum.accumulate(calls))]
        quantize = _quantize_of_keys(ready_at, keys, quantized)
        for i, k in enumerate(keys):
            grad, q = grads.get(k.layer), quantize.get(i)
            at = max(ready_at[i], mend[q]) if q is not None else ready_at[i]
            v = node(ISSUE, Kind.COMM_ENQUEUE, at, at, rank=r, step=step, bucket=k.key)
            edges += [(ready, v)] + [(u, v) for u in (grad, q) if u is not None]
        done = node(DONE, Kind.SYNC, last, last, rank=r, step=step)
        for h, wait in zip(head, _key_waits(keys, ready_at, push_starts, pull_ends, [mstart[h] for h in head], last)):
            if wait is None:
                edges.append((done, h))
                continue
            key, at = wait
            if key < 0:  # it ran before any pull was in: it waits for none
                continue
            if (step, r, key) not in key_in:
                key_in[(step, r, key)] = node(KEY_IN, Kind.SYNC, at, at, rank=r, step=step, bucket=key)
            edges.append((key_in[(step, r, key)], h))
            floating.add(h)
    edges += _thread_edges(chains, floating)
    row_pull_us = [RowPull(p.step, p.worker, p.key, p.arrived - p.issued) for p in row_pulls_in]
    b.add_edges([u for u, _ in edges], [v for _, v in edges])
    g = b.build()
    gap = _gaps(g, np.asarray(mstart), np.asarray(mend), first_marks)
    gap[list(floating)] = 0.0  # ``_key_waits``: the thread's time beside the pulls stays hidden by them
    servers = ps.num_servers
    link = link or initial_link(run)
    g = g.replace(gap=gap)
    g.meta = g.meta.replace(
        world_size=n, ranks=[t.rank for t in run.ranks], steps=chosen, backend="ps-lite", framework=ps.framework, source=run.source,
        measured_iter_us={t.rank: measured_iter_us(t, chosen) for t in run.ranks},
        ps=msgspec.structs.replace(ps, exchange_us=spans, row_pull_us=row_pull_us, pull_after_ack=apart),
        scheme=CollectiveSpec(Scheme.PS, servers), topology=Topology.flat(n, link), buckets=(), host_cpus=host_cpus(run), pinned_groups=pinned_groups(run),
        loop_steps=loop_steps(run), warnings=said,
    )
    if apart:  # a pull op takes its engine thread while the thread waits for work, not after that wait
        g = gaps_apart(g, np.flatnonzero(np.isin(g.device, list(g.meta.main_device.values()))), ENGINE_IDLE)
    return rebuild_ps(g, servers, link)


@dataclass(frozen=True)
class _PullIn:
    """A row_sparse key's pull on a worker in a step, as measured (us on the shared clock) and where it joins the graph."""

    step: int
    worker: int
    key: int
    issued: float  # its call
    arrived: float  # its rows in
    consumer: int  # the key's first forward op, which waits for the rows


def _row_pulls(t: RankTrace, keys: list[PsKey], calls: np.ndarray, pulls: np.ndarray, step: int, node_of: dict) -> list[_PullIn]:
    """Each row_sparse key's pull in a step.

    Gluon pulls a SparseEmbedding's rows (``row_sparse_pull``) as its forward begins, in model order: the step's i-th pull
    call is the i-th row_sparse key in layer order, and the first forward op of that key's layer waits for the rows; what
    ran on the main engine thread before the call does not. mx.profiler names no key, and the pulls in flight together
    may end (and start) in either order: a key's pull is the earliest-started one left that ended before its forward op
    began (the one that ended first where none did)."""
    sparse = sorted((k for k in keys if k.row_bytes), key=lambda k: t.layers.index(k.layer) if k.layer in t.layers else len(t.layers))
    if not sparse:
        return []
    ev, base = t.events, t.base_ns / 1e3
    if not len(calls) == len(pulls) == len(sparse):
        raise DagprofError(f"worker {t.rank} step {step}: {len(calls)} row_sparse pull calls and {len(pulls)} pulls for {len(sparse)} row_sparse keys "
                           "(a forward that pulls a table twice, or not at all, is not modelled)", t.source)
    forward = np.flatnonzero((ev.step == step) & (ev.kind == Kind.FORWARD) & (ev.layer >= 0))
    left = sorted((int(i) for i in pulls), key=lambda i: ev.start[i])
    end = {i: float(ev.start[i] + ev.dur[i]) for i in left}
    out = []
    for k, call in zip(sparse, sorted(calls, key=lambda i: ev.start[i])):
        at = base + float(ev.start[call])
        mine = [int(i) for i in forward if t.layers[int(ev.layer[i])] == k.layer and int(i) in node_of]
        consumer = min(mine, key=lambda i: ev.start[i], default=None)
        if consumer is None:
            raise DagprofError(f"worker {t.rank} step {step}: no forward op of {k.layer} (row_sparse key {k.key}) after its pull", t.source)
        pull = next((i for i in left if end[i] <= ev.start[consumer] + 1.0), min(left, key=end.get))
        left.remove(pull)
        out.append(_PullIn(step, t.rank, k.key, at, base + end[pull], node_of[consumer]))
    return out


def _front_plan(calls: list[tuple[float, float, str]], pulls: list[float], engine: list[tuple[float, str]]
                ) -> tuple[list[tuple[bool, int]], list[tuple[int, int]]]:
    """A worker's Python thread in a step: which of its calls (``calls``: start, end, C-API name, in order) and row_sparse
    pull calls (``pulls``: their starts) go on its chain, in order, as (is a pull, index); and which engine ops (``engine``:
    start, name) wait for which of them, as (position on the chain, index in ``engine``).

    MXNet's front end hands the engine each operator and goes on; the engine runs it once what it reads is ready. The
    thread's own time (dispatch, autograd, numpy) up to a row_sparse pull call is the pull's lead, and it is the thread's,
    not the engine's: tied to the engine op that ran last before the call, it was a ``WaitForVar`` in one step and the
    weights' copies in another, each averaged with twins that ran elsewhere (``mx_sparse_mf.py``: the averaged replay +3.5
    and +3.1 % on two fresh runs whose per-step replays were within 0.1 %). On the chain, from the step's mark, each call's
    time since the one before is a gap of the thread, the same call in every step. An array's ``WaitForVar`` runs inside
    the call that filled it from numpy (``MXNDArraySyncCopyFromCPU``) and waits for it; the other engine ops keep their
    thread's measured order (each after its k-th operator call, or the backward pass's after the backward call, was tried:
    the averaged replay of the dense user fixtures moved up to +2.5 points, the calls' time then averaged beside the
    engine's instead of where it held the engine up). The chain ends at the step's last pull call: a step without one
    keeps the engine's order alone (tied to their calls, the ``WaitForVar`` ops of ``mx_gru_forecast.py``, which pulls
    no rows, moved a worker's averaged replay +0.7 -> +1.2 %)."""
    items = sorted([(c[0], False, i) for i, c in enumerate(calls)] + [(at, True, j) for j, at in enumerate(pulls)])
    last = max((k for k, (_, is_pull, _) in enumerate(items) if is_pull), default=-1)
    items = items[:last + 1]
    waits = []
    for j, (start, name) in enumerate(engine):
        if name.split(".", 1)[-1] != "WaitForVar":
            continue
        inside = next((k for k, (at, is_pull, i) in enumerate(items) if not is_pull and at <= start + 1.0 <= calls[i][1] + 2.0), None)
        if inside is not None:
            waits.append((inside, j))
    return [(is_pull, i) for _, is_pull, i in items], waits


def _thread_edges(chains: list[list[int]], floating: set[int]) -> list[tuple[int, int]]:
    """Each engine thread's program order: its ops in a chain, but an op in ``floating`` (a pulled key's copy, waiting for
    that key's pull) only after the chain's op before it and before the one after it. The engine runs a copy as its key's
    pull comes in, whichever pull that is: kept in the measured order, a copy whose pull the replay brings in later than
    measured held the copies after it (a fresh ``mx_mlp.py`` profile's worker, a 3.2 ms copy under load: +3.7 ms on a
    step whose 1.6 MB key's pull the replay brought in last, the measured run's 7 ms before the last)."""
    out = []
    for chain in chains:
        prev, pending = None, []
        for v in chain:
            if v in floating:
                out += [(prev, v)] if prev is not None else []
                pending.append(v)
                continue
            out += [(u, v) for u in pending] or ([(prev, v)] if prev is not None else [])
            prev, pending = v, []
    return out


def _key_waits(keys: list[PsKey], ready_at: list[float], push_starts: np.ndarray, pull_ends: np.ndarray, starts: list[float],
               last: float) -> list[tuple[int, float] | None]:
    """Per op that waits for a worker's exchange (measured ``starts``): (the key whose pull it waits for, that pull's
    measured end), (-1, 0) for none (it began before any pull ended), or None for the exchange's last pull (``DONE``).

    The worker copies each pulled key into its weights as that key's pull arrives, while the others are still in flight
    (a user's ``backward(); trainer.step()``: 14 copies, the first 16 ms before the last pull on ``mx_mlp.py``); made to
    wait for the last pull, they all ran after it, back to back, and the profiled run replayed 2-4 % long. An op that
    began before the last pull ended waits for the latest pull that had ended by then (before any had: for none; the
    ``DeleteVariable`` ops right after the backward held the engine thread's every copy behind the last pull). mx.profiler names no push's key:
    the engine pushes a key once its gradient is ready, so the i-th push to start is the i-th key by gradient ready
    (``ready_at``), ties in key order (the trainer's priority). With a push count other than the key count, or a
    row_sparse key (its pull is an acknowledgement), the op waits for the last pull.

    Such an op keeps no gap: its thread's time since the pull before it (an engine thread descheduled under load, or a
    pull of another key than the one assumed) ran beside the pulls still in flight, hidden by them. Kept, it came after
    the assumed key's pull wherever the replay brought that pull in later than measured: a fresh profile's first copy,
    4.8 ms after the pull that ended 21 ms before the last, waited for the 1.6 MB key the replay brings in last (+5.7 %
    where main's model was +2.6 %; +2.2 % without the gap); a burst of copies the thread ran back to back once it got the
    core again, each keeping its wait since its pull (about 1 ms), serialised: +11 ms on a step."""
    if len(push_starts) != len(keys) or not len(keys):
        return [None] * len(starts)
    by_ready = sorted(range(len(keys)), key=lambda i: (ready_at[i], keys[i].key))
    pushes = np.argsort(push_starts, kind="stable")
    key_of = {int(p): keys[i] for p, i in zip(pushes, by_ready)}
    out: list[tuple[int, float] | None] = []
    for s in starts:
        arrived = np.flatnonzero(pull_ends <= s + 1.0)
        p = int(arrived[np.argmax(pull_ends[arrived])]) if len(arrived) else -1
        k = key_of.get(p)
        if s >= last - 1.0 or (k is not None and k.row_bytes):
            out.append(None)
        else:
            out.append((-1, 0.0) if k is None else (k.key, float(pull_ends[p])))
    return out


def _quantized(t: RankTrace, at_step: np.ndarray, node_of: dict, mstart: list[float]) -> list[int]:
    """A worker's ``QuantizeCPU`` nodes in a step (``traces.mxnet.QUANTIZE``: a 2-bit compressed gradient), in start order."""
    ev = t.events
    mine = [node_of[int(i)] for i in at_step if int(i) in node_of and ev.name_of(i) == QUANTIZE]
    return sorted(mine, key=lambda v: mstart[v])


def _quantize_of_keys(ready_at: list[float], keys: list[PsKey], quantized: list[int]) -> dict[int, int]:
    """Key index -> the ``QuantizeCPU`` node its compressed push waits for: MXNet quantizes a key's gradient into its
    compressed buffer on the engine once the gradient is ready, and pushes that buffer (``KVStoreDist::PushCompressed``).
    mx.profiler names no key: the engine quantizes in the order the gradients became ready (ties in key order, the
    trainer's priority), as it pushes (``_key_waits``), so the i-th quantize to start is the i-th key by ``ready_at``.
    {} where the step's quantize count is not the dense key count (an uncompressed job: none)."""
    dense = [i for i, k in enumerate(keys) if not k.row_bytes]
    if len(quantized) != len(dense):
        return {}
    by_ready = sorted(dense, key=lambda i: (ready_at[i], keys[i].key))
    return dict(zip(by_ready, quantized))


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
    """A first link model before fitting (``passes.comm.fit_ps_link``): the shortest push/pull or row pull is one small
    round trip less the server's update it held (``_round_trip``; alpha per message); the mean exchange moves every byte in and out of one server port;
    gamma is the servers' engine time per byte received (their copies, sums and ``*_update`` ops: the rest of their busy time
    is per key part, ``update_us``)."""
    ps = run.meta.ps
    durs = np.concatenate([t.events.dur[t.events.kind == Kind.COMM] for t in run.ranks])
    rows = np.concatenate([t.events.dur[(t.events.kind == Kind.COMM) & (t.events.role == CommRole.ROWS)] for t in run.ranks])
    exchanges = np.concatenate([t.events.dur[(t.events.kind == Kind.COMM) & (t.events.role != CommRole.ROWS)] for t in run.ranks])
    trips = ([_round_trip(ps, float(exchanges.min()))] if len(exchanges) else []) + ([float(rows.min())] if len(rows) else [])
    alpha = min(trips) / 2 if trips else 0.0
    step = ps.rows[0][0] if ps.rows else -1
    parts = [p for k in ps.keys for p in pslite_bytes(ps, k, step, 1)]
    moved = sum(push + pull for _, push, pull in parts)  # a step's pushes and pulls
    per_worker = sum(pull for _, _, pull in parts)  # the values the servers sum and update (a compressed push's decompressed)
    total = moved * run.world_size / max(ps.num_servers, 1)
    beta = max(float(np.median(durs)) - 2 * alpha, 1.0) / max(total, 1.0) if len(durs) else 1e-3
    busy = ps.server_busy
    handled = per_worker * run.world_size * len({s.step for s in busy})
    gamma = sum(s.ops_us for s in busy) / handled if busy and handled else 0.0
    return AlphaBeta(alpha, beta, gamma)


def _round_trip(ps: PsRecord, shortest: float) -> float:
    """The wire's round trip in the shortest push/pull (us; a row_sparse pull waits for no update): ps-lite answers a
    ``dist_sync`` push only once every worker's is in and the key updated, so that op held a server's work on its key too, which the graph prices on the server
    (``update_us``, its least step). Taken for latency, it came twice on every key: a fresh ``mx_deepfm_workers.py``
    profile's shortest push/pull, 567 us, held about 420 us of ftrl updater; its exchanges replayed long at an infinitely
    fast link, the profiled run +0.9 to +2.1 % on all 5 runs (docs/evidence.md). At least a tenth of it."""
    steps = sorted({b.step for b in ps.server_busy})
    least = min((update_us(ps, s) for s in steps), default=0.0)
    return max(shortest - least, shortest / 10)


def update_us(ps: PsRecord, step: int | None = None) -> float:
    """A server's time per key part it updates beside its engine's time per byte (``initial_link``'s gamma): the key handed
    to the updater and the updater's Python between its engine calls, which no byte count prices (``mx_sparse_mf.py``'s
    dense AdaGrad: 1-1.5 ms a key of 4 B to 16 kB). The mean over the profiled servers in ``step``: a load that comes in
    one step slows that step's updates (a fresh ``mx_fasttext_sparse.py`` profile: 28, 6 and 4 ms of server work in its 3
    steps, priced at their mean +7.0 % off, its link fitted infinitely fast); over every step where ``step`` is None or not
    profiled. A part costs it on any server count, link and worker count: ``mx_sparse_mf.py``'s server, on its CPU clock,
    was busy 10.1-13.1 ms a step with 3 workers and 9.4-13.2 with 2, and the work between its updates came to 0.24-0.28 ms
    a part with 3 (0.08-0.09 a push) and 0.25-0.33 with 2 (0.12-0.17 a push): ps-lite's work per push did not add up
    per worker; with 4 its time a part (less the engine's) was 1.33 ms against 1.2 with 2 (medians, load 20-26), half
    of a push's work more per worker (docs/evidence.md)."""
    rows = [b for b in ps.server_busy if b.step == step] or ps.server_busy
    parts = sum(b.updates for b in rows)
    return max(sum(b.busy_us - b.ops_us for b in rows), 0.0) / parts if parts else 0.0


def ops_factor(ps: PsRecord, step: int) -> float:
    """The servers' engine time per byte received in ``step`` against their mean over the profiled steps (``initial_link``'s
    gamma), as ``update_us`` keeps each step's updater time: a load that comes in one step slows that step's sums and
    ``*_update`` ops. At the mean, a fresh ``mx_deepfm_workers.py`` profile's server ops of 6.3-6.8 ms a step, and 12.6 in
    the step the load came, were priced 7.7 ms each: its quiet steps' exchanges replayed 0.7-1.9 ms long at an infinitely
    fast link, the profiled run +0.9 to +2.1 % on all 5 runs (docs/evidence.md). 1 for a step not profiled."""
    busy = ps.server_busy
    if not any(b.step == step for b in busy):
        return 1.0
    steps = sorted({b.step for b in busy})
    per_byte = {}
    for s in steps:
        moved = sum(nb for k in ps.keys for _, _, nb in pslite_bytes(ps, k, s, 1))
        per_byte[s] = sum(b.ops_us for b in busy if b.step == s) / moved if moved > 0 else 0.0
    mean = float(np.mean(list(per_byte.values())))
    return per_byte[step] / mean if mean > 0 else 1.0


def scale_server_work(g: Graph, factor: float) -> Graph:
    """``g`` with its servers' host work times ``factor``: their time per key part (``update_us``), in the record
    ``rebuild_ps`` prices from and on the servers' nodes, and each row_sparse pull's time beyond the wire (``PsLinkFit``,
    the serve nodes). The profiler's cost on the servers (``passes.profiler_cost.scale_host_work``): their updater runs
    in Python, traced call by call as the workers are, and a pull waits for it and for busy cores. Their engine's ops
    (gamma) keep their measured times, as the workers' communication does."""
    ps, fit = g.meta.ps, g.meta.ps_link_fit
    if ps is None or factor == 1.0:
        return g
    cpu = np.array([_is_ps_device(d.name) and d.name.endswith(" cpu") for d in g.devices] + [False])
    dur = g.dur.copy()
    on = np.flatnonzero(cpu[g.device])
    steps, at = np.unique(g.step[on], return_inverse=True)
    dur[on] = np.maximum(dur[on] - np.array([update_us(ps, int(s)) for s in steps])[at] * (1.0 - factor), 0.0)
    dur[np.char.find(np.asarray(g.names, dtype=str)[g.name], " serve w") >= 0] *= factor
    meta = g.meta.copy()
    meta.ps = msgspec.structs.replace(ps, server_busy=[msgspec.structs.replace(b, busy_us=b.ops_us + (b.busy_us - b.ops_us) * factor)
                                                       for b in ps.server_busy])
    if fit is not None:
        meta.ps_link_fit = replace(fit, row_pull_extra_us=tuple(p._replace(us=p.us * factor) for p in fit.row_pull_extra_us))
    return g.replace(dur=dur, meta=meta)


def is_ps_graph(g: Graph) -> bool:
    return g.meta.ps is not None


def engine_idle(g: Graph) -> np.ndarray:
    """Mask of the main engine's gaps that wait off the thread (``ENGINE_IDLE``): the framework's work on a shared core
    (``passes.compute.share_cores``), though not the engine thread's."""
    named = [i for i, n in enumerate(g.names) if n.endswith(f" ({ENGINE_IDLE})")]
    return np.isin(g.name, named) & (g.device < 0)


def exchange_nodes(g: Graph) -> np.ndarray:
    """Mask of the push/sum/pull sub-graphs (``add_ps_part``): nodes on ports and server CPUs, the device-less latency of
    each message and a pull op on a worker's engine (every ``Kind.COMM`` node: the measured push/pull ops are none); the
    workers' own ops, issues and dones are not."""
    ps_dev = np.array([_is_ps_device(d.name) for d in g.devices] + [False])
    return ps_dev[g.device] | (g.kind == Kind.COMM)


def rebuild_ps(g: Graph, servers: int, link: AlphaBeta, row_pull_extra_us: dict | None = None, row_pull_beta_ratio: float | None = None,
               step_factors: dict[int, float] | None = None) -> Graph:
    """The graph with every key's push/sum/pull placed on ``servers`` servers and priced by ``link``; each row_sparse pull
    takes ``row_pull_extra_us[(step, worker, key)]`` beyond its wire, by default the fitted ones (``PsLinkFit``). The pulls'
    wire is ``row_pull_beta_ratio`` of the fitted link's time per byte: at a link that much slower per byte than the fitted
    one, every byte takes the difference longer; at a faster one, the ratio of the link's. Step ``s``'s exchanges move
    their bytes at ``step_factors[s]`` times ``link``'s time per byte, by default the fitted ones (1 for a step not there)."""
    ps = g.meta.ps
    fit = g.meta.ps_link_fit
    if step_factors is None:
        step_factors = dict(fit.step_factors) if fit else {}
    if row_pull_extra_us is None:
        row_pull_extra_us = {(p.step, p.worker, p.key): p.us for p in fit.row_pull_extra_us} if fit else {}
    if row_pull_beta_ratio is None:
        row_pull_beta_ratio = fit.row_pull_beta_ratio if fit else 1.0
    fitted = 1e6 / fit.bandwidth_bytes_per_s if fit and fit.bandwidth_bytes_per_s > 0 else link.beta_us_per_byte
    pull_link = replace(link, beta_us_per_byte=_pull_beta(g.meta, link.beta_us_per_byte, fitted, row_pull_beta_ratio))
    extra = _row_pull_extra(row_pull_extra_us)
    keep = ~exchange_nodes(g)
    b, remap = GraphBuilder.from_graph(g, keep)
    issue, issue_order, done = {}, {}, {}
    pull, pulled, key_in = {}, {}, {}
    for v in np.flatnonzero(keep):
        name = g.node_name(v)
        at = (int(g.step[v]), int(g.bucket[v]), int(g.rank[v]))
        if name == ISSUE:
            issue[at] = int(remap[v])
            issue_order[at[:2]] = min(issue_order.get(at[:2], np.inf), float(g.order[v]))
        elif name == DONE:
            done[(int(g.step[v]), int(g.rank[v]))] = int(remap[v])
        elif name == PULL_ISSUE:
            pull[at] = int(remap[v])
            issue_order[(at[0], -1 - at[1])] = min(issue_order.get((at[0], -1 - at[1]), np.inf), float(g.order[v]))
        elif name == PULLED:
            pulled[at] = int(remap[v])
        elif name == KEY_IN:
            key_in[at] = int(remap[v])
    n = int(g.meta.world_size)
    main = g.meta.main_device
    engines = [main[w] for w in range(n)] if ps.pull_after_ack and all(w in main for w in range(n)) else None
    lanes = server_lanes(g.meta, servers)
    for step in g.meta.steps:
        per_update, per_byte = update_us(ps, step), link.gamma_us_per_byte * ops_factor(ps, step)
        at_step = replace(link, beta_us_per_byte=link.beta_us_per_byte * step_factors.get(step, 1.0))
        for k in ps.keys:
            key = k.key
            ready = [[issue[(step, key, w)]] for w in range(n)]
            order = issue_order[(step, key)]
            tag = f"key{key} s{step}"
            parts = pslite_bytes(ps, k, step, servers)
            total = sum(nb for _, _, nb in parts)
            for server, pushed, part in parts:
                ends = add_ps_part(b, ready, server, part, at_step, per_update + part * n * per_byte, tag=tag, order=order, step=step, bucket=key,
                                   pull=not k.row_bytes, pushed=pushed, engines=engines, lane=server % lanes)
                b.add_edges(ends, [done[(step, w)] for w in range(n)])
                arrived = [(u, key_in[(step, key, w)]) for w, u in enumerate(ends) if (step, key, w) in key_in]
                if arrived:  # what the worker ran as this key's pull arrived (its copy)
                    b.add_edges([u for u, _ in arrived], [v for _, v in arrived])
                if k.row_bytes and (step, key, 0) in pull:  # the forward's pull of the same rows (the batch's), from the same server
                    share = part / total if total else 1.0 / len(parts)  # a pull cut over servers: each part its share
                    got = add_ps_pull(b, [[pull[(step, key, w)]] for w in range(n)], server, part * PS_INDEX_BYTES / k.row_bytes, part, pull_link,
                                      [share * extra(step, w, key) for w in range(n)], tag=f"{tag} pull", order=issue_order[(step, -1 - key)],
                                      step=step, bucket=key)
                    b.add_edges(got, [pulled[(step, key, w)] for w in range(n)])
    out = b.build()
    out.meta.scheme, out.meta.topology = CollectiveSpec(Scheme.PS, servers), Topology.flat(n, link)
    return out


def server_lanes(meta, servers: int) -> int:
    """How many of ``servers`` parameter servers' CPUs work at once: each its own, unless they would be more than the
    profile's and share one host's cores with its workers, more processes than cores; then as many as the profile's servers
    (server ``s`` works on server ``s % lanes``'s CPU), since the profile's busy time is wall time, its waits for a core in
    it, and a split onto more processes adds no cores. Profiled 2 workers and 1 server on 2 cores, 2 servers measured
    x0.90-1.19 of 1 server's step where a CPU each predicted x0.87-0.96 (``mx_kws_2bit.py``, 4 rounds), ``mx_gcn_molecule.py``'s
    tiny keys x0.98-1.04 against x0.87-0.89; held out, ``ps:2``'s summed |error| over 7 fresh rounds 64.4 -> 50.6 points
    (docs/evidence.md, mx69)."""
    ps = meta.ps
    if servers <= ps.num_servers or len(meta.host_cpus) != 1:
        return servers
    group = next(iter(meta.host_cpus.values()))
    return servers if group.ranks + servers <= group.cores else ps.num_servers


def _pull_beta(meta, beta: float, fitted: float, ratio: float) -> float:
    """A row_sparse pull's time per byte (us) on a link of ``beta`` (the exchanges' link), the pulls' own at the fitted one
    ``ratio`` x ``fitted``: every byte takes the links' difference longer, or at a faster link their ratio. Where a
    bandwidth what-if knows the wire's rates, the profiled and the asked (``meta.wire_bytes_per_s``,
    ``ps_asked_bytes_per_s``), the difference is the wire's, not the exchanges' link's: that is a fit of the exchanges
    (``passes.comm.ps_bandwidth``), which a slower wire may leave as it is, while a pull's rows cross the wire alone in the
    forward pass (``mx_sparse_mf.py`` profiled at 1 Gbit/s: its exchanges fitted at 80-150 Mbit/s, where the server's work
    hides the wire, and its pulls at 1 % of that link's time per byte)."""
    own = fitted * ratio
    wire, asked = meta.wire_bytes_per_s, meta.ps_asked_bytes_per_s
    if wire and asked:
        fitted, beta = 1e6 / wire, 1e6 / asked
        own = min(own, fitted)  # the pulls crossed the profiled wire: at most its time per byte
    return max(beta - (fitted - own), beta * own / fitted) if fitted > 0 else beta


def _row_pull_extra(fitted: dict):
    """(step, worker, key) -> a pull's time beyond the wire: the fitted one; a worker copied by ``--workers`` has its
    source's (worker ``w % profiled``, the profiled workers those fitted: ``passes.workers``; the record's worker count is
    the copies' by then, and with it the copies' pulls were served in no time); a step the profile lacks, the mean over its steps."""
    profiled = 1 + max((w for _, w, _ in fitted), default=0)
    means: dict[tuple[int, int], list[float]] = {}
    for (_, w, k), us in fitted.items():
        means.setdefault((w, k), []).append(us)

    def extra(step: int, w: int, key: int) -> float:
        src = w % profiled
        got = fitted.get((step, src, key))
        return got if got is not None else float(np.mean(means.get((src, key), [0.0])))
    return extra


def _is_ps_device(name: str) -> bool:
    return name.startswith(("port ps", "port w")) or (name.startswith("ps") and name.endswith(" cpu"))


__all__ = ["build_ps_graph", "rebuild_ps", "is_ps_graph", "initial_link", "update_us", "ops_factor", "scale_server_work", "ps_devices", "exchange_nodes"]
