"""FSDP2's ``reshard_after_forward=N`` (an int below the shard degree; ``bench/fsdp_fresh/intra_reshard.py``, 4 ranks,
each block resharded to 2 after forward: ``tests/data/fsdp-fresh/intra-reshard``). Its backward all-gathers run in
2-rank post-forward groups: the profile was refused as "a damaged file", then read as a 2x2 HSDP mesh (whatif crashed
shrinking it to one replica); now the unit records ``reshard_to``, the groups are no mesh dimension, those all-gathers
are priced on 2 ranks, peak memory holds the post-forward shards, and what the passes cannot regroup is refused."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import allreduce_equivalent_bytes, check_fsdp_edges, fsdp_collectives, issuers
from dagprof.passes.fsdp_mesh import scale_fsdp_workers
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.traces.dagprof_run import read_run

RUN = DATA / "fsdp-fresh" / "intra-reshard"


@pytest.fixture(scope="module")
def graph():
    return build_graph(read_run(RUN))


def test_units_and_groups(graph):
    units = {u.name: u for u in graph.meta.fsdp.units}
    assert sorted(units) == ["<root>", "tower.0", "tower.1"]  # `tower`, with no parameters of its own, is no unit
    assert units["tower.0"].reshard_to == 2 and units["<root>"].reshard_to == 0 and units["tower.0"].mesh == [4]
    par = graph.meta.parallel
    assert not par.dp_mesh and not par.hybrid and par.dp_size == 4  # not HSDP's 2x2
    sizes = {(c.kind.label, c.unit, len(issuers(graph, c.node))) for c in fsdp_collectives(graph) if c.unit != "<root>"}
    assert ("all_gather", "tower.0", 2) in sizes and ("all_gather", "tower.0", 4) in sizes and ("reduce_scatter", "tower.0", 4) in sizes


def test_post_forward_gathers_priced_on_their_group(graph):
    ag = [c for c in fsdp_collectives(graph) if c.kind.label == "all_gather" and c.unit == "tower.0"]
    two = next(c.node for c in ag if len(issuers(graph, c.node)) == 2)
    four = next(c.node for c in ag if len(issuers(graph, c.node)) == 4)
    assert graph.nbytes[two] == graph.nbytes[four]  # the same gathered bytes
    eq = allreduce_equivalent_bytes(graph, np.array([two, four]))
    assert eq[0] / eq[1] == pytest.approx((1 / 2) / (3 / 4))  # (k-1)/k of them cross each link


def test_peak_holds_post_forward_shards(graph):
    fs = graph.meta.fsdp
    plain = graph.replace(meta=graph.meta.replace(fsdp=dataclasses.replace(fs, units=[dataclasses.replace(u, reshard_to=0) for u in fs.units])))
    with_post, without = fsdp_peak(graph)[0].total, fsdp_peak(plain)[0].total
    block = next(u for u in fs.units if u.name == "tower.0").numel * 4
    assert with_post > without and with_post - without <= 2 * block / 2 + 1  # at most both blocks' halves alive
    assert fsdp_peak(graph, reshard=False)[0].at  # off: kept whole, no post-forward shard


@pytest.mark.parametrize("flags", [["--workers", "3"], ["--mesh", "2x2"], ["--units", "merge:all"], ["--reshard-after-forward", "on"]])
def test_unmodelled_whatifs_refused_in_one_line(flags, capsys):
    assert main(["whatif", str(RUN), *flags, "--allow-model-error", "--no-trace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reshard_after_forward=2" in err[0] and flags[0] in err[0]


def test_more_workers_keep_post_forward_groups(graph):
    """FSDP2 keeps the int: on 8 ranks the backward all-gathers still run in 2-rank groups (the shard mesh viewed as rows of
    2), the forward ones and the reduce-scatters in all 8; each priced on its ring. Before, --workers was refused."""
    out = scale_fsdp_workers(graph, 8)
    ag = [c for c in fsdp_collectives(out) if c.kind.label == "all_gather" and c.unit == "tower.0"]
    share = {len(issuers(out, c.node)) / out.world_size: allreduce_equivalent_bytes(out, np.array([c.node]))[0] / out.nbytes[c.node]
             for c in ag}
    assert share == pytest.approx({1 / 2: 0.5 * (1 / 2) / (7 / 8), 1.0: 0.5})  # copies of {0,1} and {2,3}; all 8


def test_fewer_workers_make_the_int_true(graph):
    """On 2 ranks reshard_after_forward=2 is the shard degree: FSDP2 makes it True. The ranks kept are 0 and 1; the
    2-rank groups of ranks 2 and 3 go (no rank joins them), and no post-forward shard stays beside the unit's own."""
    out = scale_fsdp_workers(graph, 2)
    assert out.world_size == 2 and all(sorted(issuers(out, c.node)) == [0, 1] for c in fsdp_collectives(out))
    assert check_fsdp_edges(out)["backward_all_gather_after_reshard"] > 0
    tower = build_graph(read_run(TOWER))
    assert fsdp_peak(tower, workers=2)[0].total / 2**20 == pytest.approx(18.93, rel=0.01)  # measured below


def test_reshard_off_answered(capsys):
    assert main(["whatif", str(RUN), "--reshard-after-forward", "off", "--allow-model-error", "--json", "--no-trace"]) == 0
    out = capsys.readouterr().out
    assert '"memory_per_rank"' in out


# the same script at its default size (``tests/data/fsdp-fresh/intra-tower``: 4 blocks of 2.0 MiB), its peak per rank measured
# with ``--memory`` (``bench/heap_peak.py``, 4 ranks x 11 steps after the first, 2026-12-04, load 8-11): as profiled
# (reshard_after_forward=2) median 15.69 MiB, and run with ``--reshard false`` median 17.16 MiB, every step at the last
# block's forward all-gather copy-out (``foreach_all_gather_copy_out``); on 2 ranks (``--workers 2``) median 18.93 MiB
# (2 ranks x 11 steps)
TOWER = DATA / "fsdp-fresh" / "intra-tower"
MEASURED_MIB = {None: 15.69, False: 17.16}


@pytest.mark.parametrize("reshard", [None, False])
def test_tower_peak_against_measured(reshard):
    g = build_graph(read_run(TOWER))
    peak = fsdp_peak(g, reshard=reshard)
    mib = peak[0].total / 2**20
    assert mib == pytest.approx(MEASURED_MIB[reshard], rel=0.01)
    if reshard is False:  # the units kept gathered, the last one's all-gather output (twice on gloo) and its copy beside
        assert peak[0].at == "all-gather of tower.3 (forward copy-out)"
