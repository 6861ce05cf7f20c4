"""Measure what gradient compression costs on this machine's CPU (one thread, as a training rank runs).

The casts of the fp16/bf16 hooks are timed per byte on a few MiB; PowerSGD's matrix work is
timed per parameter shape exactly as torch's hook does it (``bmm`` against the factors and its
Gram-Schmidt orthogonalisation), and torch's ``powerSGD_hook`` itself is run whole on a bucket of each
shape in a one-process gloo group (its all-reduces then cost next to nothing): what the kernels leave out
(allocations, the hook's Python) is in that figure. A few seconds; torch is imported only here.
"""
from __future__ import annotations

import math
import platform
import statistics
import time
from typing import Callable

from ...costmodel.codecs import CodecCosts, PowerSGDCost, powersgd_split

_BYTES = 4 * 2**20


def measure_codec_costs(params: list[tuple[str, tuple[int, ...]]], ranks: tuple[int, ...] = (1, 2, 4), repeats: int = 5) -> CodecCosts:
    """Costs for the fp16/bf16 casts and for PowerSGD at ``ranks`` on these (name, shape) parameters."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        buf = torch.randn(_BYTES // 4)
        enc, dec = {}, {}
        for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            half = buf.to(dtype)
            enc[name] = _time(lambda: buf.to(dtype).div_(2), repeats) / _BYTES
            dec[name] = _time(lambda: buf.copy_(half), repeats) / _BYTES
        other = torch.empty_like(buf)
        copy = _time(lambda: other.copy_(buf), repeats) / _BYTES
        by_shape: dict[tuple[tuple[int, ...], int], PowerSGDCost] = {}
        powersgd: dict[int, dict[str, PowerSGDCost]] = {}
        group = _one_process_group()
        empty = _hook_parts(group, (1,), min(ranks, default=1), repeats)  # a bucket that compresses nothing
        for r in ranks:
            per: dict[str, PowerSGDCost] = {}
            for name, shape in params:
                if not powersgd_split(shape, r)[1]:
                    continue
                key = (tuple(shape), r)
                if key not in by_shape:
                    whole = _hook_parts(group, shape, r, repeats)
                    by_shape[key] = _powersgd(shape, r, repeats, tuple(max(0.0, w - e) for w, e in zip(whole, empty)))
                per[name] = by_shape[key]
            powersgd[r] = per
    finally:
        torch.set_num_threads(threads)
    from .overlap import reference_op_us

    return CodecCosts(enc, dec, powersgd, copy, machine=f"{platform.node()} {platform.processor() or platform.machine()}",
                      reference_op_us=reference_op_us(), powersgd_bucket_us=sum(empty))


def _one_process_group():
    """A gloo group of this process alone, outside torch.distributed's default group (none need exist)."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1)


def _hook_parts(group, shape: tuple[int, ...], rank: int, repeats: int) -> tuple[float, float, float]:
    """Median microseconds of torch's ``powerSGD_hook`` (error feedback, warm start, as ``dagprof.apply`` sets it) on a
    bucket holding one gradient of ``shape``, past its warm-up iterations: to its first all-reduce, from there to its
    last, and after it (in a one-process group each future completes at once, so the callbacks run inline)."""
    import logging

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    class Bucket:  # the part of DDP's GradBucket the hook reads
        def __init__(self) -> None:
            self.grad = torch.randn(math.prod(shape))

        def buffer(self):
            return self.grad

        def index(self) -> int:
            return 0

        def gradients(self) -> list:
            return [self.grad.view(shape)]

        def is_last(self) -> bool:
            return True

    issued: list[float] = []
    plain = dist.all_reduce

    def all_reduce(*args, **kwargs):
        issued.append(time.perf_counter())
        return plain(*args, **kwargs)

    def run() -> tuple[float, float, float]:
        issued.clear()
        t0 = time.perf_counter()
        psgd.powerSGD_hook(state, bucket).wait()
        t1 = time.perf_counter()
        return issued[0] - t0, issued[-1] - issued[0], t1 - issued[-1]

    log = logging.getLogger(psgd.__name__)
    level = log.level
    log.setLevel(logging.WARNING)  # the hook logs its first compressed bucket
    dist.all_reduce = all_reduce  # the hook calls it through the module
    try:
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=rank, start_powerSGD_iter=2, min_compression_rate=2,
                                   use_error_feedback=True, warm_start=True)
        state.iter = state.start_powerSGD_iter
        bucket = Bucket()
        run()  # its first compressed iteration draws Q and allocates the error
        runs = [run() for _ in range(max(repeats, 3))]
    finally:
        dist.all_reduce = plain
        log.setLevel(level)
    return tuple(statistics.median(r[i] for r in runs) * 1e6 for i in range(3))


def _powersgd(shape: tuple[int, ...], rank: int, repeats: int, whole: tuple[float, ...]) -> PowerSGDCost:
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    n = shape[0]
    m = math.prod(shape) // n
    r = min(n, m, rank)
    M = torch.randn(1, n, m)
    P = torch.empty(1, n, r)
    Q = torch.randn(1, m, r)

    def encode() -> None:
        _orthogonalize(Q, 0)
        torch.bmm(M, Q, out=P)

    def middle() -> None:
        _orthogonalize(P, 0)
        torch.bmm(M.transpose(1, 2), P, out=Q)

    def decode() -> None:
        torch.bmm(P, Q.transpose(1, 2), out=M)

    return PowerSGDCost(_time(encode, repeats), _time(middle, repeats), _time(decode, repeats), *whole)


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Median microseconds of ``fn`` after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)
