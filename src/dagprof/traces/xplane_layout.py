"""The layout of a TensorFlow/JAX run folder, shared by its writer (``collect``) and reader (``xplane_run``).

Import-light on purpose: the collectors run inside the user's training environment.
"""
from __future__ import annotations

FORMAT = "dagprof-xplane-run"
RANK_FORMAT = "dagprof-xplane-rank"
VERSION = 1
MANIFEST = "manifest.json"


def rank_file(rank: int) -> str:
    return f"rank{rank}.json"


def rank_logdir(rank: int) -> str:
    return f"rank{rank}"
