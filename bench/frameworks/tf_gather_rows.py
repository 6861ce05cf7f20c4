"""Check a kept TF run's sparse-gradient all-gathers against the rows the script itself logged.

``tf_recsys_ragged.py`` logs ``step S history ids N`` and ``tf_textcls_buckets.py`` ``step S batch B length L`` on each
worker (stderr, ``log<R>.txt`` under ``bench_frameworks.py --keep``): the ids that worker looked up in that step. TF's
``all_reduce_indexed_slices`` gathers every worker's rows, each padded to the most any worker has where they differ
(``cond/else/``): a step's rows all-gather should carry workers x max(ids) rows, its indices' the same count. Prints,
per step and all-gather of a branch, the bytes dagprof gave it, the rows per worker those are (bytes / workers / the
bytes of a row the rank file names) and the rows the logs say; exits 1 on any mismatch.

    python bench/frameworks/tf_gather_rows.py RUN
"""
from __future__ import annotations

import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
from dagprof.traces.events import CommKind, Kind  # noqa: E402
from dagprof.traces.load import load  # noqa: E402

_LOGGED = re.compile(r"^step (\d+) (?:history ids (\d+)|batch (\d+) length (\d+))", re.M)
_BRANCH_CALL = re.compile(r"(/(?:then|else))/_\d+/")


def logged_ids(run: str, world: int) -> dict[int, list[int]]:
    """step -> the ids each worker looked up (its log's line)."""
    out: dict[int, list[int]] = {}
    for r in range(world):
        with open(os.path.join(run, f"log{r}.txt")) as f:
            for m in _LOGGED.finditer(f.read()):
                out.setdefault(int(m.group(1)), [0] * world)[r] = int(m.group(2) or int(m.group(3)) * int(m.group(4)))
    return out


def main(run: str) -> int:
    data = load(run)
    world = len(data.ranks)
    ids = logged_ids(run, world)
    bad = 0
    for t in data.ranks:
        with open(os.path.join(run, f"rank{t.rank}.json")) as f:
            row_bytes = json.load(f).get("collective_row_bytes", {})
        ev = t.events
        gathers = np.flatnonzero((ev.kind == Kind.COMM) & (ev.comm_kind == int(CommKind.ALL_GATHER)) & (ev.step >= 0))
        for i in gathers.tolist():
            name = ev.name_of(i)
            per_row = row_bytes.get(_BRANCH_CALL.sub(r"\1/", name))
            if per_row is None or "/cond" not in "/" + name:
                continue
            step, nbytes = int(ev.step[i]), int(ev.nbytes[i])
            want = ids.get(step)
            expect = (max(want) if "/else/" in name else want[t.rank]) if want else None
            got = nbytes / world / per_row
            ok = expect is not None and got == expect
            bad += not ok
            print(f"rank {t.rank} step {step} {name}: {nbytes} B = {got:g} rows a worker of {per_row} B; logged "
                  f"{want} -> {expect} {'ok' if ok else 'MISMATCH'}")
    print(f"{bad} mismatched")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
