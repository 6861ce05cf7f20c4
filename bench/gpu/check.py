"""The figures of a `bench/gpu/record.sh` recording, offline (no GPU): per kept run, the replay of its measured steps
and the averaged replay (``--template``) against the measurement, its GPU kernels in the graph, and for FSDP the peak
memory per rank the what-if predicts against the unprofiled run's ``torch.cuda.max_memory_allocated``.

    tar xzf runs.tgz -C DIR && python bench/gpu/check.py DIR [--json]
    python bench/gpu/check.py tests/data/gpu          # the two one-rank runs kept in the repository
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "src")))

from dagprof.errors import DagprofError  # noqa: E402
from dagprof.passes.profiler_cost import on_accelerator  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.fsdp_memory import fsdp_peak  # noqa: E402


def pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted / measured - 1.0)


def check(folder: str, name: str) -> dict:
    run = os.path.join(folder, name)
    out: dict = {"run": name}
    try:
        built = open_run(run)
        g = built.graph
        out["gpu_nodes"] = int(on_accelerator(g).sum())
        out["replay_pct"] = pct(built.analysis.predicted_us, built.analysis.measured_us)
        averaged = open_run(run, template=True).analysis
        out["template_pct"] = pct(averaged.predicted_us, averaged.measured_us)
    except DagprofError as e:
        return out | {"refused": str(e)}
    stats = os.path.join(folder, f"{name}.plain.json")  # as record.sh leaves it; tests/data/gpu keeps it inside the run
    stats = stats if os.path.exists(stats) else os.path.join(run, "unprofiled-stats.json")
    if built.graph.meta.fsdp is not None and os.path.exists(stats):  # as profiled (reshard on): the unprofiled run's setting
        measured = max(json.load(open(stats))["max_memory_allocated"]) / 2**20
        peak = max(m.total for m in fsdp_peak(built.graph).values()) / 2**20
        out |= {"peak_mib_predicted": peak, "peak_mib_measured": measured, "peak_pct": pct(peak, measured)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="the unpacked runs.tgz of bench/gpu/record.sh")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args()
    names = sorted(n for n in os.listdir(args.folder) if os.path.exists(os.path.join(args.folder, n, "manifest.json")))
    rows = [check(args.folder, n) for n in names]
    if args.json:
        print(json.dumps({"runs": rows}))
        return 0
    for r in rows:
        if "refused" in r:
            print(f"{r['run']:14} refused: {r['refused']}")
            continue
        mem = (f"  peak {r['peak_mib_predicted']:.1f} MiB predicted, {r['peak_mib_measured']:.1f} measured ({r['peak_pct']:+.1f} %)"
               if "peak_pct" in r else "")
        print(f"{r['run']:14} {r['gpu_nodes']:6d} GPU nodes  replay {r['replay_pct']:+.2f} %  averaged {r['template_pct']:+.2f} %{mem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
