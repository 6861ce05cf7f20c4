"""The loss's backward: what the autograd graph between the model's output and the loss holds while it runs.

The collector's saved-tensor hook sees only the model's forward. The loss computed from its output afterwards
saves more (cross-entropy: the log-softmax of the logits) and its backward makes gradients as large as that
output (the log-softmax's and the logits'): with a large vocabulary the step peaks there. At a step's backward
(``torch.autograd.backward``, patched while the window records) the nodes made after the model's forward
(autograd sequence numbers above its outputs') are walked from the loss; each one's saved tensors are sized
(but the parameters' and the model output's, counted elsewhere; not matched against what the forward saved:
FSDP frees the gathered weights it saved, and their addresses are reused), and a hook on each node
sizes the gradients it takes and makes as it runs. The step's figure is the most bytes alive at once: saved
tensors of nodes not yet run plus the gradients in flight (those handed on to the model's output included).
Nothing is kept of the graph after its backward; an error disables profiling through ``fail``.
"""
from __future__ import annotations

from functools import partial, wraps
from typing import Any, Callable

from .tensors import local_tensor, output_storages, output_tensors

_MAX_NODES = 1000  # a loss graph larger than this (a regulariser over every parameter?) is sized in part, with a warning
_ACCUMULATE = "AccumulateGrad"  # a leaf's node: no saved tensors, sequence number 2**64 - 1


class LossGraph:
    """One step's loss-backward figure (``peak``, bytes) of one process."""

    def __init__(self, fail: Callable[[BaseException, str], None], warnings: list[str]) -> None:
        self._fail = fail
        self._warnings = warnings
        self._seq = -1  # the largest sequence number of the model output's nodes (-1: no forward since the last backward)
        self._outputs: set[int] = set()  # storages of what the model returned
        self._attrs: dict[type, list[str]] = {}  # node type -> its ``_saved_*`` attributes
        self._held: dict[int, list[int]] = {}  # node id -> the storages it saved, until it runs
        self._holders: dict[int, set[int]] = {}  # saved storage (its ``_cdata``) -> the nodes holding it that have not run
        self._bytes: dict[int, int] = {}  # saved storage -> its bytes
        self._remaining = 0
        self._live: dict[int, int] = {}  # storage -> bytes of gradients in flight
        self._handles: list[Any] = []
        self.peak = 0
        self.saved = 0  # the most bytes the loss's graph saved, as a backward of this step starts

    def new_step(self) -> None:
        self.peak = 0
        self.saved = 0
        self.release()
        self._seq = -1

    def forward_ended(self, output: Any) -> None:
        """The model's forward returned ``output``: nodes made from now on belong to the loss."""
        seqs = [y.grad_fn._sequence_nr() for y in output_tensors(output) if getattr(y, "grad_fn", None) is not None]
        self._seq = max(seqs, default=-1)
        self._outputs = set(output_storages(output))

    @property
    def armed(self) -> bool:
        """A model forward ended since the last backward began."""
        return self._seq >= 0

    def backward_starting(self, roots: Any, counted: set[int]) -> None:
        """Size the loss graph behind ``roots`` (what backward was called on) and hook its nodes; ``counted``: the
        parameters' storages."""
        if not self.armed:
            return
        self.release()
        seq, self._seq = self._seq, -1
        roots = [roots] if hasattr(roots, "grad_fn") else list(roots)
        stack = [t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None]
        seen_nodes: set[int] = set()
        counted = counted | self._outputs
        nodes = []
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen_nodes or type(node).__name__ == _ACCUMULATE or node._sequence_nr() <= seq:
                continue
            if len(nodes) == _MAX_NODES:
                self._warnings.append(f"dagprof: the loss graph has over {_MAX_NODES} nodes: its backward's memory is sized from the first {_MAX_NODES}")
                break
            seen_nodes.add(id(node))
            nodes.append(node)
            self._hold(node, id(node), counted)
            stack.extend(n for n, _ in node.next_functions)
        self._remaining = sum(self._bytes.values())
        self.saved = max(self.saved, self._remaining)
        self._handles = [n.register_hook(partial(self._ran, id(n))) for n in nodes]

    def _hold(self, node: Any, key: int, counted: set[int]) -> None:
        """Note the storages ``node`` saved (those not in ``counted``): each is released once every node holding it ran."""
        attrs = self._attrs.get(type(node))
        if attrs is None:
            names = dir(node)  # a built-in node's ``_saved_<input>``; a custom Function's ``saved_tensors``
            attrs = self._attrs[type(node)] = [a for a in names if a.startswith("_saved_")] + ["saved_tensors"] * ("_raw_saved_tensors" in names)
        for a in attrs:
            v = getattr(node, a)
            for t in (v if isinstance(v, (tuple, list)) else (v,)):
                if hasattr(t, "untyped_storage"):
                    storage = local_tensor(t).untyped_storage()
                    if storage.data_ptr() not in counted:
                        ptr = storage._cdata
                        self._holders.setdefault(ptr, set()).add(key)
                        self._bytes[ptr] = storage.nbytes()
                        self._held.setdefault(key, []).append(ptr)

    def _ran(self, key: int, grad_inputs: tuple, grad_outputs: tuple) -> None:
        """A loss node's backward ran: its saved tensors, what it took and what it made are all alive now."""
        try:
            took, made = _sizes(grad_outputs), _sizes(grad_inputs)
            self.peak = max(self.peak, self._remaining + sum({**self._live, **took, **made}.values()))
            for ptr in self._held.pop(key, ()):
                holders = self._holders[ptr]
                holders.discard(key)
                if not holders:
                    self._remaining -= self._bytes[ptr]
            for p in took:
                self._live.pop(p, None)
            self._live.update(made)
        except Exception as err:  # noqa: BLE001
            self._fail(err, "loss backward hook")

    def release(self) -> None:
        """Remove the hooks on the nodes (their graph may outlive the window: ``retain_graph``)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._held.clear()
        self._holders.clear()
        self._bytes.clear()
        self._live.clear()
        self._remaining = 0


def _sizes(grads: tuple) -> dict[int, int]:
    """storage -> bytes of the gradient tensors in ``grads`` (None where a gradient is absent)."""
    out = {}
    for g in grads:
        if g is not None:
            storage = local_tensor(g).untyped_storage()
            out[storage.data_ptr()] = storage.nbytes()
    return out


def patch_backward(before: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``before(tensors)`` as ``torch.autograd.backward`` (``Tensor.backward`` too) starts; returns the undo."""
    import torch.autograd

    original = torch.autograd.backward

    @wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        before(tensors)
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = backward
    return lambda: setattr(torch.autograd, "backward", original)
