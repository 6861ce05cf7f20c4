"""DDP -> FSDP judged on kept pairs, no job: for each pair, the FSDP2 step predicted from the DDP profile
(``dagprof whatif DDP --data-parallel fsdp``) against the FSDP profile's own measured step, inside its 90 % interval or
not, and the predicted peak memory per rank; then the median miss and how many within 8 %. The interval is for the median
step of a run as the job runs unprofiled (``analysis.interval``): each pair also says whether the FSDP job's median
unprofiled step (the FSDP profile's steps around its window) lies inside it (``inside_unprofiled``; the point it is held
against is the replayed steps' median, ``predicted_median_ms``), and the interval's width and terms; the summary counts
that coverage and the median width. ``--src`` predicts with another tree (a folder holding ``dagprof/``), so two trees
compare on the same pairs.

``--to ddp`` judges the reverse on the same pairs: the DDP step predicted from the FSDP profile (``whatif FSDP
--data-parallel ddp``; its median step, which the interval is for) against the DDP job's median unprofiled step (the
job as it runs without the profiler, which the prediction stands for: its op times have the profiler's cost taken out).

A pair is ``DDP_DIR:FSDP_DIR``, or a folder holding ``ddp``/``fsdp`` (a round of ``mixer_rounds.sh``) or
``ddp-K``/``fsdp-K`` (``bench_lora_memory.py --record``).

The floor: where the round also ran both configurations again unprofiled afterwards (``pairs_hold.sh``'s ``ddp.after.log``
and ``fsdp.after.log`` beside the profiles, each printing its rank 0's "median step X ms"), every pair is also held
against that later job: the conversion's replayed median (``after_error_pct``) beside the identity cell, the target
configuration's own profile replayed unchanged against the same later job (``identity_error_pct``: what the job misses by
itself between two runs, which no conversion can beat). The summary gives both medians and their signed quartiles.
usage: python bench/fsdp_fresh/judge_pairs.py [--src TREE/src] [--to fsdp|ddp] [--json] PAIR...
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from whatif_cli import Refused, whatif_json  # noqa: E402

WITHIN_PCT = 8.0  # issue 16's goal for DDP -> FSDP


def pairs_of(arg: str) -> list[tuple[str, str]]:
    if ":" in arg:
        ddp, fsdp = arg.split(":", 1)
        return [(ddp, fsdp)]
    if os.path.isdir(os.path.join(arg, "ddp")):
        return [(os.path.join(arg, "ddp"), os.path.join(arg, "fsdp"))]
    found = [(d, d.replace(os.sep + "ddp-", os.sep + "fsdp-")) for d in sorted(glob.glob(os.path.join(arg, "ddp-*")))
             if os.path.isdir(d)]  # not a ddp-K.after.log
    if not found:
        sys.exit(f"judge_pairs: {arg}: no DDP:FSDP pair, no ddp/ and fsdp/, no ddp-K/fsdp-K")
    return found


def after_step_ms(profile: str) -> float | None:
    """The median step the same configuration ran unprofiled after the profiles (``PROFILE.after.log``), or None."""
    try:
        with open(profile.rstrip(os.sep) + ".after.log") as f:
            found = re.findall(r"median step ([0-9.]+) ms", f.read())
    except FileNotFoundError:
        return None
    return float(found[-1]) if found else None


def floor(row: dict, target: str, identity: dict, median: float) -> dict:
    """``row`` with the conversion's ``median`` and the target's own profile replayed unchanged (``identity``) held against
    the target configuration's later unprofiled job; unchanged where the round has none."""
    after = after_step_ms(target)
    if after is None or "error" in identity:
        return row
    same = identity["scenarios"][0]["predicted_median_ms"]
    return row | {"after_ms": after, "after_error_pct": 100.0 * (median / after - 1.0), "identity_ms": same,
                  "identity_error_pct": 100.0 * (same / after - 1.0)}


def whatif(src: str | None, run: str, *args: str) -> dict:
    """The what-if's answer, or {"error": its refusal}."""
    try:
        return whatif_json(run, *args, src=src)
    except Refused as e:
        return {"error": str(e)}


def judge(ddp: str, fsdp: str, src: str | None) -> dict:
    ref = whatif(src, fsdp)
    measured = ref.get("measured_iter_ms")
    unprofiled = (ref.get("profiler_cost") or {}).get("unprofiled_step_ms")  # None: the profile holds too few steps around its window
    out = whatif(src, ddp, "--data-parallel", "fsdp")
    if "error" in out or measured is None:
        return {"ddp": ddp, "fsdp": fsdp, "error": out.get("error", ref.get("error", "the FSDP profile has no measured step"))}
    row = out["scenarios"][0]
    lo, hi, median = row["lo_ms"], row["hi_ms"], row["predicted_median_ms"]
    return floor({"ddp": ddp, "fsdp": fsdp, "measured_ms": measured, "predicted_ms": row["predicted_iter_ms"],
                  "error_pct": 100.0 * (row["predicted_iter_ms"] / measured - 1.0), "inside": lo <= measured <= hi,
                  "unprofiled_ms": unprofiled, "predicted_median_ms": median, "lo_ms": lo, "hi_ms": hi,
                  "unprofiled_error_pct": None if unprofiled is None else 100.0 * (median / unprofiled - 1.0),
                  "inside_unprofiled": None if unprofiled is None else lo <= unprofiled <= hi, "width_pct": 100.0 * (hi - lo) / median,
                  "terms": row["interval_basis"]["terms"], "peak_memory_mb": row.get("peak_memory_mb")}, fsdp, ref, median)


def judge_to_ddp(ddp: str, fsdp: str, src: str | None) -> dict:
    """The DDP job's step predicted from the FSDP profile, against the DDP job's median unprofiled step."""
    ref = whatif(src, ddp)
    cost = ref.get("profiler_cost") or {}
    measured = cost.get("unprofiled_step_ms") or ref.get("measured_iter_ms")
    out = whatif(src, fsdp, "--data-parallel", "ddp")
    if "error" in out or measured is None:
        return {"ddp": ddp, "fsdp": fsdp, "error": out.get("error", ref.get("error", "the DDP profile has no measured step"))}
    row = out["scenarios"][0]
    return floor({"ddp": ddp, "fsdp": fsdp, "measured_ms": measured, "predicted_ms": row["predicted_median_ms"],
                  "error_pct": 100.0 * (row["predicted_median_ms"] / measured - 1.0), "inside": row["lo_ms"] <= measured <= row["hi_ms"],
                  "lo_ms": row["lo_ms"], "hi_ms": row["hi_ms"], "peak_memory_mb": row.get("peak_memory_mb")}, ddp, ref,
                 row["predicted_median_ms"])


def spread(errs: list[float]) -> dict:
    """Median |miss| and the signed misses' median and quartiles, %."""
    return {"median_miss_pct": float(np.median(np.abs(errs))), "signed_median_pct": float(np.median(errs)),
            "signed_q25_pct": float(np.percentile(errs, 25)), "signed_q75_pct": float(np.percentile(errs, 75)),
            f"within_{WITHIN_PCT:g}": int((np.abs(np.array(errs)) <= WITHIN_PCT).sum())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pairs", nargs="+")
    p.add_argument("--src", help="predict with this tree's dagprof (a folder holding dagprof/)")
    p.add_argument("--to", choices=("fsdp", "ddp"), default="fsdp", help="the wrapper predicted: fsdp from the DDP profile (default), "
                   "ddp from the FSDP one")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = [(judge if args.to == "fsdp" else judge_to_ddp)(d, f, args.src) for a in args.pairs for d, f in pairs_of(a)]
    errs = np.array([r["error_pct"] for r in rows if "error_pct" in r])
    summary = {"pairs": len(rows), "judged": len(errs), "median_miss_pct": float(np.median(np.abs(errs))) if len(errs) else None,
               f"within_{WITHIN_PCT:g}": int((np.abs(errs) <= WITHIN_PCT).sum()), "inside": sum(bool(r.get("inside")) for r in rows)}
    if args.to == "fsdp":  # the interval held against what it is for: the FSDP job's median unprofiled step
        held = [r for r in rows if r.get("inside_unprofiled") is not None]
        summary |= {"judged_unprofiled": len(held), "inside_unprofiled": sum(r["inside_unprofiled"] for r in held),
                    "median_width_pct": float(np.median([r["width_pct"] for r in held])) if held else None}
    floored = [r for r in rows if "after_ms" in r]
    if floored:  # both cells against the same later unprofiled jobs
        summary |= {"judged_after": len(floored), "conversion_after": spread([r["after_error_pct"] for r in floored]),
                    "identity_after": spread([r["identity_error_pct"] for r in floored])}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}))
        return
    for r in rows:
        if "error" in r:
            print(f"{r['ddp']}: {r['error']}")
        else:
            unprofiled = "" if r.get("unprofiled_ms") is None else (
                f"; unprofiled {r['unprofiled_ms']:.1f} ms {'inside' if r['inside_unprofiled'] else 'outside'} {r['lo_ms']:.1f}-{r['hi_ms']:.1f}")
            after = "" if "after_ms" not in r else (
                f"; later unprofiled job {r['after_ms']:.1f} ms: conversion {r['after_error_pct']:+.1f} %, its own profile {r['identity_error_pct']:+.1f} %")
            print(f"{r['ddp']}: {args.to.upper()} measured {r['measured_ms']:.1f} ms, predicted {r['predicted_ms']:.1f} ms ({r['error_pct']:+.1f} %, "
                  f"{'inside' if r['inside'] else 'outside'} the interval{unprofiled}), peak {r['peak_memory_mb'] or float('nan'):.2f} MiB{after}")
    coverage = "" if summary.get("judged_unprofiled") is None else (
        f"; unprofiled steps inside the interval {summary['inside_unprofiled']} of {summary['judged_unprofiled']}, median width "
        f"{summary['median_width_pct'] or float('nan'):.1f} % of the point")
    for cell, label in (("conversion_after", f"{'DDP -> FSDP' if args.to == 'fsdp' else 'FSDP -> DDP'} conversion"),
                        ("identity_after", f"{args.to.upper()} -> {args.to.upper()} identity")):
        if cell in summary:
            c = summary[cell]
            print(f"against the later unprofiled {args.to.upper()} jobs ({summary['judged_after']}), {label}: median miss "
                  f"{c['median_miss_pct']:.1f} %, signed {c['signed_median_pct']:+.1f} (quartiles {c['signed_q25_pct']:+.1f} / "
                  f"{c['signed_q75_pct']:+.1f}), {c[f'within_{WITHIN_PCT:g}']} within {WITHIN_PCT:g} %")
    print(f"{summary['judged']} of {summary['pairs']} judged: median miss {summary['median_miss_pct'] or float('nan'):.1f} %, "
          f"{summary[f'within_{WITHIN_PCT:g}']} within {WITHIN_PCT:g} %, {summary['inside']} inside the interval{coverage}")


if __name__ == "__main__":
    main()
