"""Where ``whatif --workers 4`` of a 2-rank FSDP profile misses, category by category, on kept rounds of
``workers_rounds.py`` (``DIR/rK-NAME-profile2``, ``-profile4``): each rank's main lane a step (ms, averaged over ranks and
steps; ``bench_fsdp.lane_groups``) in the 4-rank profile against the 2-rank profile's ``--workers 4`` (each rank on its
own cores: ``--cores`` puts every rank's lane on one shared device, which ``lane_groups`` does not split), split into busy
time (layers, optimizer, other host work), sleep (waits' gaps and idle lanes) and the collectives by kind, with each
graph's all-gathers' and reduce-scatters' time per step. ``--per-rank``: a row per rank too; ``--cores N``: each graph's
step (``job_iteration_us``) also with ``--cores N`` (the 2-rank profile's ``--workers 4 --cores N``), the sharing's price
beside what the 4-rank profile's ops ran longer by (gloo's CPU on the cores too, ``passes.comm_cpu``, as whatif's --cores).
``tiedlm_workers.py`` keeps ``rK-tiedlm-profile2/4`` for it. No timing:
run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/workers_categories.py DIR ... [--per-rank] [--cores 2]   (from the repository root)
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_fsdp import lane_groups  # noqa: E402

from dagprof.analysis import job_iteration_us  # noqa: E402
from dagprof.graph.build_fsdp import fsdp_collectives  # noqa: E402
from dagprof.passes.comm_cpu import keep_comm_cpu  # noqa: E402
from dagprof.passes.compute import share_cores  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search import scenario  # noqa: E402
from dagprof.traces.events import CommKind  # noqa: E402

BUSY = ("forward layers", "backward layers", "forward other", "backward other", "loss", "post-update", "fsdp copy-out/reshard",
        "fsdp hooks")


def row(g, ranks: list[int] | None = None) -> dict[str, float]:
    """``ranks``' lanes (default all): busy, optimizer, the waits' gaps (wake-ups), idle (waiting for a collective), and
    every collective's time by kind per step (the shared transfers, not per rank)."""
    lanes = lane_groups(g, ranks)
    steps = max(len(g.meta.steps), 1)
    cs = fsdp_collectives(g)
    by = {k: sum(float(g.dur[c.node]) for c in cs if c.kind == k) / 1e3 / steps for k in (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER)}
    return {"busy": sum(lanes[k] for k in BUSY), "optimizer": lanes["optimizer"], "wake-ups": lanes["wait gaps"], "idle": lanes["idle"],
            "all-gather": by[CommKind.ALL_GATHER], "reduce-scatter": by[CommKind.REDUCE_SCATTER]}


def step_ms(g) -> float:
    return job_iteration_us(g) / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kept", nargs="+")
    p.add_argument("--per-rank", action="store_true")
    p.add_argument("--cores", type=int)
    a = p.parse_args()
    cols = ("busy", "optimizer", "wake-ups", "idle", "all-gather", "reduce-scatter")
    print(f"{'round / graph':44s} {'step':>8s}" + (f" {'cores':>8s}" if a.cores else "") + " " + " ".join(f"{c:>14s}" for c in cols))
    for root in a.kept:
        for two in sorted(d for d in os.listdir(root) if d.endswith("-profile2")):
            four = os.path.join(root, two.replace("profile2", "profile4"))
            p2 = open_run(os.path.join(root, two))
            c = scenario.Cluster()
            marked = scenario.profiled_at(p2.graph, c)
            marked = keep_comm_cpu(marked) if a.cores else marked  # as whatif's --cores: gloo's CPU priced on the profiled ranks
            graphs = [("2-rank profile", p2.graph),
                      ("--workers 4", scenario.apply(marked, scenario.Scenario(workers=4), c, scenario.base_topology(marked, c)))]
            if os.path.isdir(four):
                graphs.append(("4-rank profile", open_run(four).graph))
            for label, g in graphs:
                r = row(g)
                shared = f" {step_ms(share_cores(g, a.cores)) if g.world_size > a.cores else step_ms(g):8.1f}" if a.cores else ""
                print(f"{two.removesuffix('-profile2') + ' ' + label:44s} {step_ms(g):8.1f}{shared} " + " ".join(f"{r[c]:14.1f}" for c in cols),
                      flush=True)
                for k in range(g.world_size) if a.per_rank else ():
                    r = row(g, [k])
                    print(f"{'  rank ' + str(k):44s} {'':8s}{' ' * 9 if a.cores else ''} " + " ".join(f"{r[c]:14.1f}" for c in cols))


if __name__ == "__main__":
    main()
