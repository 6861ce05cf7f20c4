"""How much an in-flight collective slows the computation beside it, measured on dagprof's own ranks.

On a CPU-only job the network stack (and gloo's threads) run on the cores that train: while a
bucket travels, backward runs slower. On the emulated cluster a 8 MB all-reduce at 200 Mbit/s
slows a matrix-multiply loop beside it by about half. ``measure_overlap`` times a fixed compute
loop alone and beside an all-reduce, on every rank at once (inside an initialised process group),
and returns the slowdown per unit of overlap: compute that overlaps a collective for a fraction f
of its time takes (1 + slowdown * f) times as long; and, the other way round, the all-reduce beside the loop
(``comm_slowdown``, same units: on busy cores gloo's threads wait for a core, which ``sgd.contention`` prices
for WFBP's all-reduces beside the backward). ``passes.overlap`` applies it in replay. Our demo
job measures it on its own group (``measure_into``); for any other job ``dagprof calibrate --overlap``
does, on ranks of its own on the job's cluster (dagprof never adds collectives to a user's process group).
It also times the loop's op undisturbed (``matmul_us``; in the demo job, the yardstick for costs measured
on an idle core, gradient codecs: in the job they run that much slower), and small all-reduces each issued from the
previous one's completion callback (``chained_allreduce``), as PowerSGD's hook issues its P and Q all-reduces: on the
testbed's 200 Mbit/s link under load 7 a 16 KiB one took 2.7 ms where the link model fitted on the job's buckets
prices 0.7 ms (gloo's thread hand-offs and wake-ups, which a bucket's transfer hides and a small message pays whole);
and the same chain with the hook's kind of CPU in each callback (``chained_stretch``), which it takes longer there than
alone: the ranks wait for a core, for the wake-up after it, and for the later rank at each all-reduce. And PowerSGD's
chain of three small all-reduces issued while a backward runs on the issuing rank's training thread (``chained_busy``), as
a bucket's hook issues them before the last gradient: on the testbed the held-out conv's first bucket's all-reduces took
3.4-3.8 ms each beside its backward where the idle chain priced 0.8-2.5 (gloo's threads waiting for a core).
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Callable, Literal

import msgspec

from ...errors import DagprofError
from ...fsutil import atomic_open, read_input

if TYPE_CHECKING:
    import torch

FILE = "overlap.json"
FORMAT = "dagprof-overlap"
MATMUL = "matmul"  # the reference loop: 256x256 matrix products, one thread
BACKWARD = "backward"  # the job's own backward (``backward_work``)


class Overlap(msgspec.Struct, frozen=True):
    """What ``measure_overlap`` found on the job's ranks, as ``overlap.json`` in the run folder keeps it."""

    slowdown: Annotated[float, msgspec.Meta(ge=0)]  # per unit of overlap: compute overlapping a collective for a fraction f takes (1 + slowdown * f) as long
    matmul_us: float  # the reference op (``reference_op_us``) on the job's busy cores
    samples: list[float]  # rank 0's slowdown per repeat
    allreduce_bytes: Annotated[int, msgspec.Meta(ge=0)]
    allreduce_s: Annotated[float, msgspec.Meta(ge=0)]
    format: Literal["dagprof-overlap"] = FORMAT
    # False (files written before): each sample was (beside - alone) / beside, the extra time over the disturbed loop;
    # the model's slowdown is per unit of the undisturbed time, (beside - alone) / alone over the overlapped share
    per_undisturbed: bool = False
    # (bytes, us per all-reduce) of small all-reduces chained by completion callbacks, the slowest rank's (empty: not measured)
    chained_allreduce: list[tuple[int, float]] = msgspec.field(default_factory=list)
    # the other way round, in the same units: an all-reduce overlapping compute for a fraction f of its time takes
    # (1 + comm_slowdown * f) as long, the slowest rank's (0 in files written before it was measured)
    comm_slowdown: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    beside: str = MATMUL  # the compute measured beside the all-reduce (``Work.name``)
    queued: Annotated[int, msgspec.Meta(ge=1)] = 1  # all-reduces of ``allreduce_bytes`` queued back to back beside it
    # CPU between chained all-reduces, as torch's PowerSGD hook runs it between its own, per unit of that CPU's fastest
    # time alone on the rank (``chained_stretch``), the slowest rank's (0 in files written before it was measured)
    chained_stretch: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # (bytes, us per all-reduce) of PowerSGD's three chained all-reduces issued while a backward runs on the issuing thread
    # (``chained_busy``), the slowest rank's (empty in files written before it was measured: priced by ``chained_allreduce``)
    chained_busy: list[tuple[int, float]] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.per_undisturbed and self.slowdown >= 1.0:  # (B - A) / B is below 1
            raise ValueError(f"slowdown {self.slowdown} per unit of the disturbed loop is not below 1")

    @property
    def model_slowdown(self) -> float:
        """The slowdown as ``passes.overlap`` charges it (per unit of overlap of the undisturbed duration). An older
        file's figure, s = (B - A) / B with the loop wholly overlapped, is (B - A) / A = s / (1 - s) in those units."""
        return self.slowdown if self.per_undisturbed else self.slowdown / (1.0 - self.slowdown)

    @property
    def rate(self) -> float | None:
        """Bytes per second of the all-reduce it was measured beside (None where its time is not known)."""
        return self.allreduce_bytes / self.allreduce_s if self.allreduce_s > 0 else None


@dataclass(frozen=True)
class Work:
    """Compute to measure beside an all-reduce: ``run(n)`` does n units of it (each ms or less, the same every time)."""

    name: str
    run: Callable[[int], None]


def backward_work(loss: Callable[[], "torch.Tensor"]) -> Work:
    """The job's own backward as ``measure_overlap``'s compute: ``loss()`` (its forward, on its model and batch) once,
    then each unit back-propagates that graph again (``retain_graph``), so only the backward is timed, as WFBP's
    all-reduces overlap only the backward. Gradients accumulate into the parameters' ``.grad``, as a step's would."""
    graph = loss()

    def run(n: int) -> None:
        for _ in range(n):
            graph.backward(retain_graph=True)

    return Work(BACKWARD, run)


OVERLAP_BYTES = 8 * 2**20  # a DDP bucket's size; the all-reduce's slowdown beside compute is far larger for smaller ones: on the
# testbed's 1 Gbit/s link, 2 (4) ranks on 2 cores, comm_slowdown 2.85 (4.48) beside 0.66 MiB against 0.10 (0.28) beside 8 MiB


def measure_overlap(nbytes: int = OVERLAP_BYTES, repeats: int = 4, work: Work | None = None) -> Overlap:
    """Slowdown of compute while an all-reduce of ``nbytes`` is in flight (every rank must call it), in the model's
    units: the loop's extra time over its undisturbed time, per unit of its share overlapped (the all-reduce's own end
    taken from its future). Per unit of the disturbed time, as files before ``per_undisturbed`` hold it, it read
    0.39 on the testbed's 200 Mbit/s link where the model means 0.64, and the held-out conv job's PowerSGD speed-up
    came out -11.0 % per round instead of -5.8 %.

    ``work``: the compute beside the all-reduce (``backward_work``: the job's own backward; None: the reference 256x256
    matrix product). What slows beside gloo's threads depends on it: on the testbed's 1 Gbit/s link, 4 ranks on 2 cores,
    the matrix loop priced WFBP 13 % over the measured step where the job's backward, measured so, is slowed less.
    ``chained_busy`` runs beside ``work`` where it is the job's backward, else beside ``calibration_backward`` (a matrix
    loop would not time the chain beside a backward, as a bucket's hook issues it)."""
    import torch
    import torch.distributed as dist

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    buf = torch.ones(nbytes // 4)
    dist.all_reduce(buf)  # connections set up

    def matmul(n: int) -> None:
        for _ in range(n):
            a @ b

    def timed(n: int, run: Callable[[int], None] = work.run if work else matmul) -> float:
        t0 = time.perf_counter()
        run(n)
        return time.perf_counter() - t0

    t_ref = max(timed(20, matmul) / 20, 1e-6)
    t_one = t_ref if work is None else max(min(timed(1) for _ in range(3)), 1e-6)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    comm = time.perf_counter() - t0
    # beside a backward longer than the all-reduce, as many all-reduces of the size as it outlasts, queued back to back as WFBP
    # queues its layers' (one would overlap a small share of it, and the noise of a loaded machine swamp the slowdown)
    agreed = torch.tensor([1 if work is None else max(round(t_one / comm), 1)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank must issue as many
    queued = int(agreed)
    n = max(round(queued * comm / t_one), 10 if work is None else 1)  # a loop about as long as the all-reduces (a backward is ms, the product us)

    def allreduces() -> list:
        return [dist.all_reduce(buf, async_op=True) for _ in range(queued)]

    samples, alone_s, comm_samples = [], [], []
    for _ in range(repeats):
        dist.barrier()
        alone = timed(n)
        alone_s.append(alone / n)
        dist.barrier()
        t0 = time.perf_counter()
        for w in allreduces():
            w.wait()
        comm_alone = time.perf_counter() - t0
        dist.barrier()
        done: list[float] = []
        t0 = time.perf_counter()
        ws = allreduces()
        ws[-1].get_future().then(lambda _: done.append(time.perf_counter()))  # when the (last) all-reduce itself completed
        beside = timed(n)
        for w in ws:
            w.wait()
        comm_beside = (done[0] if done else time.perf_counter()) - t0
        both = min(comm_beside, beside)  # how long the two ran together
        # B = A (1 + s f), f the loop's overlapped share: s per unit of overlap of the undisturbed time; the all-reduce alike
        samples.append(max(beside - alone, 0.0) / max(alone, 1e-9) / max(both / max(beside, 1e-9), 1e-9))
        comm_samples.append(max(comm_beside - comm_alone, 0.0) / max(comm_alone, 1e-9) / max(both / max(comm_beside, 1e-9), 1e-9))
    # every rank's view; the slowest governs the job
    ref = statistics.median(alone_s) if work is None else t_ref
    t = torch.tensor([statistics.median(samples), ref, statistics.median(comm_samples)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return Overlap(float(t[0]), float(t[1]) * 1e6, samples, nbytes, comm, per_undisturbed=True, chained_allreduce=chained_allreduce(repeats),
                   comm_slowdown=float(t[2]), beside=work.name if work else MATMUL, queued=queued, chained_stretch=chained_stretch(repeats),
                   chained_busy=chained_busy(work if work and work.name == BACKWARD else None, 2 * repeats))


CHAINED_BYTES = (4096, 16384, 65536)  # the range of PowerSGD's P and Q factors per bucket on the demo's and held-out models


def chained_allreduce(repeats: int = 4) -> list[tuple[int, float]]:
    """(bytes, us per all-reduce) at each of ``CHAINED_BYTES`` when each all-reduce is issued from the previous one's
    completion callback, the slowest rank's (every rank must call it)."""
    return _slowest_per_size(lambda size: _chained_allreduce_us(size, repeats))


def _slowest_per_size(us_at: Callable[[int], float]) -> list[tuple[int, float]]:
    """(bytes, ``us_at(bytes)``) at each of ``CHAINED_BYTES``, the slowest rank's: a chain ends when its slowest rank's
    all-reduces do (every rank must call it)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([us_at(size) for size in CHAINED_BYTES], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [(size, float(us)) for size, us in zip(CHAINED_BYTES, t)]


def _chained_allreduce_us(nbytes: int, repeats: int, chain: int = 4) -> float:
    """Median microseconds per all-reduce of ``nbytes`` when each is issued from the previous one's completion
    callback (every rank must call it)."""
    import threading

    import torch
    import torch.distributed as dist

    buf = torch.ones(nbytes // 4)
    dist.all_reduce(buf)
    per = []
    for _ in range(max(repeats, 3)):
        dist.barrier()
        done = threading.Event()

        def issue(k: int) -> None:
            if k == chain:
                done.set()
            else:
                dist.all_reduce(buf, async_op=True).get_future().then(lambda _: issue(k + 1))

        t0 = time.perf_counter()
        issue(0)
        if not done.wait(600):
            raise DagprofError(f"chained all-reduces of {nbytes} bytes did not complete in 10 minutes")
        per.append((time.perf_counter() - t0) / chain)
    return statistics.median(per) * 1e6


STRETCH_BYTES = 16384  # the chained all-reduces around the CPU: the middle of ``CHAINED_BYTES``
STRETCH_SHAPE = (1024, 1024)  # the matrix of the CPU between them: PowerSGD's products with a rank-2 factor, about 2.5 ms on an idle core


def chained_stretch(repeats: int = 4, units: int = 1, chain: int = 4) -> float:
    """How long CPU between chained all-reduces takes, as torch's PowerSGD hook runs it (each completion callback
    computes, then issues the next all-reduce and waits for it), per unit of that CPU's fastest time alone on the rank
    (its thread's CPU time, so preemption there does not hide the stretch): ``4 * repeats`` chains with the CPU
    alternated with as many without it, their medians' difference over the CPU alone (the slowest rank's; every rank
    must call it). ``codec_costs`` prices the hook's CPU at its fastest on an idle core; between chained all-reduces it
    also waits for a core, for the wake-up after it, and for the later rank to reach each all-reduce. The CPU is the
    hook's own kind, Gram-Schmidt on a rank-2 factor and its products with a matrix of ``STRETCH_SHAPE``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    m = torch.randn(1, *STRETCH_SHAPE)
    p, q = torch.randn(1, STRETCH_SHAPE[0], 2), torch.randn(1, STRETCH_SHAPE[1], 2)

    def cpu() -> None:
        for _ in range(units):
            _orthogonalize(p, 0)
            torch.bmm(m.transpose(1, 2), p, out=q)
            torch.bmm(m, q, out=p)

    def alone() -> float:
        t0 = time.thread_time()
        cpu()
        return time.thread_time() - t0

    buf = torch.ones(STRETCH_BYTES // 4)
    dist.all_reduce(buf)
    cpu()  # warm-up
    fastest = min(alone() for _ in range(5))
    with_cpu, without = [], []
    for i in range(8 * max(repeats, 3)):
        dist.barrier()
        (with_cpu if i % 2 else without).append(_chain_s(buf, chain, cpu if i % 2 else None))
        fastest = min(fastest, alone())
    extra = max(statistics.median(with_cpu) - statistics.median(without), 0.0) / chain
    t = torch.tensor([extra / max(fastest, 1e-9)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def _chain_s(buf: "torch.Tensor", chain: int, cpu: Callable[[], None] | None) -> float:
    """Seconds for ``chain`` all-reduces of ``buf``, each from the previous one's completion callback as torch's PowerSGD
    hook issues them: the callback runs ``cpu``, issues the next and waits for it."""
    return _start_chain(buf, chain, cpu)[0]()


def _start_chain(buf: "torch.Tensor", chain: int, cpu: Callable[[], None] | None) -> tuple[Callable[[], float], Callable[[], bool]]:
    """Issue ``_chain_s``'s chain and return at once: (wait: the seconds from its issue to its last completion,
    done: whether it completed), so the calling thread can compute while the chain runs on gloo's threads."""
    import threading

    import torch.distributed as dist

    done, end = threading.Event(), []

    def link(k: int) -> None:
        if cpu is not None:
            cpu()
        if k < chain - 1:
            dist.all_reduce(buf, async_op=True).get_future().wait()
            link(k + 1)
        else:
            end.append(time.perf_counter())
            done.set()

    t0 = time.perf_counter()
    dist.all_reduce(buf, async_op=True).get_future().then(lambda _: link(0))

    def wait() -> float:
        if not done.wait(600):
            raise DagprofError(f"chained all-reduces of {buf.numel() * 4} bytes did not complete in 10 minutes")
        return end[0] - t0

    return wait, done.is_set


BUSY_CHAIN = 3  # PowerSGD's all-reduces per bucket: the uncompressed tensors, P, Q


def calibration_backward() -> Work:
    """Backward-like work of the calibration's own, for ``chained_busy`` where the job's backward is not at hand: a small
    CNN's backward (two 3x3 convolutions and a linear head, batch 8 of 32x32 images; 2.6 ms a unit on an idle core), on one
    thread as the testbed's jobs run."""
    import torch
    import torch.nn as nn

    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))
    x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        work = backward_work(lambda: nn.functional.cross_entropy(model(x), y))
    finally:
        torch.set_num_threads(threads)

    def run(n: int) -> None:
        torch.set_num_threads(1)
        try:
            work.run(n)
        finally:
            torch.set_num_threads(threads)

    return Work("calibration backward", run)


def chained_busy(work: Work | None = None, repeats: int = 8) -> list[tuple[int, float]]:
    """(bytes, us per all-reduce) at each of ``CHAINED_BYTES`` of PowerSGD's chain (``BUSY_CHAIN`` all-reduces, each from
    the previous one's completion callback, which issues it and waits) issued from the training thread while it runs a
    backward (``work``, the job's own; None: ``calibration_backward``) until the chain completed, as a bucket's hook issues
    its chain before the last gradient; the slowest rank's (every rank must call it). ``chained_allreduce`` times the
    chain on idle cores; beside the backward gloo's threads wait for a core and the peer's."""
    beside = work or calibration_backward()
    beside.run(1)  # warm-up
    return _slowest_per_size(lambda size: _chained_busy_us(size, beside, repeats))


def _chained_busy_us(nbytes: int, work: Work, repeats: int) -> float:
    """Median microseconds per all-reduce of ``chained_busy``'s chain of ``nbytes`` beside ``work``."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(nbytes // 4)
    dist.all_reduce(buf)
    per = []
    for _ in range(max(repeats, 3)):
        dist.barrier()
        wait, done = _start_chain(buf, BUSY_CHAIN, None)
        work.run(1)  # at least one unit: the chain is beside the backward even where it completes within it
        while not done():
            work.run(1)
        per.append(wait() / BUSY_CHAIN)
    return statistics.median(per) * 1e6


def measure_into(folder: str, rank: int) -> None:
    """``measure_overlap`` on every rank; rank 0 saves it in the run folder (our demo job does, on its own group: dagprof
    never adds collectives to a user's job, whose slowdown ``dagprof calibrate --overlap`` measures)."""
    result = measure_overlap()
    if rank == 0:
        save_overlap(folder, result)


def save_overlap(folder: str, result: Overlap) -> str:
    path = os.path.join(folder, FILE)
    with atomic_open(path, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(result), indent=1))
    return path


def load_overlap(folder: str) -> Overlap | None:
    """What was measured for the run in ``folder``; None when nothing was. A damaged file is refused in one
    line: silently ignoring it would price the search as if compute never slowed beside collectives."""
    path = os.path.join(folder, FILE)
    if not os.path.isfile(path):
        return None
    try:
        return msgspec.json.decode(read_input(path), type=Overlap)
    except msgspec.ValidationError as e:
        raise DagprofError(f"not a dagprof overlap measurement ({e})", path) from None
    except msgspec.DecodeError:
        raise DagprofError("damaged overlap measurement: not JSON", path) from None


def overlap_from_table(table: object, source: str) -> Overlap:
    """An ``Overlap`` kept as a table inside another file (a link model's ``overlap``), refused in one line if damaged."""
    try:
        return msgspec.convert(table, Overlap)
    except msgspec.ValidationError as e:
        raise DagprofError(f"its overlap is not a dagprof overlap measurement ({e})", source) from None


def reference_op_us() -> float:
    """The reference op (a 256x256 matrix product, one thread) on an idle core: with ``matmul_us`` from the
    job it says how much slower compute measured on an idle core runs inside the job."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(5):
            a @ b
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(20):
                a @ b
            runs.append((time.perf_counter() - t0) / 20)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(runs) * 1e6
