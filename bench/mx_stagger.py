"""How far apart MXNet ``dist_sync`` workers begin pushing each step, and where the distance comes from, in kept runs.

Per run folder (a kept ``bench_mxnet_ps.py --keep`` cell, or any MXNet PS run), over its profiled steps, for the workers
that began pushing first and last in a step (ms, medians over steps):

- ``push spread``: the latest worker's first push less the earliest's (``passes.comm.push_spread_us``);
- of it, ``served``: how much later the late worker's previous exchange ended (its last pull in), ``lead``: how much later
  it then began the step (the pulled weights' copies, its Python), ``compute``: how much longer it then took to its first
  push (its forward and backward; with more workers than cores, the cores shared);
- ``fan-out``: how far apart all workers' last pulls came in, and the servers' answer burst (the last update of the step
  to the last pull in); their ratio is 0 where a server's port serves its answers together (the replay: its port shares
  chunks fairly, ``graph.collectives.add_ps_part``) and (N-1)/N where one after another.

With ``--replay`` also the same read off the replay of the run's own model (``open_run``: the profiled configuration).

    .venv/bin/python bench/mx_stagger.py [--replay] RUN [RUN...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

from dagprof.graph.build_ps import DONE, ISSUE
from dagprof.traces.events import Kind


def per_step(g, start: np.ndarray) -> dict[int, dict[int, dict[str, float]]]:
    """step -> worker -> its mark (step start), first push issued and last pull in (``DONE``), in us, given ``start`` times."""
    names = np.array(g.names)[g.name]
    rows: dict[int, dict[int, dict[str, float]]] = {}
    for v in np.flatnonzero(g.kind == Kind.STEP):
        rows.setdefault(int(g.step[v]), {}).setdefault(int(g.rank[v]), {})["mark"] = float(start[v])
    for v in np.flatnonzero(names == ISSUE):
        w = rows.setdefault(int(g.step[v]), {}).setdefault(int(g.rank[v]), {})
        w["push"] = min(w.get("push", np.inf), float(start[v]))
    for v in np.flatnonzero(names == DONE):
        rows.setdefault(int(g.step[v]), {}).setdefault(int(g.rank[v]), {})["done"] = float(start[v])
    return rows


def split(rows: dict) -> list[tuple[float, float, float, float, float]]:
    """Per step with a step before it: (push spread, served, lead, compute, fan-out), us (see the module's docstring)."""
    out = []
    for s in sorted(rows):
        now, before = rows[s], rows.get(s - 1)
        if before is None or not all("push" in w and "mark" in w for w in now.values()) or not all("done" in w for w in before.values()):
            continue
        early = min(now, key=lambda w: now[w]["push"])
        late = max(now, key=lambda w: now[w]["push"])
        served = before[late]["done"] - before[early]["done"]
        lead = (now[late]["mark"] - before[late]["done"]) - (now[early]["mark"] - before[early]["done"])
        compute = (now[late]["push"] - now[late]["mark"]) - (now[early]["push"] - now[early]["mark"])
        ends = [w["done"] for w in before.values()]
        out.append((now[late]["push"] - now[early]["push"], served, lead, compute, max(ends) - min(ends)))
    return out


def answer_burst_ms(run_dir: str, g) -> float:
    """Median over the profiled steps of the last server update to the last pull in (ms), from the run's record of its
    servers' updates (``server_updates``: start and end, ns); nan where the run has none."""
    with open(os.path.join(run_dir, "mxnet-run.json")) as f:
        ups = json.load(f).get("server_updates") or {}
    if not ups:
        return float("nan")
    ends = np.sort(np.concatenate([np.array(u, dtype=float)[:, 4] / 1e3 for u in ups.values()]))
    rows = per_step(g, g.order)
    out = []
    for per in rows.values():
        if not all("push" in w and "done" in w for w in per.values()):
            continue
        last = max(w["done"] for w in per.values())
        inside = ends[(ends > min(w["push"] for w in per.values())) & (ends < last)]
        if len(inside):
            out.append((last - inside.max()) / 1e3)
    return statistics.median(out) if out else float("nan")


def describe(label: str, parts: list[tuple[float, ...]]) -> str:
    if not parts:
        return f"{label}: no step"
    med = [statistics.median(p[i] for p in parts) / 1e3 for i in range(5)]
    return (f"{label}: push spread {med[0]:.1f} ms = served {med[1]:+.1f} + lead {med[2]:+.1f} + compute {med[3]:+.1f} (medians, "
            f"{len(parts)} steps); pulls' fan-out {med[4]:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="MXNet PS run folders")
    ap.add_argument("--replay", action="store_true", help="also the replay of each run's own model")
    args = ap.parse_args()
    from dagprof.pipeline import open_run
    from dagprof.replay import replay

    for run in args.runs:
        g = open_run(run).graph
        burst = answer_burst_ms(run, g)
        measured = split(per_step(g, g.order))
        fan = statistics.median(p[4] for p in measured) / 1e3 if measured else float("nan")
        print(f"{run} ({g.meta.world_size} workers): {describe('measured', measured)}, of an answer burst of {burst:.1f} ms "
              f"(ratio {fan / burst:.2f})")
        if args.replay:
            print(f"    {describe('replayed', split(per_step(g, replay(g).start)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
