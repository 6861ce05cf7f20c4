"""What a replay returns: per-node times and the predecessor that gated each start.

Here in ``graph`` (not ``replay``) so that the passes, which sit below the replay layer, can take a
replay of a graph as a typed argument; ``dagprof.replay.ReplayResult`` is the same class."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ReplayResult:
    start: np.ndarray  # us
    end: np.ndarray  # us
    # The node whose completion let this node start: its last-arriving predecessor,
    # or the node that freed its device when the device was the bottleneck; -1 at a source.
    gate: np.ndarray
    engine: str  # "python" or "numba"

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if len(self.end) else 0.0
