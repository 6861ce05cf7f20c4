"""PowerSGD under ``dagprof.apply``'s chained hook, profiled with the collector that records a comm hook's own
collectives (tests/data/powersgd-late: the verification run of a PowerSGD rank-2 strategy on ``bench/ddp_heldout_conv.py``,
2 gloo ranks, hooks only). Whether a bucket's PowerSGD all-reduces run inside the hook's call (``Rec.HOOK_COLL``) or from
its futures' callbacks later (``Rec.HOOK_LATE``, or on gloo's thread where no record catches them) is a race each rank runs
its own way: the same bucket call was priced on one rank and not on the other, whose transfers then met nothing
("mismatched collectives"). Under a hook that called collectives late no call is priced, and every rank's bucket
transfers are the hook's, matched without their bytes."""
import numpy as np
import pytest
from testdata import DATA

from dagprof.errors import DagprofError
from dagprof.passes.buckets import refuse_own_ddp_setup
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import CommRole, Kind
from dagprof.traces.run_comm import hook_calls, hook_transfer
from dagprof.traces.run_schema import Col, RankFile, Rec, read_file

RUN = DATA / "powersgd-late"


def records_of(rank: int) -> np.ndarray:
    return np.asarray(read_file(str(RUN / f"rank{rank}.json"), RankFile).records, dtype=np.int64).reshape(-1, len(Col))


def in_call(rank: int) -> set[int]:
    """The bucket calls (seq) in which the rank recorded a collective of the hook's inside the call."""
    records = records_of(rank)
    return set(records[records[:, Col.CODE] == Rec.HOOK_COLL][:, Col.B].tolist())


def test_the_ranks_recorded_the_same_bucket_calls_differently():
    """The race the file holds: calls with the hook's collectives inside on one rank and none on the other."""
    assert in_call(0) ^ in_call(1)


def test_the_profile_opens_with_every_bucket_transfer_the_hooks_on_every_rank():
    opened = open_run(str(RUN))
    g = opened.graph
    comm = (g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0)
    assert comm.sum() == 13 * 4  # 13 profiled steps, 4 buckets, each one transfer every rank joined
    assert (g.role[comm] == CommRole.HOOK).all()
    res = replay(g)
    assert np.isfinite(res.start[comm]).all()


def test_a_hook_that_called_collectives_late_prices_no_call():
    calls = hook_calls(records_of(0))
    assert calls and all(c.late for c in calls.values())
    assert {hook_transfer(c, 2) for c in calls.values()} == {None}


def test_wire_whatifs_are_refused_for_the_late_callbacks():
    g = open_run(str(RUN)).graph
    with pytest.raises(DagprofError, match=r"from its futures' callbacks"):
        refuse_own_ddp_setup(g, "a link what-if", wire=True)
