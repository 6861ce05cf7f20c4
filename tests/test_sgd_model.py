"""S-SGD DAG model: closed forms == DAG replay, hand-computed cases, optimal merging."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dagprof.costmodel import AlphaBeta
from dagprof.errors import DagprofError
from dagprof.sgd.closed import closed_form, wfbp_tau
from dagprof.sgd.comm import CommModel
from dagprof.sgd.dag import build_sgd_graph, replay_jitter, replay_schedule
from dagprof.sgd.predict import anchor, predict
from dagprof.sgd.schedule import Policy, make_schedule, merge_groups
from dagprof.traces.events import Kind
from dagprof.traces.layerwise import LayerProfile


def profile(fw, bw, nbytes, io=0.0, h2d=0.0, update=0.0, measured=None, workers=None) -> LayerProfile:
    return LayerProfile(
        names=[f"l{i}" for i in range(len(bw))],
        forward_us=None if fw is None else np.asarray(fw, float),
        backward_us=np.asarray(bw, float),
        grad_bytes=np.asarray(nbytes, np.int64),
        allreduce_us=None if measured is None else np.asarray(measured, float),
        workers=workers,
        io_us=io,
        h2d_us=h2d,
        update_us=update,
    )


def random_profile(rng: np.random.Generator, n: int) -> LayerProfile:
    return profile(
        rng.uniform(0, 50, n),
        rng.uniform(0, 100, n),
        rng.integers(0, 5_000_000, n),
        io=float(rng.choice([0.0, rng.uniform(0, 3000)])),
        h2d=float(rng.uniform(0, 500)),
        update=float(rng.uniform(0, 200)),
    )


@pytest.mark.parametrize("seed", range(6))
def test_closed_forms_equal_dag_replay(seed):
    rng = np.random.default_rng(seed)
    prof = random_profile(rng, int(rng.integers(1, 12)))
    link = AlphaBeta(float(rng.uniform(0, 50)), float(rng.uniform(1e-5, 1e-3)), float(rng.uniform(0, 1e-4)))
    comm = CommModel(default=link, default_name="random link")
    if seed % 2:  # measured layer times at 3 workers, merged messages by their fit
        comm = comm.with_measured(3, prof.grad_bytes, rng.uniform(1, 400, prof.num_layers), "random measured")
    for workers in (1, 2, 3, 5):
        for policy in Policy:
            schedule = make_schedule(prof, policy, workers, comm)
            closed = closed_form(prof, schedule)
            dag = replay_schedule(prof, schedule, iterations=3)
            assert dag.iter_us == pytest.approx(closed.iter_us, rel=1e-9, abs=1e-6), (policy, workers)
            assert dag.comm_exposed_us == pytest.approx(closed.comm_exposed_us, rel=1e-9, abs=1e-6), (policy, workers)
            assert dag.comm_us == pytest.approx(closed.comm_us, rel=1e-9, abs=1e-6)


def test_policies_are_ordered():
    rng = np.random.default_rng(7)
    for _ in range(20):
        prof = random_profile(rng, int(rng.integers(1, 20)))
        comm = CommModel(default=AlphaBeta(float(rng.uniform(0, 100)), float(rng.uniform(1e-5, 1e-3))), default_name="x")
        t = {p: closed_form(prof, make_schedule(prof, p, 4, comm)).iter_us for p in Policy}
        assert t[Policy.IO_OVERLAP] <= t[Policy.SEQUENTIAL] + 1e-9
        assert t[Policy.WFBP] <= t[Policy.IO_OVERLAP] + 1e-9
        assert t[Policy.MG_WFBP] <= min(t[Policy.WFBP], t[Policy.FUSED]) + 1e-9


def hand_case() -> tuple[LayerProfile, CommModel]:
    # ring over 2 workers: 2(N-1) alpha + 2(N-1)/N M beta = 0.5 + 0.01 M; layer 0: 350 B -> 4 us, layer 1: 50 B -> 1 us
    return profile([1, 1], [2, 3], [350, 50], io=1, h2d=1, update=1), CommModel(default=AlphaBeta(0.25, 0.01), default_name="hand")


@pytest.mark.parametrize(
    "policy, iter_us, exposed_us",
    [
        (Policy.SEQUENTIAL, 1 + 1 + 2 + 5 + 5 + 1, 5),  # everything in a row
        (Policy.IO_OVERLAP, max(2, 2 + 5 + 5 + 1), 5),
        # tau_b(1)=0, tau_c(1)=3; tau_b(0)=3, tau_c(0)=max(3+1, 3+2)=5; t = t_f + 5 + t_c(0) + t_u
        (Policy.WFBP, 2 + 5 + 4 + 1, 4),
        (Policy.FUSED, 2 + 5 + 4.5 + 1, 4.5),  # one 400 B message after backward: 4.5 us
        (Policy.MG_WFBP, 2 + 5 + 4 + 1, 4),  # merging would end comm at 5 + 4.5: WFBP's groups are optimal
    ],
)
def test_hand_computed_two_layers(policy, iter_us, exposed_us):
    prof, comm = hand_case()
    pred = closed_form(prof, make_schedule(prof, policy, 2, comm))
    assert pred.iter_us == pytest.approx(iter_us)
    assert pred.comm_exposed_us == pytest.approx(exposed_us)


def test_layers_without_parameters_send_nothing():
    prof = profile([1, 1], [2, 3], [0, 100])
    comm = CommModel(default=AlphaBeta(10.0, 0.01), default_name="x")
    schedule = make_schedule(prof, Policy.WFBP, 4, comm)
    assert schedule.comm_us.tolist()[1] == 0.0 and schedule.comm_us[0] > 0


def test_wfbp_tau_matches_paper_recurrence_by_hand():
    tau_b, tau_c = wfbp_tau(np.array([2.0, 3.0]), np.array([4.0, 1.0]))
    assert tau_b.tolist() == [3.0, 0.0]
    assert tau_c.tolist() == [5.0, 3.0]


def test_io_bound_iteration_is_the_loader():
    prof = profile([1], [1], [100], io=50, h2d=10)
    comm = CommModel(default=AlphaBeta(1, 0.01), default_name="x")
    assert closed_form(prof, make_schedule(prof, Policy.WFBP, 2, comm)).iter_us == pytest.approx(60)
    assert closed_form(prof, make_schedule(prof, Policy.SEQUENTIAL, 2, comm)).iter_us == pytest.approx(60 + 1 + 1 + 2 + 1)


def test_latency_bound_layers_merge_into_one_message():
    # every message costs 2 us whatever its size: WFBP ends comm at 7, one merged message at 3 + 2 = 5
    prof = profile([0, 0, 0], [1, 1, 1], [10, 10, 10])
    comm = CommModel(default=AlphaBeta(1.0, 0.0), default_name="latency only")
    wfbp = closed_form(prof, make_schedule(prof, Policy.WFBP, 2, comm))
    schedule = make_schedule(prof, Policy.MG_WFBP, 2, comm)
    mg = closed_form(prof, schedule)
    assert wfbp.iter_us == pytest.approx(7) and mg.iter_us == pytest.approx(5)
    assert schedule.num_groups == 1 and schedule.group_lo.tolist() == [0] and schedule.group_hi.tolist() == [3]


@pytest.mark.parametrize("seed", range(4))
def test_merge_dp_is_optimal_against_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 8))
    bw = rng.uniform(0, 10, n)
    nbytes = rng.integers(0, 1000, n)
    alpha, beta = rng.uniform(0, 10), rng.uniform(0, 0.02)
    cost = lambda b: alpha + beta * np.asarray(b, float)  # noqa: E731
    layer_cost = rng.uniform(0, 15, n)
    lo, hi, costs = merge_groups(bw, nbytes, layer_cost, cost)
    ready_at = np.sum(bw) - np.cumsum(bw) + bw  # end of B_l
    # brute force over every cut set in backward order
    best = np.inf
    for cuts in itertools.product([0, 1], repeat=n - 1):
        t, start = 0.0, n - 1
        groups = []
        for pos in range(n - 1, -1, -1):
            if pos == 0 or cuts[pos - 1]:
                groups.append((pos, start + 1))
                start = pos - 1
        for glo, ghi in groups:
            c = layer_cost[glo] if ghi - glo == 1 else cost(nbytes[glo:ghi].sum())
            t = max(t, ready_at[glo]) + c
        best = min(best, t)
    t = 0.0
    for glo, c in zip(lo, costs):
        t = max(t, ready_at[glo]) + c
    assert t == pytest.approx(best)
    assert np.concatenate([np.arange(a, b) for a, b in sorted(zip(lo, hi))]).tolist() == list(range(n))


def test_graph_has_the_papers_edges():
    prof, comm = hand_case()
    g = build_sgd_graph(prof, make_schedule(prof, Policy.WFBP, 2, comm), iterations=2)
    names = {g.node_name(v): v for v in range(len(g))}
    succ = lambda a: {g.node_name(int(s)) for s in g.successors(names[a])}  # noqa: E731
    assert succ("w0.i0.IO") == {"w0.i0.H2D"}
    assert succ("w0.i0.H2D") == {"w0.i0.F.l0", "w0.i1.IO"}  # next I/O prefetched
    assert succ("w0.i0.F.l1") == {"w0.i0.B.l1"}
    assert "i0.C.l1+0" in succ("w0.i0.B.l1") and "i0.C.l1+0" in succ("w1.i0.B.l1")  # every worker feeds C_l
    assert succ("i0.C.l0+0") == {"w0.i0.U", "w1.i0.U"}
    assert succ("w1.i0.U") == {"w1.i1.F.l0"}
    comm_nodes = np.flatnonzero(g.kind == Kind.COMM)
    assert len({int(g.device[v]) for v in comm_nodes}) == 1 and g.devices[int(g.device[comm_nodes[0]])].capacity == 1


def test_anchor_and_scaling_rows():
    prof = profile(None, [100, 100], [1000, 1000], measured=[80, 80], workers=4)
    prof = anchor(prof, 400.0)
    assert prof.forward_us.sum() == pytest.approx(200)
    comm = CommModel(default=AlphaBeta(1, 0.01), default_name="x").with_measured(4, prof.grad_bytes, prof.allreduce_us, "m")
    scaling = predict(prof, [1, 4], comm, Policy.WFBP, check_replay=True)
    one, four = scaling.rows
    assert one.iter_us == pytest.approx(400) and one.speedup == pytest.approx(1) and one.efficiency == pytest.approx(1)
    # layer 1 ready at 100, comm 100..180; layer 0 ready at 200, comm 200..280: 80 exposed
    assert four.iter_us == pytest.approx(480) and four.comm_exposed_us == pytest.approx(80)
    assert four.speedup == pytest.approx(4 * 400 / 480)
    assert scaling.max_replay_rel_diff == pytest.approx(0, abs=1e-12)


def test_anchor_refuses_a_too_short_iteration():
    from dagprof.errors import DagprofError

    with pytest.raises(DagprofError, match="shorter than"):
        anchor(profile(None, [100, 100], [1, 1]), 150.0)


def test_anchor_removes_a_small_profiler_cost_evenly():
    """A quiet testbed's unprofiled 1-rank step ran 0.4 % under its profiled compute: scaled to it and said, not refused."""
    prof = anchor(profile(None, [100, 100], [1, 1]), 190.0)
    assert prof.backward_us.sum() + prof.forward_or_zero().sum() + prof.update_us == pytest.approx(190.0)
    assert "profiler's own cost" in prof.meta.anchored


def test_jitter_without_variation_is_the_closed_form():
    rng = np.random.default_rng(3)
    p = random_profile(rng, 6)
    steps = 5
    p = p.with_(forward_us=p.forward_or_zero(), step_forward_us=np.tile(p.forward_or_zero(), (steps, 1)),
                step_backward_us=np.tile(p.backward_us, (steps, 1)), step_update_us=np.full(steps, 7.0))
    comm = CommModel(default=AlphaBeta(20.0, 1e-3))
    for n, policy in itertools.product((1, 2, 4), (Policy.WFBP, Policy.FUSED, Policy.SEQUENTIAL)):
        s = make_schedule(p, policy, n, comm)
        assert replay_jitter(p, s, samples=3) == pytest.approx(closed_form(p, s).iter_us, rel=1e-9)


def test_jitter_is_the_expected_slowest_worker():
    """One layer whose backward takes 1 or 3 ms (mean 2), fused: each iteration is the slowest of N draws, then the all-reduce."""
    p = profile([0.0], [2000.0], [1_000_000]).with_(step_forward_us=np.zeros((2, 1)), step_backward_us=np.array([[1000.0], [3000.0]]),
                                                    step_update_us=np.zeros(2))
    comm = CommModel(default=AlphaBeta(0.0, 1e-3))
    for n in (1, 2, 4):
        s = make_schedule(p, Policy.FUSED, n, comm)
        expected = 1000 + 2000 * (1 - 0.5**n) + s.comm_us.sum()  # E[max of n fair draws of {1, 3} ms]
        assert replay_jitter(p, s, samples=1000, iterations=6) == pytest.approx(expected, rel=0.04)
    # predict() uses it beyond one worker; one worker keeps the closed form
    scaling = predict(p, [1, 4], comm, Policy.FUSED, jitter_samples=50)
    assert scaling.rows[0].iter_us == pytest.approx(2000.0) and scaling.rows[1].iter_us > 2000.0 + s.comm_us.sum()
    with pytest.raises(DagprofError, match="per-step"):
        replay_jitter(profile([0.0], [1.0], [4]), s)
