"""Per kind, the time a step per rank of the collectives a model ran inside its ops (the in-op pieces) in a profile at
the faster rate and one at the slower (``zero1_measure.py --keep``'s ``prof-<rate>-K``, or any two dagprof runs of one
script), against the growth the link model prices for them from the first profile, with ``--half-duplex`` and without:
the check of each kind's price on the testbed's shaped loopback, where whole steps are too noisy to judge a few ms.

    python bench/ddp_fresh/inop_pieces.py FAST_PROFILE SLOW_PROFILE --fast 1000 --slow 200
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

from dagprof.passes.comm import in_op_pieces
from dagprof.pipeline import open_run
from dagprof.search.scenario import Cluster, Scenario, apply, base_topology, profiled_at
from dagprof.traces.events import CommKind


def per_kind(g) -> dict[str, float]:
    """ms a step per rank of the graph's in-op pieces, by kind."""
    out: dict[str, float] = defaultdict(float)
    v = in_op_pieces(g)
    n = len(g.meta.steps) * len(g.meta.ranks)
    for x in v.tolist():
        out[CommKind(int(g.comm_kind[x])).label] += float(g.dur[x]) / 1e3 / n
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("fast_profile")
    ap.add_argument("slow_profile")
    ap.add_argument("--fast", type=float, required=True, help="Mbit/s (shaped) the first was profiled at")
    ap.add_argument("--slow", type=float, required=True, help="Mbit/s (shaped) the second was profiled at")
    ap.add_argument("--payload", type=float, default=0.478203, help="payload Mbit/s per shaped Mbit/s (as inop_predict.py)")
    a = ap.parse_args()
    fast, slow = per_kind(open_run(a.fast_profile).graph), per_kind(open_run(a.slow_profile).graph)
    g = open_run(a.fast_profile).graph
    row = {"measured_fast_ms": fast, "measured_slow_ms": slow,
           "measured_growth_ms": {k: round(slow.get(k, 0.0) - v, 2) for k, v in fast.items()}}
    for key, half in (("priced_growth_half_duplex_ms", True), ("priced_growth_ms", False)):
        c = Cluster(profiled_bandwidth=f"{a.fast * a.payload:g}Mbit", half_duplex=half)
        g0 = profiled_at(g, c)
        base = base_topology(g0, c)
        now, was = (per_kind(apply(g0, Scenario(bandwidth=bw), c, base)) for bw in (f"{a.slow * a.payload:g}Mbit", None))
        row[key] = {k: round(now[k] - was[k], 2) for k in now}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
