"""The critical path per iteration is taken over the iteration's span (``analysis.critical_path``): on a V100 trace whose
device runs a step behind its host, the path of one step ran to the end of the kernels the step launched, 89 ms after
its step mark, and ``analyze`` read 185.2 ms per iteration against a 95.7 ms step, unsaid. Now it is taken over the
window (first step mark to last), its parts adding up to it, and one line says what was left out. A trace whose path
ends with its window is as it was."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA, KINETO_PUBLIC

from dagprof.analysis import analyze
from dagprof.analysis.critical_path import critical_path
from dagprof.analysis.diff import diff_profiles
from dagprof.analysis.overhead import START_SKEW
from dagprof.cli.cmd_analyze import to_text
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind

LAGGED = KINETO_PUBLIC / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # step 103 of 101-105
SYNCED = KINETO_PUBLIC / "nccl_parser_config" / "nccl_data.json.gz"  # step 5 of 4-6: its path ends with its step


@pytest.fixture(scope="module")
def lagged():
    return open_run(LAGGED)


def test_path_over_the_iterations_span(lagged) -> None:
    a = lagged.analysis
    g, res, span = a.graph, a.result, a.predicted_us * a.steps
    whole = critical_path(g, res)  # the makespan's path, as before
    marks = res.start[g.kind == Kind.STEP]
    assert whole.total_us > span * 1.5 and whole.note is None  # the kernels of step 103 end ~89 ms after its mark
    p = a.path
    assert p.total_us == pytest.approx(span, rel=1e-12)
    assert sum(p.by_category.values()) == pytest.approx(p.total_us, rel=1e-9)  # durations and gaps from the cut on
    assert sum(p.overhead.values()) == pytest.approx(p.by_category.get("framework overhead", 0.0), rel=1e-9, abs=1e-6)
    assert set(p.nodes.tolist()) <= set(whole.nodes.tolist()) and p.nodes[-1] == whole.nodes[-1]
    cut = whole.total_us - span
    assert np.all(res.end[p.nodes] > cut)
    # the left-out head was mostly the device waiting for the previous step's kernels: no longer framework overhead
    assert p.by_category.get("framework overhead", 0.0) < 0.05 * whole.by_category["framework overhead"]
    assert cut == pytest.approx(whole.total_us - marks.max())  # one rank: the window is its iteration
    assert f"ends {cut / 1e3:.2f} ms after the window's last step mark" in p.note
    assert f"the {cut / 1e3:.2f} ms before left out" in p.note


def test_analyze_says_it_in_one_line(lagged) -> None:
    r = lagged.to_dict()
    cp = r["critical_path_per_iter"]
    assert cp["total_ms"] == pytest.approx(r["predicted_iter_ms"], rel=1e-9)
    notes = [line for line in to_text(r).splitlines() if line.strip().startswith("note: the critical path ends")]
    assert len(notes) == 1 and "\n" not in cp["note"]


def test_a_path_within_its_window_is_unchanged() -> None:
    a = open_run(SYNCED).analysis
    whole = critical_path(a.graph, a.result)
    assert a.path.note is None and a.path.total_us == whole.total_us
    assert a.path.by_category == whole.by_category and a.path.overhead == whole.overhead
    assert np.array_equal(a.path.nodes, whole.nodes)
    assert analyze(a.graph, a.result).path.to_dict(per=a.steps) == a.path.to_dict(per=a.steps)


def test_diff_counts_the_same_parts(lagged) -> None:
    """``diff`` sums the path's categories its own way: from the parts counted, not the kept nodes' whole gaps (the
    first kernel's 89 ms wait would come back as framework overhead)."""
    d = diff_profiles(lagged, lagged).to_dict()
    cp = d["a"]["critical_path_per_iter"]
    assert sum(cp["by_category_ms"].values()) == pytest.approx(cp["total_ms"], rel=1e-9)
    assert cp["by_category_ms"].get("framework overhead", 0.0) < 5.0


def test_ranks_that_began_apart_are_said() -> None:
    """On a vendored HSDP run the ranks began the window 39 ms apart: the path keeps that start (labelled), so it is longer
    per iteration than the slowest rank's iteration, and one line says by how much and why."""
    a = open_run(DATA / "fsdp" / "hsdp").analysis
    excess = a.path.total_us / a.steps - a.predicted_us
    assert excess > 0 and a.path.overhead[START_SKEW] > 0
    note = a.path.to_dict(per=a.steps)["note"]
    assert note.startswith(f"the critical path is {excess / 1e3:.2f} ms per iteration longer than the iteration")
    assert START_SKEW in note
