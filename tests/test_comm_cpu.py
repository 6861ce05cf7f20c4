"""The collectives' CPU off the training thread on the shared cores (``passes.comm_cpu``, under ``share_cores``), on a real
testbed recording of an FSDP2 job that recorded its process's CPU per step (tests/data/fsdp/testbed-workers-resnet-2:
2 gloo ranks in network namespaces of one 2-core host)."""
from __future__ import annotations

import dataclasses
import json
import shutil
import statistics

import msgspec
import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.passes.comm_cpu import comm_cpu, unrecorded_cpu_ranks, unrecorded_wake_ranks
from dagprof.passes.compute import share_cores
from dagprof.pipeline import open_run
from dagprof.search import scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.meta import OtherThreads

RUN = DATA / "fsdp" / "testbed-workers-resnet-2"


@pytest.fixture(scope="module")
def profile():
    return open_run(str(RUN)).graph


def _gloo_cpu(g) -> dict[int, float]:
    """Each rank's priced gloo CPU per step (us) in a graph ``share_cores`` gave it."""
    v = [i for i in range(len(g)) if ".gloo cpu " in g.node_name(i)]
    if not v:
        return {}
    steps = len({int(g.step[i]) for i in v})
    return {r: float(sum(g.dur[i] for i in v if g.rank[i] == r)) / steps for r in sorted({int(g.rank[i]) for i in v})}


def _unpriced(g):
    return g.replace(meta=g.meta.replace(loop_steps=None))


def test_each_rank_s_collectives_hold_its_other_threads_cpu_a_step(profile):
    loop = profile.meta.loop_steps
    price = comm_cpu(profile)
    assert price is not None and set(price.us_per_byte) == {0, 1}
    held = _gloo_cpu(share_cores(profile, 2))
    for r, steps in loop.profiled.items():
        other = statistics.median(loop.sched[r][s].process_cpu_us - loop.sched[r][s].cpu_us for s in steps)
        # the price times the bytes sent gives back what was measured, less where a call's CPU passed its transfer (5 of 140)
        assert other * 0.99 < held[r] <= other * (1 + 1e-9)


def test_on_cores_enough_for_every_thread_the_step_is_unchanged(profile):
    for g in (profile, scenario.apply(profile, scenario.Scenario(workers=4), scenario.Cluster(), None)):
        free = share_cores(g.replace(meta=g.meta.replace(comm_cpu=comm_cpu(profile))), 64)
        assert len(free) > len(share_cores(_unpriced(g), 64))
        assert job_iteration_us(free) == pytest.approx(job_iteration_us(share_cores(_unpriced(g), 64)), rel=1e-9)


def test_four_ranks_on_two_cores_wait_for_a_core_for_their_collectives(profile):
    c = scenario.Cluster(cores=2)
    four = scenario.apply(profile, scenario.Scenario(workers=4), c, None)
    assert four.meta.comm_cpu is not None  # kept while the ranks were the profile's
    two, held = _gloo_cpu(share_cores(profile, 2)), _gloo_cpu(four)
    assert sorted(held) == [0, 1, 2, 3]
    for r in held:  # a ring on 4 ranks sends 3/4 of each gathered or reduced tensor per rank where 2 sent 1/2
        assert held[r] == pytest.approx(1.5 * two[r % 2], rel=0.01)  # (the calls capped at their transfer differ)
    without = scenario.apply(_unpriced(profile), scenario.Scenario(workers=4), c, None)
    # this fixed recording: 435.1 ms -> 452.7 (the 4-rank job ran 426.8; the pair was taken at load 5.8-14.3)
    assert job_iteration_us(four) > job_iteration_us(without) * 1.02
    same = scenario.apply(profile, scenario.Scenario(), c, None)
    assert job_iteration_us(same) == pytest.approx(job_iteration_us(scenario.apply(_unpriced(profile), scenario.Scenario(), c, None)), rel=0.01)


def test_a_job_without_its_process_cpu_or_off_gloo_has_no_price(profile):
    assert comm_cpu(_unpriced(profile)) is None
    assert comm_cpu(profile.replace(meta=profile.meta.replace(framework="horovod"))) is None


def test_a_rank_without_its_process_cpu_leaves_gloo_unpriced_and_cores_say_so(profile, tmp_path):
    """The recording with rank 1's process CPU record removed (a tmp copy): no price, so ``--cores`` queues no gloo CPU, and
    the what-if says so in one line naming rank 1; without ``--cores``, or with every rank's record, no such line."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    f = run / "rank1.json"
    d = json.loads(f.read_text())
    del d["process_cpu_ns"]
    f.write_text(json.dumps(d))
    g = open_run(str(run)).graph
    assert comm_cpu(g) is None
    assert unrecorded_cpu_ranks(g) == [1] and unrecorded_cpu_ranks(profile) == []
    assert not _gloo_cpu(share_cores(g, 2))
    said = [n for n in evaluate(g, [scenario.Scenario()], scenario.Cluster(cores=2), tolerance_pct=None)["notes"] if "gloo's threads' CPU" in n]
    assert len(said) == 1 and "--cores 2" in said[0] and "rank 1 of 2 ranks" in said[0]
    for h, c in ((g, scenario.Cluster()), (profile, scenario.Cluster(cores=2))):
        assert not [n for n in evaluate(h, [scenario.Scenario()], c, tolerance_pct=None)["notes"] if "gloo's threads' CPU" in n]


def test_a_profile_without_its_other_threads_record_says_its_wake_ups_are_not_priced(profile):
    """The resnet recording (before the record of the other threads' runs): its gloo CPU priced, its wake-ups not, and
    ``--cores`` says so in one line naming both ranks; the recording that carries the record (tiedlm-wake) says nothing."""
    assert comm_cpu(profile) is not None and unrecorded_wake_ranks(profile) == [0, 1]
    said = [n for n in evaluate(profile, [scenario.Scenario(workers=4)], scenario.Cluster(cores=2), tolerance_pct=None)["notes"]
            if "wake-ups are not priced" in n]
    assert len(said) == 1 and "ranks 0, 1 of 2 ranks" in said[0]
    assert not [n for n in evaluate(profile, [scenario.Scenario(workers=4)], scenario.Cluster(), tolerance_pct=None)["notes"]
                if "wake-ups are not priced" in n]
    woken = open_run(str(DATA / "fsdp-fresh" / "tiedlm-wake")).graph
    assert unrecorded_wake_ranks(woken) == []


def test_a_ddp_job_s_all_reduces_are_priced_but_not_queued():
    """A DDP bucket's all-reduce moves its CPU beside the wire: the price is read (a DDP -> FSDP conversion carries it) and
    no node is added (the DDP testbed's 25 MB cells went 5 points up with it)."""
    g = open_run(str(DATA / "ddp-testbed-corrected" / "0" / "r2" / "run")).graph
    assert comm_cpu(g) is not None
    four = scenario.apply(g, scenario.Scenario(workers=4), scenario.Cluster(cores=2), None)
    assert not _gloo_cpu(four)
    np.testing.assert_array_equal(four.dur, scenario.apply(_unpriced(g), scenario.Scenario(workers=4), scenario.Cluster(cores=2), None).dur)


# --- gloo's wake-ups on more ranks than cores (``GlooWake``): the recording's other threads' record set by hand to a hold's
# measured values (311 runs a rank-step, 0.065 ms each: bench/fsdp_fresh/core_use.py beside the tiedlm job, 2026-12-06)

RUNS, WAIT_US = 311, 65.0


def _with_others(g, runs: int = RUNS, wait_us: float = WAIT_US):
    loop = g.meta.loop_steps
    sched = {r: {s: msgspec.structs.replace(x, others=OtherThreads(x.process_cpu_us - x.cpu_us, runs * wait_us, runs)) for s, x in steps.items()}
             for r, steps in loop.sched.items()}
    return g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(loop, sched=sched)))


def _wake_us(g) -> dict[int, float]:
    """Each rank's priced wake-up waits per step (us) in a graph ``share_cores`` gave it."""
    v = [i for i in range(len(g)) if ".gloo cpu wake-ups " in g.node_name(i)]
    steps = max(len(g.meta.steps), 1)
    return {r: float(sum(g.gap[i] for i in v if g.rank[i] == r)) / steps for r in sorted({int(g.rank[i]) for i in v})}


def test_the_wake_up_price_gives_back_the_recorded_runs_and_wait(profile):
    assert comm_cpu(profile).wake == {}  # recorded before the other threads were: no wake-up price
    price = comm_cpu(_with_others(profile))
    assert set(price.wake) == {0, 1}
    for w in price.wake.values():
        assert w.ring_steps > 0
        assert w.runs_per_ring_step * w.ring_steps == pytest.approx(RUNS)
        assert w.wait_us_per_run == pytest.approx(WAIT_US)


def test_four_ranks_on_two_cores_wait_for_their_extra_ring_steps_wake_ups(profile):
    fed = _with_others(profile)
    c = scenario.Cluster(cores=2)
    four, without = (scenario.apply(g, scenario.Scenario(workers=4), c, None) for g in (fed, profile))
    ring = comm_cpu(fed).wake[0].ring_steps
    # every collective is the shard group's: its ring steps x3 from 2 ranks to 4, each extra one waits its wake-ups
    for r, us in _wake_us(four).items():
        assert us == pytest.approx(2 * ring * RUNS / ring * WAIT_US, rel=1e-6), r
    assert sorted(_wake_us(four)) == [0, 1, 2, 3]
    assert job_iteration_us(four) > job_iteration_us(without)
    assert _gloo_cpu(four) == _gloo_cpu(without)  # the CPU queued on the cores is as before


def test_on_cores_enough_or_as_profiled_no_wake_up_waits(profile):
    fed = _with_others(profile)
    for s, cores in ((scenario.Scenario(workers=4), 4), (scenario.Scenario(), 2), (scenario.Scenario(workers=4), 64)):
        g, base = (scenario.apply(x, s, scenario.Cluster(cores=cores), None) for x in (fed, profile))
        assert not _wake_us(g)
        assert job_iteration_us(g) == pytest.approx(job_iteration_us(base), rel=1e-9)


def test_a_recording_of_its_other_threads_prices_its_wake_ups():
    """``fsdp-fresh/tiedlm-wake`` (the part-12 tiedlm job's 2-rank profile, 1 Gbit/s testbed, 2026-12-06): its collector
    recorded its other threads per step; the price gives back each rank's median wake-ups a step, and 4 ranks on 2 cores
    wait for the extra ring steps' ones."""
    g = open_run(str(DATA / "fsdp-fresh" / "tiedlm-wake")).graph
    loop = g.meta.loop_steps
    price = comm_cpu(g)
    assert price is not None and set(price.wake) == {0, 1}
    for r, w in price.wake.items():
        others = [loop.sched[r][s].others for s in loop.profiled[r]]
        assert w.runs_per_ring_step * w.ring_steps == pytest.approx(statistics.median(o.runs for o in others))
        assert w.wait_us_per_run == pytest.approx(sum(o.wait_us for o in others) / sum(o.runs for o in others))
        assert w.ring_steps == 27  # 13 all-gathers of 1 ring step and 7 reduce-scatters (gloo all-reduces) of 2 on 2 ranks
    c = scenario.Cluster(cores=2)
    four = scenario.apply(g, scenario.Scenario(workers=4), c, None)
    wake = _wake_us(four)
    assert sorted(wake) == [0, 1, 2, 3]
    for r, us in wake.items():  # 81 ring steps a step on 4 ranks
        w = price.wake[r % 2]
        assert us == pytest.approx((81 - 27) * w.runs_per_ring_step * w.wait_us_per_run, rel=1e-6)
    unrecorded = g.replace(meta=g.meta.replace(loop_steps=dataclasses.replace(
        loop, sched={r: {s: msgspec.structs.replace(x, others=None) for s, x in st.items()} for r, st in loop.sched.items()})))
    assert comm_cpu(unrecorded).wake == {}
    assert job_iteration_us(four) > job_iteration_us(scenario.apply(unrecorded, scenario.Scenario(workers=4), c, None))
