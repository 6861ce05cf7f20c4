"""The layout of a TensorFlow/JAX run folder, shared by its writer (``collect``) and reader (``xplane_run``).

Import-light on purpose: the collectors run inside the user's training environment. The file names
(``manifest.json``, ``rank<R>.json``) are those of every dagprof run folder (``run_schema``).
"""
from __future__ import annotations

from .run_schema import MANIFEST, rank_file

__all__ = ["FORMAT", "MANIFEST", "RANK_FORMAT", "VERSION", "rank_file", "rank_logdir"]

FORMAT = "dagprof-xplane-run"
RANK_FORMAT = "dagprof-xplane-rank"
VERSION = 1


def rank_logdir(rank: int) -> str:
    return f"rank{rank}"
