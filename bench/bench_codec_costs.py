"""How repeatable the codec-cost measurement is: ``measure_codec_costs`` run N times back to back on one model's shapes.

The optimizer measures the codecs once per job (``search.measured.codec_costs``) and prices PowerSGD with torch's hook
timed whole, stretch by stretch; a measurement that swings from run to run swings the prediction with it. Each run is
a fresh process, as each optimizer job's measurement is (a process's first hooks run colder than its later ones). Per run this
prints the total hook CPU of a rank-``r`` step (the per-bucket cost plus every gradient's three stretches), the named
parameter's stretches and its kernels, the load average, and then the spread (max / min) of each over the runs:

    PYTHONPATH=src .venv/bin/python bench/bench_codec_costs.py [--runs 5] [--rank 2] [--param embed.weight] [--json]

The shapes are the held-out embedding job's (``bench/ddp_heldout_embed.py``: ``fsdp1_heldout.CTR`` at its defaults).

On the 2-core VM under load 5.5-7.5 (other jobs running), 5 runs each, the old measurement (two medians taken apart,
the empty bucket's subtracted) then the new (fastest of 15 runs alternating with the empty bucket), back to back,
spread max/min at rank 2: total hook CPU 2.44x (7.8-19.1 ms) -> 1.21x (3.5-4.2 ms); the embedding's three
stretches 4.99 / 9.08 / 4.82x -> 1.36 / 1.17 / 1.54x (984-1334 / 506-594 / 693-1069 us against kernels of about
1,000 us in all); the per-bucket cost 2.01x -> 1.03x; no stretch below its own kernels. 31 runs instead of 15 did not
narrow it further (1.35x): what is left differs from process to process, not from run to run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _shapes() -> list[tuple[str, tuple[int, ...]]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fsdp1_heldout import CTR

    return [(n, tuple(p.shape)) for n, p in CTR(16384, 64, 32, 512).named_parameters()]


def _one(rank: int, param: str) -> dict:
    from dagprof.collect.measure.codec_costs import measure_codec_costs

    t0 = time.perf_counter()
    c = measure_codec_costs(_shapes(), (2, 4))
    per = c.powersgd[rank]
    p = per[param]
    return {"seconds": time.perf_counter() - t0,
            "total_hook_us": c.powersgd_bucket_us + sum(x.hook_issue_us + x.hook_middle_us + x.hook_decode_us for x in per.values()),
            "bucket_us": c.powersgd_bucket_us, "issue_us": p.hook_issue_us, "middle_us": p.hook_middle_us, "decode_us": p.hook_decode_us,
            "kernels_us": p.encode_us + p.middle_us + p.decode_us,
            "below_kernels": sum((x.hook_issue_us < x.encode_us) + (x.hook_middle_us < x.middle_us) + (x.hook_decode_us < x.decode_us)
                                 for x in per.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rank", type=int, default=2, help="PowerSGD rank whose figures are reported (2 and 4 are measured, as the optimizer does)")
    ap.add_argument("--param", default="embed.weight")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single measurement, as JSON (the runs' child)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.rank, args.param)))
        return
    rows = []
    for i in range(args.runs):
        load0 = os.getloadavg()[0]
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--rank", str(args.rank), "--param", args.param],
                             check=True, capture_output=True, text=True).stdout
        rows.append({"run": i, "load": (load0 + os.getloadavg()[0]) / 2, **json.loads(out)})
        if not args.json:
            r = rows[-1]
            print(f"run {i}: {r['seconds']:.1f} s, load {r['load']:.1f}: total hook {r['total_hook_us']:,.0f} us (bucket {r['bucket_us']:.0f}); "
                  f"{args.param} {r['issue_us']:.0f} / {r['middle_us']:.0f} / {r['decode_us']:.0f} (kernels {r['kernels_us']:.0f}); "
                  f"stretches below their kernels: {r['below_kernels']}", flush=True)
    keys = ("total_hook_us", "bucket_us", "issue_us", "middle_us", "decode_us", "kernels_us")
    spread = {k: max(r[k] for r in rows) / min(r[k] for r in rows) if min(r[k] for r in rows) > 0 else float("inf") for k in keys}
    if args.json:
        print(json.dumps({"rank": args.rank, "param": args.param, "runs": rows, "spread": spread}))
    else:
        print("spread (max/min): " + ", ".join(f"{k} {v:.2f}" for k, v in spread.items()))


if __name__ == "__main__":
    main()
