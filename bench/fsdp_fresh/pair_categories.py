"""Where a DDP -> FSDP prediction misses, category by category, on kept pairs of ``mixer_rounds.sh`` (``ROUND/ddp``,
``ROUND/fsdp``) or of ``bench_lora_memory.py`` (``DIR/ddp-K``, ``DIR/fsdp-K``): each rank's main lane a step (ms,
averaged over ranks and steps; ``bench_fsdp.lane_groups`` on each profiled step, as ``whatif`` converts them) in the FSDP
profile against the DDP profile's conversion, split into busy time (layers, other host work, optimizer, copy-outs, FSDP2's hooks) and sleep (the waits'
gaps and the lane idle before a collective ends), the collectives' own time, and each profile's stretch of CPU work by
its thread's waits for a core (``traces.meta.runnable_stretch``). No timing: run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/pair_categories.py OUT/r1 OUT/r2 ...   (from the repository root)
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_fsdp import lane_groups  # noqa: E402

from dagprof.graph.build_fsdp import fsdp_collectives  # noqa: E402
from dagprof.passes.data_parallel import _stretch  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search import scenario  # noqa: E402

BUSY = ("forward layers", "backward layers", "forward other", "backward other", "loss", "post-update", "optimizer",
        "fsdp copy-out/reshard", "fsdp hooks", "ddp enqueue/copy")


def pairs(root: str) -> list[tuple[str, str, str]]:
    """(label, DDP profile, FSDP profile) under ``root``: a round's ddp/fsdp, or a LoRA record's ddp-K/fsdp-K."""
    if os.path.isdir(os.path.join(root, "ddp")):
        return [(root, os.path.join(root, "ddp"), os.path.join(root, "fsdp"))]
    ks = sorted(e[4:] for e in os.listdir(root) if e.startswith("ddp-") and os.path.isdir(os.path.join(root, "fsdp-" + e[4:])))
    if not ks:
        raise SystemExit(f"{root}: no ddp/fsdp (or ddp-K/fsdp-K) profiles")
    return [(f"{root} {k}", os.path.join(root, f"ddp-{k}"), os.path.join(root, f"fsdp-{k}")) for k in ks]


def row(g) -> dict[str, float]:
    lanes = lane_groups(g)
    cs = fsdp_collectives(g)
    steps = max(len(g.meta.steps), 1)
    return {"busy": sum(lanes[k] for k in BUSY), "hooks": lanes["fsdp hooks"], "copy-out": lanes["fsdp copy-out/reshard"],
            "sleep": lanes["wait gaps"] + lanes["idle"], "collectives": sum(float(g.dur[c.node]) for c in cs) / 1e3 / steps}


def main() -> None:
    print(f"{'pair / profile':44s} {'busy':>7s} {'hooks':>7s} {'copy':>7s} {'sleep':>7s} {'colls':>7s}  stretch")
    for root in sys.argv[1:]:
        for label, ddp_dir, fsdp_dir in pairs(root):
            ddp_run, fsdp_run = open_run(ddp_dir), open_run(fsdp_dir)
            ddp = ddp_run.graph
            c = scenario.Cluster()
            conv = scenario.apply(ddp, scenario.Scenario(data_parallel="fsdp"), c, scenario.base_topology(ddp, c))
            for name, g, run in (("fsdp", fsdp_run.graph, fsdp_run), ("from ddp", conv, ddp_run)):
                r = row(g)
                st = _stretch(run.graph)
                print(f"{label + ' ' + name:44s} {r['busy']:7.1f} {r['hooks']:7.1f} {r['copy-out']:7.1f} {r['sleep']:7.1f} "
                      f"{r['collectives']:7.1f}  {min(st.values()):.2f}-{max(st.values()):.2f}", flush=True)


if __name__ == "__main__":
    main()
