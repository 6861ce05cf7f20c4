"""The compiled engine returns exactly the reference's arrays; known makespans; bad input."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dagprof.errors import DagprofError
from dagprof.graph.dag import NODE_COLUMNS, Device, DeviceKind, Graph, GraphBuilder, csr_graph
from dagprof.graph.random_graphs import ddp_graph, random_layered_dag
from dagprof.replay import replay, replay_python
from dagprof.traces.events import Kind


def assert_same(a, b) -> None:
    np.testing.assert_array_equal(a.start, b.start)
    np.testing.assert_array_equal(a.end, b.end)
    np.testing.assert_array_equal(a.gate, b.gate)


@st.composite
def small_graphs(draw) -> Graph:
    """Tiny graphs where ties are the rule: few distinct durations, orders, gaps; virtual nodes; capacities 1..3."""
    n = draw(st.integers(1, 25))
    ndev = draw(st.integers(1, 4))
    caps = draw(st.lists(st.integers(1, 3), min_size=ndev, max_size=ndev))
    cols = {c: np.zeros(n, dtype=t) for c, t in NODE_COLUMNS.items()}
    cols["device"] = np.array(draw(st.lists(st.integers(-1, ndev - 1), min_size=n, max_size=n)), np.int32)
    cols["dur"] = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 2.5]), min_size=n, max_size=n)))
    cols["gap"] = np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0]), min_size=n, max_size=n)))
    cols["order"] = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.float64)
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    src = np.array([min(p) for p in pairs], np.int64)
    dst = np.array([max(p) for p in pairs], np.int64)
    devices = [Device(f"d{i}", DeviceKind.COMPUTE, capacity=c) for i, c in enumerate(caps)]
    return csr_graph(n, src, dst, names=["x"], devices=devices, layers=[], **cols)


@settings(max_examples=150, deadline=None)
@given(small_graphs())
def test_numba_equals_python_on_small_graphs(g: Graph) -> None:
    assert_same(replay(g, "numba"), replay(g, "python"))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(50, 600),
    devices=st.integers(1, 6),
    capacity=st.integers(1, 3),
    virtual=st.sampled_from([0.0, 0.3]),
    zero=st.sampled_from([0.0, 0.4]),
    gap=st.sampled_from([0.0, 1.0]),
    integer=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_numba_equals_python_on_layered_dags(n, devices, capacity, virtual, zero, gap, integer, seed) -> None:
    g = random_layered_dag(n, devices=devices, capacity=capacity, virtual_frac=virtual, zero_frac=zero, gap=gap,
                           integer_times=integer, window=8, seed=seed)
    assert_same(replay(g, "numba"), replay(g, "python"))


def test_numba_equals_python_on_ddp_graph() -> None:
    g = ddp_graph(4, layers=8, buckets=3, steps=2, comm_capacity=2, jitter=0.1)
    assert_same(replay(g, "numba"), replay(g, "python"))
    assert replay(g).engine == "numba"


def _builder(capacity: int = 1) -> tuple[GraphBuilder, int]:
    b = GraphBuilder()
    return b, b.device("cpu", DeviceKind.COMPUTE, capacity=capacity)


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_chain(engine: str) -> None:
    b, d = _builder()
    b.chain([b.add_node(f"n{i}", Kind.FORWARD, device=d, dur=i + 1.0, gap=0.5, order=i) for i in range(4)])
    r = replay(b.build(), engine)
    assert r.makespan == 1 + 2 + 3 + 4 + 4 * 0.5
    assert r.gate.tolist() == [-1, 0, 1, 2]


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_fork_join_on_separate_devices(engine: str) -> None:
    b = GraphBuilder()
    devs = [b.device(f"d{i}", DeviceKind.COMPUTE) for i in range(3)]
    src = b.add_node("src", Kind.FORWARD, device=devs[0], dur=1.0)
    left = b.add_node("left", Kind.FORWARD, device=devs[1], dur=5.0)
    right = b.add_node("right", Kind.FORWARD, device=devs[2], dur=3.0)
    join = b.add_node("join", Kind.FORWARD, device=devs[0], dur=2.0)
    b.add_edges([src, src, left, right], [left, right, join, join])
    r = replay(b.build(), engine)
    assert r.makespan == 1 + 5 + 2
    assert r.gate[join] == left


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_device_contention_serialises_by_order(engine: str) -> None:
    b, d = _builder()
    late = b.add_node("late", Kind.FORWARD, device=d, dur=4.0, order=2)
    early = b.add_node("early", Kind.FORWARD, device=d, dur=3.0, order=1)
    r = replay(b.build(), engine)
    assert (r.start[early], r.start[late]) == (0.0, 3.0)
    assert r.gate[late] == early  # gated by the device, not by a predecessor
    assert r.makespan == 7.0


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_capacity_two_runs_two_at_once(engine: str) -> None:
    b, d = _builder(capacity=2)
    for i in range(5):
        b.add_node(f"c{i}", Kind.COMM, device=d, dur=2.0, order=i)
    r = replay(b.build(), engine)
    assert r.start.tolist() == [0.0, 0.0, 2.0, 2.0, 4.0]
    assert r.makespan == 6.0


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_cycle_is_a_user_error(engine: str) -> None:
    b, d = _builder()
    x = b.add_node("x", Kind.FORWARD, device=d, dur=1.0)
    y = b.add_node("y", Kind.FORWARD, device=d, dur=1.0)
    z = b.add_node("z", Kind.FORWARD, dur=1.0)
    b.add_edges([x, y], [y, x])
    b.add_edge(x, z)
    with pytest.raises(DagprofError, match="dependency cycle: 3 of 3 nodes"):
        replay(b.build(), engine)


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_bad_inputs_are_user_errors(engine: str) -> None:
    b, d = _builder()
    b.add_node("x", Kind.FORWARD, device=d, dur=1.0)
    g = b.build()
    with pytest.raises(DagprofError, match="device outside"):
        replay(g.replace(device=np.array([3])), engine)
    with pytest.raises(DagprofError, match="'dur' must be finite"):
        replay(g.replace(dur=np.array([np.nan])), engine)
    with pytest.raises(DagprofError, match="capacity < 1"):
        replay(g.replace(devices=[Device("cpu", DeviceKind.COMPUTE, capacity=0)]), engine)
    with pytest.raises(DagprofError, match="unknown replay engine"):
        replay(g, "fast")


def test_empty_graph() -> None:
    g = GraphBuilder().build()
    assert replay(g, "numba").makespan == replay_python(g).makespan == 0.0


def test_without_numba_auto_falls_back_to_python() -> None:
    import subprocess
    import sys

    code = (
        "import sys, warnings; sys.modules['numba'] = None\n"
        "from dagprof.graph.random_graphs import random_layered_dag\n"
        "from dagprof.replay import replay\n"
        "from dagprof.errors import DagprofError\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    r = replay(random_layered_dag(50))\n"
        "assert r.engine == 'python' and 'pure Python' in str(w[0].message)\n"
        "try:\n"
        "    replay(random_layered_dag(50), 'numba')\n"
        "except DagprofError as e:\n"
        "    print('ok', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok the numba replay engine is not available")
