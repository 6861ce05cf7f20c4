"""The training thread's CPU time and run-queue wait per step, and its process's CPU time, from the kernel's schedstat.

``/proc/self/task/TID/schedstat`` holds a thread's CPU time and the time it was runnable but waited for a core (ns).
Per step their sum over the CPU is how much longer the thread's CPU work took in wall time than on a core of its own:
the machine's load as this job met it. ``search.measured.profiled_stretch`` prices a codec's CPU, measured on an idle
core, by it (the held-out embedding job's strategy runs under load 4-5: the hook's decode and Adam at 1.9-2.3x their
idle price, the training thread's CPU plus waits 2.1-2.2x its CPU per step under DDP's defaults and PowerSGD alike;
``bench/bench_powersgd_parts.py``). The file stays open on the thread that opened it (one ``pread`` per step
boundary); a boundary on another thread, or a kernel without the file, records nothing. The CPU time is the thread's
CPU clock: the file's first field is brought up to date only at a tick or a switch while the thread runs (a 5-step
window of a tiny model read 0 ns in some steps), the wait only grows when the thread gets a core, so it is current.
Every step is recorded, profiled or not: the steps outside the window tell what the profiler added inside it (its CPU,
the process's, against waits for a core that a load on the machine adds: ``passes.profiler_cost``). The process's CPU
clock (every thread: Kineto's, gloo's) is read beside the thread's; a read costs two clock reads and a ``pread``. The file's
third field, how many times the thread got a core, is kept too: the run-queue wait over it is what one wake-up of a thread
waited for a core on these cores at this load (a DDP profile's, priced on each blocking collective of the job under FSDP
where none of its waits blocked: ``passes.data_parallel.wake_up``).

The process's other threads (gloo's, Kineto's, a pool's) are summed the same way (``others``: CPU, run-queue wait, runs):
gloo's threads wake once or more per ring step of every collective, and on more ranks than cores each wake-up waits for
a core (``passes.comm_cpu``'s price of those waits). Each thread's file stays open, one ``pread`` per thread and
boundary. The task list is re-read at a step's begin only after a file failed to read or a step whose process CPU
passed its watched threads' by ``UNSEEN_NS`` (a thread not yet watched ran): a listing of ``/proc/self/task`` took
40-100 us a step at load 7-10, more than the reads. A thread born within a step counts from the next one; one that
ended within a step (its file no longer reads) loses that step's part.

``by_name`` (the TF/JAX window's) also keeps them per thread name (``/proc/self/task/TID/comm``, read once per thread; the
kernel keeps ``traces.meta.THREAD_NAME_CHARS``): TF names its pools' threads (``tf_Compute``, the inter-op pool whose threads run the ops,
``collective_ops``, gRPC's), as xplane names its lines, so a reader tells the lanes' threads' CPU from the rest's
(``passes.comm_cpu.rank_cpu``). xplane's line ids are not thread ids (TF hashes them), so names are what joins the two.
A thread that bears its process's own name never set one of its own: XLA names its PjRt client's pool
``tf_XLAPjRtCpuClient``, 19 characters, which the kernel refuses, so in a JAX rank those threads (its lanes) are
``python`` beside gloo's and gRPC's unnamed threads (a 2-rank ``jax_shardmap`` run, 2026-12-06: their CPU a step followed
the client lanes' op time, Pearson +0.74 / +0.99 / +0.99, the other ``python`` threads' did not). Each such thread is kept
apart (``traces.meta.unnamed_thread_key``: ``python#TID``), so a reader can tell which of them ran a lane.
"""
from __future__ import annotations

import os
import threading
import time

from ...traces.meta import UNREAD_NAME, unnamed_thread_key

UNSEEN_NS = 1_000_000  # a step's process CPU beyond its watched threads' (less a running thread's lag, up to a tick) that re-lists


class ThreadSched:
    """Per step ``(step, CPU ns, run-queue wait ns)`` of the thread that opened it (``steps``), ``(step, CPU ns)`` of its
    process (``process``), ``(step, times the thread got a core)`` (``runs``) and ``(step, CPU ns, run-queue wait ns,
    runs)`` of the process's other threads together (``others``); with ``by_name``, the same per thread name
    (``named``: name -> [(step, CPU ns, run-queue wait ns, runs)], a step where the name's threads neither ran nor waited
    left out; a thread bearing the process's own name under ``NAME#TID``)."""

    def __init__(self, by_name: bool = False) -> None:
        self.steps: list[tuple[int, int, int]] = []
        self.process: list[tuple[int, int]] = []
        self.runs: list[tuple[int, int]] = []
        self.others: list[tuple[int, int, int, int]] = []
        self._fd: int | None = None
        self._tid = 0
        self._begin: tuple[int, int, int, int] | None = None
        self._other_fds: dict[int, int] = {}  # tid -> its open schedstat
        self._other_begin: dict[int, tuple[int, int, int]] = {}
        self.by_name = by_name
        self.named: dict[str, list[tuple[int, int, int, int]]] = {}
        self._names: dict[int, str] = {}  # tid -> its name (``by_name``)
        self._own = ""  # the process's own name (``by_name``): a thread bearing it is kept apart
        self._relist = True

    def open(self) -> None:
        """Watch the calling thread (the one that marks the steps); nothing where the kernel has no schedstat."""
        self.close()
        tid = threading.get_native_id()
        try:
            self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            return
        self._tid = tid
        if self.by_name:
            self._own = _name(os.getpid())

    def begin(self) -> None:
        self._begin = self._read()
        if self._begin is not None:
            if self._relist:
                self._list_others()
            self._other_begin = self._read_others()

    def end(self, step: int) -> None:
        now, begin, self._begin = self._read(), self._begin, None
        if now is not None and begin is not None:
            self.steps.append((step, now[0] - begin[0], now[1] - begin[1]))
            self.process.append((step, now[2] - begin[2]))
            self.runs.append((step, now[3] - begin[3]))
            ends, starts = self._read_others(), self._other_begin
            d = [sum(e[i] - starts[t][i] for t, e in ends.items() if t in starts) for i in range(3)]
            self.others.append((step, d[0], d[1], d[2]))
            self._relist = self._relist or now[2] - begin[2] - (now[0] - begin[0]) - d[0] > UNSEEN_NS
            if self.by_name:
                self._by_name(step, ends, starts)

    def _by_name(self, step: int, ends: dict[int, tuple[int, int, int]], starts: dict[int, tuple[int, int, int]]) -> None:
        sums: dict[str, list[int]] = {}
        for t, e in ends.items():
            if t in starts:
                acc = sums.setdefault(self._names.get(t, UNREAD_NAME), [0, 0, 0])
                for i in range(3):
                    acc[i] += e[i] - starts[t][i]
        for name, (cpu, wait, runs) in sums.items():
            if cpu or wait or runs:
                self.named.setdefault(name, []).append((step, cpu, wait, runs))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in self._other_fds.values():
            os.close(fd)
        self._other_fds.clear()
        self._other_begin = {}
        self._names.clear()
        self._relist = True

    def _list_others(self) -> None:
        """Open the schedstat of each thread of the process not yet open (not the watched one); close those gone. With
        ``by_name``, a thread whose schedstat opened but whose name did not read (it ended in between, most likely) keeps
        its schedstat under ``traces.meta.UNREAD_NAME``: each step's names then still sum to ``others``, and the name,
        longer than the kernel keeps, is no lane's (``passes.comm_cpu.lane_threads``), so its CPU counts off the lanes."""
        try:
            tids = {int(t) for t in os.listdir("/proc/self/task")} - {self._tid}
        except OSError:
            return
        self._relist = False
        for t in set(self._other_fds) - tids:
            os.close(self._other_fds.pop(t))
            self._names.pop(t, None)
        for t in tids - set(self._other_fds):
            try:
                self._other_fds[t] = os.open(f"/proc/self/task/{t}/schedstat", os.O_RDONLY)
            except OSError:
                continue
            if self.by_name:
                name = _name(t)
                self._names[t] = unnamed_thread_key(name, t) if name == self._own != UNREAD_NAME else name

    def _read_others(self) -> dict[int, tuple[int, int, int]]:
        """Each open other thread's (CPU ns, run-queue wait ns, runs); a thread whose file no longer reads is dropped."""
        out = {}
        for t, fd in list(self._other_fds.items()):
            try:
                f = os.pread(fd, 128, 0).split()
                out[t] = (int(f[0]), int(f[1]), int(f[2]))
            except (OSError, IndexError, ValueError):
                os.close(self._other_fds.pop(t))
                self._names.pop(t, None)
                self._relist = True
        return out

    def _read(self) -> tuple[int, int, int, int] | None:
        if self._fd is None or threading.get_native_id() != self._tid:
            return None
        fields = os.pread(self._fd, 128, 0).split()
        return time.thread_time_ns(), int(fields[1]), time.process_time_ns(), int(fields[2])


def _name(tid: int) -> str:
    """Thread ``tid``'s name as the kernel keeps it; ``traces.meta.UNREAD_NAME`` where its file does not read."""
    try:
        with open(f"/proc/self/task/{tid}/comm", "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return UNREAD_NAME
