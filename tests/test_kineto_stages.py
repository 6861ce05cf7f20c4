"""The Kineto reader's stages, one by one, on an excerpt of a real DDP trace (A100, NCCL).

Each stage is a function of the earlier stages' value objects; these tests pin what each returns.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from dagprof.traces import kineto as K, kineto_deps as D
from dagprof.traces.events import Dep, Kind
from dagprof.traces.kineto_decode import open_trace

PATH = os.path.join(os.path.dirname(__file__), "data", "kineto_excerpts", "hta_nccl_ddp_end_of_backward.json.gz")


@pytest.fixture(scope="module")
def stages():
    stream = open_trace(PATH)
    scan = K._scan(stream)
    trace = stream.head
    header = K._header(trace, scan)
    cols = K._columns(scan, PATH)
    nest = K._nest(cols)
    kinds = K._kinds(cols, nest)
    deps = D.dependencies(cols, nest, kinds, scan.syncs)
    colls = K._collectives(cols, nest, deps, header)
    return trace, header, cols, nest, kinds, deps, colls


def names(cols, rows):
    return [cols.name(int(i)) for i in rows]


def test_header_names_threads_and_reads_distributed_info(stages):
    _, header, *_ = stages
    names = set(header.thread_names.values())
    assert any("pt_main_thread" in n for n in names) and any("pt_autograd_0" in n for n in names)
    assert header.dist["backend"] == "nccl" and header.dist["rank"] == 0 and header.dist["world_size"] == 2


def test_columns_are_sorted_by_lane_then_start_longest_first(stages):
    _, _, cols, *_ = stages
    key = np.lexsort((-cols.dur, cols.start, cols.lane))
    assert np.array_equal(key, np.arange(cols.n))
    assert cols.start.min() == 0.0 and all(cols.xs[cols.orig[i]].name == cols.name(i) for i in (0, cols.n // 2, cols.n - 1))
    gpu_lanes = {cols.lane_keys[lane] for lane in np.unique(cols.lane[cols.is_gpu]).tolist()}
    assert gpu_lanes == {(True, 0, 7), (True, 0, 40)}


def test_nesting_parents_depths_and_the_enclosing_collective_call(stages):
    _, _, cols, nest, *_ = stages
    launches = [i for i in range(cols.n) if cols.name(i) == "cudaLaunchKernelExC" and nest.enqueue[i] >= 0]  # NCCL kernel launches
    assert launches  # (the excerpt cuts some c10d calls: their launches have none)
    for i in launches:
        e = int(nest.enqueue[i])
        assert cols.name(e) == "c10d::allreduce_" and nest.depth[i] > nest.depth[e] >= 0
        chain, j = [], i
        while j >= 0:
            chain.append(cols.name(j))
            j = int(nest.parent[j])
        assert chain[:3] == ["cudaLaunchKernelExC", "nccl:all_reduce", "record_param_comms"]
        assert nest.top[i] >= 0 and nest.depth[nest.top[i]] == 0
    assert np.all(nest.depth[cols.is_gpu] == 0)


def test_kinds_launchers_and_steps(stages):
    _, _, cols, _, kinds, *_ = stages
    gpu = np.flatnonzero(cols.is_gpu)
    assert np.all(kinds.launcher[gpu] >= 0)  # every GPU op has its runtime call
    assert np.all(cols.corr[kinds.launcher[gpu]] == cols.corr[gpu])
    assert set(names(cols, np.flatnonzero(kinds.kind == Kind.COMM))) == {"ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"}
    assert (kinds.kind[gpu] == Kind.BACKWARD).sum() > 10  # kernels launched by autograd nodes
    assert np.all(kinds.step == -1)  # the excerpt holds no ProfilerStep range


def test_dependencies_carry_their_rule(stages):
    _, _, cols, _, kinds, deps, _ = stages
    assert len(deps.src) == len(deps.dst) == len(deps.rule)
    by_rule = {Dep(r).name for r in np.unique(deps.rule).tolist()}
    assert by_rule >= {"LAUNCH", "COLL_READY", "STREAM_WAIT_PLAIN", "BACKWARD_END"}
    launch = deps.rule == Dep.LAUNCH
    assert np.array_equal(np.sort(deps.dst[launch]), np.flatnonzero(kinds.launcher >= 0))
    assert np.all(deps.enqueue_of[deps.kind == Kind.COMM] >= 0)


def test_collectives_group_seq_and_bytes(stages):
    _, _, cols, _, _, deps, colls = stages
    comm = np.flatnonzero(deps.kind == Kind.COMM)
    assert colls.groups == ["0"] and np.all(colls.group[comm] == 0)
    assert sorted(colls.seq[comm].tolist()) == list(range(len(comm)))
    assert np.all(colls.nbytes[comm] > 0)
    enq = deps.enqueue_of[comm]
    assert np.array_equal(colls.seq[enq], colls.seq[comm])  # the host call carries its transfer's seq


def test_rank_trace_assembly(stages):
    trace, header, cols, nest, kinds, deps, colls = stages
    t = K._rank_trace(trace, PATH, (None, None), header, cols, nest, kinds, deps, colls)
    assert (t.rank, t.world_size, t.backend) == (0, 2, "nccl")
    assert [lane.name for lane in t.lanes if lane.main] == ["thread 2910249 (pt_main_thread)"]
    assert len(t.flows) == len(t.flow_rule) and t.meta.declined == deps.declined


def _walk(st, en):
    """The definition: a stack of open events, a child cut at its parent's end."""
    parent, level, eff, stack = [-1] * len(st), [0] * len(st), list(en), []
    for i, s in enumerate(st):
        while stack and eff[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i], level[i] = stack[-1], len(stack)
            eff[i] = min(eff[i], eff[stack[-1]])
        stack.append(i)
    return parent, level


def _events(seed: int, nested: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows by start, longest first: random intervals, or a random tree of them with some children
    outliving their parent by a rounding."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 300))
    if nested:  # disjoint children inside each event, a tenth of the ends then late by 0.01
        st, en, todo = [], [], [(0.0, 1000.0)]
        while todo and len(st) < m:
            a, b = todo.pop(int(rng.integers(len(todo))))
            st.append(a)
            en.append(b)
            cuts = np.sort(rng.uniform(a, b, 2 * int(rng.integers(0, 4))))
            todo += list(zip(cuts[::2], cuts[1::2]))
        st = np.array(st)
        dur = np.array(en) - st + np.where(rng.random(len(st)) < 0.1, 0.01, 0.0)
    else:
        st = np.round(np.sort(rng.uniform(0, 100, m)), int(rng.integers(0, 3)))
        dur = np.where(rng.random(m) < 0.2, 0.0, np.round(rng.exponential(rng.choice([0.5, 5, 50]), m), 3))
    o = np.lexsort((-dur, st))
    return st[o], st[o] + dur[o]


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_parents_in_numpy_are_the_stack_walks(seed, nested):
    """Nested, outliving their parent by a rounding, overlapping, zero-length, equal starts: as the walk."""
    st, en = _events(seed, nested)
    parent, level = np.full(len(st), -1, np.int64), np.zeros(len(st), np.int64)
    K._parents(st, en, parent, level, 0)
    assert (parent.tolist(), level.tolist()) == _walk(st.tolist(), en.tolist())
