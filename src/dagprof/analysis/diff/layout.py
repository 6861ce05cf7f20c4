"""How a profile's data parallelism was laid out, so that ``diff`` names a changed setting, not only the ops it moved.

A DDP job's layout is its gradient buckets; an FSDP job's is its units, their mesh, which of them stayed gathered after
forward, the dtypes their all-gathers and reduce-scatters moved, and how many all-gathers were issued early. Two
profiles of one training that differ in any of these are told apart by name ("FSDP units kept gathered after forward
differ: B only blocks.0, blocks.1"), where the op match alone would only count all-gathers without a counterpart.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...graph.build_fsdp import fsdp_collectives, is_fsdp_graph
from ...graph.dag import Graph
from ...passes.buckets import sparse_buckets
from ...traces.events import CommKind, Kind
from ...units import KB, MB

_SHOWN = 6  # names and sizes listed before "... N more"


@dataclass(frozen=True)
class DataParallelLayout:
    """One profile's data-parallel settings as they ran; ``kind`` "" where neither DDP buckets nor FSDP units were seen."""

    kind: str  # "fsdp" | "ddp" | ""
    bucket_bytes: tuple[int, ...] = ()  # DDP: the gradient buckets of one step, in bucket order
    units: tuple[str, ...] = ()  # FSDP: the units in the order recorded
    mesh: tuple[int, ...] = ()  # FSDP: (shard,) or HSDP's (replicate, shard)
    kept_after_forward: tuple[str, ...] = ()  # FSDP: units not resharded after forward, as run
    param_dtypes: tuple[str, ...] = ()  # FSDP: what each unit's all-gather moved
    reduce_dtypes: tuple[str, ...] = ()  # FSDP: what each unit's reduce-scatter moved
    prefetched_per_step: float = 0.0  # FSDP: all-gathers issued early by another unit's hook, in one shard group

    def describe(self) -> str:
        if self.kind == "fsdp":
            return f"FSDP ({len(self.units)} units on a mesh of {_mesh(self.mesh)})"
        if self.kind == "ddp":
            n = len(self.bucket_bytes)
            return f"DDP ({n} gradient bucket{'s' * (n != 1)} a step: {sizes(list(self.bucket_bytes))})"
        return "neither DDP buckets nor FSDP units"

    def to_dict(self) -> dict:
        out = {"kind": self.kind or None, "bucket_bytes": list(self.bucket_bytes)}
        if self.kind == "fsdp":
            out |= {"units": list(self.units), "mesh": list(self.mesh), "kept_after_forward": list(self.kept_after_forward),
                    "param_dtypes": list(self.param_dtypes), "reduce_dtypes": list(self.reduce_dtypes),
                    "prefetched_per_step": self.prefetched_per_step}
        return out


def layout_of(g: Graph) -> DataParallelLayout:
    buckets = tuple(_bucket_bytes(g))
    if not is_fsdp_graph(g):
        return DataParallelLayout("ddp" if buckets else "", buckets)
    units = g.meta.fsdp.units
    mesh = tuple(units[0].mesh) if units else ()
    shard_groups = max(int(np.prod(mesh[:-1])), 1)  # HSDP: each replica's shard group runs its own all-gathers
    prefetched = sum(c.prefetched for c in fsdp_collectives(g) if c.kind == CommKind.ALL_GATHER)
    return DataParallelLayout(
        "fsdp", buckets, tuple(u.name for u in units), mesh, tuple(u.name for u in units if not u.resharded_after_forward),
        tuple(u.param_dtype for u in units), tuple(u.reduce_dtype for u in units),
        prefetched / shard_groups / max(len(g.meta.steps), 1))


def layout_notes(a: DataParallelLayout, b: DataParallelLayout, labels: tuple[str, str]) -> list[str]:
    """One line per setting that differs between ``a`` and ``b`` (none where they ran alike)."""
    la, lb = labels
    if a.kind != b.kind:
        return [f"data parallelism differs: {la} is {a.describe()}, {lb} {b.describe()}"]
    if a.kind != "fsdp":
        if a.bucket_bytes == b.bucket_bytes:
            return []
        return [f"gradient buckets differ: {la} has {len(a.bucket_bytes)} per step ({sizes(list(a.bucket_bytes))}), "
                f"{lb} {len(b.bucket_bytes)} ({sizes(list(b.bucket_bytes))})"]
    notes = []
    if a.units != b.units:
        notes.append(f"FSDP units differ: {la} has {len(a.units)} ({_names(a.units)}), {lb} {len(b.units)} ({_names(b.units)})")
    if a.mesh != b.mesh:
        notes.append(f"FSDP mesh differs: {la} {_mesh(a.mesh)}, {lb} {_mesh(b.mesh)}")
    if set(a.kept_after_forward) != set(b.kept_after_forward):
        notes.append(f"FSDP units kept gathered after forward differ: {_kept_change(a.kept_after_forward, b.kept_after_forward, labels)}")
    for what, xa, xb in (("all-gather dtype", a.param_dtypes, b.param_dtypes), ("reduce-scatter dtype", a.reduce_dtypes, b.reduce_dtypes)):
        if sorted(set(xa)) != sorted(set(xb)):
            notes.append(f"FSDP {what} differs: {la} {'/'.join(sorted(set(xa)))}, {lb} {'/'.join(sorted(set(xb)))}")
    if a.prefetched_per_step != b.prefetched_per_step:
        notes.append(f"FSDP all-gathers prefetched per step differ: {la} {a.prefetched_per_step:g}, {lb} {b.prefetched_per_step:g}")
    return notes


def sizes(nbytes: list[int]) -> str:
    if not nbytes:
        return "none"
    shown = ", ".join(f"{x / MB:.2f} MB" if x >= MB else f"{x / KB:.1f} KB" for x in nbytes[:_SHOWN])
    return shown + (f", ... {len(nbytes) - _SHOWN} more" if len(nbytes) > _SHOWN else "")


def _mesh(mesh: tuple[int, ...]) -> str:
    return "x".join(map(str, mesh)) + (" (replicate x shard)" if len(mesh) == 2 else "")


def _names(names: tuple[str, ...]) -> str:
    """Unit names; a unit of several modules (``fully_shard([a, b])``, named "a, b") in brackets."""
    if not names:
        return "none"
    return ", ".join(f"[{n}]" if ", " in n else n for n in names[:_SHOWN]) + (f", ... {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _kept_change(a: tuple[str, ...], b: tuple[str, ...], labels: tuple[str, str]) -> str:
    """Which units only one side kept gathered, then those both kept: two whole lists side by side ("A <root>, x, B <root>,
    y, z") read as one list once a job has more than a few units."""
    parts = [f"{label} only {_names(tuple(u for u in mine if u not in other))}"
             for label, mine, other in ((labels[0], a, b), (labels[1], b, a)) if set(mine) - set(other)]
    both = tuple(u for u in a if u in b)
    return "; ".join(parts + [f"both {_names(both)}"] * bool(both))


def _bucket_bytes(g: Graph) -> list[int]:
    """The first step's bucket bytes; a sparse gradient's bucket (its rows touched vary by step) at its table's bytes."""
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0))
    steps = g.meta.steps
    if not len(comm) or not steps:
        return []
    first = comm[g.step[comm] == steps[0]]
    dense = {b.index: b.nbytes for b in g.meta.buckets or ()}
    sparse = sparse_buckets(g)
    return [dense.get(int(g.bucket[v]), 0) if int(g.bucket[v]) in sparse else int(g.nbytes[v])
            for v in first[np.argsort(g.bucket[first], kind="stable")]]
