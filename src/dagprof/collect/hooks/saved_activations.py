"""The activation memory a step keeps for backward, per layer: what the memory model sizes a what-if's peak from.

A saved-tensor hook counts what each leaf module saves (each storage once per step, parameters excluded) while a root's
forward runs, and only then: saved_tensors_hooks live in thread-local state, which every collective launched meanwhile
captures (gloo's AsyncWork keeps it). A work that outlives the interpreter releases those Python objects without a GIL at
exit and aborts the process (seen in 1 of 20-40 runs while the hooks stayed on for the whole window), so backward, where
DDP launches its all-reduces, runs without them, and FSDP's collectives pause them (``fsdp``). DDP syncs buffers before
it calls the inner module, outside too. Besides, the bytes the root's forward returned (the logits and loss tensors no
saved-tensor hook sees) and the loss's own backward (``loss_graph``). An FSDP layer's saved weight is the unit's gathered
parameter, no parameter of the model: it counts among the layer's bytes, and apart too (``most_gathered``: the storages
``collect.hooks.fsdp`` names, padded to the shard count) so that the memory model takes out exactly those. And the bytes each
leaf module returned (``most_output``): the gradient that reaches it in backward is as large, which the memory model counts
in flight. What is saved between leaf modules (a block's ``F.relu``) is counted apart per FSDP unit whose forward ran
(``most_unit_outside``, the unit named by ``collect.hooks.fsdp``): it is freed at that unit's backward, not at the step's
end. And the autograd nodes each leaf module's forward recorded (``most_nodes``: on a CPU job they are host memory beside
the tensors, about 0.9 KB a node, ``search.memory.AUTOGRAD_NODE_BYTES``), by sequence number, which torch gives each node
it makes on a thread in turn: the nodes made since the previous leaf module returned (functional ops between them too)
are the next one's, those after the last one's (the model's last functional ops, the loss) are counted outside the
layers. A few cheap calls per forward, where walking the graph took 1-30 ms a step. Where what the last backward ran from
(the loss) is still alive as the next forward begins, the script keeps it (a loop variable) and with it that graph's
shells until it assigns the new loss: its nodes are counted as ``PREVIOUS_GRAPH``. And what the loss's graph saved, as
its backward starts (``LOSS_FORWARD``). Under gradient accumulation each figure is the most of one forward+backward pass
(a root forward after a backward begins a new pass, ``_fold``), since a micro-batch's backward frees what its forward
saved: summed over a step's passes, a VGG with 3 micro-batches (``bench/fsdp_fresh/hsdp_vgg_accum.py``) read 3x its
activations and a peak of 31.03 MiB against 13.24 measured. The collector owns the window and the guard; this owns the
counting.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from ...traces.run_schema import LOSS_BACKWARD, LOSS_FORWARD, MODEL_OUTPUT, PREVIOUS_GRAPH, SAVED_OUTSIDE_LAYERS
from .loss_graph import LossGraph
from .tensors import local_tensor, output_bytes, output_tensors, storage_ptr

_OUTSIDE, _OUTPUT, _LOSS, _LOSS_FWD = -1, -2, -3, -4  # keys among a step's saved bytes that are no layer's index
_PREVIOUS = -5  # among a step's autograd nodes: the step before's, still held as a forward began
_MAX_NODES_PER_COUNT = 10**7  # more nodes between two counts than any forward makes: a count from another thread's numbers


class SavedActivations:
    """Bytes saved for backward per layer: this step's, and the most of any profiled step (``most``, by layer path)."""

    def __init__(self, recording: Callable[[], bool], fail: Callable[[BaseException, str], None], warnings: list[str]) -> None:
        self._recording = recording
        self._fail = fail
        self._loss = LossGraph(fail, warnings)  # what the loss computed from the model's output holds in its backward
        self._hooks: Any = None  # saved_tensors_hooks context while a root's forward runs in the window
        self._layer_stack: list[int] = []  # leaf modules whose forward is running
        self._seen: set[int] = set()  # storages counted this step
        self._step: dict[int, int] = {}  # layer -> bytes it saved for backward this step
        self._param_ptrs: set[int] = set()
        self._gathered: set[int] = set()  # storages (by identity) of FSDP's gathered parameters
        self._step_gathered: dict[int, int] = {}  # layer -> bytes of those it saved this step
        self._step_output: dict[int, int] = {}  # layer -> bytes its forward returned this step
        self._step_input: dict[int, int] = {}  # layer -> bytes its forward received this step
        self._unit_stack: list[str] = []  # FSDP units whose forward is running (by name), innermost last
        self._step_unit: dict[str, int] = {}  # unit -> bytes saved between leaf modules while its forward ran this step
        self.most: dict[str, int] = {}  # layer path -> most bytes saved in one profiled step
        self.most_gathered: dict[str, int] = {}  # layer path -> most bytes of gathered parameters among them
        self.most_output: dict[str, int] = {}  # layer path -> most bytes its forward returned in one profiled step
        # layer path -> most bytes its forward received: what it saves when activation checkpointing runs it again in
        # backward, where no saved-tensor hook counts (``search.fsdp_memory._Job.recomputed``)
        self.most_input: dict[str, int] = {}
        self.most_unit_outside: dict[str, int] = {}  # FSDP unit -> most bytes saved between leaf modules in its forward, one step
        self._probe: Any = None  # a leaf tensor whose view's node tells the sequence number a forward starts after
        self._mark = -1  # the sequence number of the last autograd node counted (-1: no forward counting nodes)
        self._step_nodes: dict[int, int] = {}  # layer -> autograd nodes its forward made this step
        self._forward_nodes = 0  # nodes counted since the last forward began
        self._last_loss: tuple[list[Any], int] = ([], 0)  # weak references to what the last backward ran from, and its nodes
        self.most_nodes: dict[str, int] = {}  # layer path -> most autograd nodes its forward made in one profiled step
        self._backward_ran = False  # a backward began since the last root forward: the next forward starts a new pass
        self._passes: list[dict] = [{} for _ in self._figures()]  # the step's earlier passes, per figure of ``_figures`` the most (``_fold``)

    @property
    def counting(self) -> bool:
        """The hook is on: a root's forward runs in the window."""
        return self._hooks is not None

    def track(self, params: list[Any]) -> None:
        """The parameters whose storages are not activations (none: the model is released)."""
        self._param_ptrs = {ptr for p in params if (ptr := storage_ptr(p))}

    def gathered(self, params: list[Any]) -> None:
        """FSDP unsharded ``params`` (a unit's gathered parameters): their storages saved are counted apart. By identity, which
        FSDP keeps from step to step (it frees a storage by resizing it to 0 and allocates it again in place)."""
        self._gathered.update(local_tensor(p).untyped_storage()._cdata for p in params)

    def new_step(self) -> None:
        self._seen.clear()
        self._step.clear()
        self._step_gathered.clear()
        self._step_output.clear()
        self._step_input.clear()
        self._step_unit.clear()
        self._step_nodes.clear()
        self._passes = [{} for _ in self._figures()]
        self._backward_ran = False
        self._mark = -1
        self._unit_stack.clear()  # no forward runs between steps: a unit whose forward raised is not carried over
        self._loss.new_step()

    def enter(self, layer: int, args: Any = ()) -> None:
        """A leaf module's forward begins on ``args``: what is saved now is ``layer``'s."""
        self._layer_stack.append(layer)
        if self.counting:
            self._step_input[layer] = self._step_input.get(layer, 0) + output_bytes(args)

    def leave(self, layer: int, output: Any = None) -> None:
        """A leaf module's forward returned ``output``: its bytes are the gradient's that reaches the layer in backward."""
        if self._layer_stack and self._layer_stack[-1] == layer:
            self._layer_stack.pop()
        if self.counting and output is not None:
            self._step_output[layer] = self._step_output.get(layer, 0) + output_bytes(output)
            self._count_nodes(layer, output)

    def _count_nodes(self, key: int, made: Any) -> None:
        """The autograd nodes made since the last count, up to the newest behind the tensors ``made``, are ``key``'s."""
        seq = max((y.grad_fn._sequence_nr() for y in output_tensors(made) if getattr(y, "grad_fn", None) is not None), default=-1)
        if 0 <= self._mark < seq < self._mark + _MAX_NODES_PER_COUNT:  # beyond: a node made on another thread, numbered apart
            self._step_nodes[key] = self._step_nodes.get(key, 0) + seq - self._mark
            self._forward_nodes += seq - self._mark
            self._mark = seq

    def unit_enter(self, unit: str) -> None:
        """An FSDP unit's forward begins: what is saved between leaf modules now is ``unit``'s."""
        self._unit_stack.append(unit)

    def unit_leave(self, unit: str) -> None:
        """An FSDP unit's forward ended."""
        if self._unit_stack and self._unit_stack[-1] == unit:
            self._unit_stack.pop()

    def forward_begins(self, module: Any, args: tuple) -> None:
        """A root's forward pre-hook: count saved activations while the forward runs (module docstring)."""
        if not self._recording() or self._hooks is not None:
            return
        if self._backward_ran:
            self._fold()
        try:
            import torch

            if self._probe is None:
                self._probe = torch.ones((), requires_grad=True)
            with torch.enable_grad():
                self._mark = self._probe.view(()).grad_fn._sequence_nr()
            refs, nodes = self._last_loss
            if any(r() is not None for r in refs):  # the script still holds the last loss, and with it its graph's shells
                self._step_nodes[_PREVIOUS] = max(self._step_nodes.get(_PREVIOUS, 0), nodes)
            self._last_loss, self._forward_nodes = ([], 0), 0
            ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            ctx.__enter__()
            self._hooks = ctx
        except Exception as err:  # noqa: BLE001
            self._fail(err, "forward pre-hook (saved tensors)")

    def forward_ends(self, module: Any = None, args: tuple = (), output: Any = None) -> None:
        """A root's forward hook: stop counting saved activations, and count the bytes its forward returned (the
        logits and loss tensors no saved-tensor hook sees: the memory model sizes them by it)."""
        if self._hooks is not None:
            saved, self._hooks = self._hooks, None
            try:
                saved.__exit__(None, None, None)
                if output is not None:
                    self._step[_OUTPUT] = max(self._step.get(_OUTPUT, 0), output_bytes(output))
                    self._count_nodes(_OUTSIDE, output)
                    self._loss.forward_ended(output)
            except Exception as err:  # noqa: BLE001
                self._fail(err, "forward hook (saved tensors)")

    def pause(self) -> list | None:
        """Take this counter's hooks off the thread's saved-tensor stack for a collective (module docstring), leaving the
        hooks pushed above them in place and in order; None where none are on. Inside a non-reentrant
        ``checkpoint(block)`` whose block is an FSDP unit, the unit's all-gather runs with checkpoint's hooks on top:
        popping the top took those off instead of ours, and pushing ours back ran the block's forward under our pack hook,
        which keeps every tensor, so the window's steps ran without checkpointing (``bench/fsdp_fresh/ctc_speech_ckpt.py``:
        saved activations 71.6 MiB counted, the unprofiled job's whole step peak 44 MiB, profiled steps 33 % faster)."""
        if self._hooks is None:
            return None
        import torch

        ag = torch._C._autograd
        above = []
        while (top := ag._top_saved_tensors_default_hooks(False)) is not None and top[0] != self._pack:
            above.append(top)
            ag._pop_saved_tensors_default_hooks()
        if top is not None:
            ag._pop_saved_tensors_default_hooks()
        for pack, unpack in reversed(above):
            ag._push_saved_tensors_default_hooks(pack, unpack)
        return above if top is not None else None

    def resume(self, above: list | None) -> None:
        """Put this counter's hooks back where ``pause`` took them from (under ``above``)."""
        if above is None:
            return
        import torch

        ag = torch._C._autograd
        for _ in above:
            ag._pop_saved_tensors_default_hooks()
        ag._push_saved_tensors_default_hooks(self._pack, _unpack)
        for pack, unpack in reversed(above):
            ag._push_saved_tensors_default_hooks(pack, unpack)

    def backward_starting(self, tensors: Any) -> None:
        """``torch.autograd.backward`` is called on ``tensors`` (the loss): size the graph between them and the model's output."""
        if self._recording():
            self._backward_ran = True
        if self._recording() and self._mark >= 0:  # the loss's nodes: outside the layers
            try:
                self._count_nodes(_OUTSIDE, tensors)
                self._mark = -1
                self._last_loss = ([weakref.ref(t) for t in output_tensors(tensors)], self._forward_nodes)
            except Exception as err:  # noqa: BLE001
                self._fail(err, "backward start (autograd nodes)")
        if self._recording() and self._loss.armed:
            try:
                self._loss.backward_starting(tensors, self._param_ptrs)
            except Exception as err:  # noqa: BLE001
                self._fail(err, "backward start (loss graph)")

    def end_step(self, layers: list[str]) -> None:
        """The step ended: its loss backward's peak joins its figures, and each figure the most per layer path."""
        self._fold()
        for done, now in zip(self._passes, self._figures()):
            now.update(done)
        if self._loss.peak:
            self._step[_LOSS] = self._loss.peak
        if self._loss.saved:
            self._step[_LOSS_FWD] = self._loss.saved
        for path, nb in self.step_bytes(layers).items():
            self.most[path] = max(self.most.get(path, 0), nb)
        for mine, step in ((self.most_gathered, self._step_gathered), (self.most_output, self._step_output), (self.most_input, self._step_input),
                          (self.most_nodes, self._step_nodes)):
            for k, nb in step.items():
                path = _key(layers, k)
                mine[path] = max(mine.get(path, 0), nb)
        for unit, nb in self._step_unit.items():
            self.most_unit_outside[unit] = max(self.most_unit_outside.get(unit, 0), nb)

    def _figures(self) -> list[dict]:
        """This pass's figures, each a dict per layer (or unit), in the order ``_passes`` keeps their step's most."""
        return [self._step, self._step_gathered, self._step_output, self._step_unit, self._step_nodes, self._step_input]

    def _fold(self) -> None:
        """The pass that ran ends (a new forward follows its backward, or the step ends): its figures join the step's
        earlier passes' (``_passes``, the most per key) and the next pass counts from nothing."""
        for done, now in zip(self._passes, self._figures()):
            for k, nb in now.items():
                done[k] = max(done.get(k, 0), nb)
            now.clear()
        self._seen.clear()
        self._backward_ran = False

    def step_bytes(self, layers: list[str]) -> dict[str, int]:
        """This step's bytes by layer path (``layers``: the collector's, by index)."""
        return {_key(layers, k): nb for k, nb in self._step.items()}

    def stop(self) -> None:
        """The window ends or profiling failed: hooks off (a forward that raised left them on), nothing held."""
        self.forward_ends()
        self._layer_stack.clear()
        self._unit_stack.clear()
        self._loss.release()

    def _pack(self, tensor: Any) -> Any:
        """saved_tensors_hooks pack hook: count the activation memory each layer keeps for backward
        (each storage once per step, parameters excluded); the tensor itself is kept unchanged."""
        if self._recording():
            try:
                storage = local_tensor(tensor).untyped_storage()
                key = storage._cdata  # not its address: FSDP frees a gathered weight it saved (resize to 0), and the address is reused
                if key not in self._seen and storage.data_ptr() not in self._param_ptrs:
                    self._seen.add(key)
                    layer = self._layer_stack[-1] if self._layer_stack else _OUTSIDE  # between leaf modules (loss, functional ops)
                    self._step[layer] = self._step.get(layer, 0) + storage.nbytes()
                    if key in self._gathered:
                        self._step_gathered[layer] = self._step_gathered.get(layer, 0) + storage.nbytes()
                    if layer == _OUTSIDE and self._unit_stack:
                        unit = self._unit_stack[-1]
                        self._step_unit[unit] = self._step_unit.get(unit, 0) + storage.nbytes()
            except Exception as err:  # noqa: BLE001
                self._fail(err, "saved-tensor hook")
        return tensor


def _key(layers: list[str], layer: int) -> str:
    return layers[layer] if layer >= 0 else {_OUTSIDE: SAVED_OUTSIDE_LAYERS, _OUTPUT: MODEL_OUTPUT, _LOSS: LOSS_BACKWARD,
                                             _LOSS_FWD: LOSS_FORWARD, _PREVIOUS: PREVIOUS_GRAPH}[layer]


def _unpack(tensor: Any) -> Any:
    return tensor
