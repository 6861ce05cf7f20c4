"""The two waits a stock gloo trace's replay keeps as measured, read from recordings on one host's clock (issue 16).

- a pipeline receiver's wake-up: per paired send/recv whose receiver was already waiting, its ``gloo:recv`` end less its
  sender's ``c10d::send`` start (gloo posts the data inside that call, before the ``gloo:send`` range opens);
- DDP's wait for its last bucket: per rank and step whose main thread had no op open when the step's last
  ``gloo:all_reduce`` ended, the gap from that end to the main thread's next op.

    python bench/tp_fresh/fixed_waits.py tests/data/tp-fresh/pp-stages tests/data/tp-fresh/pp-dp tests/data/hybrid-dp-tp
"""
from __future__ import annotations

import argparse

import numpy as np

import dagprof
from dagprof.align.matching import match_collectives
from dagprof.traces.events import Kind, RankTrace
from dagprof.traces.parallelism import resolve_groups


def _named(t: RankTrace, name: str) -> np.ndarray:
    return np.array(t.events.names)[t.events.name] == name


def receiver_wakeups(run) -> np.ndarray:
    """us from each post to its waiting receiver's recv end."""
    m = match_collectives(run, strict=False)
    at = {t.rank: p for p, t in enumerate(run.ranks)}
    out = []
    for k, it in enumerate(m.instances):
        if not it.p2p:
            continue
        (ps, pr) = (at[r] for r in it.ranks)
        ts, tr = run.ranks[ps], run.ranks[pr]
        es, er = (int(np.flatnonzero(m.instance[p] == k)[0]) for p in (ps, pr))
        ev = ts.events
        calls = np.flatnonzero(_named(ts, "c10d::send") & (ev.lane == ev.lane[es]) & (ev.start <= ev.start[es]))
        if not len(calls):
            continue
        post = ts.base_ns / 1e3 + ev.start[calls].max()
        start = tr.base_ns / 1e3 + tr.events.start[er]
        if start < post:
            out.append(start + tr.events.dur[er] - post)
    return np.array(out)


def ddp_waits(run) -> np.ndarray:
    """us from each step's last bucket end to the main thread's next op, where no op of it was open then."""
    out = []
    for t in run.ranks:
        ev = t.events
        main = next(i for i, lane in enumerate(t.lanes) if lane.main)
        ops = np.flatnonzero((ev.lane == main) & (ev.depth == 0) & (ev.kind != Kind.STEP))
        for s in np.unique(ev.step[ev.step >= 0]).tolist():
            buckets = np.flatnonzero(_named(t, "gloo:all_reduce") & (ev.step == s))
            if not len(buckets):
                continue
            end = ev.end[buckets].max()
            later = ev.start[ops][ev.start[ops] >= end]
            if len(later) and not ((ev.start[ops] < end) & (ev.end[ops] > end)).any():
                out.append(later.min() - end)
    return np.array(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    for path in p.parse_args().runs:
        run = resolve_groups(dagprof.load(path))  # gloo's collectives into their mesh groups, as the graph builder does
        for what, x in (("receiver wake-ups", receiver_wakeups(run)), ("DDP last-bucket waits", ddp_waits(run))):
            if len(x):
                print(f"{path}: {len(x)} {what}: median {np.median(x):.0f} us, p90 {np.percentile(x, 90):.0f}, max {x.max():.0f}")


if __name__ == "__main__":
    main()
