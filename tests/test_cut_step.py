"""A Kineto trace cut inside its last step (``traces.steps.cut_step``) and an answer that rests on one step
(``traces.steps.one_step``). A one-step trace cut half-way through its step answered its half step (47.8 ms for 95.7)
with exit 0; a cut that leaves ops ending where the step marker ends, nothing after them, is now refused naming the
file, and every one-step answer says, with the count, that one step cannot show it is whole."""
from __future__ import annotations

import copy
import gzip
import json

import numpy as np
from testdata import DATA, KINETO_PUBLIC, cli_json, folded_lines

from dagprof.cli.main import main
from dagprof.traces.steps import cut_step

ONE_STEP = KINETO_PUBLIC / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # step 103 alone
NO_MARKERS = DATA / "kineto-corpus" / "tracelens" / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz"
TWO_STEPS = DATA / "tp-fresh" / "pp-stages" / "rank-0.pt.trace.json.gz"  # steps 2 and 3 of a pipeline's first stage


def _cut(src, dst) -> None:
    """``src`` cut half-way through its last ProfilerStep, well formed (as ``bench/damage_58.py``'s stop-mid)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    ev = doc["traceEvents"]
    last = max((e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    at = last["ts"] + last["dur"] / 2
    doc["traceEvents"] = [copy.copy(e) for e in ev if not (isinstance(e.get("ts"), (int, float)) and e["ts"] > at)]
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["ts"] + e["dur"] > at:
            e["dur"] = at - e["ts"]
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_a_whole_one_step_trace_is_answered_with_the_count_of_steps(capsys) -> None:
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(ONE_STEP))
    assert rc == 0, err
    said = [w for w in doc["warnings"] if "rests on 1 step" in w]
    assert len(said) == 1 and "step 103" in said[0]
    assert main(["analyze", str(ONE_STEP)]) == 0
    assert [w for w in folded_lines(capsys.readouterr().out, "warning: ") if "rests on 1 step" in w] == [f"warning: {said[0]}"]


def test_a_one_step_trace_cut_inside_its_step_is_refused_naming_the_file(tmp_path, capsys) -> None:
    cut = tmp_path / ONE_STEP.name
    _cut(ONE_STEP, cut)
    rc, doc, _ = cli_json(capsys, "analyze", "--json", str(cut))
    assert rc == 2 and "ends inside step 103" in doc["error"]
    rc, _, err = cli_json(capsys, "analyze", str(cut))
    assert rc == 2 and str(cut) in err and "ends inside step 103" in err and "profile whole steps" in err
    assert len(err.strip().splitlines()) == 1


def test_a_cut_last_step_is_refused_and_the_window_before_it_answered(tmp_path, capsys) -> None:
    cut = tmp_path / TWO_STEPS.name
    _cut(TWO_STEPS, cut)
    rc, _, err = cli_json(capsys, "analyze", "--json", str(cut))
    assert rc == 2 and "ends inside step 3" in err and "--steps 2:3 leaves it out" in err
    rc, doc, err = cli_json(capsys, "analyze", "--json", "--steps", "2:3", str(cut))
    assert rc == 0, err
    rc, whole, err = cli_json(capsys, "analyze", "--json", "--steps", "2:3", str(TWO_STEPS))
    assert doc["measured_iter_ms"] == whole["measured_iter_ms"] and any("rests on 1 step" in w for w in doc["warnings"])


def test_a_whole_multi_step_trace_is_neither_refused_nor_warned(capsys) -> None:
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(TWO_STEPS))
    assert rc == 0, err
    assert not any("rests on" in w or "ends inside" in w for w in doc["warnings"])


def test_a_trace_without_step_markers_is_said_once_as_one_window(capsys) -> None:
    """Its whole window is one iteration, which its own line says: no second line about one step."""
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(NO_MARKERS))
    assert rc == 0, err
    assert any(w.startswith("no ProfilerStep markers") for w in doc["warnings"]) and not any("rests on" in w for w in doc["warnings"])


def test_what_tells_a_cut() -> None:
    """A step marker 0-10 with an op 2-10 open at its end and nothing after: cut. The same op ending at 9, another op
    ending past the marker, an op that began before the step, or one of zero length at its end: whole, as far as it tells."""
    def told(op_start, op_end, gpu_end=5.0):
        start, end = np.array([0.0, op_start, 1.0]), np.array([10.0, op_end, gpu_end])
        return cut_step(start, end, np.array([True, False, False]), np.array([7, 7, 7]), 1e-3)

    assert told(2.0, 10.0) is not None and (told(2.0, 10.0).step, told(2.0, 10.0).ops) == (7, 1)
    assert told(2.0, 9.0) is None and told(2.0, 10.0, gpu_end=12.0) is None
    assert told(-1.0, 10.0) is None and told(10.0, 10.0) is None


SHORT_CUT = DATA / "tp-fresh" / "pp-stages" / "rank-1.pt.trace.json.gz"  # a later stage: between ops at the cut
EMPTY_LAST = DATA / "kineto_excerpts" / "hta_mi250_minitoy_train.json.gz"  # a public MI250 trace, whole: steps 1 and 2


def _said_cut(tmp_path, capsys, src, words: str):
    """``src`` cut half-way through its last step (``_cut``) and its one warning that holds ``words``, answered."""
    cut = tmp_path / src.name
    _cut(src, cut)
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(cut))
    said = [w for w in doc["warnings"] if words in w]
    assert rc == 0 and len(said) == 1, err
    return cut, said


def test_a_cut_between_ops_is_said_by_its_ops_being_the_first_of_every_earlier_step(tmp_path, capsys) -> None:
    """Cut half-way through step 3, this stage's thread was between ops and nothing was open: no op ends at the marker,
    but its 29 ops are the first 29 of step 2's 56 in order. A no_sync step after a synchronising one reads so too, so it
    is said with the window that leaves it out, not refused. The whole file says nothing; the window before answers."""
    cut, said = _said_cut(tmp_path, capsys, SHORT_CUT, "are only the first")
    assert "step 3's 29 ops" in said[0] and "first 29 of step 2's 56" in said[0] and "--steps 2:3 leaves it out" in said[0]
    rc, doc, err = cli_json(capsys, "analyze", "--json", "--steps", "2:3", str(cut))
    assert rc == 0 and not any("are only the first" in w for w in doc["warnings"]), err
    rc, whole, err = cli_json(capsys, "analyze", "--json", "--steps", "2:3", str(SHORT_CUT))
    assert rc == 0 and doc["measured_iter_ms"] == whole["measured_iter_ms"]
    rc, whole, err = cli_json(capsys, "analyze", "--json", str(SHORT_CUT))
    assert rc == 0 and not any("ends inside" in w or "are only the first" in w for w in whole["warnings"]), err


def test_an_empty_last_step_is_left_out_of_the_default_window_and_refused_where_named(capsys) -> None:
    """The loop's last ``profiler.step()`` opened step 2, ``stop()`` closed it 49 us later with none of the loop's ops in
    it: read as a step, the 9.3 ms iteration averaged to 4.69 ms (device work of step 1 ends after it, so the open-op
    tell never saw it). No step of the job: the default window leaves it out and says so; a window that names it is
    refused."""
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(EMPTY_LAST))
    assert rc == 0 and 9.2 < doc["measured_iter_ms"] < 9.4, err
    assert any("step 2 left out" in w and "none of the training loop's ops" in w for w in doc["warnings"])
    rc, _, err = cli_json(capsys, "analyze", "--json", "--steps", "1:3", str(EMPTY_LAST))
    assert rc == 2 and "ends inside step 2: it holds none of the 10 ops step 1 ran" in err and "--steps 1:2 leaves it out" in err
    rc, doc, err = cli_json(capsys, "analyze", "--json", "--steps", "1:2", str(EMPTY_LAST))
    assert rc == 0 and 9.2 < doc["measured_iter_ms"] < 9.4, err


def test_what_tells_a_step_cut_short() -> None:
    """Loop ops (name ids) a b c in step 1 and 2, and in step 3: a b -> cut; b a (no c, the op every step ends on) -> cut,
    said by that op; a b c, a c, or b c: whole, as far as it tells; no loop op in step 3: cut even with device work ending
    after its marker; a b or b a with something after: whole."""
    def told(last: list[int], gpu_end: float = 29.0):
        names = [0, 1, 2, 0, 1, 2, *last]
        step = np.array([1, 2, 3] + [1] * 3 + [2] * 3 + [3] * len(last) + [3])
        start = np.array([0.0, 10.0, 20.0] + [1.0, 2.0, 3.0, 11.0, 12.0, 13.0] + [21.0 + i for i in range(len(last))] + [24.0])
        end = np.r_[[10.0, 20.0, 30.0], start[3:-1] + 0.5, gpu_end]
        is_step = np.r_[[True] * 3, [False] * (len(start) - 3)]
        loop = np.r_[[-1] * 3, names, -1]
        return cut_step(start, end, is_step, step, 1e-3, loop)

    assert told([0, 1]) is not None and (told([0, 1]).step, told([0, 1]).ops, told([0, 1]).like, told([0, 1]).of) == (3, 2, 2, 3)
    assert told([0, 1, 2]) is None and told([0, 2]) is None and told([1, 2]) is None
    assert told([]) is not None and told([], gpu_end=31.0).ops == 0 and told([0, 1], gpu_end=31.0) is None
    assert (told([1, 0]).ops, told([1, 0]).like, told([1, 0]).of, told([1, 0]).ended) == (2, 2, 3, "2")
    assert told([0, 1]).ended == "" and told([1, 0], gpu_end=31.0) is None


HABITS = DATA / "habits" / "rank1.kineto.json.gz"  # steps 3 and 4 of a diffusion UNet under Adam, whole


def test_a_cut_step_whose_ops_differ_from_the_first_is_said_by_the_op_every_step_ends_on(tmp_path, capsys) -> None:
    """Its whole step 4 already holds 836 loop ops against step 3's 1085 and departs from step 3's at the 5th, so the
    start tell cannot tell half of it; cut half-way, it holds none of Adam's ``aten::addcdiv_``, which both whole steps
    end on: said, with the window that leaves it out. The whole file says nothing."""
    _, said = _said_cut(tmp_path, capsys, HABITS, "hold no aten::addcdiv_")
    assert "step 4's 144 ops" in said[0] and "step 3's 1085" in said[0] and "--steps 3:4 leaves it out" in said[0]
    rc, whole, err = cli_json(capsys, "analyze", "--json", str(HABITS))
    assert rc == 0 and not any("ends inside" in w or "hold no" in w for w in whole["warnings"]), err


CUT_STEPS = DATA / "cut-steps"  # torch.profiler stopped inside a step as users stop it (make_cut_steps.py there)


def test_real_profiler_stops_inside_a_step_are_said_or_refused_and_a_whole_last_step_answered(capsys) -> None:
    """Leaving the profiler's ``with`` block after step 4's backward, and a loop ending after ``prof.step()`` opened step 6:
    both closed by ``stop()`` between ops, nothing open, so only the loop's ops tell: the first said, the empty one
    left out of the default window (refused where named). ``prof.step()`` before each step closes the last one by
    ``stop()`` too, after it ran whole: answered."""
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(CUT_STEPS / "break-after-backward.rank0.json.gz"))
    said = [w for w in doc["warnings"] if "are only the first" in w]
    assert rc == 0 and len(said) == 1 and "step 4's 35 ops" in said[0] and "first 35 of step 3's 95" in said[0], err
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(CUT_STEPS / "empty-last-step.rank0.json.gz"))
    assert rc == 0 and any("step 6 left out" in w for w in doc["warnings"]), err
    rc, _, err = cli_json(capsys, "analyze", "--json", "--steps", "1:7", str(CUT_STEPS / "empty-last-step.rank0.json.gz"))
    assert rc == 2 and "ends inside step 6: it holds none of the 95 ops step 5 ran" in err and "--steps 1:6" in err
    rc, doc, err = cli_json(capsys, "analyze", "--json", str(CUT_STEPS / "step-first-whole.rank0.json.gz"))
    assert rc == 0 and not any("ends inside" in w or "are only the first" in w for w in doc["warnings"]), err


def test_a_last_step_of_epoch_end_code_only_is_left_out(capsys):
    """The user's own profiler (``bench/ddp_fresh/capsnet_scaler.py --trace``, ``schedule`` repeating by default, one
    file a rank rewritten each cycle) left steps 11 and 12: 12 holds only the code after the loop's last
    ``profiler.step()``, an all-reduce of the epoch's loss and ``ReduceLROnPlateau``'s scalar (5 ms beside 804 ms, every op
    read as forward), and the window's mean answered 404 ms an iteration. It is left out and said; named, refused."""
    folder = str(CUT_STEPS / "epoch-end")
    rc, doc, err = cli_json(capsys, "analyze", "--json", folder)
    assert rc == 0 and doc["steps"] == [11], err
    assert abs(doc["measured_iter_ms"] - 804.05) < 0.1
    assert any("step 12 left out on all ranks: it holds no backward or optimizer op" in w for w in doc["warnings"])
    rc, _, err = cli_json(capsys, "analyze", "--json", "--steps", "11:13", folder)
    assert rc == 2 and "ends inside step 12: it holds no backward or optimizer op" in err and "--steps 11:12" in err
