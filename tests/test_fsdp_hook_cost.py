"""What the FSDP collector's per-step hooks read, made cheaper (branch hookcost): a DTensor's bytes from its local tensor
(not ``to_local()``, an autograd function run per parameter in every step's optimizer hook), a process group's ranks once
per group; the same figures as before. And ``bench/bench_overhead.py``'s part 4 on another script (the tied LM)."""
from __future__ import annotations

import os
import sys

from dagprof.collect.hooks.fsdp import FsdpRecorder, _local_bytes

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def test_dtensor_bytes_as_to_local_reads_them(one_rank_group):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    for dtype in (torch.float32, torch.bfloat16):
        t = distribute_tensor(torch.ones(6, 5, dtype=dtype), mesh, [Shard(0)])
        local = t.to_local()
        assert _local_bytes(t) == local.numel() * local.element_size() == 30 * dtype.itemsize
    plain = torch.ones(3, dtype=torch.float64)
    assert (_local_bytes(plain), _local_bytes(None)) == (24, 0)


def test_group_ranks_read_once_per_group(one_rank_group):
    dist = one_rank_group
    calls = []

    class Counting:
        get_world_size = staticmethod(dist.get_world_size)

        @staticmethod
        def get_process_group_ranks(group):
            calls.append(group)
            return [0, 3] if group is not None else [0]

    rec = FsdpRecorder(None, [])
    a, b = object(), object()
    assert [rec._ranks_of(g, Counting) for g in (a, a, b, None, None, a)] == ["0,3", "0,3", "0,3", "0", "0", "0,3"]
    assert calls == [a, b]  # None (the world) from the world size, each group looked up once
    rec.release()
    assert rec._ranks_of(a, Counting) == "0,3" and calls == [a, b, a]  # released: nothing held


def test_bench_overhead_takes_another_script():
    sys.path.insert(0, BENCH)
    try:
        import bench_overhead
        from fsdp_whatif_table import FRESH

        assert bench_overhead.fsdp_args("tiedlm") == list(FRESH)
        assert bench_overhead.fsdp_args(None) == bench_overhead.FSDP_ARGS
        assert bench_overhead.fsdp_args("--model mlp --blocks 2") == ["--model", "mlp", "--blocks", "2"]
        mod = bench_overhead._load_script(os.path.join(BENCH, "fsdp_train.py"))
        args = mod.parse_args([*FRESH, "--steps", "5"])
        assert (args.model, args.blocks, args.steps) == ("tiedlm", 6, 5) and callable(mod.build) and callable(mod.train)
    finally:
        sys.path.remove(BENCH)
