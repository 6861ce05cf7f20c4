"""A what-if that gives a profile's crowded ranks more of a core than they had, refused in one line.

Where a host's ranks outnumbered its cores when profiled, every op and collective time holds their waits for a core, and
nothing recorded takes them out: a Horovod rank's training thread polls its handles while it waits, so its CPU is not its
ops' (the autoencoder's 4 ranks on 2 cores: 143-410 ms of thread CPU a step against 66-72 ms for the same job on 1 worker,
crf69's kept round), and JAX's collectives, priced by a link fitted on the crowded run, keep the crowding with the lanes
scaled to their CPU. Kept answers missed silently: Horovod ``--workers 1`` +576 % (453.9 ms against 67.2 measured), JAX
4 -> 2 workers on the same 2 cores +110..+185 % (jaxring67's kept rounds; lanes at their CPU still +113..+182 %).
"""
from __future__ import annotations

import math

from ..errors import DagprofError
from ..graph.dag import Graph


def refuse_uncrowding(g: Graph, workers: int | None, cores: int | None, ranks_per_host: int | None) -> None:
    """Raise where a host's ranks outnumbered its cores when profiled and the what-if (``workers`` ranks,
    ``ranks_per_host`` of them on each host's ``cores``; None: as profiled) puts fewer ranks on each of its cores."""
    hosts = g.meta.host_cpus
    if not hosts:
        return
    n = int(g.meta.world_size or g.world_size) if workers is None else workers
    per = ranks_per_host or (n if cores else math.ceil(n / len(hosts)))
    for host in sorted(hosts):
        for k in g.meta.crowded_groups(host, 1, among_ranks=True):
            asked = cores or k.cores
            if per * k.cores < k.ranks * asked:
                flags = " ".join(f for f in (f"--workers {n}" if workers is not None else "", f"--cores {cores}" if cores else "",
                                             f"--ranks-per-host {ranks_per_host}" if ranks_per_host else "") if f)
                raise DagprofError(
                    f"{k.ranks} ranks shared the {k.cores} cores of host {host} when profiled, so its op and "
                    f"collective times hold their waits for a core; {flags} puts {per} rank{'s' if per > 1 else ''} on "
                    f"{asked} core{'s' if asked > 1 else ''}, which this answer cannot uncrowd: profile the job with at most "
                    "as many ranks as cores on a host", g.meta.source)

