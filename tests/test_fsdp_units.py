"""``whatif --units``: FSDP units merged coarser than profiled, on the recordings of tests/data/fsdp."""
from __future__ import annotations

import dataclasses
import json

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import Passes, check_fsdp_edges, fsdp_collectives, issuers
from dagprof.passes.fsdp_units import merge_units, parse_units, unit_groups
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run

FSDP = DATA / "fsdp"
RESHARD4, KEEP4, RESHARD, FSDP1 = FSDP / "reshard4", FSDP / "keep4", FSDP / "reshard", FSDP / "fsdp1"


def graph(path):
    return build_graph(read_run(path))


def by_kind(g):
    out: dict[str, list[int]] = {}
    for c in fsdp_collectives(g):
        out.setdefault(c.kind.label, []).append(int(g.nbytes[c.node]))
    return out


@pytest.mark.parametrize("path, spec", [(RESHARD4, "merge:2"), (RESHARD4, "merge:all"), (RESHARD4, "blocks.1+blocks.2"), (FSDP / "pairs4", "merge:all"),
                                        (KEEP4, "merge:2"), (KEEP4, "merge:all"), (RESHARD, "merge:all"), (FSDP1, "merge:2")])
def test_merging_conserves_bytes_drops_collectives_and_keeps_the_orderings(path, spec):
    g = graph(path)
    m = merge_units(g, spec)
    before, after = by_kind(g), by_kind(m)
    assert {k: sum(v) for k, v in after.items()} == {k: sum(v) for k, v in before.items()}
    assert len(fsdp_collectives(m)) < len(fsdp_collectives(g))
    assert sum(u.numel for u in m.meta.fsdp.units) == sum(u.numel for u in g.meta.fsdp.units)
    assert len(m.meta.fsdp.units) == len(unit_groups(g, spec)) < len(g.meta.fsdp.units)
    counts = check_fsdp_edges(m)  # raises on any ordering the merged graph lacks
    assert counts["forward_waits_all_gather"] > 0 and counts["reduce_scatter_after_backward"] > 0
    assert max(p.total for p in fsdp_peak(m).values()) >= max(p.total for p in fsdp_peak(g).values())


def test_merge_all_is_one_unit_one_gather_per_pass_one_reduce_scatter():
    g = graph(RESHARD4)
    m = merge_units(g, "merge:all")
    assert [u.name for u in m.meta.fsdp.units] == ["<root>"]
    steps = {int(g.step[c.node]) for c in fsdp_collectives(g)}
    kinds = [(c.kind.label, Passes(m).is_forward(c.node, min(issuers(m, c.node))) if c.kind.label == "all_gather" else None) for c in fsdp_collectives(m)]
    assert sorted(kinds, key=str) == sorted([("all_gather", True), ("all_gather", False), ("reduce_scatter", None)] * len(steps), key=str)


def test_the_merged_reduce_scatter_follows_the_last_members_backward():
    """blocks.0+blocks.1: the backward runs blocks.1 then blocks.0, so the merged reduce-scatter is blocks.0's, after blocks.0's backward."""
    g = graph(RESHARD4)
    m = merge_units(g, "blocks.0+blocks.1")
    rs = [c for c in fsdp_collectives(m) if c.kind.label == "reduce_scatter" and c.unit == "blocks.0, blocks.1"]
    orig = {int(g.step[c.node]): c for c in fsdp_collectives(g) if c.kind.label == "reduce_scatter" and c.unit == "blocks.0"}
    assert rs and all(m.nbytes[c.node] == 2 * g.nbytes[orig[int(m.step[c.node])].node] for c in rs)
    layers = {k for k, n in enumerate(m.layers) if n.startswith(("blocks.0.", "blocks.1."))}
    for c in rs:
        for r, issue in issuers(m, c.node).items():
            bwd = [v for v in range(len(m)) if m.rank[v] == r and m.step[v] == m.step[c.node] and m.kind[v] == 2 and m.layer[v] in layers]
            assert all(m.order[v] < m.order[issue] for v in bwd)


def test_memory_rises_with_coarser_units():
    g = graph(RESHARD4)
    peaks = [max(p.total for p in fsdp_peak(merge_units(g, s) if s else g).values()) for s in (None, "merge:2", "merge:all")]
    assert peaks[0] < peaks[1] < peaks[2]


def test_fsdp2_holds_the_last_units_all_gather_output_to_the_forwards_end():
    """FSDP2 frees a unit's all-gather output in forward only at the next unit's copy-out, the last one's at the root's
    post-forward: merged into the root, the whole model's output beside its gathered parameters as the forward ends
    (bench/fsdp_fresh/mae_pretrain.py --units root peaked there, its loss inside the forward); FSDP1 keeps none."""
    from dagprof.search.fsdp_memory import _full, _Job

    g = graph(RESHARD4)
    job = _Job(g, None, None)
    assert job.last_gather == _full(job.units[job.others[-1]]) > 0  # the last block gathered in forward
    m = merge_units(g, "merge:all")
    whole = _full(m.meta.fsdp.units[0])
    assert _Job(m, None, None).last_gather == whole
    peak = max(fsdp_peak(m).values(), key=lambda p: p.total)
    assert peak.at.startswith("forward end") and peak.gathered == pytest.approx(2 * whole)
    assert _Job(graph(FSDP1), None, None).last_gather == 0


def test_whatif_rows_give_time_and_memory_and_fewer_units_are_cheaper(capsys):
    assert main(["whatif", str(RESHARD4), "--units", "merge:1,merge:2,merge:all", "--no-trace", "--allow-model-error", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["scenarios"]
    assert [r["units"] for r in rows] == ["merge:1", "merge:2", "merge:all"]
    assert all(r["peak_memory_mb"] > 0 for r in rows)
    ms = [r["predicted_iter_ms"] for r in rows]
    mem = [r["peak_memory_mb"] for r in rows]
    assert ms[0] > ms[1] > ms[2] and mem[0] < mem[1] < mem[2]
    assert main(["whatif", str(RESHARD4), "--units", "blocks.0+blocks.1/blocks.2+blocks.3", "--no-trace", "--allow-model-error"]) == 0
    assert "MiB/rank" in capsys.readouterr().out


def test_merged_units_answer_reshard_after_forward_too():
    g = graph(RESHARD4)
    rows = evaluate(g, [Scenario(units="merge:2"), Scenario(units="merge:2", reshard_after_forward=False)], tolerance_pct=None)["scenarios"]
    assert rows[1].predicted_iter_ms < rows[0].predicted_iter_ms and rows[1].peak_memory_mb >= rows[0].peak_memory_mb


@pytest.mark.parametrize("spec, message", [
    ("split:blocks.0", "finer than profiled"),
    ("merge:0", "expected merge:N"),
    ("blocks.0+", "expected merge:N"),
])
def test_bad_specs_are_refused_in_one_line(capsys, spec, message):
    assert main(["whatif", str(RESHARD4), "--units", spec, "--no-trace"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize("path, spec, message", [
    (RESHARD4, "blocks.0+blocks.2", "not adjacent"),
    (RESHARD4, "blocks.9+blocks.0", "no unit 'blocks.9'"),
    (RESHARD4, "blocks.0+blocks.1/blocks.1+blocks.2", "named twice"),
    (DATA / "run_schema" / "v1", "merge:2", "not an FSDP job"),
])
def test_what_the_profile_cannot_answer_is_refused_in_one_line(capsys, path, spec, message):
    assert main(["whatif", str(path), "--units", spec, "--no-trace", "--allow-model-error"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_blocks_merged_into_fsdp1s_kept_root_keep_their_parameters():
    """FSDP1's root keeps its parameters after forward: with every block in it, no unit is gathered again in backward."""
    g = graph(FSDP1)
    m = merge_units(g, "merge:all")
    assert [(u.name, u.resharded_after_forward) for u in m.meta.fsdp.units] == [("<root>", False)]
    assert not [c for c in fsdp_collectives(m) if c.kind.label == "all_gather" and not Passes(m).is_forward(c.node, 0)]
    check_fsdp_edges(m)

    def forward_gathers(x):
        return sum(int(x.nbytes[c.node]) for c in fsdp_collectives(x) if c.kind.label == "all_gather" and Passes(x).is_forward(c.node, 0))

    assert forward_gathers(m) == forward_gathers(g) and sum(by_kind(m)["reduce_scatter"]) == sum(by_kind(g)["reduce_scatter"])
    assert sum(by_kind(m)["all_gather"]) < sum(by_kind(g)["all_gather"])  # the blocks' backward all-gathers are gone
    assert max(p.total for p in fsdp_peak(m).values()) > max(p.total for p in fsdp_peak(g).values())


def test_merging_units_that_reshard_differently_is_refused():
    g = graph(RESHARD4)
    fs = g.meta.fsdp
    units = [dataclasses.replace(u, resharded_after_forward=u.name != "blocks.1") for u in fs.units]  # as set_reshard({"blocks.1": False})
    g = g.replace(meta=g.meta.replace(fsdp=dataclasses.replace(fs, units=units)))
    with pytest.raises(DagprofError, match="blocks.0\\+blocks.1 mixes units that reshard after forward and units that keep"):
        merge_units(g, "merge:2")


def test_units_with_data_parallel_is_refused():
    with pytest.raises(DagprofError, match="--units with --data-parallel"):
        evaluate(graph(RESHARD4), [Scenario(units="merge:2", data_parallel="ddp")], tolerance_pct=None)


def test_parse_units_grammar():
    assert parse_units("merge:3") == "merge:3" and parse_units("merge:all") == "merge:all"
    assert parse_units("blocks.0+blocks.1/blocks.2+blocks.3") == "blocks.0+blocks.1/blocks.2+blocks.3"
    with pytest.raises(ValueError):
        parse_units("")


def test_merged_graph_has_the_collectives_of_a_job_that_shards_pairs_of_blocks():
    """``fsdp/pairs4`` is ``fsdp/reshard4``'s job with ``fully_shard([blocks.0, blocks.1])`` and ``([blocks.2, blocks.3])``:
    its recorded units, and per step its collectives (kind, pass, unit, prefetcher, bytes, in order), are what
    ``merge:2`` makes of the per-block recording."""
    m, real = merge_units(graph(RESHARD4), "merge:2"), graph(FSDP / "pairs4")

    def units(g):
        return [(u.name, u.numel, u.layers, u.resharded_after_forward) for u in g.meta.fsdp.units]

    def per_step(g):
        out: dict[int, list] = {}
        for c in sorted(fsdp_collectives(g), key=lambda c: g.order[issuers(g, c.node)[0]]):
            phase = Passes(g).is_forward(c.node, 0) if c.kind.label == "all_gather" else None
            out.setdefault(int(g.step[c.node]), []).append((c.kind.label, phase, c.unit, c.prefetched_by, int(g.nbytes[c.node])))
        return list(out.values())

    assert units(m) == units(real)
    assert per_step(m) == per_step(real)
    check_fsdp_edges(real)
