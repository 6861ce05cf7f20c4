"""``dagprof diff`` on graphs with a known change: matching, the exact bookkeeping of the attribution,
and where it puts the change (synthetic runs here; real DDP runs in test_diff_real.py)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from dagprof.align.clocks import align_clocks
from dagprof.analysis import analyze
from dagprof.analysis.diff import categories_vs_expected, diff_analyses, match_ops
from dagprof.analysis.diff.match import first_steps
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes import set_buckets
from dagprof.traces.events import Kind

from synthetic import ddp_run


def graph(**kw):
    run, _ = align_clocks(ddp_run(**kw))
    return build_graph(run)


def check_books(d):
    """Parts + interaction + structure = replayed change; + replay residual = measured change."""
    att = d.attribution
    assert sum(p.delta_us for p in att.parts) + att.interaction_us + att.structure_us == pytest.approx(att.delta_us, abs=1e-6)
    assert att.delta_us == pytest.approx(d.b.replayed_us - d.a.replayed_us, abs=1e-6)
    if d.measured_delta_us is not None:
        assert att.delta_us + d.replay_residual_us == pytest.approx(d.measured_delta_us, abs=1e-6)
    for p in att.parts:
        if p.breakdown:
            assert sum(q.delta_us for q in p.breakdown) + p.interaction_us == pytest.approx(p.delta_us, abs=1e-6)


def test_a_profile_against_itself_changes_nothing():
    a = analyze(graph())
    d = diff_analyses(a, a)
    assert d.match.fraction_a == d.match.fraction_b == 1.0
    assert d.attribution.parts == [] and d.attribution.delta_us == 0.0 and d.attribution.structure_us == 0.0
    assert d.notes == [] and d.unmatched == [] and d.adds_up
    assert all(o.delta_us == 0.0 for o in d.top_ops)


def test_one_slower_layer_is_found_exactly():
    g = graph(steps=4)
    slow = (g.kind == Kind.FORWARD) & (g.layer == g.layers.index("layer2"))
    d = diff_analyses(analyze(g), analyze(g.replace(dur=np.where(slow, g.dur + 40.0, g.dur))))
    check_books(d)
    top = d.attribution.parts[0]
    assert [p.label for p in d.attribution.parts] == ["forward"]  # nothing else changed
    assert top.breakdown_by == "layer" and top.breakdown[0].label == "layer2"
    assert top.breakdown[0].delta_us == pytest.approx(top.delta_us) == pytest.approx(40.0)  # on every rank's critical chain
    assert top.op_delta_us == pytest.approx(40.0)  # one call per step and rank, averaged over ranks
    assert d.attribution.structure_us == 0.0 and abs(d.attribution.interaction_us) < 1e-6
    assert d.top_ops[0].label == "fw.l2" and d.top_ops[0].delta_us == pytest.approx(40.0)
    assert d.category_rows()[0] == ("forward", pytest.approx(4 * 10.0), pytest.approx(4 * 10.0 + 40.0))  # 4 layers of 10 us


def test_slower_glue_is_framework_overhead_broken_down_by_op():
    g = graph(steps=3)
    wait = np.array(["wait" in g.node_name(v) for v in range(len(g))])
    d = diff_analyses(analyze(g), analyze(g.replace(gap=np.where(wait, g.gap + 30.0, g.gap))))
    check_books(d)
    top = d.attribution.parts[0]
    assert [p.label for p in d.attribution.parts] == ["framework overhead"] and top.breakdown_by == "op"
    assert top.breakdown[0].label == "wait" and top.delta_us == pytest.approx(30.0)


def test_a_straggler_rank_is_named_and_others_wait_for_it():
    d = diff_analyses(analyze(graph()), analyze(graph(slow={1: 2.0})))
    check_books(d)
    parts = {p.label: p for p in d.attribution.parts}
    assert set(parts) <= {"forward", "backward", "communication", "framework overhead", "optimizer"}
    top = d.attribution.parts[0]
    assert top.label in ("forward", "backward") and top.by_rank[0].label == "rank 1"
    waits_b = {r.rank: r.wait_us for r in d.b.analysis.ranks}
    assert waits_b[0] > waits_b[1] and d.b.straggler_wait_max_us > d.a.straggler_wait_max_us


def test_other_buckets_are_structure_not_timing():
    g = graph(steps=3)
    a = analyze(g)
    b = analyze(set_buckets(g, 1.0))  # every gradient in its own bucket
    d = diff_analyses(a, b, a_measured=False)
    check_books(d)
    assert any("gradient buckets differ" in n for n in d.notes)
    parts = {p.label: p.delta_us for p in d.attribution.parts}
    assert parts.get("forward", 0.0) == 0.0 and parts.get("backward", 0.0) == 0.0  # compute untouched by the pass
    unmatched_kinds = {int(d.b.analysis.graph.kind[v]) for v in d.match.only_b}
    assert unmatched_kinds <= {Kind.COMM, Kind.COMM_ENQUEUE}
    assert d.attribution.structure_us != 0.0


def test_unrelated_graphs_are_refused_in_one_line():
    g = graph()
    other = g.replace(names=[n.replace("fw.", "encoder.").replace("bw.", "decoder.").replace("Optimizer", "Adam") for n in g.names])
    with pytest.raises(DagprofError) as err:
        diff_analyses(analyze(g), analyze(other))
    msg = str(err.value)
    assert "not profiles of the same training" in msg and "% of A's ops" in msg and "\n" not in msg
    # why ops of one training may not match, and each side's measured iteration, the answer the user came for
    assert "a loop's trip count" in msg and re.search(r"measured iterations: A [\d.]+ ms, B [\d.]+ ms$", msg)


def test_keys_ignore_ids_threads_and_instance_numbers():
    g = graph(steps=3)
    m = match_ops(g, g)
    assert len(m.pairs) == len(g) - 0 and (m.pairs[:, 0] == m.pairs[:, 1]).all()
    later = first_steps(graph(steps=4), 3)  # same ops, other collective instance numbers are not involved
    m = match_ops(g, later)
    assert m.fraction_a == m.fraction_b == 1.0


def test_profiles_of_different_length_are_compared_over_common_steps():
    long, short = analyze(graph(steps=5)), analyze(graph(steps=3))
    d = diff_analyses(long, short)
    check_books(d)
    assert d.a.steps == d.b.steps == [0, 1, 2] and d.a.steps_profiled == 5
    assert any("compared over the first 3" in n for n in d.notes)
    assert abs(d.attribution.delta_us) < 1e-6  # identical steps replay identically


def test_first_steps_keeps_measured_iteration_per_rank():
    run, _ = align_clocks(ddp_run(steps=4, slow={1: 1.5}))
    full, cut = build_graph(run), build_graph(run, steps=range(0, 2))
    g = first_steps(full, 2)
    assert g.meta.steps == [0, 1] and len(g) == len(cut)
    for r, us in cut.meta.measured_iter_us.items():
        assert g.meta.measured_iter_us[r] == pytest.approx(us)
    assert analyze(g).predicted_us == pytest.approx(analyze(cut).predicted_us)


def test_categories_vs_expected_names_what_the_model_missed():
    g = graph(steps=3)
    measured = analyze(g.replace(dur=np.where(g.kind == Kind.BACKWARD, g.dur * 1.5, g.dur)))
    check = categories_vs_expected(g, measured)
    assert [p.label for p in check.differing] == ["backward"]
    assert check.expected_us == pytest.approx(analyze(g).predicted_us)
    assert any(line.strip().startswith("backward:") for line in check.lines())
    same = categories_vs_expected(g, analyze(g))
    assert same.differing == [] and "within" in same.lines()[-1]


@pytest.mark.parametrize("run,whose", [("moe-uneven", "DDP's all-reduce of which parameters got a gradient"),
                                       ("clip", "SyncBatchNorm, a differentiable all_gather")])
def test_the_in_op_note_names_ddp_s_used_map_all_reduce_where_that_is_all_there_is(run, whose):
    """A triplet model under find_unused_parameters=True ran one in-op all-reduce a step, DDP's own: diff named
    SyncBatchNorm and a differentiable all_gather, which the model has neither of."""
    from testdata import DATA

    from dagprof.analysis.diff import diff_profiles
    from dagprof.pipeline import open_run
    p = open_run(str(DATA / "ddp-fresh" / run))
    notes = [n for n in diff_profiles(p, p).notes if "inside the model's own ops" in n]
    assert len(notes) == 1 and whose in notes[0]
