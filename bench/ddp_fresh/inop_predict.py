"""Predictions for ``zero1_measure.py --before`` rounds of a script whose model runs collectives inside its ops
(``clip_contrastive.py``, ``syncbn_convnet.py``): per kept round, the slower rate predicted from the profile at the
faster one by this checkout (``prof-<rate>-K``, the collector that sizes them), by the ``--before`` checkout on that
same profile (they stay as measured) and on its own (``prof-before-<rate>-K``), against the unprofiled job measured
at the slower rate in the same round. The shaped loopback carries both directions in one shaper, so each rate's payload
is given as ``zero1_measure``'s README line says (``--payload``: Mbit/s of payload per shaped Mbit/s), and this
checkout is told so (``whatif --half-duplex``: a scatter's one-way transfers get both directions' share); ``after_full``
is its answer without that, as on a switched port.

    python bench/ddp_fresh/inop_predict.py --before BEFORE DIR [DIR ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


def predict(src: str, profile: str, fast: float, slow: float, payload: float, *extra: str) -> float | None:
    """The predicted median step (ms) at ``slow`` Mbit/s from ``profile`` taken at ``fast``, by the dagprof in ``src``."""
    cmd = [sys.executable, "-m", "dagprof.cli.main", "whatif", profile, "--bandwidth", f"{slow * payload:g}Mbit",
           "--profiled-bandwidth", f"{fast * payload:g}Mbit", "--no-trace", "--json", *extra]
    r = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True)
    if r.returncode:
        print(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}", file=sys.stderr)
        return None
    return json.loads(r.stdout)["scenarios"][0]["predicted_iter_ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kept", nargs="+", help="zero1_measure.py --keep folders")
    ap.add_argument("--before", required=True, help="the checkout the rounds' prof-before-* were profiled with")
    ap.add_argument("--payload", type=float, default=0.478203, help="payload Mbit/s per shaped Mbit/s (both directions in one shaper)")
    a = ap.parse_args()
    before = os.path.join(a.before, "src")
    for kept in a.kept:
        rows = json.load(open(os.path.join(kept, "measured.json")))
        profiled = [r for r in rows if r["profiled"]]
        fast = profiled[0]["rate"] / 1e6
        for k in sorted({int(r["profiled"].rsplit("-", 1)[1]) for r in profiled}):
            at = [r for r in rows if not r["profiled"] and r["rate"] and r["rate"] / 1e6 != fast]
            slow, measured = at[k]["rate"] / 1e6, at[k]["median_ms"]
            prof, prof_before = (os.path.join(kept, f"prof{s}-{fast:g}-{k}") for s in ("", "-before"))
            out = {"kept": kept, "round": k, "measured_ms": measured, "load": round(at[k]["load"], 1),
                   "after": predict(SRC, prof, fast, slow, a.payload, "--half-duplex"), "after_full": predict(SRC, prof, fast, slow, a.payload),
                   "before_same_profile": predict(before, prof, fast, slow, a.payload), "before": predict(before, prof_before, fast, slow, a.payload)}
            for key in ("after", "after_full", "before_same_profile", "before"):
                if out[key] is not None:
                    out[f"{key}_pct"] = round(100 * (out[key] - measured) / measured, 1)
            print(json.dumps(out))


if __name__ == "__main__":
    main()
