"""The layout of a TensorFlow/JAX run folder, shared by its writer (``collect``) and reader (``xplane_run``).

Import-light on purpose: the collectors run inside the user's training environment. The file names
(``manifest.json``, ``rank<R>.json``) are those of every dagprof run folder (``run_schema``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .run_schema import MANIFEST, rank_file

__all__ = ["FORMAT", "LOOKUP_ALTERNATIVES", "MANIFEST", "RANK_FORMAT", "VERSION", "CollectiveSizes", "rank_file", "rank_logdir"]

FORMAT = "dagprof-xplane-run"
RANK_FORMAT = "dagprof-xplane-rank"
VERSION = 1
LOOKUP_ALTERNATIVES = "|"  # in a ``CollectiveSizes.lookups`` entry: lookups of the same ids, any one of which counts them (no TF node name holds it)


def rank_logdir(rank: int) -> str:
    return f"rank{rank}"


@dataclass
class CollectiveSizes:
    """What the collective ops of the traced step send, by node name (as the reader names them; a rank's own share):
    ``nbytes`` of those of a static shape; ``row_bytes``, one row of those whose first dimension only is dynamic;
    ``lookups``, for a sparse gradient's all-gathers, the lookups whose ids it gathers (an entry may name several that
    took the same ids, joined by ``LOOKUP_ALTERNATIVES``): in the branch that runs when every worker has as many rows,
    a step gathers the ids those looked up on each worker times the workers; in the branch that pads unequal counts
    (``cond/else/``), the most ids any worker looked up times the workers.
    The collector sizes them (``collect.hooks.tf_profile.collective_sizes``), the rank file keeps them under
    ``RANK_KEYS``' names, and the reader (``tf_xplane.read_xplane``) takes them back."""

    nbytes: dict[str, int] = field(default_factory=dict)
    row_bytes: dict[str, int] = field(default_factory=dict)
    lookups: dict[str, list[str]] = field(default_factory=dict)

    def to_rank_file(self) -> dict[str, dict]:
        """The rank file's keys of those that hold any (a file without one reads as none: ``xplane_run.XplaneRank``)."""
        return {key: dict(getattr(self, name)) for name, key in RANK_KEYS if getattr(self, name)}


# each field of ``CollectiveSizes`` and the rank file's key for it (files before 2026-12-03 lack all three, before 2026-12-05 the last two)
RANK_KEYS = (("nbytes", "collective_bytes"), ("row_bytes", "collective_row_bytes"), ("lookups", "collective_lookups"))
