"""How a kept MXNet testbed round's exchange splits into a part that scales with the link and a part that does not,
measured and as dagprof's model has it, at the profiled rate and one other (1 server, the profiled workers).

A bandwidth what-if scales only what the model calls wire. Two rates of one round tell the measured split apart (E(r) =
fixed + wire x r0 / r: fixed = (r1 E1 - r0 E0) / (r1 - r0)); the same algebra on the profile's own model, replayed at
each rate's payload (``bench_mxnet_ps.PAYLOAD``), gives the model's split, before the link fit moves it. Where the model's
fixed part is longer than the measured one, its wire must be shorter for the profiled exchange to come out right, and
the fit does that by raising the rate: the other rate's what-if then keeps too much of the exchange. No job, no root:

    .venv/bin/python bench/mx_wire_split.py --rate 500e6 --other-rate 1e9 KEPT [KEPT...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np
from bench_mxnet_ps import PAYLOAD, measured_parts, predict, step_ms

from dagprof.passes import set_link
from dagprof.passes.comm import exchange_us
from dagprof.pipeline import open_run
from dagprof.replay import replay


def cell(rnd: str, rate: float) -> str:
    return os.path.join(rnd, f"s1_{rate / 1e6:g}M")


def replayed_exchange_ms(g, rate: float) -> float:
    """The model's mean exchange with every message at ``rate``'s TCP payload (no fit)."""
    h = set_link(g, rate / 8 * PAYLOAD)
    return float(np.mean(list(exchange_us(h, replay(h).start).values()))) / 1e3


def split(e0: float, e1: float, r0: float, r1: float) -> tuple[float, float]:
    """(fixed, wire at ``r0``) from exchanges ``e0`` at rate ``r0`` and ``e1`` at ``r1``, in ms."""
    fixed = (r1 * e1 - r0 * e0) / (r1 - r0)
    return fixed, e0 - fixed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", nargs="+", help="folders kept by bench_mxnet_ps.py --keep (their roundN/s1_RATEM cells)")
    ap.add_argument("--rate", type=float, default=500e6, help="the profiled rate")
    ap.add_argument("--other-rate", type=float, default=1e9)
    args = ap.parse_args()
    r0, r1 = args.rate, args.other_rate
    print(f"per round, ms: exchange measured at {r0 / 1e6:g} / {r1 / 1e6:g} Mbit/s -> fixed + wire at {r0 / 1e6:g}; the "
          f"{r0 / 1e6:g} profile's model at both payload rates -> its split; the step at {r1 / 1e6:g} measured and predicted")
    errs = []
    for kept in args.kept:
        for rnd in sorted(d for d in (os.path.join(kept, x) for x in os.listdir(kept)) if os.path.isdir(cell(d, r0)) and os.path.isdir(cell(d, r1))):
            e0, e1 = measured_parts(cell(rnd, r0))[0], measured_parts(cell(rnd, r1))[0]
            g = open_run(cell(rnd, r0)).graph
            m0, m1 = replayed_exchange_ms(g, r0), replayed_exchange_ms(g, r1)
            (fm, wm), (fp, wp) = split(e0, e1, r0, r1), split(m0, m1, r0, r1)
            with open(os.path.join(cell(rnd, r1), "mxnet-run.json")) as f:
                step = step_ms(json.load(f), False)
            pred = predict(cell(rnd, r0), r0, [(1, r1, 2)])[0][(1, r1, 2)][0]
            errs.append(100 * (pred - step) / step)
            print(f"{os.path.relpath(rnd, os.path.dirname(kept.rstrip('/')))}: measured {e0:.1f} / {e1:.1f} -> fixed {fm:.1f} + wire {wm:.1f}; "
                  f"model {m0:.1f} / {m1:.1f} -> fixed {fp:.1f} + wire {wp:.1f}; step at {r1 / 1e6:g} measured {step:.1f}, "
                  f"predicted {pred:.1f} ({errs[-1]:+.1f} %)")
    if errs:
        print(f"median error at {r1 / 1e6:g} Mbit/s: {statistics.median(errs):+.1f} % over {len(errs)} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
