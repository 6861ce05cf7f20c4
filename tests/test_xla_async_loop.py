"""An XLA loop whose body went on after its op ended, on another thread (XLA:CPU runs a ``while`` asynchronously once an
iteration waits), holds that body again, as the steps whose loop op ran it inside do. ``tests/data/tf-jax/scan-async``:
``bench/frameworks/jax_scan_rnn.py`` (window 6:14), where rank 1's ``while.55`` of step 6 ran 19 ms and its 20
iterations after it on another Eigen thread, against 340-550 ms with the body inside in every other step; averaged
with those, that step's loop was counted twice (+8.8 %)."""
import pathlib

import numpy as np

from dagprof.pipeline import open_run
from dagprof.traces.load import load

RUN = pathlib.Path(__file__).parent / "data" / "tf-jax" / "scan-async"


def test_a_loop_whose_body_ran_after_it_holds_it_again():
    run = load(str(RUN))
    for t in run.ranks:
        ev = t.events
        loops = [i for i in range(len(ev)) if ev.name_of(i) == "while.55" and ev.depth[i] == 0]
        assert sorted(int(ev.step[i]) for i in loops) == list(range(6, 14))  # one a step, none named apart
        assert min(float(ev.dur[i]) for i in loops) > 300e3  # rank 1's of step 6: 19 ms before, its body after it
        body = [i for i in range(len(ev)) if ev.name_of(i) == "copy.99"]  # an op of the loop's body, 20 a step
        assert len(body) == 160 and not any(ev.depth[i] == 0 for i in body)


def test_the_averaged_replay_counts_that_loop_once():
    plain = open_run(str(RUN))
    assert abs(plain.analysis.error_pct) < 1e-6  # the per-step replay reproduces the run, names aside
    averaged = open_run(str(RUN), template=True)
    assert abs(averaged.analysis.error_pct) < 2.0  # +8.8 % with the short loop op averaged up and its body kept
    g = averaged.graph
    loop = np.array(["while.55" in g.node_name(i) for i in range(len(g))])
    assert loop.sum() == 16  # one a step on each rank
