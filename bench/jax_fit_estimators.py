"""Line estimators on a JAX run's link-fit sample: does any standard robust one set apart a size that stalled nearly
every step? The sample is the one ``passes.link_fit`` fits (``profiled_collectives`` of the instances
``transfer_spanned`` and ``joined_together`` keep), read at the testbed's wire as ``bench_frameworks --testbed`` does
(``shaped_loopback.rate_models``). Per estimator: latency (us) and time per byte against the wire's.

    python bench/jax_fit_estimators.py [RUN] [--rate 1e9]

On ``tests/data/tf-jax/zero-rs-late`` (2026-12-06) its 4-byte psums, 1.6-4.2 ms in 7 of 8 steps, carried every estimator
(least squares 0.56 of the wire's time per byte, Theil-Sen 0.59, LAD 0.62, Huber 0.65, bisquare 0.70, main's LAD with the
3-deviation cut 0.69); ``link_fit`` with ``slower_than_larger`` 0.73 (docs/evidence.md, branch jaxfit).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from shaped_loopback import rate_models  # noqa: E402  (puts this tree's src on the path)

from dagprof.passes import link_fit as lf  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.scenario import profiled_at  # noqa: E402

RUN = os.path.join(os.path.dirname(HERE), "tests", "data", "tf-jax", "zero-rs-late")


def _irls(a: np.ndarray, y: np.ndarray, weight, start: np.ndarray, scaled: bool) -> np.ndarray:
    """Iteratively reweighted least squares from ``start``: ``weight(residual / scale)``, the scale 1.4826 x MAD where ``scaled``."""
    c = start
    for _ in range(100):
        r = y - a @ c
        s = 1.4826 * float(np.median(np.abs(r - np.median(r)))) if scaled else 1.0
        w = weight(r / max(s, 1e-9))
        c = np.linalg.lstsq(a * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
    return c


def estimators(nbytes: np.ndarray, dur: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """(per-collective latency us, us per byte) of each estimator, on ``fit_link``'s design (2 (n-1) alpha + 2 (n-1)/n S beta)."""
    a = np.stack([np.full(len(nbytes), 2.0 * (n - 1)), 2 * (n - 1) / n * nbytes.astype(float)], axis=1)
    ls = np.linalg.lstsq(a, dur, rcond=None)[0]
    lad = _irls(a, dur, lambda u: 1.0 / np.maximum(np.abs(u), 1.0), ls, scaled=False)
    x = a[:, 1]
    i, j = np.triu_indices(len(x), 1)
    apart = x[i] != x[j]
    slope = float(np.median((dur[j] - dur[i])[apart] / (x[j] - x[i])[apart]))
    theil_sen = np.array([float(np.median(dur - slope * x)) / a[0, 0], slope])
    huber = _irls(a, dur, lambda u: np.minimum(1.0, 1.345 / np.maximum(np.abs(u), 1e-12)), lad, scaled=True)
    bisquare = _irls(a, dur, lambda u: np.where(np.abs(u) < 4.685, (1 - (u / 4.685) ** 2) ** 2, 0.0), lad, scaled=True)
    main = lf._fit_robust(nbytes, dur, n)[0]
    return {"least squares": ls, "Theil-Sen": theil_sen, "least absolute deviations": lad, "Huber (1.345)": huber,
            "Tukey bisquare (4.685)": bisquare, "LAD, 3-deviation cut, least squares (main)": np.array([main.alpha_us, main.beta_us_per_byte])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", default=RUN)
    ap.add_argument("--rate", type=float, default=1e9, help="the wire the run was profiled at, bit/s")
    args = ap.parse_args(argv)
    g = open_run(args.run).graph
    g = profiled_at(g, rate_models(g, args.run, args.rate, args.rate / 5).settings)
    comm = lf.profiled_comm(g)
    nbytes, dur = lf.profiled_collectives(g)
    keep = lf.transfer_spanned(g, comm) & lf.joined_together(g, comm)
    n, wire = lf.priced_world_size(g), 1e6 / g.meta.wire_bytes_per_s
    slow = lf.slower_than_larger(nbytes, dur, keep)
    print(f"{int(keep.sum())} instances, sizes {np.unique(nbytes[keep]).astype(int).tolist()}; set apart as slower than a larger size: {int(slow.sum())}")
    rows = estimators(nbytes[keep], dur[keep], n)
    fit = lf.link_fit(g)
    rows["link_fit (this tree)"] = np.array([fit.link.alpha_us, fit.link.beta_us_per_byte])
    for name, (alpha, beta) in rows.items():
        print(f"{name:45s} latency {alpha:7.1f} us   time per byte {beta / wire:5.3f} of the wire's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
