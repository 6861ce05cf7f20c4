"""Horovod's loop gap on testbed runs, by link rate: does a rank that leaves a large all-reduce late delay the next cycle's
negotiation more on a slower wire, and would the bandwidth what-if gain by scaling that delay?

Horovod's background thread (horovod/common/operations.cc, ``RunLoopOnce``) starts its next cycle as soon as the previous
one's responses are done on its rank, and a cycle begins with a coordination exchange that waits for every rank. gloo's
ring releases one rank while its peer still receives up to a socket buffer's worth of bytes (``passes.comm.exit_lags``),
so after a large response the next coordination may wait for the peer's exit: wire time, which a slower link lengthens.
Rank 0's timeline is the only one Horovod writes, so the profile sees that wait inside its next ``horovod negotiate``
span, mixed with the coordination itself and with a descheduled peer on a busy host; the bandwidth what-if keeps the span
as measured.

Per run folder (``tb-NAME-K-RATEM[-before|-after]`` as ``bench_frameworks.py --testbed --keep`` writes them), each
**loop gap**: rank 0's time from one response's end to the start of the next of the same step, where that next response
began a new cycle and every rank had requested its tensors before the first ended (the gap is then Horovod's loop alone,
not backward). Pooled by rate and by whether the first response carried at least ``SOCKET_BUFFER_BYTES``. With
``--rule``, the same gaps of the faster rate's runs as the candidate rule would give them at the slower rate: each gap's
excess over the run's least gap (the coordination with the peer already waiting) taken as the peer's exit lag, at most
the wire time of the first response's bytes and of a socket buffer, scaled by the rates' ratio. Runs that kept every
rank's Horovod trace log (``traces.horovod_log``, since 2026-12-05) also give each response's **peer lag**, how long after
rank 0 its last peer left it (``HorovodRecord.peer_lags``), pooled the same way: the wire tail the gap may hold.

    python bench/horovod/loop_gaps.py /tmp/KEPT/tb-hvd_autoencoder-* [--rule 500e6 200e6]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "src"))
sys.path.insert(0, os.path.dirname(HERE))

from shaped_loopback import PAYLOAD_SHARE  # noqa: E402

from dagprof.errors import DagprofError  # noqa: E402
from dagprof.graph.provenance import provenance  # noqa: E402
from dagprof.passes.comm import SOCKET_BUFFER_BYTES  # noqa: E402
from dagprof.passes.link_fit import find_collectives  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402
from dagprof.traces.horovod import GROUP  # noqa: E402


@dataclass(frozen=True)
class Gap:
    """One loop gap on rank 0: the first response's bytes and the gap, us."""

    prev_bytes: int
    us: float


def loop_gaps(run: str) -> list[Gap]:
    """The run's loop gaps (module docstring), from its graph's measured times (``graph.provenance``)."""
    g = open_run(run).graph
    p = provenance(g)
    if p is None or g.meta.horovod is None:
        raise DagprofError("not a Horovod run with its measured times", run)
    channel = next(i for i, d in enumerate(g.devices) if d.name == f"group {GROUP}")
    at = lambda v, end: (p.mend if end else p.mstart)[v] + p.clock_us.get(int(g.rank[v]), 0.0)  # noqa: E731  one clock
    colls = sorted((c for c in find_collectives(g) if g.device[c.comm] == channel), key=lambda c: p.mstart[c.comm])
    out = []
    for a, b in zip(colls, colls[1:]):
        if g.step[a.comm] != g.step[b.comm]:
            continue
        mine = lambda c: [v for v in c.ready if g.rank[v] == 0]  # noqa: E731  rank 0's copy-in (response start)
        out_a = [v for v in a.consumers if g.rank[v] == 0]
        heads = [u for v in b.ready for u in g.predecessors(v).tolist()]
        negotiate = [u for u in heads if g.node_name(u).endswith("horovod negotiate")]
        asked = [u for u in heads + [w for n in negotiate for w in g.predecessors(n).tolist()] if g.kind[u] == Kind.COMM_ENQUEUE]
        if not (negotiate and out_a and mine(b) and asked):
            continue
        end_a = max(at(v, True) for v in out_a)
        if max(at(u, True) for u in asked) <= end_a:
            out.append(Gap(int(g.nbytes[a.comm]), min(at(v, False) for v in mine(b)) - end_a))
    return out


def peer_lags(run: str) -> list[Gap]:
    """Each response's bytes and how long after rank 0 its last peer left it, us (none: the run kept no trace logs)."""
    g = open_run(run).graph
    size = {(s, k): nb for s, k, nb, *_ in g.meta.horovod.measured}
    return [Gap(size[(s, k)], us) for s, k, us in g.meta.horovod.peer_lags if (s, k) in size]


def rule(gaps: list[Gap], rate: float, other: float) -> list[float]:
    """``gaps`` measured at ``rate`` bit/s as the candidate rule has them at ``other``: each one's excess over the least
    (the peer's exit lag), at most the wire time of the first response's bytes and of a socket buffer, times the ratio."""
    least = min(x.us for x in gaps)
    per_byte = 8e6 / (rate * PAYLOAD_SHARE)  # us a byte on the shaped loopback
    return [x.us + min(x.us - least, min(x.prev_bytes, SOCKET_BUFFER_BYTES) * per_byte) * (rate / other - 1.0) for x in gaps]


def _line(label: str, us: list[float]) -> str:
    v = np.asarray(us) / 1e3
    return (f"{label:34s} n {len(v):4d}  median {np.median(v):6.2f}  p25 {np.percentile(v, 25):6.2f}  p75 {np.percentile(v, 75):6.2f}"
            f"  mean {v.mean():6.2f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="testbed run folders, their rate in the name (-500M)")
    ap.add_argument("--rule", nargs=2, type=float, metavar=("RATE", "OTHER"), help="also the RATE runs' gaps by the candidate rule at OTHER bit/s")
    args = ap.parse_args(argv)
    pooled: dict[tuple[float, bool], list[Gap]] = {}
    lags: dict[tuple[float, bool], list[Gap]] = {}
    for run in args.runs:
        m = re.search(r"-(\d+)M(?:-|$)", os.path.basename(run.rstrip("/")))
        if not m:
            continue
        try:
            gaps = loop_gaps(run)
        except DagprofError as e:
            print(f"{run}: skipped ({e})", file=sys.stderr)
            continue
        for x in gaps:
            pooled.setdefault((float(m.group(1)) * 1e6, x.prev_bytes >= SOCKET_BUFFER_BYTES), []).append(x)
        for x in peer_lags(run):
            lags.setdefault((float(m.group(1)) * 1e6, x.prev_bytes >= SOCKET_BUFFER_BYTES), []).append(x)
        if args.rule and float(m.group(1)) * 1e6 == args.rule[0] and gaps:
            for x, y in zip(gaps, rule(gaps, *args.rule)):
                pooled.setdefault((-1.0, x.prev_bytes >= SOCKET_BUFFER_BYTES), []).append(Gap(x.prev_bytes, y))
    for (rate, big), gaps in sorted(pooled.items()):
        where = f"rule at {args.rule[1] / 1e6:g} Mbit/s" if rate < 0 else f"{rate / 1e6:g} Mbit/s"
        print(_line(f"{where}, after {'>=' if big else '<'} {SOCKET_BUFFER_BYTES >> 10} kB", [x.us for x in gaps]))
    for (rate, big), got in sorted(lags.items()):
        print(_line(f"peer lag {rate / 1e6:g} Mbit/s, {'>=' if big else '<'} {SOCKET_BUFFER_BYTES >> 10} kB", [x.us for x in got]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
