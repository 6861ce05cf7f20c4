"""Per-call cost of recording a functional collective (``collect.hooks.own_collectives.patch_functional``: DTensor's path,
a DP x TP job's tensor-parallel all-reduces, recorded on DDP and FSDP runs alike), against the call.

Times ``funcol.wait_tensor(funcol.all_reduce(t))`` of a 128 KiB tensor (the Llama FSDP x TP job's activation, batch 8 x seq 32
x dim 128 fp32) on a 1-rank gloo group, unpatched and patched, in interleaved rounds after a warm-up, and prints the median
added microseconds per call. ``bench/own_call_cost.py`` times the ``torch.distributed`` calls.

    .venv/bin/python bench/funcol_call_cost.py [--calls 3000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from types import SimpleNamespace


class _NoHook:
    """An FSDP job's collector: no DDP comm hook runs."""

    hook_call = None

    def in_hook_callback(self) -> bool:
        return False


def _calls(n: int, t) -> float:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    t0 = time.perf_counter_ns()
    for _ in range(n):
        funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
    return (time.perf_counter_ns() - t0) / n / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    from dagprof.collect.hooks.own_collectives import patch_functional

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    t = torch.ones(8 * 32 * 128)
    collector = SimpleNamespace(recording=True, records=[], _restore=[], _buckets=_NoHook(), _fail=lambda err, where: print(where, err))
    _calls(args.calls // 4, t)  # warm-up
    added = []
    for _ in range(args.rounds):
        plain = _calls(args.calls, t)
        patch_functional(collector, {})
        patched = _calls(args.calls, t)
        for undo in reversed(collector._restore):
            undo()
        collector._restore.clear()
        assert len(collector.records) == 2 * args.calls  # each call and its wait
        collector.records.clear()
        added.append(patched - plain)
        print(f"plain {plain:.1f} us/call, recorded {patched:.1f} us/call: +{patched - plain:.1f} us", flush=True)
    print(f"median added {statistics.median(added):.1f} us per call over {args.rounds} rounds (load {os.getloadavg()[0]:.1f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
