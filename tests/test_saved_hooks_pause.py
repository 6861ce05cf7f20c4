"""The saved-activation counter steps off the thread's saved-tensor hook stack for a collective without disturbing hooks
pushed above it. FSDP2 all-gathers a unit in its pre-forward, so under ``checkpoint(block, use_reentrant=False)`` with the
block a unit the stack holds checkpoint's hooks on top of ours: the pause popped checkpoint's and pushed ours back on top,
and the block ran its forward under our pack hook, which keeps every tensor: the window's steps ran without checkpointing
(``bench/fsdp_fresh/ctc_speech_ckpt.py``: predicted peak 79.0 MiB per rank, the job's measured 44.0)."""
from __future__ import annotations

import pytest

from dagprof.collect.hooks.saved_activations import SavedActivations

torch = pytest.importorskip("torch")


def _top():
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def test_pause_leaves_hooks_above_ours_in_place_and_resume_puts_ours_back_under_them():
    saved = SavedActivations(lambda: True, lambda err, where: (_ for _ in ()).throw(err), [])
    saved.forward_begins(None, ())
    packed = []
    other = torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t)
    other.__enter__()  # a checkpoint's hooks, pushed inside the forward
    mine = _top()
    above = saved.pause()
    assert _top() == mine  # still the checkpoint's on top
    x = torch.ones(3, requires_grad=True)
    (x * x).sum()  # saves x: the checkpoint's hook sees it, ours is off the stack
    assert packed
    saved.resume(above)
    assert _top() == mine
    other.__exit__(None, None, None)
    assert _top()[0] == saved._pack  # ours under it, as before the pause
    saved.forward_ends()
    assert _top() is None


def test_pause_without_hooks_on_is_a_no_op():
    saved = SavedActivations(lambda: True, lambda err, where: None, [])
    assert saved.pause() is None and _top() is None
    saved.resume(None)
    assert _top() is None
