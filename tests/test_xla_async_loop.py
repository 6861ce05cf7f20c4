"""An XLA loop whose body went on after its op ended, on another thread (XLA:CPU runs a ``while`` asynchronously once an
iteration waits), is told apart from the steps whose loop op holds its body. ``tests/data/tf-jax/scan-async``:
``bench/frameworks/jax_scan_rnn.py`` (window 6:14), where rank 1's ``while.55`` of step 6 ran 19 ms and its 20
iterations after it on another Eigen thread, against 340-550 ms with the body inside in every other step; averaged
with those, that step's loop was counted twice (+8.8 %)."""
import pathlib

import numpy as np

from dagprof.pipeline import open_run
from dagprof.traces.load import load

RUN = pathlib.Path(__file__).parent / "data" / "tf-jax" / "scan-async"


def test_a_loop_whose_body_ran_after_it_is_named_apart_in_that_step_only():
    run = load(str(RUN))
    for t in run.ranks:
        ev = t.events
        named = [i for i in range(len(ev)) if ev.name_of(i).startswith("while.55")]
        apart = [int(ev.step[i]) for i in named if ev.name_of(i) == "while.55 (async)"]
        assert apart == ([6] if t.rank == 1 else [])
        held = [float(ev.dur[i]) for i in named if ev.name_of(i) == "while.55" and ev.depth[i] == 0]
        assert len(held) == 7 + (t.rank == 0) and min(held) > 300e3  # the steps whose loop op holds its body


def test_the_averaged_replay_counts_that_loop_once():
    plain = open_run(str(RUN))
    assert abs(plain.analysis.error_pct) < 1e-6  # the per-step replay reproduces the run, names aside
    averaged = open_run(str(RUN), template=True)
    assert abs(averaged.analysis.error_pct) < 2.0  # +8.8 % with the short loop op averaged up and its body kept
    g = averaged.graph
    loop = np.array(["while.55" in g.node_name(i) for i in range(len(g))])
    assert loop.sum() == 16  # one a step on each rank
