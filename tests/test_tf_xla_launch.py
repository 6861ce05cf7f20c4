"""TF's ``tf.function(jit_compile=True)`` on CPU: XLA runs the program's thunks inline on the launching executor thread and
on Eigen threads, and the launching thread waits in ``BlockUntilReady`` for the rest; every run has run id -1.
``tf/fttransformer-xla``: ``bench/frameworks/tf_fttransformer_xla.py`` on 2 workers, steps 6-13."""
from collections import Counter

import numpy as np
from testdata import DATA

from dagprof.passes.average_steps import compile_gaps
from dagprof.pipeline import open_run

RUN = str(DATA / "tf" / "fttransformer-xla")


def test_each_launch_is_a_run_of_its_own():
    """With run id -1 as one run, all 8 steps' thunks went in step 6 (3,528 nodes on rank 0 there, 1,528 in each other step)
    and step 6's replay held the others' compute as gaps; each launch is now a run, its thunks in their own step."""
    g = open_run(RUN).graph
    for rank in (0, 1):
        counts = Counter(g.step[(g.rank == rank) & (g.step >= 6) & (g.step <= 13)].tolist())
        # rank 1's steps 11-13 hold up to 128 more pieces of one op (XLA split its loop into more tasks there)
        assert len(counts) == 8 and max(counts.values()) < 1.1 * min(counts.values()), counts
        names = [g.node_name(i) for i in np.flatnonzero((g.rank == rank) & (g.step == 9))]
        assert any("fusion" in n for n in names)  # XLA's thunks in a later step too


def test_the_launch_waits_for_its_thunks():
    """The launching thread's wait (``BlockUntilReady``, 20-40 ms) was the gap of the op after it: "framework overhead,
    another thread, before update op", 31.6 of 63.5 ms of the critical path, with 10 ms of compute on it. It now ends with
    the launch's last thunk, so the thunks' compute is on the path; the replay and the averaged replay stay as they were."""
    p = open_run(RUN)
    by = p.analysis.to_dict()["critical_path_per_iter"]["by_category_ms"]
    assert by["other compute"] > 25.0 and by["framework overhead"] < 30.0, by  # were 10.0 and 47.7 ms
    assert abs(p.analysis.error_pct) < 0.01
    assert abs(open_run(RUN, template=True).analysis.error_pct) < 0.5


def test_compiles_stay_in_their_steps_when_averaged():
    """``tf/tft-jit`` (Keras ``compile(jit_compile=True)`` on 1 worker, recompiling every step: 7.3 / 8.6 / 8.0 / 2.4 s of
    steps 6-9) carries each compile in the gaps of the XLA threads' first ops after it. Averaged with the pool-delay rule,
    the median compile was spread over the shorter steps while the longer kept theirs: the averaged replay +8.79 %. Each
    compile now stays in its step (``average_steps.compile_gaps``) and the averaged replay is the measured step's."""
    run = str(DATA / "tf" / "tft-jit")
    g = open_run(run).graph
    kept = compile_gaps(g)
    compiles = np.asarray(g.meta.xla_compiles[0])
    assert (kept <= g.gap).all() and kept.sum() >= (compiles[:, 1] - compiles[:, 0]).sum()  # each compile under one gap or more
    assert all(kept[g.step == s].sum() > 1e6 for s in (6, 7, 8, 9))  # every step compiled for over a second
    assert abs(open_run(run, template=True).analysis.error_pct) < 1.0  # was +8.79 %
    assert not compile_gaps(open_run(RUN).graph).any()  # fttransformer-xla compiled before its window
