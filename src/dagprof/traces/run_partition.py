"""A dagprof rank's hook records -> the spans that partition the main lane of each profiled step.

Hook records are raw timestamps ``[code, a, b, t_ns, x]`` (see ``run_schema.Rec``), turned here into the
event-table conventions of ``events.py``. The main-thread lane of every profiled step is partitioned completely
by depth-0 events: one FORWARD and one BACKWARD node per leaf-module call, COMM_ENQUEUE per bucket all-reduce call,
COMM_WAIT for DDP's end-of-backward wait, UPDATE for the optimizer, DATA for a torch DataLoader's ``next()``,
and OTHER for every remaining gap (named by phase, e.g. ``other:pre-forward`` = zero_grad,
DDP's buffer broadcast without Kineto, data loading not done by a DataLoader).
A STEP event (depth -1, like Kineto's ``ProfilerStep#N``) spans each step (``run_rank``). A layer span cut
by a higher-priority span (enqueue, wait, update) keeps its first piece; the rest is OTHER. A collective the model ran
inside a span, whose bytes the collector recorded, is a piece of that span of its own (``cut_in_op``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .events import CommRole, Kind
from .parallelism import in_op_name
from .run_comm import bucket_kind, bucket_name, bucket_roles
from .run_schema import Col, Rec
from .run_spans import _Comm, _InOp, _Span
from .zero_run import overlap_spans


def step_bounds(records: np.ndarray) -> list[tuple[int, int, int]]:
    """Each profiled step as (step, begin ns, end ns), from its begin and end records (a step without both is left out)."""
    begins = {int(r[Col.A]): int(r[Col.T_NS]) for r in records if r[Col.CODE] == Rec.STEP_BEGIN}
    ends = {int(r[Col.A]): int(r[Col.T_NS]) for r in records if r[Col.CODE] == Rec.STEP_END}
    return [(s, begins[s], ends[s]) for s in sorted(begins) if s in ends]


def partition_step(rows: np.ndarray, begin: int, end: int, layers: list[str], comm: _Comm, grad_bytes: list[int]) -> list[_Span]:
    """The main lane of one step, ``[begin, end]`` ns: enqueues, waits, the update and data loading cut the layer spans."""
    code, a, b, t, x = (rows[:, c] for c in Col)
    priority = [h for h in comm.host if begin <= h.start <= end]  # intervals that cut through layer spans
    enq = {int(b[i]): int(t[i]) for i in np.flatnonzero(code == Rec.ENQ_BEGIN)}
    roles = bucket_roles(rows)
    for i in np.flatnonzero(code == Rec.ENQ_END):
        s = int(b[i])
        if s in enq:
            role = roles.get(s, CommRole.PLAIN)
            priority.append(_Span(Kind.COMM_ENQUEUE, bucket_name(int(a[i]), role), enq[s], int(t[i]), bucket=int(a[i]),
                                  seq=comm.seq_of.get(s, s), nbytes=int(x[i]), role=role, comm_kind=bucket_kind(role)))
    priority += overlap_spans(code, a, b, t, x)  # ZeRO's step inside DDP's comm hook (none in other jobs)
    for kb, ke, kind, name in ((Rec.UPDATE_BEGIN, Rec.UPDATE_END, Kind.UPDATE, "optimizer.step"),
                               (Rec.WAIT_BEGIN, Rec.WAIT_END, Kind.COMM_WAIT, "ddp finalize (wait for buckets)"),
                               (Rec.DATA_BEGIN, Rec.DATA_END, Kind.DATA, "dataloader next")):
        for s0, s1 in zip(t[code == kb], t[code == ke]):
            priority.append(_Span(kind, name, int(s0), int(s1)))
    spans = _carve(sorted(_cut_updates(priority), key=lambda s: s.start), _layer_spans(code, a, b, t, layers, grad_bytes), begin, end)
    return cut_in_op(spans, [x for x in comm.in_op if begin < x.end <= end])


def cut_in_op(spans: list[_Span], in_op: list[_InOp]) -> list[_Span]:
    """Each sized collective the model ran inside an op (``_InOp``) becomes a piece of the compute span it blocked: from
    its transfer's start (or the span's) to its end, communication on the rank's own lane (``Kind.COMM``, no group: no
    compute what-if or profiler-cost correction shortens it, its bytes are no layer's gradient, and the critical path
    names it communication; as a wait, the builder made its time a gap, read as framework overhead) in the span's layer,
    named by ``in_op_name`` and carrying its bytes; the span goes on after it as before (its own bytes on its first
    piece). One that ended outside compute stays inside whatever span it is in, unsized."""
    out = list(spans)
    for x in in_op:
        j = next((j for j, s in enumerate(out) if s.start < x.end <= s.end), None)
        if j is None or out[j].kind not in (Kind.FORWARD, Kind.BACKWARD, Kind.OTHER):
            continue
        s = out[j]
        at = max(x.start, s.start)
        pieces = [_Span(s.kind, s.name, s.start, at, s.layer, nbytes=s.nbytes),
                  _Span(Kind.COMM, in_op_name(x.kind, x.ranks), at, x.end, s.layer, nbytes=x.nbytes, comm_kind=x.kind,
                        group_size=x.ranks),
                  _Span(s.kind, s.name, x.end, s.end, s.layer, nbytes=0 if at > s.start else s.nbytes)]
        out[j:j + 1] = [p for p in pieces if p.end > p.start]
    return out


def _cut_updates(priority: list[_Span]) -> list[_Span]:
    """An update that issues collectives itself (ZeRO-1's step: the local optimizer's step, then its parameter
    broadcasts, waited for before ``step()`` returns) ends where its first one is issued: the collectives' enqueues
    are spans of their own, and the rest of the update the thread's wait for them (``_blocked_in``), not the step."""
    issued = [h.start for h in priority if h.kind == Kind.COMM_ENQUEUE and h.bucket < 0]
    out = []
    for p in priority:
        inner = [t for t in issued if p.start < t < p.end] if p.kind == Kind.UPDATE else []
        out.append(_Span(p.kind, p.name, p.start, min(inner)) if inner else p)
    return out


def _layer_spans(code, a, b, t, layers: list[str], grad_bytes: list[int]) -> list[_Span]:
    """One FORWARD and one BACKWARD span per (layer, call).

    Backward of a call starts when a gradient w.r.t. one of its outputs arrives and ends at
    the last of: gradient w.r.t. an input, its parameters' gradient accumulation (the first
    layer's input needs no gradient; only the accumulation marks its end).
    """
    spans = []
    fwd0 = {(int(a[i]), int(b[i])): int(t[i]) for i in np.flatnonzero(code == Rec.FWD_BEGIN)}
    for i in np.flatnonzero(code == Rec.FWD_END):
        key = (int(a[i]), int(b[i]))
        if key in fwd0:
            spans.append(_Span(Kind.FORWARD, f"{layers[key[0]]} forward", fwd0[key], int(t[i]), layer=key[0]))
    bwd0: dict[tuple[int, int], int] = {}
    bwd1: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(code == Rec.BWD_BEGIN):
        key = (int(a[i]), int(b[i]))
        bwd0[key] = min(bwd0.get(key, int(t[i])), int(t[i]))
    for i in np.flatnonzero(code == Rec.BWD_END):
        key = (int(a[i]), int(b[i]))
        bwd1[key] = max(bwd1.get(key, int(t[i])), int(t[i]))
    for i in np.flatnonzero(code == Rec.GRAD_READY):  # accumulation is once per step: the call whose backward ran last (call 0)
        key = (int(a[i]), 0)
        bwd1[key] = max(bwd1.get(key, int(t[i])), int(t[i]))
    for key, s0 in bwd0.items():
        nbytes = grad_bytes[key[0]] if key[1] == 0 else 0  # a layer's gradient is accumulated once per step
        spans.append(_Span(Kind.BACKWARD, f"{layers[key[0]]} backward", s0, max(s0, bwd1.get(key, s0)), layer=key[0], nbytes=nbytes))
    spans.sort(key=lambda s: (s.start, s.end))
    # hooks on one tensor fire back to back, so a span may end a few us after the next begins: clip
    return [
        s if k + 1 == len(spans) or s.end <= spans[k + 1].start else _Span(s.kind, s.name, s.start, spans[k + 1].start, s.layer, nbytes=s.nbytes)
        for k, s in enumerate(spans)
    ]


def _carve(priority: list[_Span], layer_spans: list[_Span], begin: int, end: int) -> list[_Span]:
    """Partition [begin, end]: priority spans win; a layer span keeps its first piece; gaps become OTHER."""
    out: list[_Span] = []
    cursor = begin
    pi = 0
    phase = "pre-forward"

    def gap(upto: int) -> None:
        nonlocal cursor
        if upto > cursor:
            out.append(_Span(Kind.OTHER, f"other:{phase}", cursor, upto))
            cursor = upto

    def flush_priority(upto: int) -> None:
        nonlocal pi, cursor, phase
        while pi < len(priority) and priority[pi].start < upto:
            p = priority[pi]
            pi += 1
            if p.end <= cursor:
                continue
            gap(p.start)
            out.append(replace(p, start=max(cursor, p.start)))
            cursor = p.end
            if p.kind == Kind.COMM_WAIT:
                phase = "post-backward"
            elif p.kind == Kind.UPDATE:
                phase = "post-update"

    for s in layer_spans:
        flush_priority(s.start)
        if s.end <= cursor:
            continue
        if s.kind == Kind.BACKWARD and phase in ("forward", "pre-forward"):
            phase = "loss"
        gap(s.start)
        piece_end = s.end
        if pi < len(priority) and priority[pi].start < piece_end:
            piece_end = priority[pi].start
        out.append(_Span(s.kind, s.name, max(cursor, s.start), piece_end, s.layer, nbytes=s.nbytes))
        cursor = piece_end
        phase = "forward" if s.kind == Kind.FORWARD else "backward"
        flush_priority(s.end)
    flush_priority(end + 1)
    gap(end)
    return [s for s in out if s.end > s.start or s.kind == Kind.COMM_ENQUEUE]
