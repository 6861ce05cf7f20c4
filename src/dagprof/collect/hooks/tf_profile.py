"""Profile TensorFlow training into a dagprof run folder: a context manager for custom loops, a Keras callback.

Custom loop (``tf.distribute.MultiWorkerMirroredStrategy`` or none)::

    with dagprof.collect.tf_profile.tf_profile("run", steps=(5, 10)) as prof:
        for step in range(20):
            with prof.step(step):
                train_step(x, y)          # a tf.function, e.g. calling strategy.run

Keras ``fit`` (with MultiWorkerMirroredStrategy use tf-keras: ``TF_USE_LEGACY_KERAS=1``)::

    model.fit(ds, callbacks=[dagprof.collect.tf_profile.keras_callback("run", steps=(5, 10))])

Each worker writes its own log folder ``run/rank<R>/`` (two workers on one host sharing a
log folder overwrite each other's ``<host>.xplane.pb``) and ``run/rank<R>.json``; the rank and
world size come from ``TF_CONFIG`` unless given. Steps are marked with
``tf.profiler.experimental.Trace("train", step_num=...)`` (Keras ``fit`` marks its own).
TensorFlow's profiler can crash while collecting (``stop_in_child``): it collects in a forked child,
and again in fresh children with its threads reordered. Where all of them die, that rank's profile of
the window is lost, and every worker profiles the same number of steps again from the step after next
(up to ``xplane_window.RETRIES`` times, while training lasts), so all keep the same steps.
TensorFlow is imported only when profiling starts.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, ContextManager

from ...traces.steps import DEFAULT_STEPS, parse_steps
from ...traces.xplane_layout import LOOKUP_ALTERNATIVES, CollectiveSizes
from .xplane_window import LoopProfile, StepWindow, run_forked_retrying


def tf_config_rank() -> tuple[int, int] | None:
    """(rank, world size) from ``TF_CONFIG``: the chief is rank 0 and workers follow; None without it."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cluster, task = cfg.get("cluster", {}), cfg.get("task", {})
        chiefs = len(cluster.get("chief", []))
        world = chiefs + len(cluster.get("worker", []))
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    if kind == "chief":
        return index, max(world, 1)
    if kind == "worker":
        return chiefs + index, max(world, 1)
    return None  # a parameter server or evaluator: not a training rank


def _options(host_tracer_level: int, python_tracer_level: int) -> Any:
    import tensorflow as tf  # noqa: PLC0415

    return tf.profiler.experimental.ProfilerOptions(host_tracer_level=host_tracer_level,
                                                    python_tracer_level=python_tracer_level, device_tracer_level=1)


SETTLE_S = 0.2  # after the barrier: the peers' last pulls of this worker's tensors are served by then


def settle(strategy: Any) -> None:
    """Return once no collective is in flight: a barrier over the workers (every one has finished the
    window's last step), then a moment for the peers' pulls of this worker's last tensors.

    Stopping the profiler while a peer still pulled this worker's gradients (gRPC threads recording
    into the tracer being torn down) killed workers inside ``tf.profiler.experimental.stop()``.
    """
    if strategy is None or getattr(strategy, "num_replicas_in_sync", 1) < 2:
        return
    import tensorflow as tf  # noqa: PLC0415

    def one() -> Any:
        return tf.constant(1.0)

    def barrier() -> Any:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(one), axis=None)

    tf.function(barrier, autograph=False)()
    time.sleep(SETTLE_S)


def agree(strategy: Any, rank: int, world_size: int, lost: bool) -> list[int]:
    """The ranks whose profile of the window was lost (``lost`` is this rank's say): a sum over the
    workers of one flag per rank, in a tf.function as the barrier (every worker joins it)."""
    if strategy is None or getattr(strategy, "num_replicas_in_sync", 1) < 2:
        return [rank] if lost else []
    import tensorflow as tf  # noqa: PLC0415

    flags = [1.0 if (r == rank and lost) else 0.0 for r in range(world_size)]

    def mine() -> Any:
        return tf.constant(flags)

    def total() -> Any:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(mine), axis=None)

    return [r for r, v in enumerate(tf.function(total, autograph=False)().numpy().tolist()) if v > 0]


def _window(out_dir: str | os.PathLike[str], steps, rank: int | None, world_size: int | None,
            host_tracer_level: int, python_tracer_level: int, strategy: Callable[[], Any] = lambda: None,
            size_live: bool = False) -> StepWindow:
    """``size_live``: before the profiler starts, size the collectives of every ``tf.function`` traced so far
    (``live_collective_sizes``: a custom loop's steps, which the collector is not handed)."""
    import tensorflow as tf  # noqa: PLC0415  (fail early and clearly if TensorFlow is missing)

    found = tf_config_rank()
    rank = rank if rank is not None else (found[0] if found else 0)
    world_size = world_size if world_size is not None else (found[1] if found else 1)

    def start(logdir: str) -> None:
        if size_live and not window.sizes.nbytes:
            try:  # TF's graph internals: never stop the user's training (the reader falls back to the tracer's sizes)
                window.sizes = live_collective_sizes()
            except Exception as err:  # noqa: BLE001
                window.warnings.append(f"collectives not sized from the traced functions ({type(err).__name__}: {err})")
        tf.profiler.experimental.start(logdir, options=_options(host_tracer_level, python_tracer_level))

    window = StepWindow(out_dir, parse_steps(steps), rank, world_size, "tensorflow", tf.__version__,
                        start, stop_in_child, settle=lambda: settle(strategy()), agree=lambda lost: agree(strategy(), rank, world_size, lost))
    return window


TRACE_LEVEL_SYMBOL = "_ZN3tsl8profiler8internal13g_trace_levelE"  # tsl::profiler::internal::g_trace_level
RECORD_SYMBOL = "_ZN3tsl8profiler15TraceMeRecorder6RecordEONS1_5EventE"  # tsl::profiler::TraceMeRecorder::Record(Event&&)
TRACING_DISABLED = -1  # TraceMeRecorder::kTracingDisabled
COLLECT_TIMEOUT_S = 600.0
COLLECT_ATTEMPTS = 5  # children collecting one window: the first as the process is, the others with its tracer reordered
REORDER_THREADS = 256  # threads the k-th retry registers with the host tracer, times k
_UNMATCHED_ID = 0x7FFF0000 << 32  # activity ids of those threads' starts: TensorFlow numbers its threads from 1 up


def _framework() -> Any:
    """``libtensorflow_framework.so.2``, already loaded by ``import tensorflow``, as a ctypes library; None if not found."""
    import ctypes  # noqa: PLC0415

    import tensorflow as tf  # noqa: PLC0415

    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(tf.__file__), "libtensorflow_framework.so.2"), mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        return None


def _trace_level() -> Any:
    """TensorFlow's host-tracer switch (``std::atomic<int>``, lock-free: a plain int) as a ctypes int; None if not found."""
    import ctypes  # noqa: PLC0415

    lib = _framework()
    try:
        return None if lib is None else ctypes.c_int.in_dll(lib, TRACE_LEVEL_SYMBOL)
    except ValueError:
        return None


def _reorderer() -> Callable[[int], None] | None:
    """A function that changes the order in which TensorFlow's host tracer consumes its threads (for a collecting
    child, see ``stop_in_child``); None where ``TraceMeRecorder::Record`` is not found.

    ``reorder(k)`` starts ``REORDER_THREADS * k`` threads, one after the other; each records one start event of an
    activity that never ends. Recording registers the thread in the tracer's hash map of threads: the map grows
    and rehashes, and its order changes. A start without its end is dropped when collecting: the threads leave
    nothing in the trace (an event: ``{std::string name; int64 start_time, end_time}``, a start has end_time < 0).
    """
    import ctypes  # noqa: PLC0415
    import threading  # noqa: PLC0415

    lib = _framework()
    record = getattr(lib, RECORD_SYMBOL, None) if lib is not None else None
    if record is None:
        return None
    record.argtypes, record.restype = [ctypes.c_void_p], None

    class Event(ctypes.Structure):  # libstdc++'s std::string (pointer, length, 16-byte local buffer), then the times
        _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("local", ctypes.c_char * 16),
                    ("start_time", ctypes.c_int64), ("end_time", ctypes.c_int64)]

    def one(activity: int) -> None:
        event = Event()
        event.data = ctypes.addressof(event) + Event.local.offset  # an empty name, in its own buffer
        event.start_time, event.end_time = 1, -activity
        record(ctypes.addressof(event))

    def reorder(k: int) -> None:
        for i in range(REORDER_THREADS * k):
            t = threading.Thread(target=one, args=(_UNMATCHED_ID | (k << 24) | i,))
            t.start()
            t.join()

    return reorder


def stop_in_child(timeout_s: float = COLLECT_TIMEOUT_S, attempts: int = COLLECT_ATTEMPTS) -> str | None:
    """Stop the profiler and write its xplane from a forked child, so a crash while collecting cannot end the training.

    TensorFlow's host tracer (``tsl::profiler::TraceMeRecorder::Consume``, TF 2.21) crashes while collecting
    an activity that starts on one thread and ends on another when the ending thread is consumed first: it
    keeps a pointer to the end event in that thread's deque, then grows its vector of per-thread deques, which
    copies them (their move is not noexcept), and later merges the start into the freed copy (``double free``,
    ``munmap_chunk(): invalid pointer``, a segfault). Under ``MultiWorkerMirroredStrategy`` every collective
    of every step makes one on each worker but the group leader: the worker resolves the collective's
    instance with the leader by RPC (its key holds the step id, so it is never cached), and the activity
    ``CollectiveExecutor::CompleteParams`` starts on the thread running the op and ends on the RPC's thread.
    Whether it crashes depends on the tracer's order of threads, which stays the same in a process: a
    worker whose collection crashed once crashes at every window (rank 1 lost 17 windows in 20 runs, up to 6
    in one run). The child (a copy of this process, its one thread) collects and exports; the parent switches
    its host tracer off by TensorFlow's own flag, so its session ends without consuming the events (they are
    dropped when a profiler next starts), and the events stay intact here. So when a child dies, a fresh one
    collects the same events again, after reordering the tracer's threads (``_reorderer``), up to ``attempts``
    children. Where the flag is not found, the stop runs here as before.
    Returns a note when a child died and a later one collected.
    """
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.python.profiler import profiler_v2  # noqa: PLC0415

    level = _trace_level()
    if level is None or not hasattr(os, "fork"):
        tf.profiler.experimental.stop()
        return None
    tracing, reorder = level.value, _reorderer()

    def before_retry(k: int) -> None:  # in the k-th fresh child: tracing on again (the parent switched it off), threads reordered
        level.value = tracing
        reorder(k)  # type: ignore[misc]

    statuses = run_forked_retrying(tf.profiler.experimental.stop, timeout_s, in_parent=lambda: setattr(level, "value", TRACING_DISABLED),
                                   before_retry=before_retry if reorder is not None else None, attempts=attempts)
    with profiler_v2._profiler_lock:  # end the parent's session: its host tracer finds tracing off and consumes nothing
        profiler_v2._profiler = None
    status = statuses[-1]
    died = ", ".join("a stall" if s is None else f"signal {-s}" if s < 0 else f"exit status {s}" for s in statuses if s != 0)
    if status is None:
        raise RuntimeError(f"collecting the profile stalled or took over {timeout_s:.0f} s and was stopped ({died}); this rank has no trace")
    if status != 0:
        raise RuntimeError(f"TensorFlow's profiler failed while collecting in {len(statuses)} child process(es) ({died}; "
                           "training is unaffected); this rank has no trace")
    if len(statuses) > 1:
        return (f"TensorFlow's profiler crashed while collecting in {len(statuses) - 1} child process(es) ({died}); "
                f"child {len(statuses)} collected the window")
    return None


def grad_bytes(variables: Any, model: Any = None) -> tuple[int, int]:
    """Bytes of the trainable variables whose gradients are dense (what a data-parallel step all-reduces), and of the
    ``Embedding`` tables apart.

    An ``Embedding``'s gradient is sparse (the looked-up rows): the strategy all-gathers it instead, and the trace sizes
    those gathers itself, so its table is left out of the first. But a step that turns it dense first (Keras 3's
    ``global_clipnorm`` and ``LossScaleOptimizer`` multiply every gradient) all-reduces the tables in the pack: the
    reader adds the second where a step all-gathers nothing."""
    import numpy as np  # noqa: PLC0415

    flatten = getattr(model, "_flatten_layers", None)  # Keras 3 and tf-keras: every nested layer
    layers = flatten(include_self=False, recursive=True) if flatten else getattr(model, "submodules", ())
    sparse = {id(v) for layer in layers if type(layer).__name__ == "Embedding" for v in getattr(layer, "trainable_variables", ())}
    dense = tables = 0
    for v in variables or []:
        dtype = getattr(v.dtype, "name", v.dtype)  # tf.DType (tf-keras) or a string (Keras 3)
        nbytes = int(np.prod([int(d or 0) for d in v.shape])) * np.dtype(str(dtype)).itemsize
        if id(v) in sparse:
            tables += nbytes
        else:
            dense += nbytes
    return dense, tables


_BRANCHES = (("then", "then_branch"), ("else", "else_branch"))  # an ``If`` op's functions, as its lowered nodes name them


def live_collective_sizes() -> CollectiveSizes:
    """``collective_sizes`` of every ``tf.function`` alive in the process. A custom loop's step functions are the
    user's own: with ``CommunicationOptions(bytes_per_pack=...)`` the strategy splits the gradients into several packed
    all-reduces (``sgd/CollectiveReduceV2``, ``_1``, ``_2``), which the trace does not size; all of the model's gradient
    bytes once went on the first and 0 B on the others."""
    import gc  # noqa: PLC0415

    import tensorflow as tf  # noqa: PLC0415

    kinds = tf.types.experimental
    kind = getattr(kinds, "PolymorphicFunction", None) or kinds.GenericFunction
    return collective_sizes(*[o for o in gc.get_objects() if isinstance(o, kind)], skip_failing=True)


_GATHERS = ("GatherV2", "ResourceGather")  # an embedding's lookup (its ids: input 1), whose gradient is an IndexedSlices
_PADS = ("Pad", "PadV2")  # TF's padding of a worker's rows to the most any worker has (``all_gather_with_padding``)
_PASSING = {"Reshape": 1, "Identity": 1, "Cast": 1, "Squeeze": 1, "ExpandDims": 1, "ConcatV2": -1}  # op -> its data inputs


def _unpadded(t: Any) -> Any:
    """The tensor ``t`` pads (itself where it is no ``Pad``'s output)."""
    while t.op.type in _PADS and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _lookups_of(indices: Any) -> list[str]:
    """The lookups (``GatherV2``/``ResourceGather`` ops) whose ids a sparse gradient's ``indices`` tensor holds: back
    through the reshapes, casts and concatenations TF's gradient makes of them (an ``Embedding`` looked up twice
    concatenates both), to the tensors a lookup takes as its ids. Ids that feed several lookups (two tables over the same
    ids) are one entry of those lookups joined by ``LOOKUP_ALTERNATIVES``: each took as many ids, so the reader counts
    any of them whose count was traced. Empty where the walk leads elsewhere."""
    found: list[str] = []
    todo, seen = [indices], set()
    while todo:
        t = todo.pop()
        if t.name in seen or len(seen) > 64:
            continue
        seen.add(t.name)
        lookups = [c.name for c in t.consumers() if c.type in _GATHERS and len(c.inputs) > 1 and c.inputs[1] is t]
        if lookups:
            found.append(LOOKUP_ALTERNATIVES.join(sorted(lookups)))
            continue
        n = _PASSING.get(t.op.type)
        if n is None:
            return []
        todo += list(t.op.inputs)[:n] if n > 0 else list(t.op.inputs)[:-1]
    return sorted(set(found))


def collective_sizes(*functions: Any, skip_failing: bool = False) -> CollectiveSizes:
    """What each collective op of a ``tf.function`` sends, from its input tensor in the traced graphs (``CollectiveSizes``).

    The profiler records no tensor sizes, and its memory tracer sees only large allocations: wide_deep's embedding
    gradients (IndexedSlices, all-gathered as 832 rows and 832 indices) went unsized, the link was fitted to 1 sized
    collective of 17 a step. Where the looked-up ids' shape is dynamic (``padded_batch`` over ``Input((None,))``, or the
    branch that pads the workers' unequal row counts) a sparse gradient's rows and indices have no static shape: the
    bytes of one row (its other dimensions and dtype) are kept, and the reader multiplies them by the rows the run
    recorded in each step; for TF's branch of equal row counts (``cond/then/``) the lookups whose ids the indices hold
    are kept too, whose ids the profile counts in each step (``_lookups_of``).
    Ops in an ``If``'s branches (TF's all-gather of a sparse gradient) are named as their lowered nodes run, less the
    call's number: ``cond_1/then/cond_1/CollectiveGatherV2`` for ``cond_1/then/_18/cond_1/CollectiveGatherV2``.
    A step function traced again for new shapes (``reduce_retracing``: the first call's shapes static, the next trace's
    dynamic) may hold a name in both: it is sized by its rows, not by the first call's shape on every step
    (``bench/frameworks/tf_textcls_buckets.py``).
    Left out: a name two traced graphs size differently (in one function or two). ``skip_failing``: a function whose
    traced graphs cannot be listed (TF's own, e.g. a checkpoint's save function bound to its input signature) is left out."""
    import numpy as np  # noqa: PLC0415

    found: dict[str, set[int]] = {}
    dynamic: set[str] = set()  # of no static shape in some traced graph
    per_row: dict[str, set[int]] = {}
    lookups: dict[str, set[tuple[str, ...]]] = {}

    def walk(graph: Any, prefix: str) -> None:
        for op in graph.get_operations():
            if op.type.startswith("Collective") and op.inputs:
                t = op.inputs[0]
                dims = t.shape.as_list() if t.shape.rank else None
                if t.shape.is_fully_defined():
                    found.setdefault(prefix + op.name, set()).add(int(np.prod(dims or [], dtype=np.int64)) * t.dtype.size)
                    continue
                u = _unpadded(t)
                if u is not t and u.shape.is_fully_defined():
                    # padded to the most any worker has, from a shape every worker's program fixes (``strategy.gather`` of
                    # a per-replica tensor): nothing to pad, sent as that shape; sized per row, no rows were counted for
                    # it and it went at 0 B (tf_kws_specaug_gather's gathered predictions, 2026-12-06)
                    found.setdefault(prefix + op.name, set()).add(int(np.prod(u.shape.as_list() or [], dtype=np.int64)) * u.dtype.size)
                    continue
                dynamic.add(prefix + op.name)
                if dims is None or None in dims[1:]:  # padded by a computed amount, which shape inference leaves all unknown
                    t = _unpadded(t)
                    dims = t.shape.as_list() if t.shape.rank else None
                if dims is not None and None not in dims[1:]:
                    per_row.setdefault(prefix + op.name, set()).add(int(np.prod(dims[1:], dtype=np.int64)) * t.dtype.size)
            if op.type in ("If", "StatelessIf"):
                for label, attr in _BRANCHES:
                    branch = graph._get_function(op.get_attr(attr).name)  # noqa: SLF001  (the graph's own library)
                    if branch is not None and getattr(branch, "graph", None) is not None:
                        _branch_lookups(op, branch.graph, f"{prefix}{op.name}/{label}/")
                        walk(branch.graph, f"{prefix}{op.name}/{label}/")

    def _branch_lookups(op: Any, branch: Any, prefix: str) -> None:
        """The lookups of the sparse gradient a branch all-gathers: its gathers' inputs are the branch's arguments (in
        the branch that pads unequal row counts, each padded first: ``Pad``), the ``If``'s inputs after the predicate;
        one of them (the indices) leads back to the lookups' ids."""
        args = {t.name: k for k, t in enumerate(branch.inputs)}
        gathers = [(b, k) for b in branch.get_operations() if b.type == "CollectiveGatherV2" and b.inputs
                   and not b.inputs[0].shape.is_fully_defined() and (k := args.get(_unpadded(b.inputs[0]).name)) is not None]
        outer = [op.inputs[k + 1] for _, k in gathers if k + 1 < len(op.inputs)]
        gathers = [b for b, _ in gathers]
        found_lookups = {tuple(x) for t in outer if (x := _lookups_of(t))}
        if len(gathers) == len(outer) and len(found_lookups) == 1:
            for b in gathers:
                lookups.setdefault(prefix + b.name, set()).update(found_lookups)

    for function in functions:
        try:
            concretes = getattr(function, "_list_all_concrete_functions", lambda: [])()  # noqa: SLF001
        except Exception:  # noqa: BLE001
            if not skip_failing:
                raise
            continue
        for concrete in concretes:
            walk(concrete.graph, "")
    return CollectiveSizes(nbytes={name: sizes.pop() for name, sizes in found.items() if len(sizes) == 1 and name not in dynamic},
                           row_bytes={name: sizes.pop() for name, sizes in per_row.items() if len(sizes) == 1},
                           lookups={name: list(ops.pop()) for name, ops in lookups.items() if len(ops) == 1 and name in dynamic})


class tf_profile(LoopProfile):  # noqa: N801  (used like a profiler object)
    """Profile steps ``steps`` of a custom training loop; ``prof.step(i)`` wraps step ``i`` (in the
    window: a ``train`` range with its ``step_num``).

    ``model``: optional Keras model whose trainable variables give the gradient bytes of the
    all-reduce (the trace itself records no tensor sizes). ``strategy`` (default: the model's) lets
    the profiler stop after a barrier over the workers, when no collective is in flight.
    """

    def __init__(self, out_dir: str | os.PathLike[str], steps: range | tuple[int, int] | str | int = DEFAULT_STEPS,
                 rank: int | None = None, world_size: int | None = None, model: Any = None,
                 host_tracer_level: int = 2, python_tracer_level: int = 0, strategy: Any = None):
        self._args = (out_dir, steps, rank, world_size, host_tracer_level, python_tracer_level)
        self._model = model
        self._strategy = strategy if strategy is not None else getattr(model, "distribute_strategy", None)

    def _open(self) -> StepWindow:
        window = _window(*self._args, strategy=lambda: self._strategy, size_live=True)
        if self._model is not None:
            window.grad_bytes, window.embedding_grad_bytes = grad_bytes(self._model.trainable_variables, self._model)
        return window

    def _mark(self, step: int) -> ContextManager[Any]:
        import tensorflow as tf  # noqa: PLC0415

        return tf.profiler.experimental.Trace("train", step_num=step, _r=1)


def looped_collectives(model: Any) -> str | None:
    """What to tell the user of a model whose ``fit`` runs several batches per call over several replicas, else None:
    the loop's collectives reuse their keys each iteration, which the reader refuses (``traces.tf_xplane``), so the
    profile would be seen unreadable only once training is over. Never raises (the user's training goes on)."""
    try:
        spe = getattr(model, "steps_per_execution", None)  # tf-keras: a tf.Variable; Keras 3: an int
        n = int(spe.numpy() if hasattr(spe, "numpy") else spe or 1)
        replicas = int(getattr(getattr(model, "distribute_strategy", None), "num_replicas_in_sync", 1))
    except Exception:  # noqa: BLE001
        return None
    if n <= 1 or replicas <= 1:
        return None
    return (f"dagprof: compile(steps_per_execution={n}) on {replicas} replicas runs {n} batches per call in a loop whose "
            "collectives reuse their keys: this profile will be refused when read; profile with steps_per_execution=1")


def keras_callback(out_dir: str | os.PathLike[str], steps: range | tuple[int, int] | str | int = DEFAULT_STEPS,
                   rank: int | None = None, world_size: int | None = None, host_tracer_level: int = 2) -> Any:
    """A ``tf.keras.callbacks.Callback`` profiling global batches ``steps`` (counted over epochs) of ``fit``.

    Keras opens a ``train`` range (with ``step_num``) around each batch before the callbacks run,
    so the profiler starts at the end of the batch before the window and stops at the beginning
    of the batch after it: every profiled batch is whole.
    """
    import tensorflow as tf  # noqa: PLC0415

    class DagprofCallback(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.window = _window(out_dir, steps, rank, world_size, host_tracer_level, 0,
                                  strategy=lambda: getattr(self.model, "distribute_strategy", None))
            self.batch = -1  # global batch index
            self.sized = False  # the collectives' bytes read from the traced step (after its first batch)

        def _begin_window(self) -> None:
            if self.model is not None:
                self.window.grad_bytes, self.window.embedding_grad_bytes = grad_bytes(self.model.trainable_variables, self.model)
            self.window.open()

        def on_train_begin(self, logs: Any = None) -> None:
            if (said := looped_collectives(self.model)) is not None:
                print(said, file=sys.stderr, flush=True)
            if self.window.steps.start == 0:
                self._begin_window()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.batch += 1
            w = self.window
            if self.batch == w.steps.stop:
                w.close(retry=True)  # a window lost on some rank is profiled again from the batch after next
            w.time_begin()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            w = self.window
            w.step_end(self.batch)
            if not self.sized and self.model is not None:  # once ``fit`` has traced its step, outside the step's time
                self.sized = True
                try:  # TF's graph internals: never stop the user's training (the reader falls back to the tracer's sizes)
                    w.sizes = collective_sizes(getattr(self.model, "train_function", None))
                except Exception as err:  # noqa: BLE001
                    w.warnings.append(f"collectives not sized from fit's traced step ({type(err).__name__}: {err})")
            if self.batch + 1 == w.steps.start:
                self._begin_window()

        def on_train_end(self, logs: Any = None) -> None:
            self.window.finish()

    return DagprofCallback()
