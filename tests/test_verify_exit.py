"""A verification job that aborts at exit after training (torch's gloo teardown) is kept; any other failure is not."""
from __future__ import annotations

from dagprof.collect.hooks.steptimes import write_times
from dagprof.collect.jobs.launch import last_error_line
from dagprof.collect.jobs.verify import _finished
from dagprof.errors import DagprofError

# how finished PyTorch gloo jobs' ranks ended when they aborted at exit: the abort's line (``hooks.exit_gc``), and the tail
# of a rank log kept on 2026-12-03 (a finished job on the 2-core machine)
NO_EXCEPTION = "terminate called without an active exception\n"
DEADLOCK = ("[W1203 15:03:33.654184038 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n"
            "terminate called after throwing an instance of 'std::system_error'\n  what():  Resource deadlock avoided\n")


def failed(log: str, logs: str) -> DagprofError:
    """The error ``launch`` raises for a rank that failed with ``log`` (``netns.run_ranks``' message, then its line)."""
    return DagprofError(f"the job failed: {last_error_line(f'rank 1 failed (exit -6); log {logs}/rank1.log:' + chr(10) + log)} (logs in {logs})")


def test_an_exit_abort_after_every_rank_wrote_its_times_is_kept(tmp_path):
    times = str(tmp_path / "times")
    err = failed(NO_EXCEPTION, str(tmp_path))
    write_times(times, 0, [0.1, 0.1])
    assert not _finished(times, 2, err)  # rank 1 never wrote its times: it did not finish training
    write_times(times, 1, [0.1, 0.1])
    assert _finished(times, 2, err)
    assert not _finished(times, 2, DagprofError("the job failed: RuntimeError: connection reset"))  # not the exit abort
    assert not _finished(times, None, err)  # a launcher command: how many ranks there were is unknown


def test_a_resource_deadlock_at_exit_is_kept_another_system_error_is_not(tmp_path):
    times = str(tmp_path / "times")
    for rank in (0, 1):
        write_times(times, rank, [0.1, 0.1])
    err = failed(DEADLOCK, str(tmp_path))
    assert "what():  Resource deadlock avoided" in str(err)  # the thrown error's text is kept with the abort's line
    assert _finished(times, 2, err)
    other = DEADLOCK.replace("Resource deadlock avoided", "Connection reset by peer")
    assert not _finished(times, 2, failed(other, str(tmp_path)))
