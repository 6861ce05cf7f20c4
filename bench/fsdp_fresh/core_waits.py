"""What ``--cores 2`` makes the ranks wait for a core in the model, beside what ``core_use.py`` measured: per kept
2-rank FSDP profile, ``whatif --workers 4 --cores 2`` and ``--mesh 2x2 --cores 2`` replayed (``scenario.apply`` as whatif
does), per rank and step (ms): gloo's blocks on the shared cores (``passes.comm_cpu``: their count, CPU and wait) and the
training threads' ops (their time and wait); a node's wait is its start less its gap less its latest predecessor's end.
No timing: run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/core_waits.py PROFILE ...   (a part-12 round's ``roundK/fsdp``)
"""
from __future__ import annotations

import argparse

import numpy as np

from dagprof.analysis import job_iteration_us
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.search import scenario


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", nargs="+")
    a = p.parse_args()
    c = scenario.Cluster(cores=2)
    for path in a.profiles:
        marked = scenario.profiled_at(open_run(path).graph, c)
        topology = scenario.base_topology(marked, c)
        for s in (scenario.Scenario(workers=4), scenario.Scenario(mesh=(2, 2))):
            g = scenario.apply(marked, s, c, topology)
            res = replay(g)
            shared = [i for i, d in enumerate(g.devices) if d.rank < 0 and d.capacity == 2]
            on = np.flatnonzero(np.isin(g.device, shared))
            gloo = np.array([".gloo cpu " in g.node_name(int(v)) for v in on], bool)
            indptr, pred = g.pred_csr
            ready = np.array([res.end[pred[indptr[v]:indptr[v + 1]]].max(initial=0.0) for v in on])
            wait = res.start[on] - g.gap[on] - ready
            per = g.world_size * max(len(g.meta.steps), 1)
            print(f"{path} {'--workers 4' if s.workers else '--mesh 2x2'}: step {job_iteration_us(g) / 1e3:.1f} ms | gloo blocks "
                  f"{gloo.sum() / per:.0f}, CPU {g.dur[on[gloo]].sum() / per / 1e3:.1f}, wait {wait[gloo].sum() / per / 1e3:.1f} | "
                  f"training ops {g.dur[on[~gloo]].sum() / per / 1e3:.1f}, wait {wait[~gloo].sum() / per / 1e3:.1f}  (ms a rank and step)",
                  flush=True)


if __name__ == "__main__":
    main()
