"""Per-process collector: module, autograd, comm and optimizer hooks over a window of steps.

Hooks only append ``(code, a, b, time.time_ns(), x)`` tuples to a list (Kineto uses the
same Unix clock, so both line up without conversion); everything else happens at step
boundaries and when the window ends. Each completed step of the window is written at once
(``run_schema.StepPart``: one line appended to the rank's step log), and SIGTERM/SIGINT leave
a note of what stopped the process before the previous handler runs, so a rank killed
mid-window keeps its completed steps and the reader can say which are lost. Every hook body
is guarded: an exception disables profiling with one warning and training carries on. Outside the window the leaf-module hooks are removed; the comm
hook (DDP allows registering only one) stays as a pass-through.

The collector owns the window, the steps and the guard; the rest lives beside it: the activation memory counted for
backward in ``saved_activations``, DDP's bucket all-reduces in ``ddp_buckets``, where and how files are written in
``collector_files``.

Torch is imported lazily, inside functions: here, in the modules beside it, and in those that create a Collector.
"""
from __future__ import annotations

import os
import re
import sys
import time
import warnings
from functools import partial
from typing import Any

from ...progress import bar
from ...traces.run_schema import Clock, Manifest, RankFile, Rec, StepPart, ZeroInfo, kineto_file
from ...traces.steps import parse_steps
from .collector_files import (
    Flushed,
    append_step_part,
    export_kineto,
    process_info,
    start_step_files,
    write_ended,
    write_manifest,
    write_rank_file,
)
from .ddp_buckets import DdpBuckets
from .exit_gc import collect_cycles_at_exit
from .fsdp import FsdpRecorder, fsdp_modules
from .fsdp1 import Fsdp1Recorder, clean_name, fsdp1_modules
from .grad_clip import patch_grad_clip
from .loss_graph import patch_backward
from .own_collectives import patch_own_collectives
from .saved_activations import SavedActivations
from .stop_signals import StopSignals
from .tensors import group_ranks, output_tensors
from .thread_sched import ThreadSched
from .zero import zero_info

_MAX_OUTPUT_HOOKS = 4  # tensors per module output that get a gradient hook


def _whole_layer(module: Any) -> bool:
    """A module timed as one layer though it has children: ``nn.MultiheadAttention`` computes the attention itself and
    uses its ``out_proj``'s weights through ``F.multi_head_attention_forward`` without calling it, so as leaves its
    attention was no layer's (untimed gaps, ``other:forward``) and its ``out_proj`` a layer that never ran. A parametrized
    module (``parametrizations.weight_norm``, ``spectral_norm``) gains a child holding its weight's parametrization: as
    leaves only that child was timed, and the conv or linear itself, with the parametrization's gradients, was no layer's
    (a VQ-VAE decoder's two weight-normed convs, 38 ms of a 217 ms step in ``other:forward``: bench/ddp_fresh/vqvae_ema.py)."""
    import torch  # noqa: PLC0415  (imported by then: a model exists)
    from torch.nn.utils import parametrize  # noqa: PLC0415

    return isinstance(module, torch.nn.MultiheadAttention) or parametrize.is_parametrized(module)


def _inside(path: str, paths: list[str]) -> str | None:
    """The one of ``paths`` that is ``path`` or holds it, if any."""
    return next((w for w in paths if path == w or path.startswith(w + ".")), None)


def compiled(module: Any) -> bool:
    """Whether ``module`` runs under torch.compile: ``torch.compile(module)`` wraps it (``OptimizedModule``), or
    ``module.compile()`` compiled its call in place (as per-block compile before FSDP's ``fully_shard`` does). Dynamo
    does not guard on hooks added after it compiled (``skip_nnmodule_hook_guards``): those inside run never, silently."""
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


def replicated(model: Any) -> bool:
    """Whether ``model`` was given to the composable ``replicate()``, DDP's: its registry names it and that replicate()'s
    state is on it (torch's FSDP-based ``replicate_with_fsdp`` registers under the same name, with a state of its own)."""
    from torch.distributed._composable import replicate
    from torch.distributed._composable.contract import _get_registry

    return "replicate" in (_get_registry(model) or {}) and replicate.state(model) is not None


def replicate_ddp(model: Any) -> Any:
    """The DDP the composable ``replicate()`` runs for ``model`` (None: not replicate()-ed). Where its first forward has
    not built it yet, it is built now, as that forward's pre-hook would first (``dagprof.profile`` finds the model in the
    global forward pre-hook, which runs before the module's own); the comm hooks the user gave the module are left for
    that pre-hook to register, so they run inside dagprof's."""
    from torch.distributed._composable import replicate

    if not replicated(model):
        return None
    state = replicate.state(model)
    if not state.has_initialized:
        state.init(*state._init_args, **state._init_kwargs)
    return state._ddp


class Collector:
    """Records one window of steps of this process into ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike[str], steps: range | str, kineto: bool = True,
                 record_shapes: bool = False, ranges: bool = False, mode: str = "api"):
        import torch  # fail early and clearly if torch is missing

        self.steps = parse_steps(steps)
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.kineto = kineto
        self.record_shapes = record_shapes
        self.ranges = ranges  # also emit record_function ranges per layer (visible in Kineto)
        self.mode = mode
        # autograd records this forward (False under ``torch.no_grad``/``inference_mode``: an evaluation pass, whose forwards
        # the reader counts apart; ``Rec.FWD_BEGIN``'s x); bound once, read once per leaf hook
        self._grad_enabled = torch.is_grad_enabled
        self.records: list[tuple[int, int, int, int, int]] = []
        self.step = -1  # current step index; -1 before the first step began
        self.step_begin_ns = 0
        self.step_times: list[tuple[int, int, int]] = []  # every step seen, profiled or not
        self.profiled: list[int] = []
        self.enabled = True
        self.in_window = False
        self.warnings: list[str] = []
        self.layers: list[str] = []
        self._layer_index: dict[str, int] = {}
        self._modules: list[tuple[Any, str]] = []  # (leaf module, path)
        self._params: list[tuple[Any, str]] = []  # (parameter, module path)
        self._param_names: dict[int, str] = {}
        self._param_shapes: dict[int, tuple[int, ...]] = {}
        self._grad_bytes: dict[str, int] = {}  # module path -> bytes of its parameters' gradients
        self._layer_types: dict[str, str] = {}  # a layer path a container numbers -> its module's class (RankFile.layer_types)
        self._frozen_bytes: dict[str, int] = {}  # module path -> bytes of its parameters without (RankFile.layer_frozen_bytes)
        self._roots: list[Any] = []  # the instrumented modules (DDP's inner module)
        self._whole: list[str] = []  # layers of modules with children (``_whole_layer``), by path as ``layers`` names them
        self._ddps: list[Any] = []
        self._ddp_seen = False  # a DDP model was attached (kept after the model references are dropped)
        self._ddp_ranks: list[int] = []  # ranks of the first DDP model's process group (a mesh's DP group in a hybrid job)
        self._compiled = False  # the model runs under torch.compile: its modules get no hooks (``mark_compiled``)
        self._kineto_written = False
        self._manifest_written = False
        self._handles: list[Any] = []  # removed at window end
        self._restore: list[Any] = []  # undo class patches at window end
        self._calls: dict[int, int] = {}
        self._bwd_seen = False
        self._grad_watch: dict[tuple[int, int], tuple[Any, list]] = {}  # (id, version) -> (tensor, what to record)
        self._kineto_prof = None
        self._ranges_open: dict[tuple[int, int], Any] = {}
        self._info: dict[str, Any] = {}
        self._bar: Any = None  # rank 0's progress over the window (a terminal only)
        self._flushed = Flushed()  # how much of each list the step files already hold
        self._signals = StopSignals(self._note_end, lambda: self.step)  # watched while the window records
        self._ended = ""  # what stopped the process inside the window (a signal, an exception)
        self._update_depth = 0  # optimizer steps open (ZeRO's wraps its local optimizer's)
        self._zero: ZeroInfo | None | bool = None  # the job's ZeroRedundancyOptimizer (False: it has none; None: not looked yet)
        self._fsdp: FsdpRecorder | None = None  # an FSDP model's units and collectives (collect.hooks.fsdp, fsdp1)
        self.saved = SavedActivations(lambda: self.recording, self._fail, self.warnings)  # read by collect.hooks.fsdp too
        self.sched = ThreadSched()  # the training thread's CPU and waits for a core, and the process's CPU, per step
        self._buckets = DdpBuckets(self.records, lambda: self.recording, self._fail, self.warnings, self._param_names, self._param_shapes)

    # ---------------------------------------------------------------- guard
    def _fail(self, err: BaseException, where: str) -> None:
        if self.enabled:
            self.enabled = False
            msg = f"dagprof: profiling disabled after an error in {where}: {type(err).__name__}: {err}"
            self.warnings.append(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            try:
                self._detach()
            except Exception:  # noqa: BLE001  (already failing; training must go on)
                pass

    @property
    def recording(self) -> bool:
        return self.in_window and self.enabled

    # ---------------------------------------------------------------- attach
    def attach(self, model: Any, reducer: Any = None) -> None:
        """Instrument a model: a DDP module (leaves + comm hook) or any nn.Module (compute only). ``reducer``: the DDP that
        reduces ``model``'s gradients without holding it (the composable ``replicate()``'s, built over a flat parameter
        list): its buckets are timed as a DDP model's, and ``model``'s leaves as the layers; found by ``replicate_ddp``
        where not given."""
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP

            reducer = reducer if reducer is not None else replicate_ddp(model)
            held = [m for m in model.modules() if isinstance(m, DDP)]
            ddps = held + ([reducer] if reducer is not None else [])
            if any(compiled(m) for m in model.modules()):
                self.mark_compiled()
            roots = [r for r in ([d.module for d in held] if held else [model]) if not any(r is x for x in self._roots)]
            for root in roots:
                self._add_root(root)
            if isinstance(self._fsdp, FsdpRecorder) and (units := fsdp_modules(model)):
                self._fsdp.modules += units  # another fully_shard root (a GAN's discriminator)
            elif self._fsdp is None and (units := fsdp_modules(model)):
                self._fsdp = FsdpRecorder(self, units)
            elif self._fsdp is None and (named := fsdp1_modules(model)):
                self._fsdp = Fsdp1Recorder(self, named)
                self._grad_bytes, self._frozen_bytes = ({}, {})  # its parameters are flat: per layer from the originals
                for mine, sizes in zip((self._grad_bytes, self._frozen_bytes), self._fsdp.layer_bytes()):
                    for k, n in sizes.items():
                        mine[self._layer_of(k)] = mine.get(self._layer_of(k), 0) + n
            if (ddps or self._fsdp) and not self._info:
                self._resolve_info()  # the process group exists now; it may be gone by exit
            for ddp in ddps:
                if not any(ddp is d for d in self._ddps):
                    self._ddps.append(ddp)
                    self._ddp_seen = True
                    self._ddp_ranks = self._ddp_ranks or group_ranks(ddp.process_group)
                    self._buckets.install(ddp, composable=ddp is reducer)
            if self.in_window:
                self._attach_leaf_hooks(roots)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "attach")

    def root_of(self, module: Any) -> int | None:
        """The index of the attached root that holds ``module`` (None: no attached model does)."""
        return next((k for k, r in enumerate(self._roots) if any(module is m for m in r.modules())), None)

    def root_prefix(self, k: int) -> str:
        """What the names of root ``k``'s layers begin with: a second model's paths get a prefix to stay distinct."""
        return f"{type(self._roots[k]).__name__}{k}." if k else ""

    def _add_root(self, root: Any) -> None:
        """Leaves are named by module path (``root_prefix``). A module that computes with its children's parameters
        without calling them (``_whole_layer``) is one layer, its children none."""
        self._roots.append(root)
        prefix = self.root_prefix(len(self._roots) - 1)
        whole = [path for path, mod in root.named_modules() if _whole_layer(mod)]
        self._whole += [prefix + clean_name(w) for w in whole]
        for path, mod in root.named_modules():
            if (next(mod.children(), None) is not None and path not in whole) or _inside(path, whole) not in (None, path):
                continue
            path = prefix + (clean_name(path) or type(mod).__name__)
            if path not in self._layer_index:
                self._layer_index[path] = len(self.layers)
                self.layers.append(path)
                if path.rpartition(".")[2].isdigit():
                    self._layer_types[path] = type(mod).__name__
            self._modules.append((mod, path))
        for name, p in root.named_parameters():
            name = clean_name(name)
            self._param_names[id(p)] = prefix + name
            self._param_shapes[id(p)] = tuple(p.shape)
            path = self._layer_of(prefix + (name.rpartition(".")[0] or type(root).__name__))
            sizes = self._grad_bytes if p.requires_grad else self._frozen_bytes
            sizes[path] = sizes.get(path, 0) + p.numel() * p.element_size()
            self._params.append((p, path))

    def _layer_of(self, module: str) -> str:
        """The layer a module's parameters are counted to: the whole-layer module holding it, else its own path."""
        return _inside(module, self._whole) or module

    def mark_compiled(self) -> None:
        """The model runs under torch.compile: Dynamo would trace hooks on its modules, breaking its graphs at each and
        recompiling them (the profiled steps of ``bench/ddp_fresh/compiled_lm.py`` ran 1.9-2.8x the others), and still
        not time a layer inside a graph. None is installed; the parameters' gradient hooks, which autograd runs outside
        the graphs, stay (the reader counts them in its warning that no layer was seen)."""
        self._compiled = True

    def _attach_leaf_hooks(self, roots: list[Any] | None = None) -> None:
        wanted = None if roots is None else {id(m) for r in roots for m in r.modules()}
        wanted_params = set() if roots is None else {id(p) for r in roots for p in r.parameters()}
        for root in [] if self._compiled else self._roots if roots is None else roots:
            self._handles.append(root.register_forward_pre_hook(self.saved.forward_begins))
            self._handles.append(root.register_forward_hook(self.saved.forward_ends))
        for mod, path in [] if self._compiled else self._modules:
            if wanted is not None and id(mod) not in wanted:
                continue
            layer = self._layer_index[path]
            self._handles.append(mod.register_forward_pre_hook(partial(self._fwd_pre, layer)))
            self._handles.append(mod.register_forward_hook(partial(self._fwd_post, layer)))
        for p, path in self._params:
            layer = self._layer_index.get(path)
            if layer is None or not p.requires_grad or not hasattr(p, "register_post_accumulate_grad_hook"):
                continue  # torch < 2.1: backward spans end at the input gradient only
            if wanted is None or id(p) in wanted_params:
                self._handles.append(p.register_post_accumulate_grad_hook(partial(self._grad_ready, layer)))

    def _detach(self) -> None:
        if self._bar is not None:
            self._bar.close()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        while self._restore:
            self._restore.pop()()
        self._grad_watch.clear()
        for rf in self._ranges_open.values():
            rf.__exit__(None, None, None)
        self._ranges_open.clear()
        self.saved.stop()

    # ---------------------------------------------------------------- module / autograd hooks
    def _fwd_pre(self, layer: int, module: Any, args: tuple) -> None:
        if not self.recording:
            return
        try:
            call = self._calls.get(layer, 0)
            self._calls[layer] = call + 1
            if self.ranges:
                self._open_range(layer, call, "forward")
            grad = self._grad_enabled()
            self.records.append((Rec.FWD_BEGIN, layer, call, time.time_ns(), int(not grad)))
            self.saved.enter(layer, args if grad else ())  # an evaluation forward under no_grad: nothing for backward
            for x in {id(x): x for x in args}.values():  # once per tensor: attention is called as (x, x, x)
                if getattr(x, "requires_grad", False) and hasattr(x, "register_hook"):
                    self._on_grad(x, (Rec.BWD_END, layer, call))
        except Exception as err:  # noqa: BLE001
            self._fail(err, f"forward pre-hook of {self.layers[layer]}")

    def _fwd_post(self, layer: int, module: Any, args: tuple, output: Any) -> None:
        if not self.recording:
            return
        try:
            t = time.time_ns()
            call = self._calls.get(layer, 1) - 1
            self.records.append((Rec.FWD_END, layer, call, t, 0))
            self.saved.leave(layer, output if self._grad_enabled() else None)
            if self.ranges:
                self._close_range(layer, call)
            n = 0
            for y in output_tensors(output):
                if y.requires_grad:
                    self._on_grad(y, (Rec.BWD_BEGIN, layer, call))
                    n += 1
                    if n == _MAX_OUTPUT_HOOKS:
                        break
        except Exception as err:  # noqa: BLE001
            self._fail(err, f"forward hook of {self.layers[layer]}")

    def _on_grad(self, tensor: Any, what: tuple[Rec, int, int]) -> None:
        """Record ``what`` when the gradient w.r.t. ``tensor`` arrives.

        A layer's output is usually the next layer's input: one hook per tensor version serves
        both (half the hooks). The version tells an in-place result (ReLU(inplace)) from its
        input; holding the tensor until backward starts keeps its id from being reused.
        """
        self._watch(tensor).append(what)

    def _watch(self, tensor: Any) -> list[tuple[Rec, int, int]]:
        """What to record when the gradient w.r.t. ``tensor`` arrives (one hook per tensor version, registered now)."""
        key = (id(tensor), tensor._version)
        entry = self._grad_watch.get(key)
        if entry is None:
            entry = self._grad_watch[key] = (tensor, [])
            tensor.register_hook(partial(self._grad_arrived, entry[1]))
        return entry[1]

    def _grad_arrived(self, whats: list[tuple[Rec, int, int]], grad: Any) -> None:
        if not self.recording:
            return
        try:
            t = time.time_ns()
            for code, layer, call in whats:
                self.records.append((code, layer, call, t, 0))
            if not self._bwd_seen:
                self._bwd_seen = True
                self._grad_watch.clear()
                if self._ddps:
                    from torch.autograd import Variable

                    Variable._execution_engine.queue_callback(self._backward_done)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "backward hook")

    def _grad_ready(self, layer: int, param: Any) -> None:
        self._mark(Rec.GRAD_READY, layer, 0)

    def _mark(self, code: Rec, a: int = 0, b: int = 0) -> None:
        """Record a timestamp now (the guarded body shared by the simplest hooks)."""
        if self.recording:
            try:
                self.records.append((code, a, b, time.time_ns(), 0))
            except Exception as err:  # noqa: BLE001
                self._fail(err, f"hook {code.name}")

    def _backward_done(self) -> None:
        """First end-of-backward callback; DDP's finalize (the bucket wait) is queued after it."""
        try:
            if self.recording:
                self.records.append((Rec.WAIT_BEGIN, 0, 0, time.time_ns(), 0))
                from torch.autograd import Variable

                Variable._execution_engine.queue_callback(self._finalize_done)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "end-of-backward callback")

    def _finalize_done(self) -> None:
        self._mark(Rec.WAIT_END)
        self._bwd_seen = False  # the next backward pass (gradient accumulation) gets its own pair

    def _open_range(self, layer: int, call: int, what: str) -> None:
        from torch.autograd.profiler import record_function

        rf = record_function(f"{self.layers[layer]}.{what}")
        rf.__enter__()
        self._ranges_open[(layer, call)] = rf

    def _close_range(self, layer: int, call: int) -> None:
        rf = self._ranges_open.pop((layer, call), None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def _time_dataloaders(self) -> None:
        """Time every DataLoader ``next()`` during the window (a class patch, undone at window end)."""
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        original = cls.__next__
        collector = self

        def __next__(it: Any) -> Any:
            if not collector.recording:
                return original(it)
            collector._mark(Rec.DATA_BEGIN)
            try:
                return original(it)
            finally:
                collector._mark(Rec.DATA_END)

        cls.__next__ = __next__
        self._restore.append(lambda: setattr(cls, "__next__", original))

    # ---------------------------------------------------------------- optimizer
    def optimizer_hook(self, begin: bool) -> Any:
        """torch's optimizer step pre (``begin``) or post hook: an error in it disables profiling, never the user's step
        (a collector whose ``update_end`` took no optimizer stopped every Horovod job in its first step)."""
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            try:
                (self.update_begin if begin else self.update_end)(opt)
            except Exception as err:  # noqa: BLE001
                self._fail(err, "optimizer hook")
        return hook

    def update_begin(self, opt: Any = None) -> None:
        """An optimizer's step begins; one inside another's (ZeRO's local optimizer) is part of the outer update. The
        ``step()`` of a ZeroRedundancyOptimizer(overlap_with_ddp=True) does nothing (its comm hook steps it): not one."""
        if getattr(opt, "_overlap_with_ddp", False):
            return
        self._update_depth += 1
        if self._update_depth == 1:
            self._mark(Rec.UPDATE_BEGIN)
            if opt is not None and self._zero is None:
                try:
                    self._note_zero(opt)
                except Exception as err:  # noqa: BLE001
                    self._fail(err, "optimizer hook")

    def update_end(self, opt: Any = None) -> bool:
        """An optimizer's step ended; True where it was the outermost (one update: ZeRO's ends after its broadcasts)."""
        if getattr(opt, "_overlap_with_ddp", False):
            return False
        self._update_depth = max(self._update_depth - 1, 0)
        if self._update_depth:
            return False
        self._mark(Rec.UPDATE_END)
        return True

    @property
    def steps_by_forward(self) -> bool:
        """Steps are marked at the DDP model's forwards: ZeRO's overlapped step runs inside backward and the loop calls no
        optimizer's ``step()`` (``zero.ZeroOverlap``)."""
        return self._buckets.zero is not None

    def _note_zero(self, opt: Any) -> None:
        info, warning = zero_info(opt, self._info.get("rank", 0))
        self._zero = info or False
        if warning:
            self.warnings.append(warning)

    # ---------------------------------------------------------------- steps and window
    def start(self) -> None:
        """Step 0 begins now."""
        if self.step < 0:
            self.step = 0
            self._guarded(self._begin_step, time.time_ns())

    def next_step(self) -> None:
        """The current step ends now and the next begins."""
        if self.step < 0:
            self.start()
            return
        self._guarded(self._end_step, time.time_ns())
        self.step += 1
        self._guarded(self._begin_step, time.time_ns())

    def _guarded(self, fn: Any, t: int) -> None:
        try:
            fn(t)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "step boundary")

    def _begin_step(self, t: int) -> None:
        self.step_begin_ns = t
        if self.step == 0:  # every step's, so that the window's can be held against the others' (passes.profiler_cost)
            self.sched.open()
        if self.step == self.steps.start and self.enabled:
            try:
                self._begin_window()
            except Exception as err:  # noqa: BLE001
                self._fail(err, "window start")
            t = self.step_begin_ns = time.time_ns()
        if self.recording:
            self._calls.clear()
            self.saved.new_step()
            self._bwd_seen = False
            self._grad_watch.clear()
            self._buckets.new_step()
            self.records.append((Rec.STEP_BEGIN, self.step, 0, t, 0))
        self.sched.begin()

    def _end_step(self, t: int) -> None:
        self.step_times.append((self.step, self.step_begin_ns, t))
        self.sched.end(self.step)
        if self.recording:
            self.records.append((Rec.STEP_END, self.step, 0, t, 0))
            self.saved.end_step(self.layers)
            self.profiled.append(self.step)
            self._bar.update()
            self._buckets.end_step()
            self._write_step_part()
            if self._kineto_prof is not None and self.step + 1 < self.steps.stop:
                self._kineto_prof.step()
        if self.step + 1 == self.steps.stop and self.in_window:
            self._end_window()

    def _begin_window(self) -> None:
        if not self._info.get("backend"):
            self._resolve_info()
        self._write_manifest()
        self._write_steps_head()
        self._signals.catch(self.warnings)
        self._bar = bar(len(self.steps), f"profiling steps {self.steps.start}..{self.steps.stop - 1}", "step", show=self._info["rank"] == 0)
        self.in_window = True
        self.sched.open()  # the thread that marks the window's steps (if another marked step 0)
        self._attach_leaf_hooks()
        self._time_dataloaders()
        patch_grad_clip(self)
        self._restore.append(patch_backward(self.saved.backward_starting))
        self.saved.track([p for p, _ in self._params])
        if self._fsdp is not None:
            self._fsdp.begin()
        # sizes for Kineto's transfers of the model's own collectives, of a script's own data parallelism (no DDP, no FSDP:
        # its async per-parameter all-reduces), and the wire of a comm hook of the user's own
        elif (self._ddp_seen or self._info.get("backend")) and (self.kineto or self._buckets.comm_hook):
            patch_own_collectives(self)
        if self.kineto:
            import torch
            from torch.profiler import ProfilerAction, ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            # a schedule (always RECORD) makes torch write ProfilerStep#N markers with our step numbers
            prof = profile(activities=activities, record_shapes=self.record_shapes, schedule=lambda step: ProfilerAction.RECORD)
            prof.step_num = self.step
            prof.start()
            self._kineto_prof = prof

    def _end_window(self) -> None:
        self.in_window = False
        try:
            if self._fsdp is not None:
                self._fsdp.end()
            self._detach()
            self._write_rank(final=False)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "writing the profile")
        self._signals.release()

    def close(self, error: BaseException | None = None) -> None:
        """Write whatever was collected (also when training ended before or inside the window).

        ``error``: the exception that ended training, if any; inside the window it is recorded
        (``RankFile.ended``) so the reader knows the missing steps were lost, not never run."""
        try:
            if self.in_window:  # training ended inside the window; the open step never finished
                self.in_window = False
                if error is not None and not self._ended:
                    # the innermost message: gloo wraps it ("... callback: RuntimeError: [file:line] Connection closed ...")
                    first = re.sub(r"^\[[^\]]*\]\s*", "", re.split(r"\b\w*Error: ", " ".join(str(error).split()))[-1])[:80]
                    self._ended = f"ended by {type(error).__name__}{f' ({first})' if first else ''} during step {self.step}"
                if self._fsdp is not None:  # its shards' sizes, read as the window ends: else every one is 0, and the peak without them
                    self._fsdp._guarded("FSDP's shard sizes at exit", self._fsdp.end)
                self._detach()
            if not self._info:
                self._resolve_info()
            if not self._manifest_written:  # the window never began
                self._write_manifest()
            self._write_rank(final=True)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "writing the profile at exit")
        self.sched.close()
        self._signals.release()
        self._release_model()

    def _release_model(self) -> None:
        """Drop every reference to the user's model once the profile is written.

        DDP's reducer holds our comm hook, which holds this collector: holding the DDP, its module
        or its parameters here would close a cycle through C++ that only interpreter exit breaks.
        The process group would then be torn down during finalization, where gloo's threads release
        Python-owned objects without a GIL and abort the process (``exit_gc``; FSDP's own cycles too)."""
        self._ddps.clear()
        self._roots.clear()
        self._modules.clear()
        self._params.clear()
        self._grad_watch.clear()
        self.saved.track([])
        if self._fsdp is not None:
            self._fsdp.release()
        if self._ddp_seen or self._fsdp is not None:
            collect_cycles_at_exit()

    # ---------------------------------------------------------------- output
    def _resolve_info(self) -> None:
        self._info = process_info()

    def _write_manifest(self) -> None:
        manifest = Manifest(world_size=self._info["world_size"], steps_requested=(self.steps.start, self.steps.stop),
                            backend=self._info["backend"], kineto=self.kineto, record_shapes=self.record_shapes, mode=self.mode,
                            argv=list(sys.argv), created_ns=time.time_ns())
        if write_manifest(self.out_dir, self._info["rank"], manifest):
            self._manifest_written = True

    def _write_rank(self, final: bool) -> None:
        rank = self._info["rank"]
        kfile = None
        if self._kineto_prof is not None:
            prof, self._kineto_prof = self._kineto_prof, None
            prof.stop()
            export_kineto(prof, self.out_dir, rank)
            self._kineto_written = True
        if self._kineto_written:
            kfile = kineto_file(rank)
        zero = self._zero or (self._buckets.zero.info(bool(self.profiled)) if self._buckets.zero else None)  # may warn
        doc = self._rank_file(
            steps_profiled=self.profiled, final=final, ended=self._ended, kineto_file=kfile, warnings=self.warnings, layers=self.layers,
            layer_grad_bytes=self._grad_bytes, layer_frozen_bytes=self._frozen_bytes, layer_saved_bytes=self.saved.most,
            layer_output_bytes=dict(self.saved.most_output) if self._fsdp is None else {},  # FSDP's in its FsdpInfo
            layer_autograd_nodes=dict(self.saved.most_nodes) if all(p.device.type == "cpu" for p, _ in self._params) else {},
            bucket_layouts=self._buckets.layouts, step_times_ns=self.step_times, records=self.records, ddp_group_ranks=self._ddp_ranks,
            thread_sched_ns=self.sched.steps, process_cpu_ns=self.sched.process, thread_runs=self.sched.runs,
            other_threads_ns=self.sched.others,
            fsdp=self._fsdp.info(self.layers) if self._fsdp is not None else None, zero=zero,
        )
        write_rank_file(self.out_dir, doc)

    def _rank_file(self, **fields: Any) -> RankFile:
        """What the step files' head and the final rank file both say of this process now; ``fields`` the rest."""
        return RankFile(**self._info, mode=self.mode, bucket_cap_mb=self._buckets.cap_mb, ddp=self._ddp_seen,
                        ddp_models=self._buckets.models, ddp_api=self._buckets.api, comm_hook=self._buckets.comm_hook,
                        find_unused=self._buckets.find_unused,
                        steps_requested=(self.steps.start, self.steps.stop), steps_completed=len(self.step_times),
                        record_shapes=self.record_shapes, clock=Clock(time.time_ns(), time.perf_counter_ns()),
                        layer_types=dict(self._layer_types), **fields)

    # ---------------------------------------------------------------- step files: what survives a kill
    def _write_steps_head(self) -> None:
        """``rank<R>.steps/head.json``: everything known at the window's start; step files add to it."""
        head = self._rank_file(
            steps_profiled=[], warnings=list(self.warnings), layers=list(self.layers), layer_grad_bytes=dict(self._grad_bytes),
            layer_frozen_bytes=dict(self._frozen_bytes), bucket_layouts=list(self._buckets.layouts), step_times_ns=list(self.step_times), records=[],
            thread_sched_ns=list(self.sched.steps), process_cpu_ns=list(self.sched.process), thread_runs=list(self.sched.runs),
            other_threads_ns=list(self.sched.others),
        )
        start_step_files(self.out_dir, head)
        self._flushed = Flushed(len(self.records), len(self.layers), dict(self._grad_bytes), len(self.warnings),
                                len(self.step_times), len(self._buckets.layouts), len(self.sched.steps))

    def _write_step_part(self) -> None:
        """The step that just ended, and whatever else was appended since the previous one: one line appended to the log."""
        done = self._flushed
        n = len(self.records)  # comm threads may append meanwhile: take what is there now
        grad = {k: v for k, v in self._grad_bytes.items() if done.grad_bytes.get(k) != v}
        part = StepPart(
            rank=self._info["rank"], step=self.step, layers=self.layers[done.layers:], layer_grad_bytes=grad,
            layer_saved_bytes=self.saved.step_bytes(self.layers),
            bucket_layout=self._buckets.layouts[-1] if len(self._buckets.layouts) > done.layouts else None,
            warnings=self.warnings[done.warnings:], step_times_ns=self.step_times[done.step_times:], records=self.records[done.records:n],
            thread_sched_ns=self.sched.steps[done.sched:], process_cpu_ns=self.sched.process[done.sched:],
            thread_runs=self.sched.runs[done.sched:], other_threads_ns=self.sched.others[done.sched:],
        )
        append_step_part(self.out_dir, part)
        if grad:
            done.grad_bytes.update(grad)
        done.records, done.layers, done.warnings = n, len(self.layers), len(self.warnings)
        done.step_times, done.layouts, done.sched = len(self.step_times), len(self._buckets.layouts), len(self.sched.steps)

    # ---------------------------------------------------------------- what stops the process
    def _note_end(self, how: str) -> None:
        """``rank<R>.steps/ended.json`` saying ``how`` the process stops ("" removes it); never raises (a signal handler)."""
        try:
            self._ended = how
            if self.in_window and self._info:
                write_ended(self.out_dir, self._info["rank"], how)
        except Exception:  # noqa: BLE001  (the signal must still take effect)
            pass
