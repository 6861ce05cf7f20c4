"""What-ifs of an FSDP2 job (``graph.build_fsdp``), and the ones its graph cannot answer yet.

Link bandwidth and latency reprice every collective by its kind (``graph.build_fsdp.allreduce_equivalent_bytes``,
used by ``passes.comm``). Workers (the shard degree of plain FSDP): each collective still moves
its unit's whole parameters or gradients, priced for N ranks, and the optimizer step, which
updates this rank's shards only, takes N0/N of its time. DDP's knobs (buckets, overlap off,
tensor partition, parameter-server or tree schemes, Horovod's fusion) have no FSDP meaning, and
HSDP's two dimensions are not scaled yet: those are refused in one line, never answered as DDP.
"""
from __future__ import annotations

import numpy as np

from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.dag import Graph
from ..traces.events import Kind
from .comm import graph_world_size
from .workers import scale_workers

UNMODELLED = {
    "bucket_mb": "--bucket-mb (FSDP has no gradient buckets: each unit is reduce-scattered after its backward)",
    "no_overlap": "--no-overlap",
    "scheme": "--scheme (FSDP's all-gathers and reduce-scatters are ring collectives here)",
    "partition": "--partition",
    "horovod": "--fusion-mb / --cycle-ms",
    "fine": "--fine",
}


def refuse_unmodelled(g: Graph, asked: list[str]) -> None:
    """One line naming the first what-if an FSDP graph cannot answer (``asked``: keys of ``UNMODELLED``)."""
    if is_fsdp_graph(g) and asked:
        raise DagprofError(f"this profile is an FSDP job; {UNMODELLED[asked[0]]} is not modelled for FSDP yet "
                           "(modelled: --bandwidth, --latency, --workers, --compute-speed)")


def scale_fsdp_workers(g: Graph, workers: int) -> Graph:
    """What if the FSDP job sharded over ``workers`` ranks (same per-rank batch)?"""
    mesh = (g.meta.fsdp["units"] or [{}])[0].get("mesh") or []
    n0 = graph_world_size(g)
    shard0 = mesh[-1] if mesh else n0
    if len(mesh) > 1 and workers not in (1, n0):  # one worker (the scaling-efficiency baseline) shards nothing
        raise DagprofError(f"this profile is an HSDP job (mesh {'x'.join(map(str, mesh))}); --workers is not modelled for HSDP yet")
    out = scale_workers(g, workers)
    dur = out.dur.copy()
    upd = np.flatnonzero(out.kind == Kind.UPDATE)
    shard = workers if len(mesh) <= 1 or workers == 1 else shard0
    dur[upd] *= shard0 / shard  # the optimizer steps this rank's shards: 1/shard degree of every parameter
    return out.replace(dur=dur)
