"""Match each rank's collectives to the same logical collective on the other ranks.

A transfer event (``Kind.COMM``) is identified by (process group, seq). When the trace
carried its own sequence number (``Seq``, 2026+ schemas) that key is authoritative. When
the reader counted ``seq`` itself, a rank that lost events (sampled traces) would shift
every later key, so counted sequences are aligned per group against a reference rank on
their signature (step, collective, bytes, dtype) with a longest-common-subsequence match.

Real profiler windows are ragged: each rank's profiler may start and stop at a different
iteration (its own ``schedule``, or a profiler started at a different step), so one rank
holds collectives before or after the window another rank recorded. Those leading and
trailing collectives are left unmatched (instance -1) and reported in ``warnings``; only a
collective missing or different *inside* the window every rank recorded is a problem
(``strict`` raises it in one line naming rank, group and position).

Which iteration of one rank is which iteration of another: ``ProfilerStep#N`` numbers count
from the profiler's creation, so they agree across ranks only when every rank created it at
the same iteration. Ranks on one host share one clock, and a collective ends on every rank
at nearly the same instant, so there the end times decide the step correspondence (a rank
whose numbers are off is renumbered, ``Matching.step_offset``). Across hosts, whose clocks
may disagree by more than an iteration, the step numbers are trusted when they match at all;
windows without step numbers are placed by the end times.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import numpy as np

from ..errors import DagprofError
from ..traces.comm_kind import P2P, P2P_PEERED, P2P_SEND
from ..traces.events import CommKind, CommRole, Kind, RankTrace, Run
from ..traces.parallelism import p2p_peer

# Collectives whose per-rank payload legitimately differs (uneven splits).
_UNEVEN = frozenset({CommKind.ALL_TO_ALL, CommKind.SEND_RECV, CommKind.SEND, CommKind.RECV, CommKind.GATHER, CommKind.SCATTER})
# Collectives whose tensors gloo's Kineto event records on their root only (a scatter's inputs, the chunks it sends; the
# other ranks' transfer has no arguments): their dtype and bytes are the root's (``_sized``), and paired by dtype the
# roots' scatters of CLIP's backward (one per rank in turn) met each other, not their peers' of the same root.
ROOT_SIZED = frozenset({CommKind.SCATTER})


@dataclass
class Instance:
    group: str
    seq: int
    name: str
    nbytes: int
    ranks: list[int]
    kind: CommKind = CommKind.UNKNOWN  # the collective its calls ran (``Collectives.kind``, else the events' ``comm_kind``)
    dtype: str = ""
    p2p: bool = False  # a send and its peer's recv (``ranks``: sender, receiver), paired by ``_pair_p2p``
    root: int = -1  # a broadcast's root rank where every rank's record names the same one (``EventTable.peer``), else -1


@dataclass
class Matching:
    instance: list[np.ndarray]  # per rank (position in run.ranks): event index -> instance id, -1 none
    instances: list[Instance]
    problems: list[str] = field(default_factory=list)  # mismatches inside the common window
    warnings: list[str] = field(default_factory=list)  # ragged windows trimmed, steps renumbered
    step_offset: dict[int, int] = field(default_factory=dict)  # rank -> add to its step numbers (nonzero only)

    def complete(self, world: int | None = None) -> list[int]:
        """Ids of instances every participating rank of the run has."""
        n = world if world is not None else max((len(i.ranks) for i in self.instances), default=0)
        return [k for k, it in enumerate(self.instances) if len(it.ranks) == n]


@dataclass
class _Op:
    event: int
    seq: int
    explicit: bool
    coll: CommKind
    dtype: str
    nbytes: int
    step: int  # in the reference's numbering once the rank's offset is known
    end_us: float  # absolute (the rank's own clock)
    peer: int = -1  # a send's or recv's peer, a broadcast's root, as its group numbers it (``EventTable.peer``)
    role: CommRole = CommRole.PLAIN  # ``EventTable.role``

    @property
    def kind(self) -> tuple[CommKind, str, int]:
        """What must agree across ranks, whichever iteration it belongs to: the bytes too, but where each rank's are its
        own (an uneven split; a sparse gradient's gather, each rank's estimate of all ranks' rows; a comm hook's of the job's
        own, whose sizes its data may decide)."""
        uneven = self.coll in _UNEVEN or self.role in (CommRole.SPARSE, CommRole.HOOK)
        return (self.coll, "" if self.coll in ROOT_SIZED else self.dtype, -1 if uneven else self.nbytes)

    @property
    def signature(self) -> tuple[int, CommKind, str, int]:
        return (self.step, *self.kind)


def _ops(trace: RankTrace) -> dict[str, list[_Op]]:
    """Transfers per group in seq order, with the kind and dtype the reader recorded (else the events' kind, no dtype)."""
    ev = trace.events
    info = trace.meta.collectives
    by_event = {int(e): (c, d) for e, c, d in zip(info.event, info.kind, info.dtype)} if info is not None else {}
    explicit = trace.meta.explicit_seq
    base_us = trace.base_ns / 1e3
    out: dict[str, list[_Op]] = {}
    for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.group >= 0) & (ev.seq >= 0)).tolist():
        coll, dtype = by_event.get(i, (CommKind(int(ev.comm_kind[i])), ""))
        out.setdefault(trace.groups[int(ev.group[i])], []).append(
            _Op(i, int(ev.seq[i]), explicit, coll, dtype.lower(), int(ev.nbytes[i]), int(ev.step[i]),
                base_us + float(ev.start[i] + ev.dur[i]), int(ev.peer[i]), CommRole(int(ev.role[i]))))
    for ops in out.values():
        ops.sort(key=lambda o: o.seq)
    return out


def _one_clock(run: Run) -> bool:
    """All ranks recorded on one named host: their timestamps come from one clock ("localhost" names no host)."""
    hosts = {t.host for t in run.ranks}
    return len(hosts) == 1 and not hosts & {"", "localhost"}


def match_collectives(run: Run, strict: bool = True) -> Matching:
    """Match COMM events of every rank; mismatches inside the common window raise when ``strict``."""
    per_rank_ops = [_ops(t) for t in run.ranks]
    one_clock = _one_clock(run)
    step_ref, offsets = _step_offsets(run, per_rank_ops, one_clock)
    for p, c in enumerate(offsets):
        for ops in per_rank_ops[p].values():
            for o in ops:
                o.step = o.step + c if o.step >= 0 else o.step
    p2p = [{g: [o for o in ops if o.coll in P2P] for g, ops in mine.items()} for mine in per_rank_ops]
    per_rank_ops = [{g: kept for g, ops in mine.items() if (kept := [o for o in ops if o.coll not in P2P])} for mine in per_rank_ops]
    instance = [np.full(len(t.events), -1, dtype=np.int64) for t in run.ranks]
    instances: list[Instance] = []
    problems: list[str] = []
    warnings: list[str] = []
    present = {t.rank for t in run.ranks}
    recorded = [{int(x) + c for x in t.step_spans()[:, 0]} for t, c in zip(run.ranks, offsets)]  # steps in each window
    for g in sorted({g for ops in per_rank_ops for g in ops}):
        holders = [p for p, ops in enumerate(per_rank_ops) if g in ops]
        members = set(run.ranks[holders[0]].group_ranks.get(g, [])) & present or present
        absent = members - {run.ranks[p].rank for p in holders}
        for r in sorted(absent):
            problems.append(f"rank {r}: no collectives of group {g} in its trace")
        ref = max(holders, key=lambda p: len(per_rank_ops[p][g]))
        ref_ops, ref_rank = per_rank_ops[ref][g], run.ranks[ref].rank
        joined: list[list[tuple[int, _Op]]] = [[(ref, op)] for op in ref_ops]  # per reference position
        lacking: list[list[int]] = [[] for _ in ref_ops]  # ranks without it although it lies in their window
        dropped: set[int] = set()  # reference positions outside some rank's window
        for p in holders:
            if p == ref:
                continue
            r, ops = run.ranks[p].rank, per_rank_ops[p][g]
            pairs = _pairs(ops, ref_ops, problems, r, ref_rank, g)
            if not pairs:
                problems.append(f"rank {r}: none of its {len(ops)} collectives of group {g} matches one of rank {ref_rank}")
                continue
            inside_ref = _window(ops, [k for _, k in pairs], recorded[ref])
            inside_mine = _window(ref_ops, [a for a, _ in pairs], recorded[p])
            matched = {k for _, k in pairs}
            for k, o in enumerate(ops):
                if k not in matched and inside_ref[k]:
                    problems.append(f"rank {r}: collective #{k} of group {g} ({run.ranks[p].events.name_of(o.event)}, {o.nbytes} B) "
                                    f"matches nothing on rank {ref_rank}")
            matched = {a for a, _ in pairs}
            for a in range(len(ref_ops)):
                if a in matched:
                    continue
                if inside_mine[a]:
                    lacking[a].append(r)
                else:
                    dropped.add(a)
            for a, k in pairs:
                joined[a].append((p, ops[k]))
        for a, members_at in enumerate(joined):
            op = ref_ops[a]
            if lacking[a] or absent:
                problems.append(f"collective #{op.seq} ({run.ranks[ref].events.name_of(op.event)}) of group {g} "
                                f"is missing on rank(s) {_short(sorted([*lacking[a], *absent]))}")
            if a in dropped:  # outside a rank's window: nobody's instance (kept when lost inside: reported above)
                continue
            k = len(instances)
            sized = _sized(op, [o for _, o in members_at])
            instances.append(Instance(g, op.seq, run.ranks[ref].events.name_of(op.event), sized.nbytes,
                                      [run.ranks[p].rank for p, _ in members_at], op.coll, sized.dtype, root=_root(run.ranks[ref], g, members_at)))
            for p, o in members_at:
                instance[p][o.event] = k
        trimmed = _trimmed(run, per_rank_ops, holders, g, instance)
        if trimmed:
            warnings.append(f"profiler windows differ between ranks: collectives of group {g} outside the window every rank "
                            f"recorded are left unmatched ({trimmed})")
    _pair_p2p(run, p2p, recorded, instance, instances, problems)
    step_offset = {run.ranks[p].rank: c for p, c in enumerate(offsets) if c}
    if step_offset:
        warnings.append("ProfilerStep numbers count from different iterations on different ranks; renumbered to rank "
                        f"{run.ranks[step_ref].rank}'s by their collectives: " + ", ".join(f"rank {r} {c:+d}" for r, c in step_offset.items()))
    if problems and strict:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        why = ("; the traces record no process group (no pg_config or record_param_comms), so every collective counts in one "
               "group and ranks that run different programs (pipeline stages) cannot be matched"
               if all(t.groups == ["0"] and not t.meta.group_desc for t in run.ranks) and run.world_size > 2 else "")
        raise DagprofError(f"mismatched collectives: {problems[0]}{more}{why}", run.source)
    return Matching(instance, instances, problems, warnings, step_offset)


def _sized(op: _Op, members: list[_Op]) -> _Op:
    """The op whose bytes and dtype an instance carries: the reference rank's, but a ``ROOT_SIZED`` collective's root's
    (the one member that recorded them), so that every rank's instance has them or none has."""
    if op.coll not in ROOT_SIZED:
        return op
    return next((o for o in members if o.nbytes > 0), op)


def _root(ref: RankTrace, g: str, members_at: list[tuple[int, _Op]]) -> int:
    """The instance's root rank: the one its every rank's op names (``_Op.peer``, in group ``g``'s numbering, which the
    reference rank's trace lists), else -1."""
    peers = {o.peer for _, o in members_at}
    ranks = ref.group_ranks.get(g, [])
    local = peers.pop() if len(peers) == 1 else -1
    return ranks[local] if 0 <= local < len(ranks) else -1


def _pair_p2p(run: Run, p2p: list[dict[str, list[_Op]]], recorded: list[set[int]], instance: list[np.ndarray],
              instances: list[Instance], problems: list[str]) -> None:
    """Pair each send with its peer's recv: the k-th send from rank A to rank B in a group and step is the k-th recv on
    B from A there, of the same bytes. One instance of the two ranks each, so the graph builder joins them like a
    collective: the recv waits for the send, and pipeline bubbles emerge from the replay. Matched by position like a
    collective, a stage's send met the other stage's send, and a dagprof run's met its DDP peer's, which it never
    exchanges with. The peer: each op's own argument (a pipeline's group of N stages), else the other rank of a 2-rank
    group (``traces.parallelism.p2p_peer``). Send/recv whose peer the trace does not tell stay unpaired, timed in the
    ops that issued them (``Parallelism.unpaired_p2p``); a step both ranks recorded with more sends than recvs (or other
    bytes) is a problem, like a missing collective, unless either rank holds send/recv of untold peers there."""
    present = {t.rank for t in run.ranks}
    sides: dict[tuple[str, int, int, int], tuple[list[tuple[int, _Op]], list[tuple[int, _Op]]]] = {}
    unknown: set[tuple[int, str, int]] = set()  # (rank, group, step) holding a send/recv whose peer the trace does not tell
    for p, t in enumerate(run.ranks):
        for g, ops in p2p[p].items():
            for o in ops:
                peer = p2p_peer(t, g, o.peer) if o.coll in P2P_PEERED else None
                if peer is None:
                    unknown.add((t.rank, g, o.step))
                elif peer in present:
                    send = o.coll in P2P_SEND
                    src, dst = (t.rank, peer) if send else (peer, t.rank)
                    sides.setdefault((g, src, dst, o.step), ([], []))[0 if send else 1].append((p, o))
    at = {t.rank: p for p, t in enumerate(run.ranks)}
    for (g, src, dst, step), (sends, recvs) in sorted(sides.items()):
        if len(sends) != len(recvs):  # a problem, unless the counterpart may be among the ops whose peer is not told
            if (step in recorded[at[src]] and step in recorded[at[dst]] or step < 0) and not {(src, g, step), (dst, g, step)} & unknown:
                problems.append(f"rank {src} sends {len(sends)} time(s) to rank {dst} in group {g} in step {step}, and rank {dst} "
                                f"receives {len(recvs)} time(s) from it: the pipeline's send/recv cannot be paired")
            continue
        for (ps, s), (pr, r) in zip(sends, recvs):
            if s.nbytes != r.nbytes:
                problems.append(f"rank {src}'s send #{s.seq} of group {g} ({s.nbytes} B) meets rank {dst}'s recv #{r.seq} of {r.nbytes} B: "
                                "the pipeline's send/recv cannot be paired")
                continue
            instance[ps][s.event] = instance[pr][r.event] = len(instances)
            instances.append(Instance(g, s.seq, run.ranks[ps].events.name_of(s.event), s.nbytes, [src, dst], CommKind.SEND, s.dtype, p2p=True))


def _pairs(ops: list[_Op], ref_ops: list[_Op], problems: list[str], r: int, ref_rank: int, g: str) -> list[tuple[int, int]]:
    """(reference position, rank position) of the same collective."""
    if ops and ref_ops and ops[0].explicit and ref_ops[0].explicit:
        by_seq = {o.seq: a for a, o in enumerate(ref_ops)}
        pairs = []
        for k, o in enumerate(ops):
            a = by_seq.get(o.seq)
            if a is None:
                continue
            ref = ref_ops[a]
            if o.signature != ref.signature:
                problems.append(f"rank {r}: collective seq {o.seq} of group {g} is {o.coll.label} {o.nbytes} B {o.dtype} in step {o.step}, "
                                f"rank {ref_rank} has {ref.coll.label} {ref.nbytes} B {ref.dtype} in step {ref.step}")
                continue
            pairs.append((a, k))
        return pairs
    if any(o.step >= 0 for o in ops) and any(o.step >= 0 for o in ref_ops):
        return _pairs_by_step(ops, ref_ops)
    a0, k0 = _overlap_by_time(ops, ref_ops)  # unnumbered windows: only the clock tells which iteration is which
    sm = difflib.SequenceMatcher(None, [o.signature for o in ref_ops[a0:]], [o.signature for o in ops[k0:]], autojunk=False)
    return [(a0 + b.a + j, k0 + b.b + j) for b in sm.get_matching_blocks() for j in range(b.size)]


def _pairs_by_step(ops: list[_Op], ref_ops: list[_Op]) -> list[tuple[int, int]]:
    """Pairs within each (step, collective, bytes, dtype): in order where both ranks hold as many, else the
    order-keeping choice whose ends agree best on the reference's clock (a lost one is told by its time)."""
    mine: dict[tuple, list[int]] = {}
    theirs: dict[tuple, list[int]] = {}
    for k, o in enumerate(ops):
        mine.setdefault(o.signature, []).append(k)
    for a, o in enumerate(ref_ops):
        theirs.setdefault(o.signature, []).append(a)
    keys = [key for key in mine if key in theirs]
    even = [(a, k) for key in keys if len(mine[key]) == len(theirs[key]) for a, k in zip(theirs[key], mine[key])]
    loose = even or [(a, k) for key in keys for a, k in zip(theirs[key], mine[key])]
    shift = float(np.median([ref_ops[a].end_us - ops[k].end_us for a, k in loose])) if loose else 0.0
    pairs = list(even)
    for key in keys:
        if len(mine[key]) != len(theirs[key]):
            t_ref = [ref_ops[a].end_us for a in theirs[key]]
            t_mine = [ops[k].end_us + shift for k in mine[key]]
            pairs += [(theirs[key][i], mine[key][j]) for i, j in _closest_in_order(t_ref, t_mine)]
    return pairs


def _closest_in_order(x: list[float], y: list[float]) -> list[tuple[int, int]]:
    """Order-keeping pairs (i, j) that use every element of the shorter list, least total |x[i] - y[j]| (a small DP)."""
    if len(x) < len(y):
        return [(i, j) for j, i in _closest_in_order(y, x)]
    n, m = len(x), len(y)
    # f[i][j]: least cost of pairing all of y[:j] with some of x[:i] (i >= j)
    f = [[0.0] * (m + 1) for _ in range(n + 1)]
    for j in range(1, m + 1):
        f[j - 1][j] = float("inf")
        for i in range(j, n + 1):
            take = f[i - 1][j - 1] + abs(x[i - 1] - y[j - 1])
            f[i][j] = min(take, f[i - 1][j]) if i > j else take
    pairs, i, j = [], n, m
    while j:
        if i > j and f[i][j] == f[i - 1][j]:
            i -= 1
        else:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return pairs[::-1]


def _window(ops: list[_Op], matched: list[int], other_steps: set[int]) -> list[bool]:
    """Per op, whether it lies in the window the other rank recorded too: a step both ranks profiled, or
    (windows without step markers) between the first and the last op matched."""
    if other_steps and any(o.step >= 0 for o in ops):
        return [o.step in other_steps for o in ops]
    lo, hi = min(matched), max(matched)
    return [lo < k < hi for k in range(len(ops))]


def _overlap_by_time(ops: list[_Op], ref_ops: list[_Op]) -> tuple[int, int]:
    """Where two unnumbered windows overlap: the shift whose equal collectives end closest in time."""
    codes: dict[tuple, int] = {}
    x = np.array([codes.setdefault(o.kind, len(codes)) for o in ref_ops])
    y = np.array([codes.setdefault(o.kind, len(codes)) for o in ops])
    tx = np.array([o.end_us for o in ref_ops])
    ty = np.array([o.end_us for o in ops])
    best, best_cost = 0, np.inf
    for d in range(-len(ops) + 1, len(ref_ops)):  # rank position k <-> reference position k + d
        k = np.arange(max(0, -d), min(len(ops), len(ref_ops) - d))
        same = x[k + d] == y[k]
        if same.any():
            cost = float(np.median(np.abs(tx[k + d][same] - ty[k][same])))
            if cost < best_cost:
                best, best_cost = d, cost
    return (best, 0) if best >= 0 else (0, -best)


def _step_offsets(run: Run, per_rank_ops: list[dict[str, list[_Op]]], one_clock: bool) -> tuple[int, list[int]]:
    """The reference rank (most collectives) and, per rank, what to add to its step numbers to get the reference's."""
    out = [0] * len(run.ranks)
    if len(run.ranks) < 2:
        return 0, out
    ref = max(range(len(run.ranks)), key=lambda p: sum(len(v) for v in per_rank_ops[p].values()))
    by_key_ref = _by_step(per_rank_ops[ref])
    ref_steps = {s for s, _ in by_key_ref}
    for p in range(len(run.ranks)):
        by_key = _by_step(per_rank_ops[p])
        steps = {s for s, _ in by_key}
        if p == ref or not steps or not ref_steps:
            continue
        scored = []  # (offset, collectives paired, median gap between their ends)
        for c in sorted({a - b for a in ref_steps for b in steps}, key=abs):
            gaps = [abs(x.end_us - y.end_us) for (s, kind), mine in by_key.items()
                    for x, y in zip(mine, by_key_ref.get((s + c, kind), ()))]
            if gaps:
                scored.append((c, len(gaps), float(np.median(gaps))))
        nearest = min(scored, key=lambda s: (s[2], -s[1])) if scored else None
        near = one_clock and nearest is not None and nearest[2] <= _step_us(run.ranks[ref]) / 2
        if _explicit(per_rank_ops[p]) and _explicit(per_rank_ops[ref]):  # Seq pairs them; step numbers follow
            out[p] = _offset_from_seq(per_rank_ops[p], per_rank_ops[ref])
            if near and nearest[0] != out[p] and dict((c, g) for c, _, g in scored).get(out[p], np.inf) > 2 * nearest[2] + 1e3:
                s, r, r0 = min(steps), run.ranks[p].rank, run.ranks[ref].rank  # an XLA seq holds its step: relabelled, it pairs wrong
                raise DagprofError(f"rank {r}'s step numbers disagree with rank {r0}'s by {nearest[0]:+d}: on their one clock rank {r}'s "
                                   f"collectives of step {s} end with rank {r0}'s of step {s + nearest[0]}, but their sequence numbers "
                                   f"pair them with step {s + out[p]}'s (a rank file of another window, or its steps renumbered)",
                                   run.source)
            continue
        if nearest is None:
            continue
        if near:
            out[p] = nearest[0]
        elif not any(c == 0 for c, _, _ in scored):
            out[p] = max(scored, key=lambda s: (s[1], -s[2]))[0]
    return ref, out


def _step_us(trace: RankTrace) -> float:
    """The median step of a rank in us (inf without two steps): on one clock, collectives a step or more apart at every
    offset mean the clocks are not one (a host's clock stepped, two hosts of one name), and times cannot number steps."""
    spans = trace.step_spans()
    return float(np.median(spans[:, 2] - spans[:, 1])) if len(spans) else float("inf")


def _by_step(ops: dict[str, list[_Op]]) -> dict[tuple, list[_Op]]:
    out: dict[tuple, list[_Op]] = {}
    for g, group_ops in ops.items():
        for o in group_ops:
            if o.step >= 0:
                out.setdefault((o.step, (g, *o.kind)), []).append(o)
    return out


def _explicit(ops: dict[str, list[_Op]]) -> bool:
    return any(group_ops and group_ops[0].explicit for group_ops in ops.values())


def _offset_from_seq(ops: dict[str, list[_Op]], ref_ops: dict[str, list[_Op]]) -> int:
    diffs = Counter()
    for g, group_ops in ops.items():
        ref = {o.seq: o for o in ref_ops.get(g, [])}
        diffs.update(ref[o.seq].step - o.step for o in group_ops if o.seq in ref and o.step >= 0 and ref[o.seq].step >= 0)
    return diffs.most_common(1)[0][0] if diffs else 0


def _trimmed(run: Run, per_rank_ops: list[dict[str, list[_Op]]], holders: list[int], g: str, instance: list[np.ndarray]) -> str:
    """'rank 0: 4 leading; rank 1: 4 trailing' for the collectives left out before / after each rank's matched ones."""
    parts = []
    for p in holders:
        matched = [instance[p][o.event] >= 0 for o in per_rank_ops[p][g]]
        if not any(matched) or all(matched):
            continue
        lead = matched.index(True)
        trail = matched[::-1].index(True)
        if lead or trail:
            parts.append(f"rank {run.ranks[p].rank}: " + "; ".join(
                f"{n} {where}" for n, where in ((lead, "leading"), (trail, "trailing")) if n))
    return ", ".join(parts)


def renumber_steps(run: Run, step_offset: dict[int, int]) -> Run:
    """A run whose ranks number their steps alike (``Matching.step_offset`` added to each rank's)."""
    if not step_offset:
        return run
    ranks = []
    for t in run.ranks:
        c = step_offset.get(t.rank, 0)
        if c:
            ev = t.events
            step = np.where(ev.step >= 0, ev.step + c, ev.step).astype(ev.step.dtype)
            t = dataclasses.replace(t, events=dataclasses.replace(ev, step=step), meta=msgspec.structs.replace(t.meta, step_offset=c))
        ranks.append(t)
    return Run(ranks, source=run.source, meta=run.meta)


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"{ranks[:8]}... ({len(ranks)} ranks)"
