"""Two ``fully_shard`` roots in one job (DINO's teacher and student, a GAN's generator and discriminator): the zero-code
collector times every root; the units of a root it did not attach (``dino-roots``: recorded before it attached more than
the first; ``dino-teacher``: a file from before the field) are said and marked, never silently read as the profiled model's."""
from __future__ import annotations

import shutil

import pytest
from testdata import DATA

from dagprof.analysis import analyze
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.fsdp import set_reshard
from dagprof.passes.fsdp_units import unit_groups
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.run_schema import FSDP_ROOT

ROOTS, OLD = DATA / "fsdp-fresh" / "dino-roots", DATA / "fsdp-fresh" / "dino-teacher"
BOTH, GAN = DATA / "fsdp-fresh" / "dino-both", DATA / "fsdp-fresh" / "gan-roots"
LATE = DATA / "fsdp-fresh" / "gan-late"  # the discriminator sharded after the generator's first forward (``--late-disc``)


def test_a_second_roots_units_are_recorded_as_untimed_and_said_once():
    """The zero-code collector attached the teacher (first forward); the student's 5 units are marked with its class and
    run no timed layer, and every command's warnings say so in one line."""
    units = read_run(ROOTS).ranks[0].meta.fsdp.units
    assert [u.untimed_root for u in units] == [""] * 5 + ["ViT"] * 5
    assert all(not u.layers for u in units[5:]) and units[5].name == FSDP_ROOT
    said = [w for w in open_run(ROOTS).warnings if "FSDP units of" in w]
    assert len(said) == 1 and said[0].startswith("5 FSDP units of 1 fully_shard root(s) besides the profiled model (ViT) ran untimed")


def test_a_file_from_before_the_field_is_said_by_its_repeated_unit_names():
    """The older recording has no ``untimed_root``: the student's units repeat the teacher's names."""
    said = [w for w in open_run(OLD).warnings if "FSDP units of" in w]
    assert len(said) == 1 and "(a root's class not recorded)" in said[0]


@pytest.mark.parametrize("run", [ROOTS, OLD])
def test_what_ifs_that_re_lay_units_refuse_in_one_line_and_link_ones_answer(run, tmp_path):
    g = build_graph(read_run(run))
    assert [u.untimed_root != "" for u in g.meta.fsdp.units] == [False] * 5 + [True] * 5
    for what in (lambda: unit_groups(g, "merge:2"), lambda: set_reshard(g, False)):
        with pytest.raises(DagprofError, match="5 FSDP units belong to a fully_shard root besides the profiled model"):
            what()
    copy = tmp_path / "dino"  # whatif writes its timelines beside the run
    shutil.copytree(run, copy)
    assert main(["whatif", str(copy), "--bandwidth", "200Mbit", "--json"]) == 0
    assert main(["whatif", str(copy), "--data-parallel", "ddp"]) != 0
    assert main(["optimize", str(copy)]) != 0


@pytest.mark.parametrize("run, units, rel", [(BOTH, 10, 2e-3), (GAN, 7, 1e-6), (LATE, 7, 1e-3)])
def test_every_root_is_timed_its_units_named_by_its_layers_prefix(run, units, rel):
    """The second root (DINO's student, sharded before the teacher's first forward; the GAN's discriminator, and the same
    sharded only after the generator's first forward, attached at its own first forward) is attached too: its layers and
    units read beside the first's, prefixed, each unit running its own root's layers. Replay of the measured
    configuration: exact up to clock alignment (DINO's residual skew, median 2.3 ms, leaves +0.14 %)."""
    t = read_run(run).ranks[0]
    us = t.meta.fsdp.units
    assert len(us) == units and {u.root for u in us} == {0, 1} and not any(u.untimed_root for u in us)
    for u in us:
        prefix = f"FSDP{'ViT' if run == BOTH else 'Sequential'}1."
        assert u.layers and all(t.layers[i].startswith(prefix) == (u.root == 1) for i in u.layers)
        assert u.name.startswith(prefix.rstrip(".")) == (u.root == 1)
    assert not [w for w in open_run(run).warnings if "FSDP units of" in w]
    g = build_graph(read_run(run))
    a = analyze(g, replay(g))
    for r, measured in a.measured_iter_us.items():
        assert a.predicted_iter_us[r] == pytest.approx(measured, rel=rel)
    assert all(len({g.meta.fsdp.units[[u.name for u in us].index(n)].root for n in grp}) == 1
               for us in [g.meta.fsdp.units] for grp in unit_groups(g, "merge:2"))  # within a root (test_fsdp_roots_whatifs)
