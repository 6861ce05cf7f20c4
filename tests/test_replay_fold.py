"""Rank folding: simulate one rank per class of alike ranks, expand back to every rank."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from dagprof.graph.dag import csr_graph
from dagprof.graph.random_graphs import ddp_graph
from dagprof.graph.symmetry import expand, fold_ranks
from dagprof.replay import replay

from test_replay_engines import assert_same
from test_replay_incremental import COLUMNS, edges


@settings(max_examples=20, deadline=None)
@given(world=st.integers(1, 6), layers=st.integers(2, 12), buckets=st.integers(1, 4), steps=st.integers(1, 2),
       cap=st.integers(1, 2), slow=st.lists(st.integers(0, 5), max_size=2))
def test_fold_expand_equals_full_replay(world, layers, buckets, steps, cap, slow) -> None:
    g = ddp_graph(world, layers=layers, buckets=min(buckets, layers), steps=steps, comm_capacity=cap)
    dur = g.dur.copy()
    for r in slow:  # some ranks run slower: they form classes of their own
        dur[g.rank == r % world] *= 1.5 + r
    g = g.replace(dur=dur)
    folded, info = fold_ranks(g)
    assert sorted(m for ms in info.classes.values() for m in ms) == list(range(world))
    assert len(info.classes) == len({tuple(g.dur[g.rank == r]) for r in range(world)})
    assert folded.meta.world_size == world
    assert_same(expand(replay(folded), info), replay(g, "python"))


def test_symmetric_ranks_fold_to_one() -> None:
    g = ddp_graph(16, layers=6, buckets=2, steps=2)
    folded, info = fold_ranks(g)
    assert info.classes == {0: list(range(16))} and info.folded
    assert set(folded.rank.tolist()) == {-1, 0}
    assert len(folded) == len(g) - 15 * int(np.sum(g.rank == 1))


def test_tolerance_and_averaging() -> None:
    g = ddp_graph(4, layers=6, buckets=2, jitter=0.01, seed=3)
    _, exact = fold_ranks(g)
    assert exact.classes == {r: [r] for r in range(4)}
    _, loose = fold_ranks(g, tol=0.2)
    assert loose.classes == {0: [0, 1, 2, 3]}
    folded, avg = fold_ranks(g, average=True)
    assert avg.classes == {0: [0, 1, 2, 3]}
    fwd0 = [v for v in range(len(folded)) if folded.names[folded.name[v]] == "rank0.fwd.0"][0]
    mean = np.mean([g.dur[v] for v in range(len(g)) if g.names[g.name[v]].endswith(".fwd.0") and g.rank[v] >= 0])
    assert np.isclose(folded.dur[fwd0], mean)


def test_directly_coupled_ranks_are_not_folded() -> None:
    g = ddp_graph(4, layers=4, buckets=1)
    src, dst = edges(g)
    a, b = np.flatnonzero(g.rank == 1)[0], np.flatnonzero(g.rank == 2)[-1]
    g = csr_graph(len(g), np.append(src, a), np.append(dst, b), names=g.names, devices=g.devices, layers=g.layers,
                  meta=g.meta.copy(), **{c: getattr(g, c) for c in COLUMNS})
    folded, info = fold_ranks(g)
    assert info.classes == {0: [0, 3], 1: [1], 2: [2]}
    full, got = replay(g, "python"), expand(replay(folded), info)
    np.testing.assert_array_equal(full.start, got.start)
    np.testing.assert_array_equal(full.end, got.end)


def test_graph_without_ranks_is_kept() -> None:
    g = ddp_graph(1, layers=3, buckets=1)
    g = g.replace(rank=np.full(len(g), -1))
    folded, info = fold_ranks(g)
    assert len(folded) == len(g) and info.classes == {} and not info.folded
    assert_same(expand(replay(folded), info), replay(g))


def test_fold_graph_from_the_builder() -> None:
    """The global graph built from (synthetic) rank traces folds exactly; a slower rank stays apart."""
    from dagprof.graph.build import build_graph

    from synthetic import ddp_run

    for slow, classes in (({}, {0: [0, 1, 2, 3]}), ({2: 1.3}, {0: [0, 1, 3], 2: [2]})):
        g = build_graph(ddp_run(ranks=4, steps=3, slow=slow))
        folded, info = fold_ranks(g)
        assert info.classes == classes
        assert_same(expand(replay(folded), info), replay(g, "python"))
