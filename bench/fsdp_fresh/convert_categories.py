"""Where ``whatif DDP --data-parallel fsdp`` misses, category by category, on kept DDP/FSDP2 pairs (``judge_pairs.py``'s
pairs): each rank's main lane a step (ms, averaged over ranks and steps; ``bench_fsdp.lane_groups``) in the FSDP2 job's own
profile against the conversion of the DDP profile as ``whatif --raw`` converts it (the profiler's own cost left in, as in
the FSDP profile it is held against; without ``--raw`` whatif takes it out of both, so its point is lower where a
window ran slower than the steps around it), split as ``workers_categories.row`` splits it (busy: layers, FSDP2's
host work; the optimizer; the waits' gaps; idle; each collective kind's time) and the host work by group (layers, copy-out
and reshard, FSDP2's hooks, the lanes' other host work: a job's own hooks are no named span of its profile, so they lie
in its "other host", and the two compare together), then the median of each category's difference over the pairs. The
blocking collectives by kind too (``blocked``): what each rank's lane spends on them, the idle before their waits and the
waits' gaps (wake-ups), which "idle" and "wake-ups" hold among the rest. No timing: run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/convert_categories.py PAIR ... [--json]   (from the repository root)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_fsdp import lane_groups, lane_idle  # noqa: E402
from judge_pairs import pairs_of  # noqa: E402
from workers_categories import row, step_ms  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402
from dagprof.replay import replay  # noqa: E402
from dagprof.search import scenario  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402

KINDS = {"all_gather": "AG blocked", "reduce_scatter": "RS blocked"}  # by the waits' names, "rankR.wait <kind> <unit>"
COLS = ("step", "busy", "layers", "fsdp host", "other host", "optimizer", "wake-ups", "idle", "all-gather", "reduce-scatter",
        *KINDS.values())


def blocked(g) -> dict[str, float]:
    """Per kind of FSDP collective, the ms a step each rank's main lane spends blocked on its waits (the idle before them
    and their gaps), averaged over ranks: where the lane's idle and wake-ups go."""
    res, out = replay(g), dict.fromkeys(KINDS, 0.0)
    ranks = sorted({int(r) for r in g.rank if r >= 0})
    for r in ranks:
        for v, idle in lane_idle(g, res, r):
            kind = g.node_name(v).partition(".")[2].split(" ")[1:2]
            if g.kind[v] == Kind.COMM_WAIT and kind and kind[0] in out:
                out[kind[0]] += idle + float(g.gap[v])
    return {KINDS[k]: v / 1e3 / len(ranks) / max(len(g.meta.steps), 1) for k, v in out.items()}


def categories(g) -> dict[str, float]:
    """``workers_categories.row`` of ``g`` with the busy time split: layers, FSDP2's host work (copy-out, reshard, hooks), the
    rest; and ``blocked``."""
    lanes = lane_groups(g)
    layers = lanes["forward layers"] + lanes["backward layers"]
    fsdp = lanes["fsdp copy-out/reshard"] + lanes["fsdp hooks"]
    r = row(g)
    return {"step": step_ms(g), **r, "layers": layers, "fsdp host": fsdp, "other host": r["busy"] - layers - fsdp, **blocked(g)}


def converted(ddp: str):
    """The DDP profile ``ddp`` as ``whatif --data-parallel fsdp --raw`` converts it (the scenario's passes, no link file)."""
    c = scenario.Cluster()
    marked = scenario.profiled_at(open_run(ddp).graph, c)
    return scenario.apply(marked, scenario.Scenario(data_parallel="fsdp"), c, scenario.base_topology(marked, c))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pairs", nargs="+")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rows = []
    for arg in a.pairs:
        for ddp, fsdp in pairs_of(arg):
            rows.append({"ddp": ddp, "converted": categories(converted(ddp)), "fsdp": categories(open_run(fsdp).graph)})
            if not a.json:
                conv, job = rows[-1]["converted"], rows[-1]["fsdp"]
                print(f"{ddp}\n  {'':10s}" + " ".join(f"{c:>14s}" for c in COLS))
                for label, r in (("converted", conv), ("FSDP job", job)):
                    print(f"  {label:10s}" + " ".join(f"{r[c]:14.2f}" for c in COLS))
    median = {c: float(np.median([r["converted"][c] - r["fsdp"][c] for r in rows])) for c in COLS}
    if a.json:
        print(json.dumps({"rows": rows, "median_difference_ms": median}))
    else:
        print(f"median converted - FSDP job over {len(rows)} pairs, ms a step:\n  {'':10s}" + " ".join(f"{median[c]:+14.2f}" for c in COLS))


if __name__ == "__main__":
    main()
