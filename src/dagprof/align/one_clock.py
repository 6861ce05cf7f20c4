"""Every rank on one clock, once: the step between reading traces and building a graph.

``build_graph`` calls ``on_one_clock`` so the public path ``load -> build_graph -> replay``
aligns as ``pipeline.open_run`` does. A run remembers that it was aligned (``run.meta.clocks_done``,
the offsets in ``run.meta.clock_alignment``, None when they could not be fitted), so a second call does nothing, and the collective
matching computed for the alignment is handed on to the graph builder instead of redone.
"""
from __future__ import annotations

import msgspec

from ..errors import DagprofError
from ..traces.events import Run
from ..traces.meta import ClockAlignment
from ..traces.parallelism import resolve_groups
from ..traces.step_marks import refuse_mixed_markers
from .clocks import align_clocks
from .matching import Matching, match_collectives, renumber_steps


def on_one_clock(run: Run, matching: Matching | None = None) -> tuple[Run, Matching]:
    """``run`` with its ranks' clocks aligned on matched collective ends, and that matching.

    Mismatched collectives raise (one line, naming the rank and position). Ranks that share no
    collective stay as recorded, with a warning in ``run.meta.warnings``.
    """
    if matching is None:
        refuse_mixed_markers(run)
        run = resolve_groups(run)  # gloo records no group per collective: match ranks within their mesh groups
        matching = match_collectives(run)
    if len(run.ranks) < 2 or run.meta.clocks_done:
        return run, matching
    try:
        aligned, _ = align_clocks(run, matching)
    except DagprofError as err:
        run = renumber_steps(run, matching.step_offset)
        meta = msgspec.structs.replace(run.meta.warned(*matching.warnings, f"clocks not aligned: {err.problem}"),
                                       clocks_done=True, clock_alignment=None)
        return Run(run.ranks, run.source, meta), matching
    return aligned, matching


def alignment_of(run: Run) -> ClockAlignment | None:
    """The alignment ``on_one_clock`` applied to ``run``; None for one rank or when it was not possible."""
    return run.meta.clock_alignment
