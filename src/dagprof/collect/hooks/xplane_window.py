"""The profiling window shared by the TensorFlow and JAX collectors, and the run folder it writes.

Framework-neutral: the collectors pass in how to start and stop their profiler. The window
never lets the profiler break training: a failure to start or stop becomes a warning in the
rank file and profiling stops for this process. Files are written atomically, so a reader
never sees half a rank. Layout: ``dagprof.traces.xplane_layout``; the reader, ``dagprof.traces.xplane_run``.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import socket
import time
import warnings
from typing import Any, Callable, ContextManager, Iterator

import msgspec

from ...fsutil import atomic_open
from ...traces import cpu_sets
from ...traces.window_cpu import WindowCpu
from ...traces.xplane_layout import FORMAT, MANIFEST, RANK_FORMAT, VERSION, CollectiveSizes, rank_file, rank_logdir
from .thread_sched import ThreadSched

RETRIES = 5  # windows profiled again when a rank's profile was lost (as long as training lasts)
MAX_UNPROFILED = 1000  # unprofiled steps timed (for the profiler's cost): enough for the medians, bounded in a long training


STALL_S = 30.0  # a forked child that used no CPU for this long waits on a lock no thread of it will release


def cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of process ``pid`` in clock ticks (Linux ``/proc``); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    except (OSError, IndexError, ValueError):
        return None


def net_tx_bytes() -> int | None:
    """Bytes this host's network interfaces (of this network namespace) have sent, from Linux ``/proc/net/dev``; None
    where it cannot be read."""
    try:
        with open("/proc/net/dev") as f:
            return sum(int(line.split(":", 1)[1].split()[8]) for line in f.readlines()[2:])
    except (OSError, IndexError, ValueError):
        return None


def cpu_now() -> tuple[int, int, int] | None:
    """(now, the busy time of the cores this process may run on: ``/proc/stat``'s time of theirs neither idle nor in
    iowait, this process's CPU time), ns, for ``traces.window_cpu.WindowCpu``; None where ``/proc/stat`` does not read."""
    cores = {f"cpu{c}" for c in os.sched_getaffinity(0)}
    try:
        with open("/proc/stat") as f:  # user nice system idle iowait irq softirq steal (guest time is in user already)
            ticks = sum(sum(int(v) for i, v in enumerate(line.split()[1:9]) if i not in (3, 4))
                        for line in f if line.split(maxsplit=1)[0] in cores)
    except (OSError, IndexError, ValueError):
        return None
    return time.monotonic_ns(), ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK"), time.process_time_ns()


def kernel_hz() -> int | None:
    """The scheduler tick rate (``CONFIG_HZ``) of the kernel running this process, as its build configuration says
    (``/boot/config-<release>``, else ``/proc/config.gz``); None where neither says it. A thread woken on a core another
    thread keeps busy may wait up to a tick for it (``analysis.operand_stall``)."""
    for opener, path in ((open, f"/boot/config-{os.uname().release}"), (gzip.open, "/proc/config.gz")):
        try:
            with opener(path, "rt") as f:  # type: ignore[operator]
                for line in f:
                    if line.startswith("CONFIG_HZ="):
                        return int(line.split("=", 1)[1])
        except (OSError, EOFError, ValueError):
            continue
    return None


def run_forked(fn: Callable[[], None], timeout_s: float, in_parent: Callable[[], None] = lambda: None,
               stall_s: float = STALL_S) -> int | None:
    """Run ``fn`` in a forked child of this process and wait for it: its exit status (0 when ``fn`` returned,
    1 when it raised, negative: the signal that killed it), or None when it ran past ``timeout_s``, or used no
    CPU for ``stall_s`` seconds, and was killed.

    A profiler whose collection can crash the process (a native bug) is stopped this way: the crash
    ends the child, never the training. ``in_parent`` runs in the parent as soon as the child exists.
    The child leaves by ``os._exit``: none of the parent's exit handlers or destructors run twice.
    A child is a copy of one thread of a threaded process: a lock another thread held at the fork stays
    held in it forever (a TF child after a heap corruption sat 150 s in a futex at 0 % CPU); it is
    stopped when its CPU time stands still, not after the whole timeout, so training waits seconds.
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    in_parent()
    now = time.monotonic()
    deadline, ticks, moved = now + timeout_s, cpu_ticks(pid), now
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        now = time.monotonic()
        latest = cpu_ticks(pid)
        if latest != ticks:
            ticks, moved = latest, now
        if now > deadline or (ticks is not None and now - moved > stall_s):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)


def run_forked_retrying(fn: Callable[[], None], timeout_s: float, in_parent: Callable[[], None] = lambda: None,
                        before_retry: Callable[[int], None] | None = None, attempts: int = 1) -> list[int | None]:
    """``run_forked(fn)`` again in a fresh child while one dies (up to ``attempts`` children): the exit statuses, the
    last one the outcome. Each child starts from this process as it is, so a crash that follows from its state
    would repeat: the ``k``-th retry's child runs ``before_retry(k)`` first, to change that state in the child only.
    ``in_parent`` runs once, after the first child exists. No retry after a stall (None) or without ``before_retry``."""
    statuses = [run_forked(fn, timeout_s, in_parent=in_parent)]
    for k in range(1, attempts if before_retry is not None else 1):
        if statuses[-1] in (0, None):
            break

        def again(k: int = k) -> None:
            before_retry(k)  # type: ignore[misc]
            fn()
        statuses.append(run_forked(again, timeout_s))
    return statuses


class StepWindow:
    """Profiles steps ``steps`` of one process into ``out_dir/rank<R>/`` and describes them in ``rank<R>.json``."""

    def __init__(self, out_dir: str | os.PathLike[str], steps: range, rank: int, world_size: int, framework: str,
                 framework_version: str, start: Callable[[str], None], stop: Callable[[], str | None],
                 settle: Callable[[], None] | None = None, agree: Callable[[bool], list[int]] | None = None,
                 retries: int = RETRIES):
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.steps, self.rank, self.world_size = steps, int(rank), int(world_size)
        self.requested = steps  # what the user asked for; ``steps`` moves on when a window is profiled again
        self.framework, self.framework_version = framework, framework_version
        self._start, self._stop = start, stop
        self.settle = settle  # waits until no collective is in flight, so the profiler stops at a safe point
        # agree(lost) -> the ranks whose window was lost: every worker joins it after the stop (as the barrier)
        self.agree = agree
        self.retries = int(retries)
        self.active = False
        self.done = False  # the profiler will not start (again) for this window
        self.ended = False  # the window's end was handled (barrier, stop, agreement, files)
        self.lost = False  # this rank's profile of the current window is lost (its start or stop failed)
        self.grad_bytes = 0
        self.embedding_grad_bytes = 0  # TF: the Embedding tables', left out of grad_bytes (``tf_profile.grad_bytes``)
        self.sizes = CollectiveSizes()  # TF: what each collective op sends (``tf_profile.collective_sizes``)
        self.warnings: list[str] = []
        self.step_times_ns: dict[int, tuple[int, int]] = {}  # profiled steps
        # steps run without the profiler (before, between and after windows): measure the profiler's own cost
        self.unprofiled_ns: dict[int, int] = {}
        # every step's CPU of the thread marking them, its waits for a core and its process's CPU (every thread: TF's pools,
        # its collective executor, gRPC), as the torch collector records them: what ranks sharing cores ask of them
        # and per thread name (TF's ``tf_Compute`` pool runs the ops, its lanes): the lanes' CPU apart from the rest's
        self.sched = ThreadSched(by_name=True)
        self._watching = False
        self._t0: int | None = None
        self._t0_profiled = False
        # the interfaces' sent bytes at the window's first profiled step's start and its last's end: what the wire carried
        # per step beside the collectives' payload (headers, acknowledgements, small messages), for the bench's link rate
        self.tx_bytes: list[int | None] = [None, None]
        # ``cpu_now`` at the same two points: the CPU other processes took on these cores (``traces.window_cpu``)
        self.cpu_marks: list[tuple[int, int, int] | None] = [None, None]
        self._written = -1  # unprofiled steps in the rank file as last written

    @property
    def logdir(self) -> str:
        return os.path.join(self.out_dir, rank_logdir(self.rank))

    def open(self) -> None:
        """Start the profiler (once, before the window's first step)."""
        if self.active or self.done:
            return
        try:
            os.makedirs(self.logdir, exist_ok=True)
            self._start(self.logdir)
            self.active = True
        except Exception as err:  # noqa: BLE001  (the profiler must never stop training)
            self._fail(f"the profiler did not start ({type(err).__name__}: {err})")

    def close(self, retry: bool = False) -> None:
        """Stop the profiler and write this rank's files (idempotent; also when training ended early).

        ``retry`` (at the window's end, training going on): when the profile of the window was lost on
        some rank, every rank drops its own and profiles the same number of steps again, one step later.
        The ranks learn it from ``agree``, joined by every worker right after the stop; the next step's
        collectives wait for the same workers, so it adds no wait that training would not have.
        """
        if self.ended:  # the same call on every rank: each joins the barrier and the agreement once per window
            return
        self.ended = True
        settle = self.settle
        if settle is not None:  # every worker joins, its profiler running or not: a barrier one skipped would hang the rest
            try:
                settle()
            except Exception as err:  # noqa: BLE001
                self.warnings.append(f"the workers could not be waited for before the profiler stopped ({type(err).__name__}: {err})")
        self.done = True
        if self.active:
            self.active = False
            try:
                note = self._stop()
                if isinstance(note, str):  # the stop went through, with something to say (e.g. a collection retried)
                    self.warnings.append(note)
            except Exception as err:  # noqa: BLE001
                self.lost = True
                self.step_times_ns.clear()  # none of the window's steps has a trace here
                self.warnings.append(f"the profiler did not stop cleanly ({type(err).__name__}: {err})")
        if retry and self.agree is not None and self.retries > 0 and self._retry():
            return
        try:
            self._write()
        except OSError as err:
            warnings.warn(f"dagprof: could not write the run folder {self.out_dir} ({err})", stacklevel=2)

    def _retry(self) -> bool:
        """Agree with the other workers whether the window was lost on any of them; if so, start over on the
        next steps (this rank's own profile of the window dropped too: every rank must keep the same steps)."""
        try:
            lost = self.agree(self.lost)  # type: ignore[misc]
        except Exception as err:  # noqa: BLE001
            self.warnings.append(f"the workers could not agree on the profiled window ({type(err).__name__}: {err})")
            return False
        if not lost:
            return False
        n = len(self.steps)
        first = self.steps.stop + 1  # a step between: Keras opens its step range before the callback could start the profiler
        note = (f"steps {self.steps.start}-{self.steps.stop - 1} profiled again as {first}-{first + n - 1}: the profile was lost "
                f"on rank(s) {', '.join(map(str, lost))}")
        if self.lost and self.warnings:
            note += f" (here: {self.warnings.pop()})"
        self.warnings.append(note)
        shutil.rmtree(self.logdir, ignore_errors=True)
        self.steps, self.retries = range(first, first + n), self.retries - 1
        self.done = self.lost = self.ended = False
        self.step_times_ns.clear()
        self.tx_bytes = [None, None]
        self.cpu_marks = [None, None]
        return True

    def step_begin(self, step: int) -> None:
        if step >= self.steps.stop:
            self.close(retry=True)  # stopped here, not at the end of the last step: the collective threads' last ranges have ended by now
        elif step == self.steps.start:
            self.open()
        self.time_begin()

    def time_begin(self) -> None:
        """A step starts now (after the profiler's start or stop, which no step pays for)."""
        if not self._watching:  # the thread that marks the steps (the first step's)
            self.sched.open()
            self._watching = True
        self.sched.begin()
        self._t0, self._t0_profiled = time.time_ns(), self.active
        if self.active and not self.step_times_ns:
            self.tx_bytes[0], self.cpu_marks[0] = net_tx_bytes(), cpu_now()

    def step_end(self, step: int) -> None:
        """Step ``step`` ended: a profiled one's span, an unprofiled one's duration (up to ``MAX_UNPROFILED`` of them)."""
        if self._t0 is not None:
            if self._t0_profiled or len(self.sched.steps) < MAX_UNPROFILED:
                self.sched.end(step)
            if self._t0_profiled:
                if self.active:  # a profiler that failed in the step leaves no trace of it
                    self.step_times_ns[step] = (self._t0, time.time_ns())
                    self.tx_bytes[1], self.cpu_marks[1] = net_tx_bytes(), cpu_now()
            elif len(self.unprofiled_ns) < MAX_UNPROFILED:
                self.unprofiled_ns[step] = time.time_ns() - self._t0
        self._t0 = None

    def finish(self) -> None:
        """Training ended: close the window, and write the rank file again if unprofiled steps ran after it was
        written. Never raises: the rank file is a by-product of training."""
        try:
            self.close()
            if self._written != len(self.unprofiled_ns):
                self._write()
        except Exception as err:  # noqa: BLE001
            warnings.warn(f"dagprof: could not write the run folder {self.out_dir} ({type(err).__name__}: {err})", stacklevel=2)

    @contextlib.contextmanager
    def step(self, step: int, mark: Callable[[int], ContextManager[Any]]) -> Iterator[None]:
        """Run step ``step``; inside the window ``mark(step)`` (the framework's step range) wraps it."""
        self.step_begin(step)
        if self.active:
            with mark(step):
                yield
        else:
            yield
        self.step_end(step)

    def _fail(self, why: str) -> None:
        self.warnings.append(why)
        self.done = self.lost = True
        warnings.warn(f"dagprof: {why}; training continues without profiling", stacklevel=3)
        try:
            self._write()
        except OSError:
            pass

    def _write(self) -> None:
        profiled = sorted(self.step_times_ns)
        said = list(self.warnings)  # the file is written again at the end of training: these are said once
        if profiled and len(profiled) < len(self.steps):
            said.append(f"steps {self.steps.start}-{self.steps.stop - 1} requested, "
                        f"steps {profiled[0]}-{profiled[-1]} profiled (training ended first)")
        elif not profiled and not self.lost and self.steps != self.requested:
            said.append(f"training ended before step {self.steps.start}, where the window was to be profiled again")
        info = {
            "format": RANK_FORMAT, "version": VERSION, "rank": self.rank, "world_size": self.world_size,
            "framework": self.framework, "framework_version": self.framework_version,
            "host": socket.gethostname(), "pid": os.getpid(), "logdir": rank_logdir(self.rank),
            "steps_requested": [self.requested.start, self.requested.stop], "steps_profiled": profiled,
            "step_times_us": {str(s): (b - a) / 1e3 for s, (a, b) in sorted(self.step_times_ns.items())},
            "unprofiled_step_times_us": {str(s): d / 1e3 for s, d in sorted(self.unprofiled_ns.items())},
            "grad_bytes": int(self.grad_bytes), "warnings": said,
            "cpus": cpu_sets.usable_cpus(),
            "cpu_set": cpu_sets.this_process(),
        }
        info |= {"thread_sched_ns": self.sched.steps, "process_cpu_ns": self.sched.process, "thread_runs": self.sched.runs,
                 "other_threads_ns": self.sched.others, "named_threads_ns": self.sched.named}
        info.update(self.sizes.to_rank_file())
        if self.embedding_grad_bytes:
            info["embedding_grad_bytes"] = int(self.embedding_grad_bytes)
        hz = kernel_hz()
        if hz:
            info["kernel_hz"] = hz
        if profiled and None not in self.tx_bytes:
            info["window_tx_bytes"] = self.tx_bytes[1] - self.tx_bytes[0]  # type: ignore[operator]
        window = _window_cpu(*self.cpu_marks) if profiled else None
        if window is not None:
            info["window_cpu"] = msgspec.structs.asdict(window)
        manifest = {
            "format": FORMAT, "version": VERSION, "framework": self.framework, "world_size": self.world_size,
            "steps_requested": [self.requested.start, self.requested.stop], "created_ns": time.time_ns(),
        }
        with atomic_open(os.path.join(self.out_dir, rank_file(self.rank))) as f:
            json.dump(info, f, indent=1)
        with atomic_open(os.path.join(self.out_dir, MANIFEST)) as f:  # every rank writes the same job-wide facts
            json.dump(manifest, f, indent=1)
        self._written = len(self.unprofiled_ns)


def _window_cpu(begin: tuple[int, int, int] | None, end: tuple[int, int, int] | None) -> WindowCpu | None:
    """The window between two ``cpu_now`` reads; None where either did not read or the clock stood still."""
    if begin is None or end is None or end[0] <= begin[0]:
        return None
    return WindowCpu(wall_ns=end[0] - begin[0], cores_busy_ns=max(0, end[1] - begin[1]), own_cpu_ns=max(0, end[2] - begin[2]))


class LoopProfile:
    """What ``tf_profile`` and ``jax_profile`` share: ``with`` opens the window, ``prof.step(i)`` wraps step ``i``."""

    window: StepWindow | None = None

    def _open(self) -> StepWindow:
        raise NotImplementedError

    def _mark(self, step: int) -> ContextManager[Any]:
        raise NotImplementedError

    def __enter__(self) -> "LoopProfile":
        self.window = self._open()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.window is not None:
            if exc[0] is not None:  # training failed here: its peers may be gone, wait for none of them
                self.window.settle = None
            self.window.finish()

    def step(self, step: int) -> ContextManager[None]:
        if self.window is None:
            raise RuntimeError(f"use {type(self).__name__} as a context manager: with {type(self).__name__}(...) as prof")
        return self.window.step(step, self._mark)
