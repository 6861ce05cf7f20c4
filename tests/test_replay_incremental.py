"""Incremental replay gives exactly the full replay's arrays after any local change."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dagprof.errors import DagprofError
from dagprof.graph.dag import Graph, csr_graph
from dagprof.graph.random_graphs import ddp_graph, random_layered_dag
from dagprof.replay import IncrementalReplayer, replay
from dagprof.traces.events import Kind

from test_replay_engines import assert_same

COLUMNS = ("name", "kind", "rank", "device", "dur", "gap", "order", "step", "layer", "bucket", "nbytes")


def rewired(g: Graph, src: np.ndarray, dst: np.ndarray) -> Graph:
    return csr_graph(len(g), src, dst, names=g.names, devices=g.devices, layers=g.layers, meta=g.meta.copy(),
                     **{c: getattr(g, c) for c in COLUMNS})


def edges(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(np.arange(len(g)), np.diff(g.indptr)), g.succ.astype(np.int64)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), tell=st.booleans(), rewire=st.booleans(), capacity=st.integers(1, 3),
       compact=st.booleans())
def test_update_equals_full_replay(seed: int, tell: bool, rewire: bool, capacity: int, compact: bool) -> None:
    rng = np.random.default_rng(seed)
    g = random_layered_dag(200, devices=3, capacity=capacity, virtual_frac=0.2, zero_frac=0.3, gap=1.0,
                           integer_times=True, window=10, seed=seed)
    inc = IncrementalReplayer(g)
    if compact:  # merge changed predecessor rows into the CSR at every update
        inc.compact_extra = -len(g.succ)
    assert_same(inc.result, replay(g, "python"))
    for _ in range(4):
        c = rng.choice(len(g), size=int(rng.integers(1, 4)), replace=False)
        dur, order, device = g.dur.copy(), g.order.copy(), g.device.copy()
        dur[c] = rng.integers(0, 4, len(c))
        order[c] += rng.integers(-3, 4, len(c))
        device[c] = rng.integers(-1, len(g.devices), len(c))
        new = g.replace(dur=dur, order=order, device=device)
        changed = set(c.tolist())
        if rewire:
            src, dst = edges(new)
            if len(src):
                i = int(rng.integers(len(src)))
                changed |= {int(src[i]), int(dst[i])}
                src, dst = np.delete(src, i), np.delete(dst, i)
            u, v = sorted(rng.choice(len(g), 2, replace=False).tolist())
            changed |= {u, v}
            new = rewired(new, np.append(src, u), np.append(dst, v))
        got = inc.update(new, sorted(changed) if tell else None)
        assert_same(got, replay(new, "python"))
        g = new


def test_late_change_resimulates_only_the_tail() -> None:
    g = ddp_graph(4, layers=20, buckets=4, steps=3)
    inc = IncrementalReplayer(g)
    last = np.flatnonzero((g.kind == Kind.UPDATE) & (g.step == 2))
    new = g.replace(dur=np.where(np.isin(np.arange(len(g)), last), g.dur * 3, g.dur))
    assert_same(inc.update(new, last), replay(new, "python"))
    assert 0 < inc.last_resimulated < len(g) // 10
    # undo by updating back: the first run again
    assert_same(inc.update(g, last), replay(g, "python"))


def test_no_change_and_node_count_change() -> None:
    g = random_layered_dag(100, seed=1)
    inc = IncrementalReplayer(g)
    assert_same(inc.update(g.replace(), None), replay(g, "python"))
    assert inc.last_resimulated == 0
    other = random_layered_dag(120, seed=2)
    assert_same(inc.update(other), replay(other, "python"))
    assert inc.last_resimulated == len(other)


def test_new_cycle_is_an_error_and_keeps_the_previous_run() -> None:
    g = random_layered_dag(100, window=4, seed=3)
    inc = IncrementalReplayer(g)
    src, dst = edges(g)
    u, v = int(src[-1]), int(dst[-1])
    with pytest.raises(DagprofError, match="dependency cycle"):
        inc.update(rewired(g, np.append(src, v), np.append(dst, u)), [u, v])
    assert inc.graph is g
    assert_same(inc.result, replay(g, "python"))


def test_bad_changed_ids() -> None:
    g = random_layered_dag(10, seed=0)
    with pytest.raises(DagprofError, match="changed node ids"):
        IncrementalReplayer(g).update(g, [10])
