"""Profiling a Horovod (PyTorch) job: dagprof's hooks on every rank plus Horovod's own timeline.

What each part contributes to the run folder:
- every rank: the usual ``rank<R>.json`` (per-layer forward/backward, optimizer, step times) and
  ``rank<R>.horovod.json``: each gradient's all-reduce request (the moment Horovod's
  ``DistributedOptimizer`` hook enqueued it, with its Horovod tensor name and bytes), the
  ``synchronize()`` wait inside ``optimizer.step()`` (as the rank's COMM_WAIT) and the
  settings (``HOROVOD_FUSION_THRESHOLD``, ``HOROVOD_CYCLE_TIME``...);
- rank 0 (Horovod's coordinator, the only process that writes it): ``horovod_timeline.json``,
  started and stopped with the profiled window (``hvd.start_timeline``, cycles marked), so it
  holds the window only: negotiation, the fused responses, memcpy in/out and the transfers.

Horovod must have been initialised with its timeline enabled: ``HOROVOD_TIMELINE=DYNAMIC`` in the
job's environment (or ``horovodrun --timeline-filename X``). Without it the hooks still record
compute and the requests, and a warning says the timeline is missing.

Horovod's timeline writer thread (rank 0) busy-waits (``sched_yield`` in a loop) from ``hvd.init``
on whenever ``HOROVOD_TIMELINE`` is set, recording or not: on a small CPU-only host it takes a core
from training (+50 % step time measured on 2 shared cores). The collector finds that thread (the
one of this process that is always runnable and never blocks) and lowers it to nice 19 outside
the window. While the timeline records it must run at the job's own priority again (Horovod's
background thread takes a lock the writer holds; a starved writer stalls every cycle), which needs
CAP_SYS_NICE (root); without it the writer stays low. Never above the job's: in a job started
with ``nice -n 10`` a writer raised to 0 took a core from rank 0's training (its optimizer steps
ran 10x longer, the profiled steps 3-4x the unprofiled ones). Either way the window itself costs time:
measured here, the profiled steps ran 0-45 % slower than unprofiled ones (machine shared and noisy).

Why a subclass of the DDP ``Collector``: Horovod's optimizer is a dynamic subclass of the user's,
and ``torch.optim`` wraps ``step`` on both classes, so the global step hooks fire twice per
``optimizer.step()`` (outer: before ``synchronize``; inner: the real update). Only the innermost
pair is the update.
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ...fsutil import atomic_open
from ...traces import cpu_sets
from ...traces.horovod import RANK_FORMAT, TIMELINE, VERSION, horovod_rank_file
from ...traces.horovod_log import LOG_FILE
from ...traces.run_schema import Rec
from ...traces.steps import DEFAULT_STEPS
from .collector import Collector
from .horovod_log import QUIET_ENV, LogTee, wanted
from .profile import profile as _profile
from .xplane_window import net_tx_bytes

DEFAULT_FUSION_BYTES = 128 * 1024 * 1024  # Horovod 0.28 defaults (horovod/common/operations.cc)
DEFAULT_CYCLE_MS = 1.0
DEFAULT_CACHE_CAPACITY = 1024


def settings_from_env(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The knobs the what-ifs change, as this process's Horovod read them at init."""
    env = os.environ if env is None else env
    raw = {k: env[k] for k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_AUTOTUNE",
                               "HOROVOD_TIMELINE") if k in env}
    return {
        "fusion_threshold_bytes": int(raw["HOROVOD_FUSION_THRESHOLD"]) if "HOROVOD_FUSION_THRESHOLD" in raw else DEFAULT_FUSION_BYTES,
        "cycle_time_ms": float(raw["HOROVOD_CYCLE_TIME"]) if "HOROVOD_CYCLE_TIME" in raw else DEFAULT_CYCLE_MS,
        "cache_capacity": int(raw["HOROVOD_CACHE_CAPACITY"]) if "HOROVOD_CACHE_CAPACITY" in raw else DEFAULT_CACHE_CAPACITY,
        "autotune": raw.get("HOROVOD_AUTOTUNE", "0") not in ("", "0"),
        "env": raw,
    }


class HorovodCollector(Collector):
    """``Collector`` plus Horovod's requests, ``synchronize`` waits and the rank-0 timeline."""

    def __init__(self, *args: Any, mark_cycles: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.mark_cycles = mark_cycles
        self._update_begin_ns = 0
        self._update_recorded = False
        self._update_depth = 0
        self.enqueues: list[tuple[int, str, int, int, int]] = []  # (step, tensor, t0, t1, bytes)
        self._optimizers: list[Any] = []
        self._timeline: str | None = None  # the file rank 0 records Horovod's timeline into
        self._timeline_open = False
        self._calmed: dict[int, int] = {}  # busy-waiting thread -> its nice value before it was lowered
        # the interfaces' sent bytes at the window's start and end: what the wire carried per step beside the gradients'
        # payload (frame headers, acknowledgements, each cycle's negotiation), for a link rate read against a known wire
        self._tx_bytes: list[int | None] = [None, None]
        self._log: LogTee | None = None  # each rank's own response ends (HOROVOD_LOG_LEVEL=trace: ``horovod_log``)
        if wanted():
            try:
                self._log = LogTee(quiet=os.environ.get(QUIET_ENV) == "1")
            except OSError as err:
                self.warnings.append(f"Horovod's trace log not kept ({err.strerror}): rank 0's timeline alone times the responses")

    # ------------------------------------------------------------ optimizer.step (nested hooks)
    def update_begin(self, opt: Any = None) -> None:
        self._update_depth += 1
        self._update_begin_ns = time.time_ns()
        self._update_recorded = False

    def update_end(self, opt: Any = None) -> bool:
        """The first end closes the innermost step: the update proper, after ``synchronize``."""
        if not self._update_recorded and self.recording:
            try:
                self.records.append((Rec.UPDATE_BEGIN, 0, 0, self._update_begin_ns, 0))
                self.records.append((Rec.UPDATE_END, 0, 0, time.time_ns(), 0))
            except Exception as err:  # noqa: BLE001
                self._fail(err, "optimizer hook")
        self._update_recorded = True
        self._update_depth = max(self._update_depth - 1, 0)
        return self._update_depth == 0

    @property
    def outermost_step_done(self) -> bool:
        """True right after the outermost ``optimizer.step()`` returned (one training step)."""
        return self._update_depth == 0

    # ------------------------------------------------------------ Horovod's optimizer
    def attach_optimizer(self, opt: Any) -> None:
        """Record every all-reduce request and the ``synchronize`` wait of a ``hvd.DistributedOptimizer``."""
        try:
            if any(o is opt for o in self._optimizers):
                return
            if not hasattr(opt, "_allreduce_grad_async") or not hasattr(opt, "_parameter_names"):
                self.warnings.append(f"{type(opt).__name__} is not a horovod.torch.DistributedOptimizer: no Horovod requests recorded")
                return
            self._optimizers.append(opt)
            sync, names = opt.synchronize, opt._parameter_names
            collector = self

            def synchronize(*args: Any, **kwargs: Any) -> Any:
                collector._mark(Rec.WAIT_BEGIN)
                try:
                    return sync(*args, **kwargs)
                finally:
                    collector._mark(Rec.WAIT_END)

            opt._allreduce_grad_async = self._timed_requests(opt._allreduce_grad_async, "Horovod request hook",
                                                             lambda p: _requests_sent(opt, names.get(p), p.grad))
            opt.synchronize = synchronize
            if getattr(opt, "_groups", None) is not None and hasattr(opt, "_grouped_allreduce_grad_async"):
                # DistributedOptimizer(groups=...) sends each group, once all its gradients are ready, as one grouped
                # all-reduce: Horovod names its tensors grouped_allreduce.<first parameter>_<k>of<n>
                opt._grouped_allreduce_grad_async = self._timed_requests(
                    opt._grouped_allreduce_grad_async, "Horovod grouped request hook",
                    lambda ps: [(f"grouped_allreduce.{names.get(ps[0])}_{k + 1}of{len(ps)}", int(p.grad.numel() * p.grad.element_size()))
                                for k, p in enumerate(ps)])
        except Exception as err:  # noqa: BLE001
            self._fail(err, "attaching to the Horovod optimizer")

    def _timed_requests(self, request: Any, what: str, sent: Callable[[Any], list[tuple[str, int]]]) -> Any:
        """``request`` (one of the optimizer's request methods) timed while recording: each Horovod tensor ``sent(arg)``
        names, with this rank's bytes, enqueued between the call's start and return; a fault in the recording says ``what``."""
        collector = self

        def timed(arg: Any) -> Any:
            if not collector.recording:
                return request(arg)
            t0 = time.time_ns()
            out = request(arg)
            try:
                t1 = time.time_ns()
                collector.enqueues += [(collector.step, tensor, t0, t1, nbytes) for tensor, nbytes in sent(arg)]
            except Exception as err:  # noqa: BLE001
                collector._fail(err, what)
            return out

        return timed

    # ------------------------------------------------------------ window, timeline, files
    def _resolve_info(self) -> None:
        super()._resolve_info()
        try:
            import horovod.torch as hvd

            if hvd.is_initialized():
                self._info.update(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(),
                                  backend="horovod/gloo" if hvd.gloo_enabled() else "horovod/mpi")
        except Exception as err:  # noqa: BLE001  (an uninitialised Horovod: keep the environment's view)
            self.warnings.append(f"Horovod rank unknown ({type(err).__name__}: {err})")

    def start(self) -> None:
        if os.environ.get("HOROVOD_TIMELINE") and self.step < 0:
            try:
                self._calmed = calm_spinning_threads()
            except Exception as err:  # noqa: BLE001  (best effort: never break training)
                self.warnings.append(f"could not lower the timeline writer's priority ({type(err).__name__}: {err})")
        super().start()

    def _begin_window(self) -> None:
        super()._begin_window()
        self._tx_bytes = [net_tx_bytes(), None]
        if self._log is not None:
            self._log.path = os.path.join(self.out_dir, LOG_FILE.format(rank=self._info["rank"]))
            self._log.keep(True)
        if self._info.get("rank") != 0:
            return  # only the coordinator writes a timeline
        import horovod.torch as hvd

        path = os.path.join(self.out_dir, TIMELINE)
        self._renice(restore=True)  # while it records, a starved writer would stall Horovod on the lock they share
        try:
            if os.path.exists(path):
                os.unlink(path)
            hvd.start_timeline(path, mark_cycles=self.mark_cycles)
            self._timeline, self._timeline_open = path, True
        except ValueError as err:
            msg = f"no Horovod timeline ({err}): start the job with HOROVOD_TIMELINE=DYNAMIC to see fusion and transfers"
            self.warnings.append(msg)
            warnings.warn(f"dagprof: {msg}", RuntimeWarning, stacklevel=2)

    def _end_window(self) -> None:
        self._tx_bytes[1] = net_tx_bytes()
        if self._log is not None:
            self._log.keep(False)
        self._stop_timeline()
        super()._end_window()

    def close(self, error: BaseException | None = None) -> None:
        self._stop_timeline()
        super().close(error)
        if self._log is not None:
            self._log.close()

    def _stop_timeline(self) -> None:
        if not self._timeline_open:
            return
        self._timeline_open = False
        try:
            import horovod.torch as hvd

            if hvd.is_initialized():  # else Horovod shut down (the job failed or ended) and closed its timeline itself
                hvd.stop_timeline()  # returns once the writer closed the file
        except Exception as err:  # noqa: BLE001
            self.warnings.append(f"stopping the Horovod timeline failed: {type(err).__name__}: {err}")
        self._renice(restore=False)

    def _renice(self, restore: bool) -> None:
        """The writer back to the nice value it had (the job's own: a writer above a niced job would take its cores), or low."""
        for tid, before in self._calmed.items():
            try:
                os.setpriority(os.PRIO_PROCESS, tid, before if restore else max(before, _CALM_NICE))
            except OSError:  # raising priority back needs CAP_SYS_NICE: the writer stays low
                pass

    def _write_rank(self, final: bool) -> None:
        super()._write_rank(final)
        try:
            import horovod

            version = horovod.__version__
        except Exception:  # noqa: BLE001
            version = None
        doc = {
            "format": RANK_FORMAT, "version": VERSION, "rank": self._info["rank"], "world_size": self._info["world_size"],
            "host": self._info.get("host"), "horovod": version, "settings": settings_from_env(),
            "timeline": os.path.basename(self._timeline) if self._timeline else None, "warnings": self.warnings,
            "log": os.path.basename(self._log.path) if self._log is not None and self._log.path else None,
            "utc_offset_s": time.localtime().tm_gmtoff, "calmed_threads": len(self._calmed), "cpus": cpu_sets.usable_cpus(), "cpu_set": cpu_sets.this_process(),
            "window_tx_bytes": _window_bytes(*self._tx_bytes),
            "enqueues": [list(e) for e in self.enqueues],
        }
        with atomic_open(os.path.join(self.out_dir, horovod_rank_file(self._info["rank"]))) as f:
            json.dump(doc, f, separators=(",", ":"))


_CALM_NICE = 19


def _window_bytes(start: int | None, end: int | None) -> int | None:
    """Bytes sent between the window's two counts; None where either could not be read (or a counter wrapped)."""
    return end - start if start is not None and end is not None and end >= start else None


def _requests_sent(opt: Any, name: str, grad: Any) -> list[tuple[str, int]]:
    """The Horovod tensors (timeline names) and this rank's bytes one gradient's request sends. A sparse gradient
    (``nn.Embedding(sparse=True)``) is not all-reduced unless ``sparse_as_dense``: Horovod all-gathers its indices
    and its values (``horovod.torch.mpi_ops.sparse_allreduce_async``), only the rows this rank touched."""
    if grad.is_sparse and not getattr(opt, "sparse_as_dense", False):
        idx, val = grad._indices(), grad._values()
        return [(f"allgather.{name}.indices", int(idx.numel() * idx.element_size())),
                (f"allgather.{name}.values", int(val.numel() * val.element_size()))]
    return [(f"allreduce.{name}", int(grad.numel() * grad.element_size()))]


def calm_spinning_threads(samples: int = 25, interval_s: float = 0.002, nice: int = _CALM_NICE) -> dict[int, int]:
    """Busy-waiting threads of this process get ``nice``; returns their ids with the nice value each had before.

    Busy-waiting: runnable in (nearly) every sample and never blocked in between (no voluntary
    context switch). Threads that sleep between bursts (Horovod's background loop, gloo) block
    every cycle, so a loaded machine that keeps them runnable does not make them look alike.
    Linux only (``/proc/self/task``; elsewhere nothing happens); the calling thread is left out.
    """
    base = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(base):
        return {}
    me = threading.get_native_id()

    def voluntary() -> dict[int, int]:
        out = {}
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/status") as f:
                    out[int(tid)] = next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt_switches"))
            except (OSError, StopIteration, ValueError, IndexError):
                continue
        return out

    before = voluntary()
    runnable: dict[int, int] = {}
    for _ in range(samples):
        for tid in before:
            try:
                with open(f"{base}/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if tid != me and state == "R":
                runnable[tid] = runnable.get(tid, 0) + 1
        time.sleep(interval_s)
    after = voluntary()
    spinners = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid, n in runnable.items()
                if n >= 0.9 * samples and tid in after and after[tid] - before[tid] <= 1}
    for tid, was in spinners.items():
        os.setpriority(os.PRIO_PROCESS, tid, max(was, nice))
    return spinners


class profile(_profile):  # noqa: N801  (used like dagprof.profile)
    """``dagprof.profile`` for Horovod jobs: give it the ``hvd.DistributedOptimizer`` too.

    ::

        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        with dagprof.collect.horovod.profile("runs/hvd", steps=range(5, 10), model=model, optimizer=opt) as prof:
            for batch in loader:
                ...; loss.backward(); opt.step(); prof.step()

    Run the job with ``HOROVOD_TIMELINE=DYNAMIC`` so rank 0 can record Horovod's timeline.
    Kineto is off by default: Horovod's transfers run in its own threads, which Kineto does not see.
    """

    collector_class = HorovodCollector

    def __init__(self, out_dir: str | os.PathLike[str], steps: str | range | tuple[int, int] | int = DEFAULT_STEPS, model: Any = None, optimizer: Any = None,
                 kineto: bool = False, record_shapes: bool = False, ranges: bool = False, mark_cycles: bool = True):
        super().__init__(out_dir, steps, model=model, kineto=kineto, record_shapes=record_shapes, ranges=ranges)
        self._optimizer = optimizer
        self._mark_cycles = mark_cycles

    def __enter__(self) -> "profile":
        super().__enter__()
        c = self._collector
        c.mark_cycles = self._mark_cycles
        if self._optimizer is not None:
            c.attach_optimizer(self._optimizer)
        else:  # the first Horovod optimizer that steps (its first step's requests are missed)
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._handles.append(register_optimizer_step_pre_hook(
                lambda opt, args, kwargs: c.attach_optimizer(opt) if hasattr(opt, "_allreduce_grad_async") else None))
        return self
