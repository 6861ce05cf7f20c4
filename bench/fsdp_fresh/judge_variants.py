"""DDP -> FSDP judged under named variants of the conversion's wake-up price, in one process (``judge_pairs.py``'s rows: the
FSDP side once per pair, the DDP profile's conversion once per variant), so a candidate is chosen on one half of the kept
pairs and the other half judged once. Sets are ``NAME=GLOB[,GLOB...]`` (each match a ``judge_pairs.pairs_of`` argument); a set's pairs
in sorted order, even positions the development half, odd the held-out (as branch fsdpiv fixed the 95 kept pairs'). Rows
are appended to OUT (jsonl) and pairs already there skipped; ``--limit S`` stops after S seconds with exit 3, so a loop of
short ``dp-shared`` holds finishes the set (no timing: the holds only keep timed runs first). ``--table OUT...``: median
|miss| against the FSDP job's median unprofiled step (signed), within 8 %, inside the 90 % interval (below / above), median
width, per variant, for all, each half and each set.

Variants: ``base``, the tree as it is; ``rqW``, each blocking FSDP collective's two wake-ups (its issue and its wait) at the DDP
profile's run-queue wait per time its training thread got a core (``passes.data_parallel.wake_up``'s schedstat price) beyond
W us, the wait one wake-up already holds in gloo's measured cost per call (``FSDP_HOST``; fsdpwake's 2-rank jobs' gloo threads
waited 0.065-0.070 ms a run); ``wkW``, the same from ``wake_up`` itself (the DDP finalize's blocked lags first). Tried on
branch ddpfsdp59, not kept (docs/evidence.md).

    PYTHONPATH=src python bench/fsdp_fresh/judge_variants.py OUT --variants base,rq70 [--half dev|held] [--limit 200] NAME=GLOB...
    python bench/fsdp_fresh/judge_variants.py --table OUT...      (from the repository root)
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import io
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from judge_pairs import WITHIN_PCT, pairs_of  # noqa: E402


@contextlib.contextmanager
def variant(name: str):
    """The conversion's ``priced_wake_up`` (and ``search.whatif``'s, which sizes the interval from it) as ``name`` prices it."""
    from dagprof.passes import data_parallel as dp
    from dagprof.search import whatif as sw
    tree = dp.priced_wake_up
    m = re.fullmatch(r"(rq|wk)(\d+)", name)
    if name != "base" and m is None:
        sys.exit(f"judge_variants: unknown variant {name!r} (base, rqW, wkW)")

    def priced(g, costs):
        if costs is not None or dp.FSDP_HOST.get(g.meta.torch_minor) is None:
            return tree(g, costs)
        w = (dp.run_queue_wake if m.group(1) == "rq" else dp.wake_up)(g)
        return None if w is None else dataclasses.replace(w, us={r: max(0.0, u - float(m.group(2))) for r, u in w.us.items()})
    dp.priced_wake_up = sw.priced_wake_up = tree if m is None else priced
    try:
        yield
    finally:
        dp.priced_wake_up = sw.priced_wake_up = tree


def whatif(run: str, *args: str) -> dict:
    """``dagprof whatif RUN ARGS --json`` in this process (so a variant's patch holds), or {"error": ...}."""
    from dagprof.cli.main import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["whatif", run, *args, "--no-trace", "--allow-model-error", "--json"])
    try:
        out = json.loads(buf.getvalue())
    except ValueError:
        return {"error": f"exit {rc}"}
    return out if rc == 0 else {"error": out.get("error", rc)}


def row(out: dict, ref: dict) -> dict:
    """``judge_pairs.judge``'s figures of one conversion (``out``) against its FSDP job (``ref``)."""
    measured, unprofiled = ref.get("measured_iter_ms"), (ref.get("profiler_cost") or {}).get("unprofiled_step_ms")
    if "error" in out or measured is None or unprofiled is None:
        return {"error": str(out.get("error", ref.get("error", "no unprofiled step")))}
    r = out["scenarios"][0]
    lo, hi, median = r["lo_ms"], r["hi_ms"], r["predicted_median_ms"]
    return {"measured_ms": measured, "unprofiled_ms": unprofiled, "predicted_median_ms": median, "lo_ms": lo, "hi_ms": hi,
            "unprofiled_error_pct": 100.0 * (median / unprofiled - 1.0), "inside_unprofiled": lo <= unprofiled <= hi,
            "width_pct": 100.0 * (hi - lo) / median}


def set_pairs(sets: list[str]) -> list[tuple[str, int, str, str]]:
    """(set, position, ddp, fsdp) of every ``NAME=GLOB[,GLOB...]`` set: each glob's matches sorted, in the order given."""
    out = []
    for s in sets:
        name, _, pattern = s.partition("=")
        paths = [m for one in pattern.split(",") if one for m in sorted(glob.glob(one))]
        if not paths:
            sys.exit(f"judge_variants: {s}: no folder matches (NAME=GLOB)")
        out += [(name, k, d, f) for k, (d, f) in enumerate(p for a in paths for p in pairs_of(a))]
    return out


def judge(out_path: str, variants: list[str], sets: list[str], half: str | None, limit: float | None) -> int:
    done = set()
    if os.path.exists(out_path):
        done = {json.loads(line)["ddp"] for line in open(out_path)}
    t0 = time.monotonic()
    for name, k, ddp, fsdp in set_pairs(sets):
        if ddp in done or (half == "dev" and k % 2) or (half == "held" and not k % 2):
            continue
        if limit is not None and time.monotonic() - t0 > limit:
            return 3
        ref = whatif(fsdp)
        res = {"set": name, "k": k, "half": "held" if k % 2 else "dev", "ddp": ddp, "fsdp": fsdp}
        for v in variants:
            with variant(v):
                res[v] = row(whatif(ddp, "--data-parallel", "fsdp"), ref)
        with open(out_path, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0


def summary(rows: list[dict]) -> str:
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return "-"
    e = np.array([r["unprofiled_error_pct"] for r in ok])
    below = sum(r["unprofiled_ms"] < r["lo_ms"] for r in ok)
    above = sum(r["unprofiled_ms"] > r["hi_ms"] for r in ok)
    return (f"{np.median(np.abs(e)):5.1f} ({np.median(e):+5.1f}), {int((np.abs(e) <= WITHIN_PCT).sum()):2d} within {WITHIN_PCT:g} %, "
            f"{sum(r['inside_unprofiled'] for r in ok):2d} of {len(ok)} inside ({below}/{above}), width {np.median([r['width_pct'] for r in ok]):.0f} %")


def table(paths: list[str]) -> None:
    rows = [json.loads(line) for p in paths for line in open(p)]
    if not rows:
        sys.exit("judge_variants: no rows")
    names = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    sets = list(dict.fromkeys(r["set"] for r in rows))
    for v in names:
        print(f"== {v}: median |miss| (signed), within, inside (below/above), median width")
        groups = [("all", lambda r: True), ("dev", lambda r: r["half"] == "dev"), ("held", lambda r: r["half"] == "held")]
        groups += [(s, (lambda s: lambda r: r["set"] == s)(s)) for s in sets]
        for label, sel in groups:
            print(f"  {label:20s} {summary([r[v] for r in rows if sel(r) and v in r])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("args", nargs="+", help="OUT NAME=GLOB...; with --table: OUT...")
    p.add_argument("--variants", default="base")
    p.add_argument("--half", choices=("dev", "held"))
    p.add_argument("--limit", type=float, help="seconds, then exit 3 (rerun to go on)")
    p.add_argument("--table", action="store_true")
    a = p.parse_intermixed_args()
    if a.table:
        table(a.args)
        return
    if len(a.args) < 2:
        sys.exit("judge_variants: need OUT and at least one NAME=GLOB set")
    sys.exit(judge(a.args[0], a.variants.split(","), a.args[1:], a.half, a.limit))


if __name__ == "__main__":
    main()
