"""The most tensor memory a CPU training step holds, measured (the memory benches' reference; needs torch).

``tensor_bytes``: the tensors a rank holds as a step starts, to add the heap's rise within it to. ``StepPeaks``: a fresh
script's ``--memory FILE`` in three lines.

A step's peak is the bytes of the tensors alive as it starts (parameters, gradients, optimizer state: read from the
tensors by the caller) plus the most the heap grew above its level then. The heap in use is glibc's ``mallinfo2`` (all
arenas and mmapped blocks: where the CPU allocator takes its memory), sampled after every aten op (a dispatch mode). Its
level itself is not the tensors': the math libraries keep their own buffers (about 19 MB above the tensors after a few
steps), so only its rise within a step counts. torch.profiler's memory events are not used: they miss frees made on
threads it does not profile (its counter grows by about one logits tensor per step on ``fsdp_train.py``).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
from typing import Any, Callable, Iterator


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]


class HeapPeak:
    """``with probe.step(alive):`` around each step; ``peaks`` holds each step's peak bytes. ``on_peak(func)`` runs
    whenever the heap reaches a new high within a step (``func``: the aten op just run), to say where it fell."""

    def __init__(self, on_peak: Callable[[Any], None] | None = None) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        self._mallinfo2 = libc.mallinfo2
        self.peaks: list[int] = []
        self._high = 0
        probe = self

        class Sample(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                now = probe.in_use()
                if now > probe._high:
                    probe._high = now
                    if on_peak is not None:
                        on_peak(func)
                return out

        self._mode = Sample

    def in_use(self) -> int:
        m = self._mallinfo2()
        return m.uordblks + m.hblkhd

    @contextlib.contextmanager
    def step(self, alive: int) -> Iterator[None]:
        """One step, ``alive`` bytes of tensors held as it starts."""
        start = self._high = self.in_use()
        with self._mode():
            yield
        self.peaks.append(alive + max(self._high, self.in_use()) - start)


def tensor_bytes(model: Any, opt: Any, ddp: bool) -> int:
    """This rank's parameters (its shards under FSDP), gradients and optimizer state, and under DDP the reducer's own flat
    buffer per bucket (``gradient_as_bucket_view=False``): every trained gradient's bytes once more."""
    def local(t) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    import torch

    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    buckets = sum(local(p) for p in params if p.requires_grad) if ddp else 0
    return sum(local(p) + (local(p.grad) if p.grad is not None else 0) for p in params) + sum(local(v) for v in state) + buckets


class Optimizers:
    """Several optimizers as one for ``StepPeaks`` (a job of two models: a GAN's, an actor's and a critic's): their state."""

    def __init__(self, *opts: Any) -> None:
        self.opts = opts

    @property
    def state(self) -> dict:
        return {k: v for o in self.opts for k, v in o.state.items()}


class StepPeaks:
    """A script's ``--memory FILE``: ``with peaks.step():`` around each training step (nothing without a file), then
    ``peaks.save(rank)`` writes each step's peak to ``FILE.<rank>`` as ``{"step_peak_bytes": [...]}``."""

    def __init__(self, path: str | None, model: Any, opt: Any, ddp: bool = False) -> None:
        self.path, self.model, self.opt, self.ddp = path, model, opt, ddp
        self.probe = HeapPeak() if path else None

    def step(self) -> contextlib.AbstractContextManager:
        return self.probe.step(tensor_bytes(self.model, self.opt, self.ddp)) if self.probe else contextlib.nullcontext()

    def save(self, rank: int) -> None:
        if self.probe is not None:
            with open(f"{self.path}.{rank}", "w") as f:
                json.dump({"step_peak_bytes": self.probe.peaks}, f)
