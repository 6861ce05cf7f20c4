"""Per-call cost of the recorder of the model's own collectives (``collect.hooks.own_collectives``), against the call.

Each patched call binds its arguments, and an ``async_op=True`` call walks its caller's stack to tell DDP's comm hook
and ZeRO's broadcasts (the library's own, recorded elsewhere) from the model's. That walk grows with the depth of the
stack, so this times one gloo ``all_reduce`` of a small tensor on a 1-rank group (the cheapest real call: the
recorder's share of any real collective is smaller) from stacks of several depths, unpatched and patched, in
interleaved rounds, and prints the median added microseconds per call and the ratio to the unpatched call.

    .venv/bin/python bench/own_call_cost.py [--calls 2000] [--rounds 5] [--depths 5,50,200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from types import SimpleNamespace


def _at_depth(depth: int, fn, *args):
    return _at_depth(depth - 1, fn, *args) if depth > 0 else fn(*args)


def _calls(n: int, asynchronous: bool, tensor) -> float:
    import torch.distributed as dist

    t0 = time.perf_counter_ns()
    for _ in range(n):
        work = dist.all_reduce(tensor, async_op=asynchronous)
        if asynchronous:
            work.wait()
    return (time.perf_counter_ns() - t0) / n / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--depths", default="5,50,200")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    from dagprof.collect.hooks.own_collectives import patch_own_collectives

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        tensor = torch.ones(256)
        collector = SimpleNamespace(recording=True, records=[], _restore=[], _ddps=[], _fail=lambda err, where: print(where, err))
        depths = [int(d) for d in args.depths.split(",")]
        cells: dict[tuple[bool, int, bool], list[float]] = {}
        for _ in range(args.rounds):
            for asynchronous in (False, True):
                for depth in depths:
                    for patched in (False, True):
                        if patched:
                            patch_own_collectives(collector)
                        cells.setdefault((asynchronous, depth, patched), []).append(
                            _at_depth(depth, _calls, args.calls, asynchronous, tensor))
                        for undo in reversed(collector._restore):
                            undo()
                        collector._restore.clear()
                        collector.records.clear()
        dist.destroy_process_group()
    print(f"{'call':<16}{'stack depth':>12}{'unpatched us':>14}{'patched us':>12}{'added us':>10}{'ratio':>8}"
          f"  (medians of {args.rounds} rounds, spread of the added)")
    for asynchronous in (False, True):
        for depth in depths:
            base, rec = cells[(asynchronous, depth, False)], cells[(asynchronous, depth, True)]
            added = [r - b for r, b in zip(rec, base)]
            print(f"{'async_op=True' if asynchronous else 'blocking':<16}{depth:>12}{statistics.median(base):>14.1f}{statistics.median(rec):>12.1f}"
                  f"{statistics.median(added):>10.1f}{statistics.median(rec) / statistics.median(base):>8.2f}  ({min(added):.1f}..{max(added):.1f})")


if __name__ == "__main__":
    main()
