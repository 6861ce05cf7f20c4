"""A JAX program dispatched between steps (an evaluation pass) belongs to no step on any rank.
``tests/data/tf-jax/wavenet-eval``: ``bench/frameworks/jax_wavenet_lion.py``, whose loop evaluates after step 7 (a
second program, compiled at that call); rank 1 did not wait for its result, so its all-reduce ran after step 8's marker
began there, and took step 8's first collective position on rank 1 only ("mismatched collectives")."""
import pathlib

import numpy as np

from dagprof.align.matching import match_collectives
from dagprof.traces.events import Kind
from dagprof.traces.load import load

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
