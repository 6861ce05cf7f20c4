"""An XLA loop whose body went on after its op ended, on another thread (XLA:CPU runs a ``while`` asynchronously once an
iteration waits), holds that body again, as the steps whose loop op ran it inside do. ``tests/data/tf-jax/scan-async``:
``bench/frameworks/jax_scan_rnn.py`` (window 6:14), where rank 1's ``while.55`` of step 6 ran 19 ms and its 20
iterations after it on another Eigen thread, against 340-550 ms with the body inside in every other step; averaged
with those, that step's loop was counted twice (+8.8 %)."""
import pathlib
from types import SimpleNamespace

import numpy as np

from dagprof.pipeline import open_run
from dagprof.traces.events import EventRows, Kind
from dagprof.traces.load import load
from dagprof.traces.tf_xplane import _Reader

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


def _reader_rows(extra: list[tuple[str, int, float, float]] = (), async_steps: tuple[int, ...] = (3,)):
    """A reader's rows as ``_async_loops`` reads them: a loop op ``while.1`` on thread 1 each step, its body (``body.a``,
    ``body.b``) nested in it, or, in ``async_steps``, after it on thread 2, unnested, then ``after`` there; flows from the
    loop to its body's first op and from its body's last op to ``after``."""
    rows = EventRows()
    flows = []
    for s in range(4):
        t = 100.0 * s
        if s in async_steps:
            loop = rows.add("while.1", Kind.FORWARD, 1, t, 5.0, step=s)
            a = rows.add("body.a", Kind.FORWARD, 2, t + 5.0, 10.0, step=s)
            b = rows.add("body.b", Kind.FORWARD, 2, t + 15.0, 15.0, step=s)
            after = rows.add("after", Kind.FORWARD, 2, t + 30.0, 1.0, step=s)
            flows += [(loop, a), (b, after)]
        else:
            rows.add("while.1", Kind.FORWARD, 1, t, 30.0, step=s)
            rows.add("body.a", Kind.FORWARD, 1, t + 1.0, 10.0, step=s, depth=1)
            rows.add("body.b", Kind.FORWARD, 1, t + 12.0, 15.0, step=s, depth=1)
            rows.add("after", Kind.FORWARD, 2, t + 30.0, 1.0, step=s)
    for name, lane, start, dur in extra:
        rows.add(name, Kind.FORWARD, lane, start, dur, step=int(start // 100))
    rows.flows = flows
    return SimpleNamespace(tab=rows, lane_of={0: 0}, main=0), rows.columns()


def test_the_rule_nests_an_exceptional_async_body_and_names_it_apart_where_its_thread_was_busy():
    reader, c = _reader_rows()
    _Reader._async_loops(reader, c)
    loop = [i for i in range(len(c["start"])) if reader.tab.names[c["name"][i]] == "while.1" and c["step"][i] == 3]
    assert len(loop) == 1 and c["dur"][loop[0]] == 30.0  # until its body's last op ended
    body = [i for i in range(len(c["start"])) if reader.tab.names[c["name"][i]].startswith("body.") and c["step"][i] == 3]
    assert all(c["depth"][i] == 1 for i in body)
    after = next(i for i in range(len(c["start"])) if reader.tab.names[c["name"][i]] == "after" and c["step"][i] == 3)
    assert reader.tab.flows == [(loop[0], after)]  # released by the loop op; the flow into its body dropped
    busy, c = _reader_rows(extra=[("other", 1, 310.0, 2.0)])  # its thread ran another op before its body ended
    _Reader._async_loops(busy, c)
    assert "while.1 (async)" in busy.tab.names and not (c["depth"][c["step"] == 3] > 0).any()
    usual, c = _reader_rows(async_steps=(1, 2, 3))  # its usual way: left as read
    before = {k: v.copy() for k, v in c.items()}
    _Reader._async_loops(usual, c)
    assert all((c[k] == before[k]).all() for k in c) and "while.1 (async)" not in usual.tab.names


def test_a_loop_whose_body_usually_runs_after_it_holds_none_of_it():
    """Its usual way (steps 1-3: the body after the loop op, on thread 2): where it held its body (step 0), the body's ops
    are ops of their own there too, and the loop op only its head, up to the first of them; the line's nodes follow."""
    usual, c = _reader_rows(async_steps=(1, 2, 3))
    usual.lane_of, usual.nodes = {0: 0, 1: 1, 2: 2}, {}
    _Reader._split_loops(usual)
    c = usual.tab.columns()
    names = [usual.tab.names[n] for n in c["name"]]
    loop = [i for i, n in enumerate(names) if n == "while.1"]
    assert [float(c["dur"][i]) for i in loop] == [1.0, 5.0, 5.0, 5.0]  # step 0's: until body.a began
    assert not (c["depth"] > 0).any()
    starts, rows = usual.nodes[1]
    assert [names[i] for i in rows] == ["while.1", "body.a", "body.b"] + ["while.1"] * 3 and (np.diff(starts) >= 0).all()
    _Reader._async_loops(usual, c)  # then nothing is left for it to nest
    assert not (c["depth"] > 0).any() and c["dur"][loop[0]] == 1.0
    rare, c = _reader_rows()  # async in one step of four: _async_loops' (it nests that step's body), not split
    rare.lane_of, rare.nodes = {0: 0, 1: 1, 2: 2}, {}
    before = {k: v.copy() for k, v in c.items()}
    _Reader._split_loops(rare)
    assert all((c[k] == before[k]).all() for k in c) and rare.nodes == {}
