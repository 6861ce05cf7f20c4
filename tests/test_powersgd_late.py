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


USER = DATA / "ddp-fresh" / "powersgd-user"


def test_a_users_powersgd_hook_has_every_collective_recorded_in_its_call_or_late_on_every_rank():
    """Torch's ``powerSGD_hook`` registered by the user (``bench/ddp_fresh/powersgd_user.py``, one bucket): its 3
    all-reduces a call are each in the call or late, a split each rank made its own way; the profile opens, every call the
    hook's and none priced, and the wire what-ifs are refused."""
    split = []
    for rank in (0, 1):
        code = np.asarray(read_file(str(USER / f"rank{rank}.json"), RankFile).records, dtype=np.int64)[:, Col.CODE]
        split.append((int((code == Rec.HOOK_COLL).sum()), int((code == Rec.HOOK_LATE).sum()), int((code == Rec.ENQ_END).sum())))
    assert split[0] != split[1] and all(inside + late == 3 * calls for inside, late, calls in split)
    g = open_run(str(USER)).graph
    comm = (g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0)
    assert comm.sum() == 4 and (g.role[comm] == CommRole.HOOK).all()
    with pytest.raises(DagprofError, match=r"called \d+ collectives from its futures' callbacks"):
        refuse_own_ddp_setup(g, "--workers", wire=True)


HELD = DATA / "ddp-fresh" / "held-hooks"


def test_a_hook_held_in_an_object_has_its_callbacks_collectives_recorded_on_every_rank():
    """A bound method registered as the hook (``bench/ddp_fresh/held_hooks.py --hook class``), whose two all-gathers a
    call run from a bound method chained through ``functools.partial``: defined inside no hook, they were unrecorded, and
    each bucket was priced at its 4-byte norm all-reduce. Every one of the 3 a call is recorded now, in the call or late,
    and the wire what-ifs are refused."""
    for rank in (0, 1):
        code = np.asarray(read_file(str(HELD / f"rank{rank}.json"), RankFile).records, dtype=np.int64)[:, Col.CODE]
        calls, inside, late = ((code == c).sum() for c in (Rec.ENQ_END, Rec.HOOK_COLL, Rec.HOOK_LATE))
        assert calls == 4 and inside + late == 3 * calls and late == 2 * calls
    g = open_run(str(HELD)).graph
    assert g.meta.hook_wire.late == 8 and g.meta.hook_wire.unpriced == g.meta.hook_wire.calls == 4
    with pytest.raises(DagprofError, match=r"called \d+ collectives from its futures' callbacks"):
        refuse_own_ddp_setup(g, "a link what-if", wire=True)
