"""Per collective of a JAX job's kept testbed rounds, its time beyond the wire's at each rate: what a link what-if keeps.

``bench_frameworks.py --testbed --keep DIR`` keeps each round's jobs (``tb-NAME-K-RATEM``, ``-before``, ``-after``, the
settle job), every one profiled over its window. Per job and per all-reduce instruction (a data-parallel JAX job's
gradients; other kinds are counted, not priced here): its bytes, how often a step,
its median time over the ranks' profiled steps, and the wire's time for its bytes at the job's rate on the one shaped
loopback (a ring all-reduce of S bytes on N ranks puts 2 (N - 1) S on it; the payload share measured on the job,
``shaped_loopback.payload_share``). ``predict_rate`` keeps the collectives' time beyond the wire at the profiled rate as
work at the other rate (``passes.link_fit.split_at_wire``); this shows, job by job, whether the jobs at the other rate
kept it. Also the gloo calls a step (XLA runs one per operand, ``analysis.operand_stall``). No timing: run it anywhere,
on a copy (the reader caches its parse beside the traces).

    PYTHONPATH=src python bench/jax_wire_excess.py DIR NAME
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from shaped_loopback import payload_share  # noqa: E402

from dagprof.traces.comm_kind import CommKind  # noqa: E402
from dagprof.traces.events import Kind  # noqa: E402
from dagprof.traces.load import load  # noqa: E402

JOB = re.compile(r"tb-(?P<name>.+)-(?P<round>\d+|settle)(?:-(?P<rate>\d+)M)?(?P<side>-\w+)?$")


def job_rows(out: str, rate_bit: float) -> tuple[list[tuple[str, int, float, float, float]], float, float | None, int]:
    """(per all-reduce: name, bytes, times a step, median ms, the wire's ms), the payload share, the gloo calls a step,
    and the events of other collective kinds left out."""
    run = load(out)
    n = run.world_size
    share, _ = payload_share(out, n)
    durs: dict[tuple[str, int], list[float]] = {}
    steps = others = 0
    for t in run.ranks:
        ev = t.events
        steps += len(t.step_spans())
        comm = ev.kind == Kind.COMM
        others += int((comm & (ev.comm_kind != CommKind.ALL_REDUCE)).sum())
        for i in np.flatnonzero(comm & (ev.comm_kind == CommKind.ALL_REDUCE)):
            durs.setdefault((ev.name_of(i), int(ev.nbytes[i])), []).append(float(ev.dur[i]) / 1e3)
    rank_steps = max(steps, 1)
    rows = [(name, nbytes, len(d) / rank_steps, float(np.median(d)), 2 * (n - 1) * nbytes * 8 / (rate_bit * share) * 1e3)
            for (name, nbytes), d in sorted(durs.items())]
    return rows, share, run.ranks[0].meta.collective_operands_per_step, others


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kept", help="a bench_frameworks.py --testbed --keep folder (a copy)")
    ap.add_argument("name", help="the script's name, e.g. jax_lru_multiopt")
    args = ap.parse_args(argv)
    for out in sorted(glob.glob(os.path.join(args.kept, f"tb-{args.name}-*"))):
        m = JOB.match(os.path.basename(out))
        if not os.path.isdir(out) or m is None or m["rate"] is None:
            continue
        rows, share, calls, others = job_rows(out, float(m["rate"]) * 1e6)
        step = sum(k * med for _, _, k, med, _ in rows)
        wire = sum(k * w for _, _, k, _, w in rows)
        print(f"{os.path.basename(out)}: collectives {step:.1f} ms a step, the wire's {wire:.1f} (payload share {100 * share:.0f} %), "
              f"beyond it {step - wire:+.1f}; {calls if calls is not None else '?'} gloo calls a step"
              + (f"; {others} events of other collective kinds left out" if others else ""))
        for name, nbytes, k, med, w in rows:
            print(f"  {name:24s} {nbytes / 1e3:9.1f} kB  x{k:.2g} a step  median {med:7.2f} ms  wire {w:7.2f}  beyond {med - w:+7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
