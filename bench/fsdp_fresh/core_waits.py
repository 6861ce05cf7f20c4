"""What ``--cores 2`` makes the ranks wait for a core in the model, beside what ``core_use.py`` measured: per kept
2-rank FSDP profile, ``whatif --workers 4 --cores 2`` and ``--mesh 2x2 --cores 2`` replayed (``scenario.apply`` as whatif
does), per rank and step (ms): gloo's blocks on the shared cores (``passes.comm_cpu``: their count, CPU and wait) and the
training threads' ops (their time and wait); a node's wait is its start less its gap less its latest predecessor's end.
No timing: run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/core_waits.py PROFILE ...   (a part-12 round's ``roundK/fsdp``)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from dagprof.analysis import job_iteration_us
from dagprof.graph.dag import DeviceKind
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.search import scenario


@dataclass(frozen=True, slots=True)
class Waits:
    """One what-if's replay under ``--cores 2``, per rank and step: gloo's blocks (count, CPU ms, wait ms) and the training
    threads' ops on the shared cores (time ms, wait ms); its step (ms)."""

    step_ms: float
    gloo_blocks: float
    gloo_cpu_ms: float
    gloo_wait_ms: float
    ops_ms: float
    ops_wait_ms: float


def waits(g) -> Waits:
    """``Waits`` of the replay of ``g`` (a graph ``scenario.apply`` gave with ``cores``): a node's wait is its start less its gap
    less its latest predecessor's end."""
    res = replay(g)
    shared = [i for i, d in enumerate(g.devices) if d.rank < 0 and d.kind == DeviceKind.COMPUTE and "cores)" in d.name]
    on = np.flatnonzero(np.isin(g.device, shared))
    gloo = np.array([".gloo cpu " in g.node_name(int(v)) for v in on], bool)
    indptr, pred = g.pred_csr
    ready = np.array([res.end[pred[indptr[v]:indptr[v + 1]]].max(initial=0.0) for v in on])
    wait = res.start[on] - g.gap[on] - ready
    per = g.world_size * max(len(g.meta.steps), 1)
    return Waits(job_iteration_us(g) / 1e3, gloo.sum() / per, g.dur[on[gloo]].sum() / per / 1e3, wait[gloo].sum() / per / 1e3,
                 g.dur[on[~gloo]].sum() / per / 1e3, wait[~gloo].sum() / per / 1e3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", nargs="+")
    a = p.parse_args()
    c = scenario.Cluster(cores=2)
    for path in a.profiles:
        marked = scenario.profiled_at(open_run(path).graph, c)
        topology = scenario.base_topology(marked, c)
        for s in (scenario.Scenario(workers=4), scenario.Scenario(mesh=(2, 2))):
            w = waits(scenario.apply(marked, s, c, topology))
            print(f"{path} {'--workers 4' if s.workers else '--mesh 2x2'}: step {w.step_ms:.1f} ms | gloo blocks {w.gloo_blocks:.0f}, "
                  f"CPU {w.gloo_cpu_ms:.1f}, wait {w.gloo_wait_ms:.1f} | training ops {w.ops_ms:.1f}, wait {w.ops_wait_ms:.1f}  "
                  "(ms a rank and step)", flush=True)


if __name__ == "__main__":
    main()
