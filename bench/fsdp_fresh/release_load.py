"""What the FSDP2 jobs' later-rank release at gloo's all-gathers follows, on kept DDP/FSDP pairs: per pair, the FSDP
job's mean and median release (each all-gather's two waits' gaps, later less first: ``pair_skew.releases``), its own
stretch of CPU work by its thread's waits for a core and the DDP profile's (``passes.data_parallel._stretch``, the
slowest rank's), and the DDP profile's blocked-wait wake-up; then, across pairs, the Spearman rank correlation of the
release with each stretch and the least-squares line of the release in the FSDP job's own (stretch - 1). The
conversion prices the release from the DDP profile, so only what that profile records can carry it. ms; no timing.

    PYTHONPATH=src python bench/fsdp_fresh/release_load.py [--json FILE] ROUND...   (a round's ddp/fsdp, or ddp-K/fsdp-K)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pair_categories import pairs  # noqa: E402
from pair_skew import releases  # noqa: E402

from dagprof.passes.data_parallel import _blocked_lags, _stretch  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.traces.events import CommKind  # noqa: E402


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rounds", nargs="+")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = []
    print(f"{'pair':32s} {'rel mean':>8s} {'median':>6s} {'job st':>6s} {'DDP st':>6s} {'DDP wake':>8s}")
    for root in args.rounds:
        for label, ddp_dir, fsdp_dir in pairs(root):
            job, ddp = open_run(fsdp_dir).graph, open_run(ddp_dir).graph
            x = releases(job, CommKind.ALL_GATHER)
            if not len(x):
                continue
            spread, lags = x[:, 1] - x[:, 0], _blocked_lags(ddp) / 1e3
            rows.append({"pair": label, "release_mean_ms": float(spread.mean()), "release_median_ms": float(np.median(spread)),
                         "job_stretch": max(_stretch(job).values()), "ddp_stretch": max(_stretch(ddp).values()),
                         "ddp_wake_ms": float(np.median(lags)) if len(lags) else None})
            r = rows[-1]
            print(f"{label[-32:]:32s} {r['release_mean_ms']:8.2f} {r['release_median_ms']:6.2f} {r['job_stretch']:6.2f} {r['ddp_stretch']:6.2f} "
                  f"{r['ddp_wake_ms'] if r['ddp_wake_ms'] is not None else float('nan'):8.2f}", flush=True)
    rel = np.array([r["release_mean_ms"] for r in rows])
    js, ds = np.array([r["job_stretch"] for r in rows]), np.array([r["ddp_stretch"] for r in rows])
    quiet = js < 1.1
    slope, icept = np.polyfit(js - 1.0, rel, 1) if len(rows) > 1 else (float("nan"), float("nan"))
    print(f"{len(rows)} pairs: Spearman release ~ job stretch {spearman(rel, js):+.2f}, ~ DDP stretch {spearman(rel, ds):+.2f}; "
          f"release = {icept:.2f} + {slope:.2f} x (job stretch - 1) ms (Pearson {np.corrcoef(rel, js)[0, 1]:+.2f}); "
          f"{int(quiet.sum())} jobs at stretch < 1.1: median {np.median(rel[quiet]) if quiet.any() else float('nan'):.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
