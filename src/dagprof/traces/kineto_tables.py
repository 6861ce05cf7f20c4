"""The per-row tables the Kineto reader's stages hand each other (``kineto`` builds them, ``kineto_deps`` reads them).

Their own module so the dependency rules and the reader both import them and not each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from . import kineto_schema as ks
from .events import Kind

# the phases an op of no kind of its own takes from where it runs (forward, backward, optimizer step, data loading);
# a kernel takes the first three from the call that launched it
CONTEXT_KINDS = np.array([Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.DATA], dtype=np.int8)


@dataclass(frozen=True, eq=False)
class Columns:
    """One row per complete event, in (lane, start, longest-first) order.

    Per-name facts live once per distinct (name, category) ``pair``: ``info[pair[i]]``.
    A lane is one CPU thread or one GPU stream; ``lane_keys[l]`` is (is_gpu, pid, tid).
    """

    kept: dict[int, ks.Event]  # by file-order position (``orig[i]`` is row i's): the events whose arguments are read
    orig: np.ndarray
    names: list[str]
    info: list[ks.NameInfo]  # per pair
    pair: np.ndarray
    pair_name: np.ndarray  # per pair: index into ``names``
    pair_cat: list[str]  # per pair: the category as the trace spells it
    lane: np.ndarray
    lane_keys: list[tuple[bool, Any, Any]]
    start: np.ndarray  # us since ``t0``
    dur: np.ndarray
    t0: float
    is_gpu: np.ndarray
    corr: np.ndarray  # correlation id per row (-1 none): joins a runtime call and the GPU ops it launched

    @property
    def n(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        return self.start + self.dur

    def event(self, i: int) -> ks.Event:
        """Row ``i`` as an event: as decoded when its arguments were kept, else rebuilt from the columns (no arguments)."""
        e = self.kept.get(int(self.orig[i]))
        if e is not None:
            return e
        _, pid, tid = self.lane_keys[self.lane[i]]
        return ks.Event(self.name(i), self.pair_cat[self.pair[i]], pid, tid, self.t0 + float(self.start[i]), float(self.dur[i]))

    @cached_property
    def xs(self) -> _FileOrder:
        """The complete events in file order (``xs[orig[i]]`` is row i's)."""
        return _FileOrder(self)

    def name(self, i: int) -> str:
        return self.names[self.pair_name[self.pair[i]]]

    def per_event(self, attr: str, dtype: Any = None) -> np.ndarray:
        """A ``NameInfo`` field for every row (computed per pair, then gathered)."""
        return np.array([getattr(i, attr) for i in self.info], dtype=dtype)[self.pair]

    @cached_property
    def own_kind(self) -> np.ndarray:
        """The kind each row's name gives it, before context and rules refine it."""
        return self.per_event("kind", np.int8)

    def has_role(self, role: str) -> np.ndarray:
        """Rows whose name plays ``role`` in a collective (``kineto_schema.Role``; "" for none)."""
        return np.array([i.role == role for i in self.info], dtype=bool)[self.pair]


class _FileOrder:
    def __init__(self, cols: Columns):
        self.cols = cols
        self.row = np.empty_like(cols.orig)
        self.row[cols.orig] = np.arange(len(cols.orig))

    def __len__(self) -> int:
        return len(self.row)

    def __getitem__(self, k: int) -> ks.Event:
        return self.cols.event(int(self.row[k]))


@dataclass(frozen=True, eq=False)
class Nesting:
    """Per row: enclosing event (``parent``), ``depth`` (-1 wrapper, 0 node), depth-0 ancestor (``top``,
    -1 when only wrappers enclose it), the context a wrapper or op above it set (``ctx``, a Kind or -1)
    and the host collective call (c10d::*) it sits in (``enqueue``, itself when it is one, -1 none)."""

    parent: np.ndarray
    depth: np.ndarray
    top: np.ndarray
    ctx: np.ndarray
    enqueue: np.ndarray


@dataclass(frozen=True, eq=False)
class Kinds:
    """Per row: ``kind`` (forward inferred from the step phase, kernels inheriting their launcher's),
    ``step`` (-1 outside the profiled steps), ``launcher`` (the runtime call with the same correlation
    id, -1 none) and ``ctx`` (context after forward inference)."""

    kind: np.ndarray
    step: np.ndarray
    launcher: np.ndarray
    ctx: np.ndarray
