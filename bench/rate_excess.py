"""Where a DDP job's 1 Gbit/s -> 200 Mbit/s what-if misses, from ``fresh_rounds.py`` rounds profiled at both rates
(``--profiles profile-1G,profile-200M``): the collectives' time beyond the wire in each profile, and the step's change
in ms, predicted against measured. No lock: it reads kept rounds and replays them.

Per round and collective size (priced collectives, ``passes.link_fit.priced_comm``): the mean node time at each rate
less the wire's time for the bytes a port sends (a 2-rank ring's 2 (n-1)/n of them, at ``shaped_loopback.PAYLOAD_SHARE``
of each frame), and that excess at 200 Mbit/s over the one at 1 Gbit/s: about 5 where the excess is queueing behind
data on a shaped port (it grows with 1/rate), about 1 where it is fixed time (the link fit's latency, kept at every
rate), below 1 where a slower wire hides it. Per round, the median step (ms): the model of each profile and the other
rate predicted from it (``whatif --bandwidth A,B --profiled-bandwidth A``), the unprofiled twins, and the change error
two ways: ``fresh_rounds.py``'s ratio ((pred / model) / (meas / twin) - 1), and with the predicted change in ms put
on the unprofiled twin ((twin + pred - model) / meas - 1), which leaves out the level the profile ran at.

    .venv/bin/python bench/rate_excess.py KEPT/JOB [--src TREE/src]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fresh_rounds import measured_ms  # noqa: E402
from shaped_loopback import PAYLOAD_SHARE  # noqa: E402
from whatif_cli import whatif_json  # noqa: E402

RATES = {"1G": 1e9, "200M": 200e6}
ARGS = {"1G": "1Gbit", "200M": "200Mbit"}


def excess_us(run: str, rate: float) -> dict[int, tuple[int, float, float]]:
    """Per priced collective size (bytes): (instances, mean node us, mean us beyond the wire at ``rate`` bit/s)."""
    from dagprof.passes.link_fit import priced_comm, priced_world_size
    from dagprof.pipeline import open_run

    g = open_run(run).graph
    idx = np.flatnonzero(priced_comm(g))
    n = max(priced_world_size(g), 2)
    out = {}
    for b in np.unique(g.nbytes[idx]).tolist():
        on = idx[g.nbytes[idx] == b]
        wire = 2 * (n - 1) / n * b * 8 / (rate * PAYLOAD_SHARE) * 1e6
        dur = g.dur[on].astype(float)
        out[int(b)] = (len(on), float(dur.mean()), float(dur.mean() - wire))
    return out


def step_change(rnd: str, src: str | None) -> dict[str, float]:
    """Median steps (ms) of one round: each profile's model and its prediction at the other rate, and the twins."""
    row = {f"meas_{c}": measured_ms(rnd, c) for c in RATES}
    for at, to in (("1G", "200M"), ("200M", "1G")):
        with tempfile.TemporaryDirectory() as tmp:  # whatif writes beside its input: a copy
            run = shutil.copytree(os.path.join(rnd, f"profile-{at}"), os.path.join(tmp, "p"))
            base, s = whatif_json(run, "--bandwidth", f"{ARGS[at]},{ARGS[to]}", "--profiled-bandwidth", ARGS[at], src=src)["scenarios"]
        row[f"model_{at}"], row[f"pred_{to}_from_{at}"] = base["predicted_median_ms"], s["predicted_median_ms"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", help="a fresh_rounds.py --keep folder's job folder (KEPT/JOB), its rounds profiled at both rates")
    ap.add_argument("--src", default=None, help="the dagprof tree's src to predict with (default: this one's)")
    args = ap.parse_args()
    rounds = sorted((r for r in os.listdir(args.job) if r.startswith("round")), key=lambda r: int(r[5:]))
    level, free = [], []
    for r in rounds:
        rnd = os.path.join(args.job, r)
        if not all(os.path.isdir(os.path.join(rnd, f"profile-{c}")) for c in RATES):
            print(f"{r}: skipped, not profiled at both rates")
            continue
        ex = {c: excess_us(os.path.join(rnd, f"profile-{c}"), RATES[c]) for c in RATES}
        for b in sorted(set(ex["1G"]) & set(ex["200M"])):
            (n1, d1, e1), (n2, d2, e2) = ex["1G"][b], ex["200M"][b]
            ratio = f"x{e2 / e1:.2f}" if abs(e1) > 1 else "-"
            print(f"{r} {b / 1e3:8.1f} kB: 1G {n1} x {d1 / 1e3:6.2f} ms, beyond the wire {e1 / 1e3:+6.2f}; "
                  f"200M {n2} x {d2 / 1e3:6.2f} ms, beyond {e2 / 1e3:+6.2f} ({ratio})")
        s = step_change(rnd, args.src)
        if s["meas_1G"] is None or s["meas_200M"] is None:
            print(f"{r}: an unprofiled twin did not run")
            continue
        pred_d, meas_d = s["pred_200M_from_1G"] - s["model_1G"], s["meas_200M"] - s["meas_1G"]
        level.append(100 * ((s["pred_200M_from_1G"] / s["model_1G"]) / (s["meas_200M"] / s["meas_1G"]) - 1))
        free.append(100 * ((s["meas_1G"] + pred_d) / s["meas_200M"] - 1))
        print(f"{r} steps (ms): twins 1G {s['meas_1G']:.1f} 200M {s['meas_200M']:.1f} (+{meas_d:.1f}); profile-1G model "
              f"{s['model_1G']:.1f} -> 200M {s['pred_200M_from_1G']:.1f} (+{pred_d:.1f}); profile-200M model {s['model_200M']:.1f} "
              f"-> 1G {s['pred_1G_from_200M']:.1f}; predicted 200M over profile-200M's model "
              f"{100 * (s['pred_200M_from_1G'] / s['model_200M'] - 1):+.1f} %; change error {level[-1]:+.1f} %, "
              f"on the twin {free[-1]:+.1f} %")
    if level:
        print(f"change error median {statistics.median(level):+.1f} % ({min(level):+.1f} .. {max(level):+.1f}); on the twin "
              f"{statistics.median(free):+.1f} % ({min(free):+.1f} .. {max(free):+.1f}), {len(level)} round(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
