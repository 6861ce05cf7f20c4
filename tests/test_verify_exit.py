"""A verification job that aborts at exit after training (torch's gloo teardown) is kept; any other failure is not."""
from __future__ import annotations

from dagprof.collect.hooks.steptimes import write_times
from dagprof.collect.jobs.verify import EXIT_ABORT, _finished
from dagprof.errors import DagprofError


def test_an_exit_abort_after_every_rank_wrote_its_times_is_kept(tmp_path):
    times = str(tmp_path / "times")
    err = DagprofError(f"the job failed: {EXIT_ABORT} (logs in {tmp_path})")
    write_times(times, 0, [0.1, 0.1])
    assert not _finished(times, 2, err)  # rank 1 never wrote its times: it did not finish training
    write_times(times, 1, [0.1, 0.1])
    assert _finished(times, 2, err)
    assert not _finished(times, 2, DagprofError("the job failed: RuntimeError: connection reset"))  # not the exit abort
    assert not _finished(times, None, err)  # a launcher command: how many ranks there were is unknown
