"""Traces without ProfilerStep: the profiled window as one iteration, or the user's own step marker."""
from __future__ import annotations

import os

import numpy as np
import pytest

from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.provenance import violations
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind, Run
from dagprof.traces.kineto import read_kineto
from dagprof.traces.step_marks import WINDOW_STEP_NAME, mark_steps

PATH = os.path.join(os.path.dirname(__file__), "data", "kineto_excerpts", "hta_param_simple_add.json.gz")  # a PARAM benchmark: no ProfilerStep


def replayed_iter(g) -> float:
    res = replay(g)
    marks = np.flatnonzero(g.kind == Kind.STEP)
    return float(res.start[marks].max() - res.start[marks].min()) / len(g.meta.steps)


def test_no_step_markers_replays_the_window_as_one_iteration():
    t = read_kineto(PATH)
    assert not (t.events.kind == Kind.STEP).any()
    run = mark_steps(Run([t], PATH))
    ev = run.ranks[0].events
    (step, start, end), = run.ranks[0].step_spans().tolist()
    assert (step, start, end) == (0, ev.start.min(), ev.end.max()) and np.all(ev.step == 0)
    assert ev.name_of(int(np.flatnonzero(ev.kind == Kind.STEP)[0])) == WINDOW_STEP_NAME
    assert any("one iteration" in str(w) for w in run.meta.warnings)
    g = build_graph(Run([t], PATH))
    assert g.meta.measured_iter_us[0] == pytest.approx(end - start)
    assert replayed_iter(g) == pytest.approx(end - start, rel=1e-9)
    assert all(c.violated == 0 for c in violations(g))


def test_a_user_named_marker_opens_each_iteration():
    t = read_kineto(PATH)
    g = build_graph(Run([t], PATH), step_marker="[param|clear_cache]")
    assert g.meta.steps == [0, 1]
    ev = t.events
    spans = sorted((ev.start[i], ev.end[i]) for i in range(len(ev)) if ev.name_of(i) == "[param|clear_cache]")
    assert g.meta.measured_iter_us[0] == pytest.approx((spans[-1][1] - spans[0][0]) / 2)
    assert replayed_iter(g) == pytest.approx(g.meta.measured_iter_us[0], rel=1e-9)


def test_a_marker_opened_inside_itself_is_one_step():
    g = build_graph(Run([read_kineto(PATH)], PATH), step_marker="[param|torch.add|0|0|0|warmup|forward]")
    assert g.meta.steps == [0]  # the nested range of the same name stays inside the outer one


def test_unknown_marker_is_a_one_line_error():
    with pytest.raises(DagprofError, match="no event named 'train_step'") as err:
        build_graph(Run([read_kineto(PATH)], PATH), step_marker="train_step")
    assert "\n" not in str(err.value)


def test_python_api_and_cli_take_the_marker(tmp_path, capsys):
    prof = open_run(PATH, step_marker="[param|clear_cache]")
    assert prof.graph.meta.steps == [0, 1] and prof.analysis.error_pct == pytest.approx(0.0, abs=1e-9)
    from dagprof.cli.main import main

    assert main(["replay", PATH, "--step-marker", "[param|clear_cache]", "-o", str(tmp_path), "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == [0, 1] and abs(out["error_pct"]) < 1e-9
