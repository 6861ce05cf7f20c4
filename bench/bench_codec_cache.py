"""Torch's PowerSGD hook timed with warm caches (as ``measure_codec_costs`` times it) against cold ones (the caches
flushed by writing a 64 MiB scratch before each run), on the gradients of kept runs.

    PYTHONPATH=src .venv/bin/python bench/bench_codec_cache.py RUN [RUN ...] [--rank 2] [--pairs 15]

Each RUN is a profile folder (its gradients' shapes are read from it); per compressed gradient it prints the hook's three
stretches (to its first all-reduce, between, after; microseconds), the fastest and the median of ``--pairs`` cold runs and
as many warm ones (each timed after an untimed warm run) alternated, one thread, beside the empty bucket's, and the load average.

On the 2-core VM (3 runs, load 1.9-2.1), the held-out jobs' kept profiles at rank 2: the embedding's 16,384 x 64 to its
first all-reduce 1,334-1,368 us cold against 961-1,044 warm; summed over each job's gradients, to the first all-reduce,
cold minus warm +0.39 to +0.41 ms (embedding), +0.26 to +0.38 (conv), +0.13 to +0.22 (LSTM).
"""
from __future__ import annotations

import argparse
import os
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()
    import torch

    from dagprof.collect.measure.codec_costs import _PowerSGDHooks
    from dagprof.costmodel.codecs import powersgd_split
    from dagprof.passes.gradients import gradient_order
    from dagprof.pipeline import open_run

    torch.set_num_threads(1)
    scratch = torch.zeros(16 << 20)  # 64 MiB of float32: larger than the last-level cache
    with _PowerSGDHooks() as hooks:
        for path in args.runs:
            p = open_run(path)
            order = gradient_order(p.graph, p.run.ranks[0].buckets)
            shapes = [(n, tuple(s)) for n, s in zip(order.params, order.shapes) if s is not None and powersgd_split(tuple(s), args.rank)[1]]
            print(f"{path} (load {os.getloadavg()[0]:.2f})")
            totals = {"warm": [0.0] * 3, "cold": [0.0] * 3}
            for name, shape in [("(empty bucket)", (1,))] + shapes:
                cold_run = hooks.bucket(shape, args.rank)

                def cold(run=cold_run):
                    scratch.add_(1.0)
                    return run()

                runs = {"warm": hooks.bucket(shape, args.rank), "cold": cold}
                got: dict[str, list] = {"warm": [], "cold": []}
                for i in range(args.pairs + 2):  # a cold run flushes the warm one's buffers too: a warm run is timed after another
                    cold, _, warm = runs["cold"](), runs["warm"](), runs["warm"]()
                    if i >= 2:  # after two warm-ups
                        got["cold"].append(cold)
                        got["warm"].append(warm)
                line = []
                for kind, rs in got.items():
                    fast = [min(r[j] for r in rs) for j in range(3)]
                    med = [statistics.median(r[j] for r in rs) for j in range(3)]
                    if shape != (1,):
                        totals[kind] = [t + f for t, f in zip(totals[kind], fast)]
                    line.append(f"{kind} fastest {' / '.join(f'{x:6.0f}' for x in fast)} median {' / '.join(f'{x:6.0f}' for x in med)}")
                print(f"  {name:<22} {str(shape):<20} " + " | ".join(line), flush=True)
            print(f"  sum of fastest (gradients only): warm {' / '.join(f'{x:.0f}' for x in totals['warm'])}, "
                  f"cold {' / '.join(f'{x:.0f}' for x in totals['cold'])} (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
