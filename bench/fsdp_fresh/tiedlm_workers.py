"""Part 12's job (``fsdp_train.py --model tiedlm``, ``fsdp_whatif_table.FRESH``) profiled at 2 and at 4 ranks on the
namespace testbed at 1 Gbit/s, with its unprofiled 2- and 4-rank jobs between, so that ``workers_categories.py`` can say
where ``whatif --workers 4`` of the 2-rank profile misses the 4-rank one (issue 16). The profiles use part 12's window
(the first half of the steps after warm-up). Root, under the exclusive lock:

    sudo dp-excl .venv/bin/python bench/fsdp_fresh/tiedlm_workers.py --keep DIR [--rounds 1] [--steps 24]
    PYTHONPATH=src .venv/bin/python bench/fsdp_fresh/workers_categories.py DIR [--cores 2]

Kept as ``DIR/rK-tiedlm-{profile2,profile4}`` (profiles) and ``DIR/rK-tiedlm-{measure2,measure4}`` (rank 0's step times,
``times.json``), each with its ranks' logs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_fsdp import RATES, WARMUP, job  # noqa: E402
from fsdp_whatif_table import FRESH  # noqa: E402

from dagprof.collect.jobs.netns import Cluster  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", required=True)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=24)
    a = p.parse_args()
    os.makedirs(a.keep, exist_ok=True)
    first = sum(1 for e in os.listdir(a.keep) if e.endswith("-profile2"))
    window = f"{WARMUP + 1}:{(a.steps + WARMUP + 1) // 2}"
    t0 = time.perf_counter()
    with Cluster(4) as cluster:
        cluster.set_rate(RATES["1Gbit"])
        for k in range(first, first + a.rounds):
            for cell in ("profile2", "measure2", "measure4", "profile4"):
                out = os.path.join(a.keep, f"r{k}-tiedlm-{cell}")
                ranks = int(cell[-1])
                ms = job(ranks, FRESH, a.steps, out + "-log", cluster, profile=out if cell.startswith("profile") else None,
                         kineto=False, window=window)
                if not cell.startswith("profile"):
                    os.makedirs(out, exist_ok=True)
                    os.replace(os.path.join(out + "-log", "times.json"), os.path.join(out, "times.json"))
                print(f"round {k} {cell}: rank 0's median step {ms:.1f} ms ({time.perf_counter() - t0:.0f} s, load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
