"""A JAX program dispatched between steps (an evaluation pass) belongs to no step on any rank, and an iteration that
holds a long time between steps is left out of a window chosen by default, and said. ``tests/data/tf-jax/wavenet-eval``:
``bench/frameworks/jax_wavenet_lion.py``, whose loop evaluates after step 7 (a second program, compiled at that call);
rank 1 did not wait for its result, so its all-reduce ran after step 8's marker began there, and took step 8's first
collective position on rank 1 only ("mismatched collectives"). And a program launched inside a step whose inputs' copy,
put on the pool between steps, ran late belongs to the step it was launched in (``tests/data/tf-jax/clip-h2d-late``)."""
import pathlib

import numpy as np

from dagprof.align.matching import match_collectives
from dagprof.passes.profiler_cost import measure_profiler_cost
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind
from dagprof.traces.load import load
from dagprof.traces.steps import steady_window, time_between_steps

RUN = pathlib.Path(__file__).parent / "data" / "tf-jax" / "wavenet-eval"
PINN = pathlib.Path(__file__).parent / "data" / "tf-jax" / "pinn-rank0-check"
CLIP = pathlib.Path(__file__).parent / "data" / "tf-jax" / "clip-h2d-late"


def test_a_program_dispatched_between_steps_is_in_no_step():
    run = load(str(RUN))
    for t in run.ranks:
        ev = t.events
        comm = np.flatnonzero(ev.kind == Kind.COMM)
        evaluation = [i for i in comm if ev.nbytes[i] == 4]
        assert len(evaluation) == 1 and ev.step[evaluation[0]] == -1  # the evaluation's loss all-reduce
        per_step = sorted(int(ev.step[i]) for i in comm if ev.nbytes[i] != 4)
        assert per_step == [7, 8, 9]  # the gradients' all-reduce, once a step
    m = match_collectives(run)
    assert not m.problems and len(m.instances) == 3


def test_a_program_launched_in_a_step_after_a_late_input_copy_is_in_that_step():
    """``bench/frameworks/jax_clip_gather.py``: rank 1's step-10 batch copy (``make_array_from_process_local_data``,
    put on the pool between steps) ran inside step 10, and PjRt started the step's program, launched inside it, from the
    copy's task. Its ops were in no step there, and the job was refused as "mismatched collectives"."""
    run = load(str(CLIP))
    for t in run.ranks:
        ev = t.events
        comm = np.flatnonzero(ev.kind == Kind.COMM)
        assert sorted(set(ev.step[comm].tolist())) == list(range(6, 14))
        assert all((ev.step[comm] == s).sum() == 5 for s in range(6, 14))  # 2 all-gathers, 2 reduce-scatters, 1 all-reduce
        assert (ev.step >= 0).all()  # rank 1's step-10 program: 422 ops in no step before
    m = match_collectives(run)
    assert not m.problems and len(m.instances) == 40


def test_time_between_steps_is_left_out_of_the_default_window_and_said_where_steps_keep_it():
    prof = open_run(str(RUN))
    assert prof.graph.meta.steps == [8, 9]  # step 7's iteration held the evaluation's 10 s compile
    left = [w for w in prof.warnings if "left out of the window" in w]
    assert len(left) == 1 and "1 step left out" in left[0] and "after step 7" in left[0] and "steps 8..9 kept" in left[0]
    assert not [w for w in prof.warnings if "choose --steps without it" in w]
    assert prof.analysis.measured_us < 1e6  # 3.5 s with the compile in step 7's iteration
    averaged = open_run(str(RUN), template=True)
    assert averaged.graph.meta.steps == [8, 9] and averaged.analysis.measured_us < 1e6
    assert measure_profiler_cost(prof.graph).profiled_steps == 2  # the loop's step times of the window's steps only
    kept = open_run(str(RUN), steps=range(7, 10))  # --steps overrides, and the time is said as before
    said = [w for w in kept.warnings if "between two steps" in w]
    assert kept.graph.meta.steps == [7, 8, 9] and len(said) == 1 and "after step 7" in said[0] and "choose --steps" in said[0]
    assert kept.analysis.measured_us > 3e6


def test_time_between_steps_rule():
    steps = np.array([[s, 100.0 * s, 100.0 * s + 90.0] for s in range(5)])  # 10 us between 90 us steps
    assert time_between_steps({0: steps, 1: steps}) is None
    late = steps.copy()
    late[3:, 1:] += 500.0  # 510 us between steps 2 and 3
    said = time_between_steps({0: steps, 1: late})
    assert said is not None and "rank 1: 1 ms after step 2" in said


def test_steady_window_rule():
    steps = np.array([[s, 100.0 * s, 100.0 * s + 90.0] for s in range(6, 14)])
    window = list(range(6, 14))
    assert steady_window({0: steps, 1: steps}, window) == (window, None)
    late = steps.copy()
    late[4:, 1:] += 5000.0  # 5 ms after step 9: stretches 6..9 (9 ends it, counted to its own end) and 10..13
    kept, said = steady_window({0: steps, 1: late}, window)
    assert kept == [6, 7, 8, 9] and said is not None and "4 steps left out of the window (10..13)" in said
    early = steps.copy()
    early[2:, 1:] += 5000.0  # after step 7: 8..13 kept
    kept, said = steady_window({0: early, 1: steps}, window)
    assert kept == list(range(8, 14)) and "(6..7)" in said and "rank 0: 5 ms after step 7" in said
    assert steady_window({0: early}, list(range(8, 14)))[1] is None  # a window without it: nothing left out
    waited = steps.copy()
    waited[2, 2] += 5000.0  # rank 1 waited out rank 0's time after step 7 inside step 8: 8 left out too, 9..13 kept
    kept, said = steady_window({0: early, 1: waited}, window)
    assert kept == list(range(9, 14)) and "(6..7, 8)" in said and "the other ranks waited it out in step 8" in said
    every_other = steps.copy()
    every_other[:, 1:] += 5000.0 * (np.arange(8) // 2)[:, None]  # after steps 7, 9, 11: the loop's own time, each 2 steps
    assert steady_window({0: every_other, 1: every_other}, window) == (window, None)


def test_a_check_on_rank_0_alone_leaves_out_the_step_the_other_rank_waited_it_out_in():
    """Rank 0's 317 ms check after step 7; rank 1 went on and waited for it inside step 8 (423 ms against ~110): a
    window of 8..10 held that wait (a 220 ms mean step), 6..7 does not."""
    spans = {t.rank: t.step_spans() for t in load(str(PINN)).ranks}
    assert spans[1][2, 0] == 8 and spans[1][2, 2] - spans[1][2, 1] > 3 * (spans[0][2, 2] - spans[0][2, 1])
    prof = open_run(str(PINN))
    left = [w for w in prof.warnings if "left out of the window" in w]
    assert prof.graph.meta.steps == [6, 7] and len(left) == 1
    assert "(8, 9..10)" in left[0] and "the other ranks waited it out in step 8, left out too" in left[0]
    assert prof.analysis.measured_us < 130e3  # 219.6 ms with step 8 in the window
    assert open_run(str(PINN), template=True).graph.meta.steps == [6, 7]
