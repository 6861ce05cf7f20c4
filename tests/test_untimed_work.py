"""The largest op on the critical path when it is a gap of the loop's own, between the hooked model's calls (stop 60).

MoCo's key encoder runs outside DDP (``bench/ddp_fresh/moco_shuffle_bn.py``, ``tests/data/ddp-fresh/moco``, hooks only):
its convolutions fall between the model's forward and its backward, in ``other:loss`` (59.6 ms of a 165 ms step, said in words), which
the finding named with its time alone. It now says what such a gap holds and that a module outside the model lands there."""
from __future__ import annotations

from testdata import DATA

from dagprof.analysis import analyze
from dagprof.analysis.findings import findings
from dagprof.graph.build import build_graph
from dagprof.traces.dagprof_run import read_run


def test_a_loop_gap_leading_the_path_says_what_it_can_hold():
    a = analyze(build_graph(read_run(DATA / "ddp-fresh" / "moco")))
    (top,) = [f for f in findings(a) if f.title == "largest op on the critical path"]
    assert top.detail.startswith("loss (between forward and backward): ")  # ``op_words``: the gap named in words
    assert ("(time no hook timed: the code between the model's forward and its backward: the loss, and any module run outside "
            "the wrapped model there, such as a frozen teacher or an EMA or momentum encoder;") in top.detail
