"""Measure what gradient compression costs on this machine's CPU (one thread, as a training rank runs).

The casts of the fp16/bf16 hooks are timed per byte on a few MiB; PowerSGD's matrix work is
timed per parameter shape exactly as torch's hook does it (``bmm`` against the factors and its
Gram-Schmidt orthogonalisation). A few seconds; torch is imported only here.
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
        for r in ranks:
            per: dict[str, PowerSGDCost] = {}
            for name, shape in params:
                if not powersgd_split(shape, r)[1]:
                    continue
                key = (tuple(shape), r)
                if key not in by_shape:
                    by_shape[key] = _powersgd(shape, r, repeats)
                per[name] = by_shape[key]
            powersgd[r] = per
    finally:
        torch.set_num_threads(threads)
    from .overlap import reference_op_us

    return CodecCosts(enc, dec, powersgd, copy, machine=f"{platform.node()} {platform.processor() or platform.machine()}",
                      reference_op_us=reference_op_us())


def _powersgd(shape: tuple[int, ...], rank: int, repeats: int) -> PowerSGDCost:
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

    return PowerSGDCost(_time(encode, repeats), _time(middle, repeats), _time(decode, repeats))


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Median microseconds of ``fn`` after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out)
