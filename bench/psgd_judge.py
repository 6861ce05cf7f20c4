"""Judge a change to the optimizer's pricing on kept rounds: every cell re-predicted before and after, side by side.

Runs no job: ``bench_optimize.py --repredict`` of each kept folder (``--keep``) with one ``src`` tree, its JSON kept
per folder; then the two sides compared cell by cell (the optimizer's headline on the searched profile and each round's
error from its own profile of the defaults, against the same measured rounds):

    python bench/psgd_judge.py run --src BEFORE/src --out OUT/before KEPT [KEPT ...]
    python bench/psgd_judge.py run --src src --out OUT/after KEPT [KEPT ...]
    python bench/psgd_judge.py compare OUT/before OUT/after [--family embed=psgdcontend_embed,...]

``compare`` prints per cell the headline and the per-round median error before -> after, how many rounds moved toward
their measurement and the largest move, then the keep rule's three readings (docs/evidence.md, branch psgdemb59): the
lossless cells' largest move (must be 0), the named family's cells toward or not (all must be), and the other lossy
cells' median absolute per-round error before -> after (must not grow). Each folder's JSON is ``bench_optimize.py --out``'s rows.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))


def name_of(kept: str) -> str:
    """A kept folder's key: its path below the temporary folder, else its path, joined by ``_`` (``/tmp/psgdcontend/embed``
    -> ``psgdcontend_embed``, the name ``--family`` gives)."""
    path = os.path.abspath(kept)
    below = os.path.relpath(path, tempfile.gettempdir())
    return (path.lstrip(os.sep) if below.startswith("..") else below).replace(os.sep, "_")


def run_side(src: str, out: str, kept: list[str]) -> int:
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    bad = 0
    for k in kept:
        n = name_of(k)
        with open(os.path.join(out, n + ".txt"), "w") as log:
            rc = subprocess.call([sys.executable, os.path.join(HERE, "bench_optimize.py"), "--repredict", k, "--workloads", "a,b,c",
                                  "--out", os.path.join(out, n + ".json")], env=env, stdout=log, stderr=subprocess.STDOUT)
        print(f"{n}: rc {rc}", flush=True)
        bad += rc != 0
    return 1 if bad else 0


def cells(folder: str) -> dict[tuple[str, str, str], dict]:
    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
        for r in json.load(open(f))["rows"]:
            out[(os.path.basename(f)[:-5], r["workload"], r["mode"])] = r
    return out


@dataclass
class Verdict:
    """The keep rule's readings: the lossless cells' largest move (points of a round's error, or x of the headline), each
    family cell toward its measurement or not (its per-round median closer and its headline no further), and the other
    lossy cells' median absolute per-round error before and after."""

    lines: list[str] = field(default_factory=list)
    lossless_move: float = 0.0
    family: dict[str, bool] = field(default_factory=dict)
    others: tuple[float, float] | None = None

    @property
    def keep(self) -> bool:
        return (self.lossless_move == 0.0 and bool(self.family) and all(self.family.values())
                and (self.others is None or self.others[1] <= self.others[0]))


def judge(a: dict, b: dict, family: set[str]) -> Verdict:
    """``a``, ``b``: ``cells`` of the two sides; ``family``: FOLDER or FOLDER:WORKLOAD names of the family's cells."""
    v, others_a, others_b = Verdict(), [], []
    for key in sorted(a.keys() & b.keys()):
        r, s = a[key], b[key]
        ea, eb = r["error_per_round_pct"], s["error_per_round_pct"]
        toward = sum(abs(y) < abs(x) - 1e-9 for x, y in zip(ea, eb))
        move = max(abs(x - y) for x, y in zip(ea, eb))
        v.lines.append(f"{key[0]:24s} {key[1]} {key[2]:8s} measured {r['measured']:.2f}x; optimizer {r['searched_predicted']:.2f}x -> "
                       f"{s['searched_predicted']:.2f}x ({r['searched_error_pct']:+.1f} -> {s['searched_error_pct']:+.1f} %); per-round median "
                       f"{r['median_error_pct']:+.1f} -> {s['median_error_pct']:+.1f} %; rounds toward {toward}/{len(ea)}; max move {move:.2f} pts")
        if key[2] == "lossless":
            v.lossless_move = max(v.lossless_move, move, abs(s["searched_predicted"] - r["searched_predicted"]))
        elif f"{key[0]}:{key[1]}" in family or key[0] in family:
            ok = (abs(s["median_error_pct"]) < abs(r["median_error_pct"])
                  and abs(s["searched_error_pct"]) <= abs(r["searched_error_pct"]) + 1e-9)
            v.family[f"{key[0]}:{key[1]}"] = ok
            v.lines.append(f"  family: per-round median {r['median_error_pct']:+.1f} -> {s['median_error_pct']:+.1f} %, headline "
                           f"{r['searched_error_pct']:+.1f} -> {s['searched_error_pct']:+.1f} %: {'toward' if ok else 'not toward'}")
        else:
            others_a += [abs(x) for x in ea]
            others_b += [abs(y) for y in eb]
    if others_a:
        v.others = (statistics.median(others_a), statistics.median(others_b))
    return v


def compare(before: str, after: str, family: set[str]) -> int:
    v = judge(cells(before), cells(after), family)
    print("\n".join(v.lines))
    print(f"lossless cells: largest move {v.lossless_move:.3f} (points of a round's error, or x of the headline)")
    print(f"family cells toward: {sum(v.family.values())} of {len(v.family)}")
    if v.others is not None:
        print(f"other lossy cells: median |per-round error| {v.others[0]:.2f} -> {v.others[1]:.2f} %")
    print(f"keep rule: {'met' if v.keep else 'not met'}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--src", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("kept", nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--family", default="", help="comma-separated FOLDER or FOLDER:WORKLOAD names (as run names them) of the family")
    args = ap.parse_args()
    if args.cmd == "run":
        return run_side(args.src, args.out, args.kept)
    return compare(args.before, args.after, {x for x in args.family.split(",") if x})


if __name__ == "__main__":
    sys.exit(main())
