"""Multi-rank replay on real recordings: how collectives shared by ranks are timed (graph/shared_collectives.py).

Replays every run folder given (default: the repository's real 2-worker TF and JAX fixtures) and,
with ``--record N``, N fresh rounds of real gloo DDP jobs recorded here in interleaved order: a
model and bucket sizes other than the demo's (a narrower CNN at 0.1 and 25 MB, an MLP in one
bucket) and the tiny model on 3 ranks (DDP's buffer broadcasts then release receivers one by one).
Per run: ranks, steps, measured iteration (slowest rank), the replay of every profiled step with
its own op times (full) and of the averaged iteration (template: each op at its mean over the
steps, a prediction), the worst rank's full error, and how many inferred edges the measured
timeline contradicts. Then the median and max |error| of each.

    python bench/bench_multirank.py [RUN ...] [--record 2] [--keep DIR]

Shared 2-core machine: recordings made under load show what users see (workers leave the same
collective milliseconds apart); say so when quoting the figures.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from diff_workload import Variant, record  # noqa: E402

from dagprof.errors import DagprofError  # noqa: E402
from dagprof.graph.provenance import violations  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402

FIXTURES = [ROOT / "tests/data/tf/loop", ROOT / "tests/data/tf/fit", ROOT / "tests/data/tf-jax/mlp"]
NARROW = dict(width=16, blocks=(1, 2, 1), image_size=16, batch_size=8)
VARIANTS = {
    "cnn16-0.1MB": Variant(bucket_cap_mb=0.1, model=NARROW, steps=14, profile_steps=(4, 12)),
    "cnn16-25MB": Variant(bucket_cap_mb=25, model=NARROW, steps=14, profile_steps=(4, 12)),
    "mlp-25MB": Variant(bucket_cap_mb=25, mlp=True, model=dict(image_size=32, batch_size=32), steps=30, profile_steps=(10, 26)),
    "tiny-3ranks": Variant(bucket_cap_mb=0.02, world_size=3, steps=14, profile_steps=(4, 12)),
}


def row(name: str, path: str) -> dict | None:
    try:
        full, tmpl = open_run(path), open_run(path, template=True)
    except DagprofError as err:
        print(f"{name:28s} refused: {err}")
        return None
    a = full.analysis
    worst = max((100 * (a.predicted_iter_us[r] / m - 1) for r, m in a.measured_iter_us.items()), key=abs)
    bad = sum(c.violated for c in violations(full.graph))
    print(f"{name:28s} {len(a.measured_iter_us):>5} {a.steps:>5} {a.measured_us / 1e3:>11.2f} {a.error_pct:>+8.2f} "
          f"{tmpl.analysis.error_pct:>+9.2f} {worst:>+10.2f} {bad:>9}", flush=True)
    return {"full": abs(a.error_pct), "template": abs(tmpl.analysis.error_pct)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="*", help="run folders (default: the TF/JAX fixtures)")
    p.add_argument("--record", type=int, default=0, help="rounds of fresh gloo recordings (each round records every variant once)")
    p.add_argument("--keep", help="keep the recordings in this folder")
    args = p.parse_args()
    runs = [(os.path.relpath(r, ROOT) if str(r).startswith(str(ROOT)) else str(r), str(r)) for r in (args.runs or FIXTURES)]
    print(f"{'run':28s} {'ranks':>5} {'steps':>5} {'measured ms':>11} {'full %':>8} {'template %':>9} {'worst rank':>10} {'violated':>9}")
    got = [x for name, path in runs if (x := row(name, path))]
    with tempfile.TemporaryDirectory(prefix="dagprof-multirank-") as tmp:
        out = pathlib.Path(args.keep or tmp)
        for rnd in range(args.record):
            for name, v in VARIANTS.items():
                folder = record(v, out / f"{name}-r{rnd}")
                got += [x for x in [row(f"{name} (round {rnd})", folder)] if x]
    for kind in ("full", "template"):
        e = [x[kind] for x in got]
        if e:
            print(f"{kind:>8}: median |error| {statistics.median(e):.2f} %, max {max(e):.2f} % over {len(e)} runs")


if __name__ == "__main__":
    main()
