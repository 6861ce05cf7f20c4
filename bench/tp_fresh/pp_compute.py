"""Check ``whatif --compute-speed 2`` on a pipeline job against a measurement: ``pp_dp.py --repeat 2`` (each stage's layers
twice per micro-batch) predicted at twice the compute speed, against ``--repeat 1`` measured afterwards, in interleaved rounds.

Both are stock torch.profiler recordings (steps 2-3), so the profiler's cost is alike on both sides. The compute-speed
answer halves every compute op and keeps the rest as measured: the pipeline's send/recv (each recv waits for its peer
stage's send in the replay), the gradient all-reduces and the framework's gaps. The load average is printed per
recording: on a shared machine the ranks' ops also wait for cores, and that sharing is not halved.

    python bench/tp_fresh/pp_compute.py --rounds 3 --keep /tmp/pp_compute
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from review import chain, record_stock

JOB = ["--width", "512", "--batch", "64", "--micro", "4"]


def iteration_ms(run: str, speed: float) -> tuple[float, float]:
    """(measured, predicted at ``speed``) ms per iteration of the recording ``run``."""
    done = chain.dagprof("whatif", run, "--compute-speed", str(speed), "--allow-model-error", "--json", "-o", run + "-out")
    if done.returncode:
        raise SystemExit(f"whatif {run}: {done.stderr.strip()[-300:]}")
    r = json.loads(done.stdout)
    return r["reference_iter_ms"], r["scenarios"][0]["predicted_iter_ms"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keep", help="folder for the recordings (default: a temporary one)")
    args = p.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="pp_compute_")
    predicted, measured = [], []
    for k in range(args.rounds):
        for repeat in (2, 1):
            run = os.path.join(root, f"r{k}-repeat{repeat}")
            load = os.getloadavg()[0]
            extra = ["--repeat", str(repeat)]
            if not record_stock("pp-dp", run, extra=JOB + extra):
                raise SystemExit(1)
            at, pred = iteration_ms(run, 2.0 if repeat == 2 else 1.0)
            (predicted if repeat == 2 else measured).append(pred if repeat == 2 else at)
            print(f"round {k} repeat {repeat}: measured {at:.1f} ms/iter" + (f", predicted at --compute-speed 2: {pred:.1f} ms" if repeat == 2 else "")
                  + f"  (load {load:.1f})", flush=True)
    pm, mm = statistics.mean(predicted), statistics.mean(measured)
    print(f"predicted (repeat 2 at --compute-speed 2) {pm:.1f} ms [{min(predicted):.1f}-{max(predicted):.1f}], measured (repeat 1) "
          f"{mm:.1f} ms [{min(measured):.1f}-{max(measured):.1f}]: {100 * (pm - mm) / mm:+.1f} %; recordings in {root}")


if __name__ == "__main__":
    main()
