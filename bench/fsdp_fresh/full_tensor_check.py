"""A state_dict save inside an FSDP2 profile, before and after its ``DTensor.full_tensor`` gathers became collectives.

For each dagprof run folder given (profiled with saves in the window, e.g. ``prefetch_offload.py --save-every 2``), the
same rank files without the gathers (what the collector wrote before: each gather host time of no collective) are
written to a temporary folder, and both are run through replay, ``replay --template`` and ``whatif --bandwidth``:

    PYTHONPATH=$PWD/src python bench/fsdp_fresh/full_tensor_check.py tests/data/fsdp-fresh/vit-save [--bandwidth 200Mbit]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

FULL_TENSOR = "full_tensor"
COLL_BEGIN, COLL_END = 16, 17  # run_schema.Rec.FSDP_COLL_BEGIN / END (a record: [code, a, b, t_ns, x])


def without_gathers(run: str, out: str) -> None:
    """``run``'s files into ``out`` with the full_tensor collectives and their records dropped, the others renumbered."""
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("*.html", "*.trace.json"))
    for name in sorted(os.listdir(out)):
        if not (name.startswith("rank") and name.endswith(".json")) or "kineto" in name:
            continue
        path = os.path.join(out, name)
        with open(path) as f:
            doc = json.load(f)
        colls = doc["fsdp"]["collectives"]
        new = {}
        for k, c in enumerate(colls):
            if c["phase"] != FULL_TENSOR:
                new[k] = len(new)
        doc["fsdp"]["collectives"] = [c for c in colls if c["phase"] != FULL_TENSOR]
        doc["records"] = [[r[0], new[r[1]], *r[2:]] if r[0] in (COLL_BEGIN, COLL_END) else r for r in doc["records"]
                          if r[0] not in (COLL_BEGIN, COLL_END) or r[1] in new]
        with open(path, "w") as f:
            json.dump(doc, f)


def cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "dagprof.cli.main", *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def figures(run: str, bandwidth: str, tmp: str) -> str:
    rep = cli("replay", run, "-o", tmp)
    avg = cli("replay", run, "--template", "-o", tmp)
    what = cli("whatif", run, "--bandwidth", bandwidth, "--allow-model-error", "--no-trace")
    s = what["scenarios"][0]
    return (f"replay {rep['error_pct']:+.2f} %, --template {avg['error_pct']:+.2f} %, "
            f"model {what['model_iter_ms']:.1f} ms, {bandwidth} {s['predicted_iter_ms']:.1f} ms "
            f"(x{s['predicted_iter_ms'] / what['model_iter_ms']:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--bandwidth", default="200Mbit")
    args = ap.parse_args()
    for run in args.runs:
        with tempfile.TemporaryDirectory() as tmp:
            before = os.path.join(tmp, "before")
            without_gathers(run, before)
            print(f"{run}:\n  gathers as host time (before): {figures(before, args.bandwidth, tmp)}"
                  f"\n  gathers as collectives (after): {figures(run, args.bandwidth, tmp)}", flush=True)


if __name__ == "__main__":
    main()
