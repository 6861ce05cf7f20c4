"""DDP -> FSDP judged on kept pairs, no job: for each pair, the FSDP2 step predicted from the DDP profile
(``dagprof whatif DDP --data-parallel fsdp``) against the FSDP profile's own measured step, inside its 90 % interval or
not, and the predicted peak memory per rank; then the median miss and how many within 8 %. ``--src`` predicts with
another tree (a folder holding ``dagprof/``), so two trees compare on the same pairs.

``--to ddp`` judges the reverse on the same pairs: the DDP step predicted from the FSDP profile (``whatif FSDP
--data-parallel ddp``; its median step, which the interval is for) against the DDP job's median unprofiled step (the
job as it runs without the profiler, which the prediction stands for: its op times have the profiler's cost taken out).

A pair is ``DDP_DIR:FSDP_DIR``, or a folder holding ``ddp``/``fsdp`` (a round of ``mixer_rounds.sh``) or
``ddp-K``/``fsdp-K`` (``bench_lora_memory.py --record``).
usage: python bench/fsdp_fresh/judge_pairs.py [--src TREE/src] [--to fsdp|ddp] [--json] PAIR...
"""
from __future__ import annotations

import argparse
import glob
import json
import os
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
    found = [(d, d.replace(os.sep + "ddp-", os.sep + "fsdp-")) for d in sorted(glob.glob(os.path.join(arg, "ddp-*")))]
    if not found:
        sys.exit(f"judge_pairs: {arg}: no DDP:FSDP pair, no ddp/ and fsdp/, no ddp-K/fsdp-K")
    return found


def whatif(src: str | None, run: str, *args: str) -> dict:
    """The what-if's answer, or {"error": its refusal}."""
    try:
        return whatif_json(run, *args, src=src)
    except Refused as e:
        return {"error": str(e)}


def judge(ddp: str, fsdp: str, src: str | None) -> dict:
    measured = whatif(src, fsdp).get("measured_iter_ms")
    out = whatif(src, ddp, "--data-parallel", "fsdp")
    if "error" in out or measured is None:
        return {"ddp": ddp, "fsdp": fsdp, "error": out.get("error", "the FSDP profile has no measured step")}
    row = out["scenarios"][0]
    return {"ddp": ddp, "fsdp": fsdp, "measured_ms": measured, "predicted_ms": row["predicted_iter_ms"],
            "error_pct": 100.0 * (row["predicted_iter_ms"] / measured - 1.0), "inside": row["lo_ms"] <= measured <= row["hi_ms"],
            "peak_memory_mb": row.get("peak_memory_mb")}


def judge_to_ddp(ddp: str, fsdp: str, src: str | None) -> dict:
    """The DDP job's step predicted from the FSDP profile, against the DDP job's median unprofiled step."""
    ref = whatif(src, ddp)
    cost = ref.get("profiler_cost") or {}
    measured = cost.get("unprofiled_step_ms") or ref.get("measured_iter_ms")
    out = whatif(src, fsdp, "--data-parallel", "ddp")
    if "error" in out or measured is None:
        return {"ddp": ddp, "fsdp": fsdp, "error": out.get("error", ref.get("error", "the DDP profile has no measured step"))}
    row = out["scenarios"][0]
    return {"ddp": ddp, "fsdp": fsdp, "measured_ms": measured, "predicted_ms": row["predicted_median_ms"],
            "error_pct": 100.0 * (row["predicted_median_ms"] / measured - 1.0), "inside": row["lo_ms"] <= measured <= row["hi_ms"],
            "lo_ms": row["lo_ms"], "hi_ms": row["hi_ms"], "peak_memory_mb": row.get("peak_memory_mb")}


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
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}))
        return
    for r in rows:
        if "error" in r:
            print(f"{r['ddp']}: {r['error']}")
        else:
            print(f"{r['ddp']}: {args.to.upper()} measured {r['measured_ms']:.1f} ms, predicted {r['predicted_ms']:.1f} ms ({r['error_pct']:+.1f} %, "
                  f"{'inside' if r['inside'] else 'outside'} the interval), peak {r['peak_memory_mb'] or float('nan'):.2f} MiB")
    print(f"{summary['judged']} of {summary['pairs']} judged: median miss {summary['median_miss_pct'] or float('nan'):.1f} %, "
          f"{summary[f'within_{WITHIN_PCT:g}']} within {WITHIN_PCT:g} %, {summary['inside']} inside the interval")


if __name__ == "__main__":
    main()
