"""A JAX program dispatched between steps (an evaluation pass) belongs to no step on any rank, and time spent between
steps is said. ``tests/data/tf-jax/wavenet-eval``: ``bench/frameworks/jax_wavenet_lion.py``, whose loop evaluates after
step 7 (a second program, compiled at that call); rank 1 did not wait for its result, so its all-reduce ran after step
8's marker began there, and took step 8's first collective position on rank 1 only ("mismatched collectives")."""
import pathlib

import numpy as np

from dagprof.align.matching import match_collectives
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind
from dagprof.traces.load import load
from dagprof.traces.steps import time_between_steps

RUN = pathlib.Path(__file__).parent / "data" / "tf-jax" / "wavenet-eval"


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


def test_time_between_steps_is_said_and_left_out_by_steps():
    said = [w for w in open_run(str(RUN)).warnings if "between two steps" in w]
    assert len(said) == 1 and "after step 7" in said[0]
    quiet = open_run(str(RUN), steps=range(8, 10))
    assert not [w for w in quiet.warnings if "between two steps" in w]
    assert quiet.analysis.measured_us < 1e6  # 3.5 s with the evaluation's compile in step 7's iteration


def test_time_between_steps_rule():
    steps = np.array([[s, 100.0 * s, 100.0 * s + 90.0] for s in range(5)])  # 10 us between 90 us steps
    assert time_between_steps({0: steps, 1: steps}) is None
    late = steps.copy()
    late[3:, 1:] += 500.0  # 510 us between steps 2 and 3
    said = time_between_steps({0: steps, 1: late})
    assert said is not None and "rank 1: 1 ms after step 2" in said
