"""A DDP gradient bucket, the one shape every layer uses: the collector writes it into run files
(``run_schema.RankFile.bucket_layouts``), readers put the last layout on ``RankTrace.buckets``
(the parse cache stores it as is), the graph carries rank 0's on ``GraphMeta.buckets``, and the
optimizer orders the gradients by it (``passes.gradients.gradient_order``).

A msgspec Struct so the run file is encoded and decoded with it directly (its JSON form is the
run-file format's: keep the fields' names and order). The strategy file names planned buckets in
its own record (``collect.deploy.strategy.Bucket``), for the reason given there.
"""
from __future__ import annotations

import msgspec


class Bucket(msgspec.Struct, frozen=True):
    """One DDP gradient bucket: the parameters one all-reduce carries, in gradient-ready order."""

    index: int  # DDP's bucket index; COMM events carry it in ``EventTable.bucket``
    nbytes: int
    params: tuple[str, ...]
    shapes: tuple[tuple[int, ...] | None, ...] = ()  # per parameter (what ``dagprof.apply`` checks a strategy against); () unknown


BucketLayout = tuple[Bucket, ...]  # one layout: its buckets by index
