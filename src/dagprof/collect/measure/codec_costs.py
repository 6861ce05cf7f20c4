"""Measure what gradient compression costs on this machine's CPU (one thread, as a training rank runs).

The casts of the fp16/bf16 hooks are timed per byte on a few MiB; PowerSGD's matrix work is
timed per parameter shape exactly as torch's hook does it (``bmm`` against the factors and its
Gram-Schmidt orthogonalisation), and torch's ``powerSGD_hook`` itself is run whole on a bucket of each
shape in a one-process gloo group (its all-reduces then cost next to nothing): what the kernels leave out
(allocations, the hook's Python) is in that figure, its fastest of alternating runs beside an empty bucket's
(repeatable on a loaded machine: 1.2x between back-to-back measurements where medians swung 1.8x). A few seconds; torch is imported only here.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

from ...costmodel.codecs import CodecCosts, PowerSGDCost, powersgd_split, this_machine

_BYTES = 4 * 2**20
Stretches = tuple[float, float, float]  # microseconds: to the hook's first all-reduce, from there to its last, after it


def measure_codec_costs(params: list[tuple[str, tuple[int, ...]]], ranks: tuple[int, ...] = (1, 2, 4), repeats: int = 5,
                        pairs: int = 15) -> CodecCosts:
    """Costs for the fp16/bf16 casts and for PowerSGD at ``ranks`` on these (name, shape) parameters; torch's hook on
    each shape is timed in ``pairs`` alternations with the empty bucket it is measured against."""
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
        keys = {r: {name: (tuple(shape), r) for name, shape in params if powersgd_split(shape, r)[1]} for r in ranks}
        hook: dict[tuple[tuple[int, ...], int], Stretches] = {}
        empties: list[Stretches] = []
        with _PowerSGDHooks() as hooks:
            empty = hooks.bucket((1,), min(ranks, default=1))  # a bucket that compresses nothing
            for key in dict.fromkeys(k for per in keys.values() for k in per.values()):
                hook[key] = _interleaved(hooks.bucket(*key), empty, pairs, empties)
            nothing = _fastest(empties or [empty() for _ in range(pairs)])
        by_shape = {key: _powersgd(*key, repeats, tuple(max(0.0, w - e) for w, e in zip(whole, nothing))) for key, whole in hook.items()}
        powersgd = {r: {name: by_shape[key] for name, key in per.items()} for r, per in keys.items()}
    finally:
        torch.set_num_threads(threads)
    from .overlap import reference_op_us

    return CodecCosts(enc, dec, powersgd, copy, machine=this_machine(), reference_op_us=reference_op_us(),
                      powersgd_bucket_us=sum(nothing), shapes={name: tuple(shape) for name, shape in params})


def _interleaved(whole: Callable[[], Stretches], empty: Callable[[], Stretches], pairs: int, empties: list[Stretches]) -> Stretches:
    """The hook on a gradient, stretch by stretch: the fastest of ``pairs`` runs, run alternately with the empty bucket
    (whole-empty, then empty-whole, after a warm-up) whose runs go to ``empties``. A loaded machine only adds time
    (preemption, a neighbour's cache and memory traffic), so the fastest run is the repeatable figure for an idle core
    (``search.measured.in_job`` scales it to the job's load); medians taken apart swung by 2x between quiet runs and
    left stretches at 0 below their own kernels, and paired differences still swung with the load in between."""
    for _ in range(2):  # warm-up: the first compressed iterations allocate, and the caches fill
        whole(), empty()
    runs: list[Stretches] = []
    for i in range(pairs):
        if i % 2:
            empties.append(empty())
            runs.append(whole())
        else:
            runs.append(whole())
            empties.append(empty())
    return _fastest(runs)


def _fastest(runs: list[Stretches]) -> Stretches:
    return tuple(min(r[i] for r in runs) for i in range(3))


def _one_process_group():
    """A gloo group of this process alone, outside torch.distributed's default group (none need exist)."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1)


class _PowerSGDHooks:
    """Torch's ``powerSGD_hook`` (error feedback, warm start, as ``dagprof.apply`` sets it) run on a bucket holding one
    gradient, in a one-process gloo group, timed stretch by stretch: to its first all-reduce, from there to its last,
    and after it (each future completes at once, so the callbacks run inline). A context: it wraps ``all_reduce``."""

    def __enter__(self) -> "_PowerSGDHooks":
        import logging

        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        self._psgd, self._dist, self._group = psgd, dist, _one_process_group()
        self._plain = dist.all_reduce
        self._issued: list[float] = []
        self._log = logging.getLogger(psgd.__name__)
        self._level = self._log.level
        self._log.setLevel(logging.WARNING)  # the hook logs its first compressed bucket

        def all_reduce(*args, **kwargs):
            self._issued.append(time.perf_counter())
            return self._plain(*args, **kwargs)

        dist.all_reduce = all_reduce  # the hook calls it through the module
        return self

    def __exit__(self, *exc) -> None:
        self._dist.all_reduce = self._plain
        self._log.setLevel(self._level)

    def bucket(self, shape: tuple[int, ...], rank: int) -> Callable[[], Stretches]:
        """A run of the hook on a fresh bucket of ``shape`` at ``rank``, past its first compressed iteration."""
        import torch

        psgd, issued = self._psgd, self._issued

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

        state = psgd.PowerSGDState(process_group=self._group, matrix_approximation_rank=rank, start_powerSGD_iter=2, min_compression_rate=2,
                                   use_error_feedback=True, warm_start=True)
        state.iter = state.start_powerSGD_iter
        bucket = Bucket()

        def run() -> Stretches:
            issued.clear()
            t0 = time.perf_counter()
            psgd.powerSGD_hook(state, bucket).wait()
            t1 = time.perf_counter()
            return (issued[0] - t0) * 1e6, (issued[-1] - issued[0]) * 1e6, (t1 - issued[-1]) * 1e6

        run()  # its first compressed iteration draws Q and allocates the error
        return run


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
