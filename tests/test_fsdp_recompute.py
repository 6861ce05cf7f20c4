"""Activation checkpointing inside an FSDP2 unit's forward is no gradient accumulation: ``tests/data/fsdp/gpt-ckpt``
(``bench/fsdp_fresh/gpt_tied_ckpt.py``: each GPT block calls ``torch.utils.checkpoint`` in its forward, so its layers run
forward again inside the backward) is one forward+backward pass a step, while the accumulating recordings keep theirs."""
from __future__ import annotations

import shutil

from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import Passes, fsdp_collectives
from dagprof.passes.fsdp_units import merge_units
from dagprof.search.fsdp_memory import _Job, fsdp_peak
from dagprof.traces.dagprof_run import read_run

GPT, NESTED, VGG = DATA / "fsdp" / "gpt-ckpt", DATA / "fsdp" / "accum-nested", DATA / "fsdp" / "hsdp-vgg-accum"
GNN, GNN_FIRST = DATA / "fsdp-fresh" / "gnn-ckpt-eval", DATA / "fsdp-fresh" / "gnn-ckpt-first"


def test_recomputed_forwards_do_not_start_micro_batches():
    g = build_graph(read_run(GPT))
    assert Passes(g).most_micro_batches() == 1
    assert Passes(build_graph(read_run(NESTED))).most_micro_batches() == 2  # real accumulation still counts
    # 3 micro-batches, though the first conv's backward was not recorded in the last two (its input needs no gradient)
    assert Passes(build_graph(read_run(VGG))).most_micro_batches() == 3
    # held out: checkpoint_wrapper layers (bench/fsdp_fresh/gnn_ckpt_eval.py) read as 5 passes, their peak 26.23 MiB
    # against 23.6 measured; then 22.94, as before accumulation was modelled (recorded again: see the test below)
    g = build_graph(read_run(GNN))
    assert Passes(g).most_micro_batches() == 1


def test_a_checkpointed_first_module_recomputes_no_micro_batch():
    """The model's first module checkpoint-wrapped (``gnn_ckpt_eval.py --checkpoint-first``: a stem of two linear layers):
    its recomputation at the backward's end begins with the model's first layer, as a new pass does, and read as a second
    micro-batch a step; it runs the stem's layers only, where a pass runs on to the head."""
    g = build_graph(read_run(GNN_FIRST))
    assert g.layers[0].startswith("encode.") and Passes(g).most_micro_batches() == 1
    assert not any(_Job(g, None, None, Passes(g).most_micro_batches() > 1).accumulated)


def test_no_phantom_accumulated_gradients_in_the_peak():
    """At the loss's backward only the root's bf16 parameters are gathered (fully_shard keeps the root after forward);
    before, every unit's fp32 gradients were held there as if accumulated from earlier micro-batches (+4.06 MiB, +21 %,
    on the 4-block job)."""
    g = build_graph(read_run(GPT))
    assert not any(_Job(g, None, None, Passes(g).most_micro_batches() > 1).accumulated)
    root = next(u for u in g.meta.fsdp.units if u.name == "<root>")
    for p in fsdp_peak(g).values():
        assert p.at == "loss backward" and p.gathered == root.numel * 2


def test_merge_2_merges_the_checkpointed_blocks_reduce_scatters():
    g = build_graph(read_run(GPT))
    m = merge_units(g, "merge:2")
    steps = {int(g.step[c.node]) for c in fsdp_collectives(g)}
    rs = [c.unit for c in fsdp_collectives(m) if c.kind.label == "reduce_scatter"]
    assert sorted(rs) == sorted(["<root>", "h.0, h.1"] * len(steps))


def test_a_recomputed_block_holds_what_its_recomputation_saved():
    """A checkpointed layer saves nothing in forward, and no saved-tensor hook sees what its recomputation saves in
    backward: the profile records what each layer received (``layer_input_bytes``), and a layer that saved nothing holds
    that from its block's recomputation to its own backward. ``gnn_ckpt_eval.py --checkpoint-first`` (500 nodes, 4000
    edges) peaked in a block's backward at 29.12-29.15 MiB (``--memory``, steps after the first), with its `msg` layer's
    recomputed 5.86 MiB input alive; read 21.31 without it (-27 %), now 27.17 (-6.7 %)."""
    g = build_graph(read_run(GNN_FIRST))
    assert round(g.meta.fsdp.layer_input_bytes["layers.1._checkpoint_wrapped_module.msg"] / 2**20, 2) == 5.86
    for p in fsdp_peak(g).values():
        assert p.at.startswith("backward of layers.") and abs(p.total / (29.13 * 2**20) - 1) < 0.10


def test_an_evaluation_forward_adds_nothing_to_the_layers_inputs_and_outputs():
    """``gnn_ckpt_eval.py --eval-every 2`` (600 nodes, 2400 edges): its evaluation forward under no_grad ran in the same
    step as a training forward, and each layer's output and input bytes were the two forwards' sum (`msg`: 3.52 MiB
    returned where it returns 2400 x 192 fp32, 1.76 MiB), which had put the gradients in flight twice as large; a no_grad
    forward makes nothing for backward and now counts nothing. Its peak reads 22.55 MiB against 23.57-23.61 measured
    (``--memory``, steps after the first; 19.03 with the recomputed inputs left out)."""
    g = build_graph(read_run(GNN))
    msg = "layers.1._checkpoint_wrapped_module.msg"
    assert g.meta.fsdp.layer_output_bytes[msg] == 2400 * 192 * 4 and g.meta.fsdp.layer_input_bytes[msg] == 2400 * 384 * 4
    for p in fsdp_peak(g).values():
        assert abs(p.total / (23.59 * 2**20) - 1) < 0.10


def test_a_forward_only_fsdp_teacher_beside_the_student_is_read_and_said_as_each_steps_own(tmp_path):
    """DINO (``bench/fsdp_fresh/dino_ema_teacher.py``): a teacher FSDP2 model run forward only under no_grad each step,
    and the user's all-reduce of its centre each step. The zero-code collector attaches to the first FSDP root to run a
    forward, here the teacher, so each rank-step holds forwards and no backward (the student is not timed: open), which
    made ``Passes`` index an empty array (every what-if and optimize: IndexError); the two warnings advised a
    ``--steps`` window without them, which no window of this loop is."""
    from dagprof.cli.main import main  # noqa: PLC0415
    from dagprof.pipeline import open_run  # noqa: PLC0415

    run = DATA / "fsdp-fresh" / "dino-teacher"
    passes = Passes(build_graph(read_run(run)))
    assert passes.most_micro_batches() == 1
    said = open_run(run).warnings
    every = [w for w in said if "every step ran them" in w]
    assert len(every) == 2 and not [w for w in said if "(--steps) times training alone" in w]
    assert any("a frozen teacher's or a target network's forward each step?" in w for w in every)
    copy = tmp_path / "dino"  # whatif writes its timelines beside the run
    shutil.copytree(run, copy)
    assert main(["whatif", str(copy), "--bandwidth", "200Mbit", "--json"]) == 0
