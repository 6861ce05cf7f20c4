"""PowerSGD in two buckets under ``dagprof.apply``'s chained hook, on a real run (tests/data/powersgd-2bucket: the
built-in cnn on the namespace testbed, 200 Mbit/s, one verification round of the strategy ``optimize --allow-lossy``
found, its profile of DDP's defaults and the strategy run's own profile).

The chained hook starts a bucket when the previous one completed: the second bucket's three all-reduces and its
hook's CPU come after the first's, on the one channel. Measured and predicted, that order holds; the prediction puts
the chained bucket's whole hook on the channel and the first bucket's callbacks on the backward they run beside."""
import numpy as np
import pytest
from testdata import DATA

from dagprof.collect.deploy.strategy import load_strategy
from dagprof.costmodel.codecs import CodecCosts
from dagprof.graph.dag import Graph
from dagprof.passes.compression import powersgd_parts
from dagprof.passes.gradients import gradient_order
from dagprof.pipeline import open_run
from dagprof.replay import ReplayResult, replay
from dagprof.search.candidate import Space, candidate_of
from dagprof.search.measured import in_job, overlap_of
from dagprof.search.optimize import predict_run
from dagprof.traces.events import Kind

RUN = DATA / "powersgd-2bucket"


@pytest.fixture(scope="module")
def defaults():
    return open_run(str(RUN / "defaults"))


@pytest.fixture(scope="module")
def strategy():
    return load_strategy(str(RUN / "strategy.json"))


def bucket_allreduces(g: Graph) -> tuple[dict[int, np.ndarray], ReplayResult]:
    """Per step, the bucket all-reduces on the channel in the order they started, and the replay that says so."""
    res = replay(g)
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.nbytes > 0))
    return {s: comm[g.step[comm] == s][np.argsort(res.start[comm[g.step[comm] == s]])] for s in sorted(set(g.step[comm].tolist()))}, res


def test_the_measured_second_bucket_completes_after_the_first_on_every_rank():
    g = open_run(str(RUN / "strategy-run")).graph
    per_step, res = bucket_allreduces(g)
    assert len(per_step) == 5
    for comm in per_step.values():
        assert [int(g.bucket[v]) for v in comm] == [0, 1]
        assert res.start[comm[1]] >= res.end[comm[0]] - 1e-6  # chained: one after the other on the channel


def test_the_prediction_chains_the_second_bucket_after_the_first(defaults, strategy):
    g = predict_run(defaults.run, defaults.graph, strategy, str(RUN / "codec-costs.json")).graph
    per_step, res = bucket_allreduces(g)
    assert len(per_step) == 5
    bwd = g.kind == Kind.BACKWARD
    for s, (first, second) in per_step.items():
        assert res.start[second] >= res.end[first] - 1e-6
        # the second bucket holds the first layers' gradients: it waits for every rank's backward
        assert res.start[second] >= res.end[bwd & (g.step == s)].max() - 1e-6


def test_the_chained_bucket_carries_its_whole_hook_on_the_channel(defaults, strategy):
    """The second bucket's hook runs when the first completed (on gloo's thread, or on the training thread once the
    first is done): its CPU before, between and after its all-reduces is on the channel. The first bucket's issue is
    on the training thread, and its callbacks, which run beside the backward, are charged to it as well."""
    g = predict_run(defaults.run, defaults.graph, strategy, str(RUN / "codec-costs.json")).graph
    order = gradient_order(defaults.graph, defaults.run.ranks[0].buckets)
    costs = in_job(CodecCosts.load(str(RUN / "codec-costs.json")), overlap_of(defaults.run))
    ends = candidate_of(Space(order, []), strategy).plan.ends
    (a0, z0), (a1, z1) = order.bucket_params(ends)
    first, second = (powersgd_parts(order, a, z, 2, costs) for a, z in ((a0, z0), (a1, z1)))
    per_step, _ = bucket_allreduces(g)
    for s, (_, c1) in per_step.items():
        assert g.dur[c1] > second.issue_us + second.middle_us + second.decode_us
        enq0, enq1 = ([v for v in np.flatnonzero((g.kind == Kind.COMM_ENQUEUE) & (g.step == s) & (g.bucket == b) & (g.rank >= 0))
                       if ".enqueue" in g.node_name(v)] for b in (0, 1))
        assert len(enq0) == len(enq1) == 2
        # both enqueues pay DDP's measured enqueue; the first adds its issue and the callbacks' CPU taken from the
        # backward, the chained second nothing (its hook is on the channel)
        assert g.dur[enq0] - g.dur[enq1] == pytest.approx([first.issue_us + first.middle_us + first.decode_us] * 2)



def test_a_job_that_measured_nothing_prices_the_chain_by_the_clusters_calibration(strategy, tmp_path):
    """A user's job (``cmd:``) has no ``overlap.json``: dagprof never adds collectives to its group. ``calibrate --overlap``
    measures the same things on dagprof's ranks on the job's cluster (the link-model file's ``overlap``); the chained
    all-reduces come from there as the slowdown does: the same measurements price the same chain, and slower chained
    all-reduces there make each of a bucket's three all-reduces as much slower. The codecs' yardstick does not (a snapshot
    of the load before the profile): the job's own here measures none (``matmul_us`` 0) to compare like with like."""
    import json
    import shutil

    from dagprof.costmodel.alphabeta import AlphaBeta
    from dagprof.costmodel.topology import save_link_model
    from dagprof.passes.bucket_plan import BucketSlots
    from dagprof.passes.compression import Chained, chained_latency_us

    user, own_run = tmp_path / "run", tmp_path / "own"
    shutil.copytree(RUN / "defaults", user, ignore=shutil.ignore_patterns("overlap.json"))
    table = json.loads((RUN / "defaults" / "overlap.json").read_text())
    shutil.copytree(RUN / "defaults", own_run, ignore=shutil.ignore_patterns("overlap.json"))
    (own_run / "overlap.json").write_text(json.dumps({**table, "matmul_us": 0.0}))
    slower = {**table, "chained_allreduce": [[b, us + 2000.0] for b, us in table["chained_allreduce"]]}
    link, link_slower = (save_link_model(tmp_path / f"link{i}.json", AlphaBeta(0.0, 0.04), overlap=t) for i, t in enumerate((table, slower)))
    run, own_run = open_run(str(user)), open_run(str(own_run))
    costs = str(RUN / "codec-costs.json")
    own, calibrated, chained_slower = (predict_run(r.run, r.graph, strategy, costs, link_model=lm).graph
                                       for r, lm in ((own_run, None), (run, link), (run, link_slower)))
    comm = [np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0)) for g in (own, calibrated, chained_slower)]
    assert len(comm[0]) == 10  # two buckets in each of 5 steps
    assert calibrated.dur[comm[1]] == pytest.approx(own.dur[comm[0]])
    price = BucketSlots(run.graph, gradient_order(run.graph, run.run.ranks[0].buckets)).price
    pairs = [Chained(tuple((b, us) for b, us in t["chained_allreduce"])) for t in (table, slower)]
    more = chained_latency_us(pairs[1], price) - chained_latency_us(pairs[0], price)
    assert more > 1000.0
    assert chained_slower.dur[comm[2]] - calibrated.dur[comm[1]] == pytest.approx(3 * more)


def test_the_chained_buckets_cpu_takes_what_cpu_between_chained_all_reduces_took_on_the_cluster(strategy, tmp_path):
    """``calibrate --overlap`` also times the hook's kind of CPU between chained all-reduces against that CPU alone
    (``chained_stretch``): the chained second bucket, whose hook runs after the backward, takes its hook's whole CPU that
    many times its idle price on the channel; the first bucket, whose callbacks run beside the backward, keeps the
    overlap slowdown's price. A file written before measured none: priced as before."""
    import json
    import shutil

    from dagprof.costmodel.alphabeta import AlphaBeta
    from dagprof.costmodel.topology import save_link_model

    user = tmp_path / "run"
    shutil.copytree(RUN / "defaults", user, ignore=shutil.ignore_patterns("overlap.json"))
    table = json.loads((RUN / "defaults" / "overlap.json").read_text())
    assert "chained_stretch" not in table  # recorded before it was measured
    before, stretched = (save_link_model(tmp_path / f"link{i}.json", AlphaBeta(0.0, 0.04), overlap={**table, **extra})
                         for i, extra in enumerate(({}, {"chained_stretch": 1.5})))
    run = open_run(str(user))
    costs = str(RUN / "codec-costs.json")
    a, b = (predict_run(run.run, run.graph, strategy, costs, link_model=str(lm)).graph for lm in (before, stretched))
    order = gradient_order(run.graph, run.run.ranks[0].buckets)
    ends = candidate_of(Space(order, []), strategy).plan.ends
    second = powersgd_parts(order, *order.bucket_params(ends)[1], 2, CodecCosts.load(costs))
    per_step, _ = bucket_allreduces(a)
    for c0, c1 in per_step.values():
        assert b.dur[c0] == pytest.approx(a.dur[c0])
        assert b.dur[c1] - a.dur[c1] == pytest.approx(0.5 * (second.issue_us + second.middle_us + second.decode_us))


def test_a_bucket_closed_during_the_backward_pays_the_chain_measured_beside_a_busy_backward(strategy, tmp_path):
    """``calibrate --overlap`` also times PowerSGD's chain issued while a backward runs on the issuing thread
    (``chained_busy``): the first bucket, whose chain runs beside the backward, pays its excess over the link model at each
    of its three all-reduces; the second, closed by the last gradient, keeps the idle chain's. A file written before it
    was measured prices both by the idle chain, as before."""
    import json
    import shutil

    from dagprof.costmodel.alphabeta import AlphaBeta
    from dagprof.costmodel.topology import save_link_model
    from dagprof.passes.bucket_plan import BucketSlots
    from dagprof.passes.compression import Chained, chained_latency_us

    user = tmp_path / "run"
    shutil.copytree(RUN / "defaults", user, ignore=shutil.ignore_patterns("overlap.json"))
    table = json.loads((RUN / "defaults" / "overlap.json").read_text())
    assert "chained_busy" not in table  # recorded before it was measured
    busy = [[b, us + 2000.0] for b, us in table["chained_allreduce"]]
    before, beside = (save_link_model(tmp_path / f"link{i}.json", AlphaBeta(0.0, 0.04), overlap={**table, **extra})
                      for i, extra in enumerate(({}, {"chained_busy": busy})))
    run = open_run(str(user))
    costs = str(RUN / "codec-costs.json")
    a, b = (predict_run(run.run, run.graph, strategy, costs, link_model=str(lm)).graph for lm in (before, beside))
    price = BucketSlots(run.graph, gradient_order(run.graph, run.run.ranks[0].buckets)).price
    idle = Chained(tuple((bb, us) for bb, us in table["chained_allreduce"]))
    more = chained_latency_us(Chained(idle.allreduce, busy=tuple((bb, us) for bb, us in busy)), price, True) - chained_latency_us(idle, price)
    assert more > 1000.0
    assert chained_latency_us(idle, price, True) == chained_latency_us(idle, price)  # no busy table: the idle one
    per_step, _ = bucket_allreduces(a)
    assert len(per_step) == 5
    for c0, c1 in per_step.values():
        assert b.dur[c0] - a.dur[c0] == pytest.approx(3 * more)
        assert b.dur[c1] == pytest.approx(a.dur[c1])


def test_a_first_bucket_issues_at_the_measured_stretch(defaults):
    """A first bucket's issue, on the training thread, runs as much slower as the chain's CPU (``Chained.stretch``),
    whether its hook runs after the backward (one bucket, the whole model: in the strategy runs of the held-out embedding
    and LSTM jobs, 2026-12-04, the issue's median took 1.2-1.8x its idle price where the calibration measured stretches of
    1.3-2.3) or during it (two buckets: 8.7-13.3 ms against 3.5-4.7 priced idle, the training thread's stretch 1.5-2.1,
    ``bench_powersgd_backward``, 2026-12-05); the callbacks' CPU it takes from the backward stays at the idle price."""
    from dagprof.costmodel.codecs import Codec
    from dagprof.passes.bucket_plan import BucketSlots
    from dagprof.passes.compression import UNMEASURED, Chained, bucket_cost

    order = gradient_order(defaults.graph, defaults.run.ranks[0].buckets)
    costs = CodecCosts.load(str(RUN / "codec-costs.json"))
    price = BucketSlots(defaults.graph, order, costs).price
    last = len(order) - 1
    whole = powersgd_parts(order, 0, last, 2, costs)
    for chained, factor in ((UNMEASURED, 1.0), (Chained(stretch=1.5), 1.5), (Chained(stretch=0.8), 1.0)):
        one = bucket_cost(order, 0, last, Codec("powersgd", 2), 1, price, costs, chained=chained)
        assert one.encode_us == pytest.approx(whole.issue_us * factor)
        during = bucket_cost(order, 0, last - 1, Codec("powersgd", 2), 1, price, costs, chained=chained)
        first = powersgd_parts(order, 0, last - 1, 2, costs)
        assert during.encode_us == pytest.approx(first.issue_us * factor + first.middle_us + first.decode_us)  # and the callbacks' CPU taken from the backward


def test_the_profiled_stretch_replaces_the_calibrated_one(strategy, tmp_path):
    """A profile that recorded its training thread's CPU and waits for a core (``RankFile.thread_sched_ns``) prices the
    codec's CPU after the backward at that stretch, the slowest rank's, instead of the one ``calibrate --overlap``
    measured minutes earlier; a profile without them (this one, recorded before) keeps the calibrated stretch."""
    import json
    import shutil

    from dagprof.costmodel.alphabeta import AlphaBeta
    from dagprof.costmodel.topology import save_link_model
    from dagprof.search.measured import profiled_stretch

    table = json.loads((RUN / "defaults" / "overlap.json").read_text())
    link = save_link_model(tmp_path / "link.json", AlphaBeta(0.0, 0.04), overlap={**table, "chained_stretch": 1.5})
    runs = {}
    for name, waits in (("older", None), ("loaded", (1.0, 0.5)), ("quiet", (0.2, 0.1))):  # rank 0 waited for a core as long as it ran, rank 1 half
        user = tmp_path / name
        shutil.copytree(RUN / "defaults", user, ignore=shutil.ignore_patterns("overlap.json"))
        for r, wait in enumerate(waits or ()):
            path = user / f"rank{r}.json"
            doc = json.loads(path.read_text())
            doc["thread_sched_ns"] = [[s, 4_000_000, int(wait * 4_000_000)] for s in doc["steps_profiled"]]
            path.write_text(json.dumps(doc))
        runs[name] = open_run(str(user))
    assert runs["older"].run.ranks[0].meta.train_thread == [] and profiled_stretch(runs["older"].run) == 0.0
    assert [s.step for s in runs["loaded"].run.ranks[1].meta.train_thread] == runs["loaded"].run.ranks[1].meta.steps_profiled
    assert profiled_stretch(runs["loaded"].run) == pytest.approx(2.0)
    costs = str(RUN / "codec-costs.json")
    a, b = (predict_run(runs[n].run, runs[n].graph, strategy, costs, link_model=str(link)).graph for n in ("older", "loaded"))
    order = gradient_order(a, runs["older"].run.ranks[0].buckets)
    second = powersgd_parts(order, *order.bucket_params(candidate_of(Space(order, []), strategy).plan.ends)[1], 2, CodecCosts.load(costs))
    per_step, _ = bucket_allreduces(a)
    loaded_steps, _ = bucket_allreduces(b)
    for (c0, c1), (d0, d1) in zip(per_step.values(), loaded_steps.values()):
        assert b.dur[d0] == pytest.approx(a.dur[c0])  # the first bucket's callbacks run beside the backward: its own price
        assert b.dur[d1] - a.dur[c1] == pytest.approx((2.0 - 1.5) * (second.issue_us + second.middle_us + second.decode_us))
    # quieter than the chain calibrate ran (stretch 1.2 < 1.5): the callbacks after the backward take the chain's 1.5
    quiet = predict_run(runs["quiet"].run, runs["quiet"].graph, strategy, costs, link_model=str(link)).graph
    for (_, c1), (_, q1) in zip(per_step.values(), bucket_allreduces(quiet)[0].values()):
        assert quiet.dur[q1] == pytest.approx(a.dur[c1])
