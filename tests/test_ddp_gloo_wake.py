"""gloo's wake-ups on more DDP ranks than cores (``passes.comm_cpu.ddp_wake_waits`` under ``share_cores``), on a real
recording of a DDP job that recorded its other threads' runs per step (tests/data/ddp-fresh/moco: 2 gloo ranks on one
2-core host): each collective waits its ranks' extra ring steps' wake-ups, at the profiled wait a wake-up."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import job_iteration_us
from dagprof.cli.main import main
from dagprof.passes.comm_cpu import comm_cpu
from dagprof.pipeline import open_run
from dagprof.search import scenario
from dagprof.traces.events import Kind

LABEL = " (gloo waits for a core)"


@pytest.fixture(scope="module")
def profile():
    return open_run(str(DATA / "ddp-fresh" / "moco")).graph


def _waits(g) -> dict[str, float]:
    return {g.node_name(i)[: -len(LABEL)]: float(g.gap[i]) for i in range(len(g)) if g.node_name(i).endswith(LABEL)}


def test_four_ranks_on_two_cores_wait_for_their_extra_ring_steps_wake_ups(profile):
    price = comm_cpu(profile)
    assert price is not None and set(price.wake) == {0, 1}
    four = scenario.apply(profile, scenario.Scenario(workers=4), scenario.Cluster(cores=2), None)
    waits = _waits(four)
    comm = np.flatnonzero((four.kind == Kind.COMM) & (four.rank < 0))
    assert len(waits) == len(comm)
    # every collective is a 4-rank all-reduce: 6 ring steps, 4 of them beyond the 2 a profiled rank made per all-reduce
    most = max(price.wake[r].runs_per_ring_step * price.wake[r].wait_us_per_run for r in (0, 1))
    for us in waits.values():
        assert us == pytest.approx(4 * most, rel=1e-6)
    unrecorded = profile.replace(meta=profile.meta.replace(loop_steps=None))
    without = scenario.apply(unrecorded, scenario.Scenario(workers=4), scenario.Cluster(cores=2), None)
    assert not _waits(without)
    assert job_iteration_us(four) > job_iteration_us(without)


def test_on_cores_enough_or_as_profiled_no_waits(profile):
    for s, cores in ((scenario.Scenario(workers=4), 4), (scenario.Scenario(), 2)):
        g = scenario.apply(profile, s, scenario.Cluster(cores=cores), None)
        assert not _waits(g)


@pytest.mark.parametrize("fixture, why", [("clip", "recorded no other threads' runs"), ("accum", "recorded no process CPU")])
def test_a_ddp_profile_without_the_record_says_its_wake_ups_are_not_priced(tmp_path, capsys, fixture, why):
    """A DDP profile from before gloo's threads were recorded answers ``--workers 4 --cores 2`` without the wake-ups (as
    main did), and says so in one line with what that missed, as FSDP's profiles do; the moco profile (recorded) says
    nothing."""
    for run, said in ((DATA / "ddp-fresh" / fixture, True), (DATA / "ddp-fresh" / "moco", False)):
        assert main(["whatif", str(run), "--workers", "4", "--cores", "2", "--no-trace"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        note = f"--cores 2: gloo's wake-ups are not priced beyond the cores: ranks 0, 1 of 2 ranks {why}"
        assert (note in out and "4 DDP ranks on 2 cores" in out) is said, out
