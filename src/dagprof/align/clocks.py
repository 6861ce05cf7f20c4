"""One clock offset per rank from matched collectives (dPRO's Sync-end alignment, made robust).

Why the END: a symmetric collective (all-reduce, all-gather...) cannot finish on any rank
before the last rank joined it, and its final exchange releases every rank within a few
microseconds, so ends are the near-simultaneous events; starts differ by however long each rank waited for a straggler.
Each rank's clock is modelled as true time minus an offset; offsets and per-instance
true end times are fitted by alternating medians (robust to outliers, works when ranks
share only some collectives), with the reference rank pinned to 0. Instances whose
residual is far beyond the typical one are dropped as outliers before the final fit.
"""
from __future__ import annotations

import dataclasses

import msgspec
import numpy as np

from ..errors import DagprofError
from ..traces.events import CommKind, Run
from ..traces.meta import ClockAlignment
from .matching import Matching, match_collectives, renumber_steps

# Every rank leaves these only once all ranks contributed; broadcast, reduce, send/recv release
# the root or the sender early, so their ends are not simultaneous.
SYMMETRIC = frozenset({CommKind.ALL_REDUCE, CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER, CommKind.ALL_TO_ALL, CommKind.BARRIER})


def _end_matrix(run: Run, matching: Matching) -> np.ndarray:
    """(instances x ranks) absolute end times in us (rank clocks), NaN where a rank lacks it;
    only symmetric collectives when the run has any, never a paired send/recv (the sender leaves before its data arrived)."""
    ends = np.full((len(matching.instances), len(run.ranks)), np.nan)
    for p, t in enumerate(run.ranks):
        inst = matching.instance[p]
        ev = np.flatnonzero(inst >= 0)
        base_us = t.base_ns / 1000.0
        ends[inst[ev], p] = (t.events.start[ev] + t.events.dur[ev]) + base_us
    symmetric = np.array([it.kind in SYMMETRIC for it in matching.instances], dtype=bool)
    shared = (np.isfinite(ends).sum(axis=1) >= 2) & ~np.array([it.p2p for it in matching.instances], dtype=bool)
    return ends[symmetric & shared] if (symmetric & shared).any() else ends[shared]


def _fit(ends: np.ndarray, ref: int, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    off = np.zeros(ends.shape[1])
    # start: each rank's median difference to the reference on shared instances
    for p in range(ends.shape[1]):
        d = ends[:, ref] - ends[:, p]
        if np.isfinite(d).any():
            off[p] = np.nanmedian(d)
    true = np.nanmedian(ends + off, axis=1)
    for _ in range(iters):
        new = np.nanmedian(true[:, None] - ends, axis=0)
        new = np.where(np.isfinite(new), new, 0.0)
        new -= new[ref]
        true = np.nanmedian(ends + new, axis=1)
        if np.allclose(new, off, atol=1e-3):
            off = new
            break
        off = new
    return off, true


def estimate_offsets(run: Run, matching: Matching | None = None, reference_rank: int | None = None) -> ClockAlignment:
    """Offsets that make matched collective ends coincide; raises when ranks share none."""
    if matching is None:
        matching = match_collectives(run, strict=False)
    ends = _end_matrix(run, matching)
    ranks = [t.rank for t in run.ranks]
    ref_rank = ranks[0] if reference_rank is None else reference_rank
    ref = ranks.index(ref_rank)
    if len(run.ranks) == 1:
        zero = {"median": 0.0, "p90": 0.0, "max": 0.0}
        return ClockAlignment({ref_rank: 0.0}, zero, {ref_rank: 0.0}, 0, reference_rank=ref_rank)
    lonely = [ranks[p] for p in range(len(ranks)) if not np.isfinite(ends[:, p]).any()]
    if not len(ends) or lonely:
        who = f"rank(s) {lonely}" if lonely else "the ranks"
        raise DagprofError(f"cannot align clocks: {who} share no matched collective", run.source)
    notes = []
    off, true = _fit(ends, ref)
    resid = ends + off - true[:, None]
    spread = np.nanmax(ends + off, axis=1) - np.nanmin(ends + off, axis=1)
    outliers = 0
    if len(spread) >= 5:
        cut = max(10 * np.median(spread), 50.0)  # us; a collective whose ends disagree wildly is not a sync point
        keep = spread <= cut
        outliers = int((~keep).sum())
        if outliers and keep.sum() >= 2:
            ends = ends[keep]
            off, true = _fit(ends, ref)
            resid = ends + off - true[:, None]
            spread = np.nanmax(ends + off, axis=1) - np.nanmin(ends + off, axis=1)
            notes.append(f"dropped {outliers} collectives whose ends disagreed by more than {cut:.0f} us")
    q = (lambda a, x: float(np.percentile(a, x)) if len(a) else 0.0)
    return ClockAlignment(
        offset_us={r: float(off[p]) for p, r in enumerate(ranks)},
        residual_us={"median": q(spread, 50), "p90": q(spread, 90), "max": float(spread.max()) if len(spread) else 0.0},
        per_rank_residual_us={r: float(np.nanmedian(np.abs(resid[:, p]))) if np.isfinite(resid[:, p]).any() else 0.0
                              for p, r in enumerate(ranks)},
        instances_used=int(len(ends)), outliers=outliers, reference_rank=ref_rank, notes=notes,
    )


def apply_offsets(run: Run, alignment: ClockAlignment) -> Run:
    """A run whose ranks share one clock: each ``base_ns`` shifted by its offset (events untouched)."""
    ranks = [dataclasses.replace(t, base_ns=t.base_ns + int(round(alignment.offset_us.get(t.rank, 0.0) * 1000.0)),
                                 meta=msgspec.structs.replace(t.meta, clock_offset_us=alignment.offset_us.get(t.rank, 0.0)))
             for t in run.ranks]
    return Run(ranks, source=run.source, meta=msgspec.structs.replace(run.meta, clocks_done=True, clock_alignment=alignment))


def align_clocks(run: Run, matching: Matching | None = None) -> tuple[Run, ClockAlignment]:
    """Estimate and apply in one call; the run also gets the matching's step renumbering and its warnings
    (ragged profiler windows trimmed), so they reach the user."""
    if matching is None:
        matching = match_collectives(run, strict=False)
    a = estimate_offsets(run, matching)
    aligned = renumber_steps(apply_offsets(run, a), matching.step_offset)
    if matching.warnings:
        aligned.meta = aligned.meta.warned(*matching.warnings)
    return aligned, a
