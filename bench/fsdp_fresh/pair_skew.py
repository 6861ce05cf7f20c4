"""Where the FSDP2 jobs' skew between the ranks comes from, on kept DDP/FSDP pairs (``pair_categories.pairs``): per pair,
at each all-gather the order and gap in which the two ranks reach it (each rank's last op before the call, as replayed),
in the FSDP2 job, in the DDP profile's conversion (``whatif --data-parallel fsdp``) and at the DDP profile's own
all-reduces; and the ranks' release after each call (each wait's measured lag beyond the transfer: first rank out, the
other) at the job's all-gathers and reduce-scatters and at DDP's all-reduces, beside the DDP profile's own wake-up
(the median lag of its waits that blocked, ``passes.data_parallel.wake_up``). ms; no timing: run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/pair_skew.py ROUND... (a round's ddp/fsdp, or a LoRA record's ddp-K/fsdp-K)
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pair_categories import pairs  # noqa: E402

from dagprof.passes.data_parallel import _blocked_lags  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.replay import replay  # noqa: E402
from dagprof.search import scenario  # noqa: E402
from dagprof.traces.events import CommKind, Kind  # noqa: E402


def arrivals(g, kind: CommKind) -> np.ndarray:
    """(step, rank 0's arrival less rank 1's) per collective of ``kind`` on two ranks: each rank's last op before it."""
    r = replay(g)
    out = []
    for v in np.flatnonzero((g.kind == Kind.COMM) & (g.comm_kind == int(kind))).tolist():
        seen: dict[int, float] = {}
        for s in g.predecessors(v).tolist():
            for u in [s] if g.rank[s] >= 0 else [u for u in g.predecessors(s).tolist() if g.rank[u] >= 0]:
                seen[int(g.rank[u])] = max(seen.get(int(g.rank[u]), -np.inf), float(r.end[u]))
        if 0 in seen and 1 in seen:
            out.append((int(g.step[v]), seen[0] - seen[1]))
    return np.array(out).reshape(-1, 2)


def releases(g, kind: CommKind) -> np.ndarray:
    """(first rank's lag, the other's) in ms after each collective of ``kind`` on two ranks (its waits' gaps)."""
    out = []
    for v in np.flatnonzero((g.kind == Kind.COMM) & (g.comm_kind == int(kind))).tolist():
        gaps = sorted(float(g.gap[w]) for w in g.successors(v).tolist() if g.kind[w] == Kind.COMM_WAIT and g.rank[w] >= 0)
        if len(gaps) == 2:
            out.append(gaps)
    return np.array(out).reshape(-1, 2) / 1e3


def skew_cell(a: np.ndarray) -> str:
    if not len(a):
        return f"{'-':>27s}"
    d = a[:, 1] / 1e3
    return f"{len(d) / len(np.unique(a[:, 0])):4.1f} {np.median(np.abs(d)):5.2f} {np.abs(d).sum() / len(np.unique(a[:, 0])):6.1f} {np.mean(d > 0):5.2f}"


def lag_cell(x: np.ndarray) -> str:
    return f"{np.mean(x[:, 0]):5.2f} {np.mean(x[:, 1]):5.2f}" if len(x) else f"{'-':>11s}"


def main() -> None:
    print("skew: calls a step, |rank 0's arrival - rank 1's| median and summed a step, share where rank 0 came later; "
          "release: first rank's lag, the other's (means)")
    print(f"{'pair':30s} {'job AG skew':>27s} {'conv AG skew':>27s} {'DDP AR skew':>27s} {'job AG rel':>11s} {'job RS rel':>11s} "
          f"{'DDP AR rel':>11s} {'DDP wake':>8s}")
    for root in sys.argv[1:]:
        for label, ddp_dir, fsdp_dir in pairs(root):
            ddp, job = open_run(ddp_dir).graph, open_run(fsdp_dir).graph
            c = scenario.Cluster()
            conv = scenario.apply(ddp, scenario.Scenario(data_parallel="fsdp"), c, scenario.base_topology(ddp, c))
            lags = _blocked_lags(ddp) / 1e3
            print(f"{label[-30:]:30s} {skew_cell(arrivals(job, CommKind.ALL_GATHER))} {skew_cell(arrivals(conv, CommKind.ALL_GATHER))} "
                  f"{skew_cell(arrivals(ddp, CommKind.ALL_REDUCE))} {lag_cell(releases(job, CommKind.ALL_GATHER))} "
                  f"{lag_cell(releases(job, CommKind.REDUCE_SCATTER))} {lag_cell(releases(ddp, CommKind.ALL_REDUCE))} "
                  f"{np.median(lags) if len(lags) else float('nan'):8.2f}", flush=True)


if __name__ == "__main__":
    main()
