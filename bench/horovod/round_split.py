"""A testbed round's bandwidth what-if error split into its parts, from the round's own profiles: where on the step did
the prediction and the measurement part?

Per round kept by ``bench_frameworks.py --testbed --keep`` (``tb-NAME-K-RATEM`` folders; every job there is profiled),
the critical path of each job's replay per category (ms per step, the window's mean: ``analysis.critical_path``; its
"framework overhead" is the gaps between ops on the path, "other" Horovod's negotiations and the phases between the
model's layers), its median step and its collectives' time per step, for:

- ``A``: the profiled job at the faster rate, as measured;
- ``model``: A on the link fitted to its collectives, the model the what-if starts from;
- ``P``: the what-if at the slower rate (``shaped_loopback.rate_models``, as ``predict_rate`` prices it);
- ``B``: the job measured at the slower rate;
- ``before``, ``after``: the faster rate's reference jobs around B (where kept).

Row "peer waits" (not a path category; mostly inside "other"): rank 0's negotiations' waits for a peer still receiving the
previous response's tail, per step (the nodes' ``exit_lag``, from every rank's Horovod trace log; P scales A's by the
link): a job where one rank left fused all-reduces tens of ms after rank 0 shows it here, not in the collectives.

The last columns: P less B, and the what-if's change less the measured one ((P - model) - (B - A)). A part that moved
between A and B alike in both references (the job's level) is the load; one that moved only between the rates and that
P misses is the model's. With ``--steps``, each job's replayed steps, collectives per step (ms) and transfers per step
(Horovod's fused responses: P keeps A's fusion, B shows the fusion at the slower wire).

    python bench/horovod/round_split.py /tmp/KEPT hvd_autoencoder 0 [--steps]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shaped_loopback import comm_per_step_ms, median_step_ms, rate_models  # noqa: E402

from dagprof.analysis.critical_path import critical_path  # noqa: E402
from dagprof.analysis.interval import step_times  # noqa: E402
from dagprof.passes.link_fit import priced_comm  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.replay import replay  # noqa: E402
from dagprof.traces.events import CommRole  # noqa: E402

CATEGORIES = ("communication", "framework overhead", "forward", "backward", "update", "other", "memcpy")
SIDES = ("before", "after")


def jobs(kept: str, name: str, k: int) -> dict:
    """The round's graphs by column (``A``, ``model``, ``P``, ``B``, and the references kept)."""
    with open(os.path.join(kept, f"tb-{name}-pair.json")) as f:
        pair = json.load(f)
    fast, slow = pair["rate_bit"], pair["other_rate_bit"]
    a = os.path.join(kept, f"tb-{name}-{k}-{int(fast / 1e6)}M")
    g = open_run(a).graph
    m = rate_models(g, a, fast, slow, pair.get("hosts", False))
    out = {"A": g, "model": m.model, "P": m.what_if, "B": open_run(os.path.join(kept, f"tb-{name}-{k}-{int(slow / 1e6)}M")).graph}
    return out | {side: open_run(f"{a}-{side}").graph for side in SIDES if os.path.isdir(f"{a}-{side}")}


def split(g) -> dict[str, float]:
    """ms per step on the critical path by category, the path's total, the median step and the collectives per step."""
    steps = len(np.unique(g.step[g.step >= 0]))
    cp = critical_path(g, replay(g))
    waits = (g.role == CommRole.NEGOTIATION) & (g.rank >= 0)
    return ({c: cp.by_category.get(c, 0.0) / steps / 1e3 for c in CATEGORIES} | {"peer waits": g.exit_lag[waits].sum() / steps / 1e3}
            | {"path": cp.total_us / steps / 1e3, "median step": median_step_ms(g), "collectives": comm_per_step_ms(g)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kept")
    ap.add_argument("name")
    ap.add_argument("round", type=int)
    ap.add_argument("--steps", action="store_true", help="each job's replayed steps and collectives per step too")
    args = ap.parse_args(argv)
    graphs = jobs(args.kept, args.name, args.round)
    rows = {col: split(g) for col, g in graphs.items()}
    print(f"{args.kept} {args.name} round {args.round} (ms per step)")
    print(f"{'':20s}" + "".join(f"{c:>9s}" for c in rows) + f"{'P-B':>9s}{'chg err':>9s}")
    for key in (*CATEGORIES, "peer waits", "path", "median step", "collectives"):
        r = {c: rows[c][key] for c in rows}
        print(f"{key:20s}" + "".join(f"{v:9.1f}" for v in r.values())
              + f"{r['P'] - r['B']:9.1f}{(r['P'] - r['model']) - (r['B'] - r['A']):9.1f}")
    if args.steps:
        for col, g in graphs.items():
            comm = priced_comm(g) & (g.dur > 0)
            per = [g.dur[comm & (g.step == s)].sum() / 1e3 for s in np.unique(g.step[comm])]
            count = [int((comm & (g.step == s)).sum()) for s in np.unique(g.step[comm])]
            print(f"{col:7s} steps " + " ".join(f"{v / 1e3:5.0f}" for v in step_times(g, replay(g)))
                  + " | collectives " + " ".join(f"{v:5.0f}" for v in per) + " | transfers " + " ".join(f"{n:3d}" for n in count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
