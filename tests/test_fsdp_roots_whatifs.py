"""What-ifs that re-lay FSDP units on a job of several timed ``fully_shard`` roots (DINO's trained student beside its
forward-only EMA teacher; a GAN's generator and discriminator): each root's units are re-laid within that root, a
forward-only root keeps FSDP2's rules for it, and what is not modelled root by root is refused in one line."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import fsdp_collectives
from dagprof.passes.fsdp import set_reshard
from dagprof.passes.fsdp_to_ddp import fsdp_to_ddp
from dagprof.passes.fsdp_units import merge_units, unit_groups
from dagprof.search.fsdp_memory import fsdp_peak, root_phases
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.run_schema import FSDP_ROOT

DINO, GAN, A2C = DATA / "fsdp-fresh" / "dino-both", DATA / "fsdp-fresh" / "gan-roots", DATA / "fsdp-fresh" / "a2c-roots"


@pytest.fixture(scope="module")
def dino():
    return build_graph(read_run(DINO))


@pytest.fixture(scope="module")
def gan():
    return build_graph(read_run(GAN))


def _gathers(g) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in fsdp_collectives(g):
        if c.kind == CommKind.ALL_GATHER:
            out[c.unit] = out.get(c.unit, 0) + 1
    return out


def test_each_roots_own_unit_is_a_root(dino, gan):
    assert [u.name for u in dino.meta.fsdp.units if u.is_root] == [FSDP_ROOT, "FSDPViT1"]
    assert not [u for u in gan.meta.fsdp.units if u.is_root]  # nn.Sequential roots with no parameters of their own


def test_units_merge_within_their_root_only(dino, gan):
    assert unit_groups(gan, "merge:2") == [["0", "1"], ["2", "3"], ["FSDPSequential1.0", "FSDPSequential1.1"], ["FSDPSequential1.2"]]
    assert unit_groups(dino, "merge:all") == [[u.name for u in dino.meta.fsdp.units[:5]], [u.name for u in dino.meta.fsdp.units[5:]]]
    with pytest.raises(DagprofError, match="joins units of two fully_shard roots"):
        unit_groups(gan, "3+FSDPSequential1.0")
    merged = merge_units(dino, "merge:all")
    assert [u.name for u in merged.meta.fsdp.units] == [FSDP_ROOT, "FSDPViT1"]
    # one all-gather a forward (and per backward pass) of each root, as fully_shard on each root alone runs
    assert set(_gathers(merged)) == {FSDP_ROOT, "FSDPViT1"}


def test_reshard_off_gathers_as_fsdp2_would(dino, gan):
    """FSDP2 skips the all-gather of a unit still unsharded: the EMA teacher has no backward to reshard it, so kept, its
    blocks are never gathered again (its root, resharded by the user's ``teacher.reshard()`` each step, still is); the
    student run forward per crop size gathers once in forward and once more in backward, after its first branch's
    post-backward resharded it; the discriminator (forward on real and fake, then on fake again) 3 times a step. The
    counts a profile of each job run with ``reshard_after_forward=False`` recorded (``roots62`` in docs/evidence.md)."""
    steps = len(dino.meta.steps)
    before, after = _gathers(dino), _gathers(set_reshard(dino, False))
    assert all(after.get(f"blocks.{k}", 0) == 0 for k in range(4)) and after[FSDP_ROOT] == before[FSDP_ROOT]
    assert before["FSDPViT1.blocks.0"] == 4 * steps and after["FSDPViT1.blocks.0"] == 2 * steps
    after = _gathers(set_reshard(gan, False))
    assert [after[u] / len(gan.meta.steps) for u in ("0", "FSDPSequential1.0", "FSDPSequential1.1", "FSDPSequential1.2")] == [1, 2, 3, 3]


def test_memory_sums_the_roots(dino):
    """Both roots' parameter shards are in the peak (the teacher's too), and the optimizer state the student's alone has."""
    m = fsdp_peak(dino)[0]
    assert m.params == sum(u.shard_bytes for u in dino.meta.fsdp.units) == dino.meta.fsdp.memory[0].param_shard_bytes
    assert m.optimizer == dino.meta.fsdp.memory[0].optim_state_bytes


def test_ddp_buckets_refuse_in_one_line_and_the_unit_what_ifs_answer(tmp_path, capsys):
    """Re-laying DDP's buckets on several roots is refused in one line; the unit what-ifs answer (``optimize`` searches
    them: tests/test_fsdp_roots_optimize.py)."""
    copy = shutil.copytree(GAN, tmp_path / "gan")
    assert main(["whatif", str(copy), "--data-parallel", "ddp", "--bucket-mb", "1"]) != 0  # re-lays one reducer's buckets
    assert "with --bucket-mb or --no-overlap" in capsys.readouterr().err
    for args in (["--reshard-after-forward", "off"], ["--units", "merge:2"], ["--workers", "4", "--cores", "2"], ["--data-parallel", "ddp"]):
        assert main(["whatif", str(copy), *args, "--json", "--no-trace"]) == 0


def _ddp_allreduces(g) -> list[tuple[int, int]]:
    """(step, bytes) of every bucket all-reduce of a DDP graph."""
    sel = (g.kind == Kind.COMM) & (g.comm_kind == CommKind.ALL_REDUCE) & (g.bucket >= 0)
    return [(int(g.step[v]), int(g.nbytes[v])) for v in np.flatnonzero(sel)]


def test_ddp_conversion_buckets_each_model_in_each_backward_that_reaches_it(dino, gan):
    """DDP wraps each trained model alone: its own reducer and buckets, all-reduced in every backward that reaches its
    parameters and waited for at that backward's end. The GAN's discriminator takes two backwards a step (its loss's,
    then the generator's through it), the generator one; DINO's no-grad EMA teacher none. No FSDP collective stays."""
    for g, second, per_step, passes in ((gan, "FSDPSequential1.", (1, 2), 2), (dino, "FSDPViT1.", (0, 1), 1)):
        grad = g.meta.fsdp.layer_grad_bytes
        first_bytes, second_bytes = sum(nb for x, nb in grad.items() if not x.startswith(second)), sum(nb for x, nb in grad.items() if x.startswith(second))
        out = fsdp_to_ddp(g)
        assert out.meta.fsdp is None and set(out.comm_kind[out.kind == Kind.COMM].tolist()) == {CommKind.ALL_REDUCE}
        for step in g.meta.steps:
            moved = sum(nb for s, nb in _ddp_allreduces(out) if s == step)
            assert moved == per_step[0] * first_bytes + per_step[1] * second_bytes
            finals = [v for v in np.flatnonzero((out.step == step) & (out.rank == 0)) if out.node_name(v).endswith("ddp finalize (wait for buckets)")]
            assert len(finals) == passes


def test_peak_memory_of_several_roots_says_what_it_assumes(tmp_path, capsys):
    """The peak on several roots assumes when each root's gradients are freed (the two-root jobs measured -10 to +9 %):
    the what-if says so beside its peaks, and a one-root job's output carries no such line."""
    copy = shutil.copytree(GAN, tmp_path / "gan")
    assert main(["whatif", str(copy), "--reshard-after-forward", "off", "--no-trace"]) == 0
    out = capsys.readouterr().out
    assert "2 fully_shard roots: the peak per rank counts each root's activations" in out and "ddp row" not in " ".join(out.split())
    assert main(["whatif", str(copy), "--data-parallel", "ddp", "--no-trace"]) == 0
    assert "a --data-parallel ddp row's peak counts every model's activations at once" in " ".join(capsys.readouterr().out.split())
    one = shutil.copytree(DATA / "fsdp-fresh" / "vit-save", tmp_path / "one")
    assert main(["whatif", str(one), "--reshard-after-forward", "off", "--no-trace"]) == 0
    assert "fully_shard roots" not in capsys.readouterr().out


def test_roots_whose_activations_never_meet_peak_apart(dino):
    """The actor-critic's critic runs forward and backward before the actor's forward: two phases, its peak (the actor's
    backward) holds the actor's activations without the critic's (every layer's together is 4.0 MB) and the critic's
    gradient shards; the GAN's generator lives through the discriminator's steps (one phase) and DINO's forward-only
    teacher joins the student's."""
    a2c = build_graph(read_run(A2C))
    assert sorted(map(sorted, root_phases(a2c))) == [[0], [1]]
    assert root_phases(build_graph(read_run(GAN))) == [frozenset({0, 1})] and root_phases(dino) == [frozenset({0, 1})]
    fs = a2c.meta.fsdp
    every = sum(v - (fs.layer_saved_gathered_bytes or {}).get(n, 0) for n, v in fs.layer_saved_bytes.items())
    critic = sum(u.shard_bytes * (u.grad_numel / u.numel) for u in fs.units if u.root == 0)
    for m in fsdp_peak(a2c).values():
        assert m.at.startswith("backward of FSDPTower1") and m.activations < 0.7 * every and m.grads == pytest.approx(critic)


def test_another_roots_gradient_shards_count_through_a_roots_backward():
    """A GAN's generator's gradient shards, kept from its last backward (the script zeroes them after the
    discriminator's step), are alive at the peak in the discriminator's backward."""
    g = build_graph(read_run(GAN))
    gen = sum(u.shard_bytes * (u.grad_numel / u.numel) for u in g.meta.fsdp.units if u.root == 0)
    for m in fsdp_peak(g).values():
        assert m.at.startswith("backward of FSDPSequential1") and m.grads >= gen
