"""Under gradient accumulation the saved activations per layer are one forward+backward pass's, not the step's sum: each
micro-batch's backward frees what its forward saved. Summed, ``bench/fsdp_fresh/hsdp_vgg_accum.py`` (3 micro-batches
with ``set_requires_gradient_sync(False)``) read 3x its activations: a predicted peak of 31.03 MiB per rank against 13.24
measured. Two forwards before one backward (both alive at once) still add up."""
from __future__ import annotations

import pytest

from dagprof.collect.hooks.saved_activations import SavedActivations

torch = pytest.importorskip("torch")

LAYERS = ["lin"]


def _forward(saved: SavedActivations, x):
    """One root forward of a layer that saves its input (``x``: 4 x 256 float32, 4 KiB) for backward."""
    w = torch.ones(256, 8, requires_grad=True)
    saved.forward_begins(None, ())
    saved.enter(0)
    y = x @ w
    saved.leave(0, y)
    saved.forward_ends(None, (), y)
    return y.sum()


def _step(passes: list[int]) -> dict[str, int]:
    """One step: ``passes`` lists, per pass, how many forwards run before its backward."""
    saved = SavedActivations(lambda: True, lambda err, where: (_ for _ in ()).throw(err), [])
    saved.new_step()
    for forwards in passes:
        losses = [_forward(saved, torch.randn(4, 256)) for _ in range(forwards)]
        total = sum(losses)
        saved.backward_starting(total)
        total.backward()
    saved.end_step(LAYERS)
    return saved.step_bytes(LAYERS)


def test_accumulated_passes_count_once_each_and_concurrent_forwards_add_up():
    one = _step([1])["lin"]
    assert one == 4 * 256 * 4
    assert _step([1, 1, 1])["lin"] == one  # 3 micro-batches: was 3x
    assert _step([2])["lin"] == 2 * one  # two forwards alive together before one backward


def test_a_recording_of_three_micro_batches_saved_one_pass():
    """``tests/data/fsdp/hsdp-vgg-accum`` (``hsdp_vgg_accum.py --batch 4``, 3 micro-batches a step): the first BatchNorm
    saved its input once (4 x 16 x 32 x 32 float32, 256 KiB, and its 16-channel statistics), not 3 times."""
    from testdata import DATA

    from dagprof.graph.build import build_graph
    from dagprof.traces.dagprof_run import read_run

    g = build_graph(read_run(DATA / "fsdp" / "hsdp-vgg-accum"))
    assert g.meta.fsdp.layer_saved_bytes["features.0.1"] < 2 * 4 * 16 * 32 * 32 * 4
    assert g.meta.fsdp.layer_output_bytes["features.0.0"] == 4 * 16 * 32 * 32 * 4
