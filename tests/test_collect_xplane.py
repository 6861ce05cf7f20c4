"""The TF/JAX collectors' window and run folder, without TensorFlow or JAX (they are imported only when profiling starts)."""
import faulthandler
import json
import os
import signal
import socket
import time

import msgspec
import pytest

from dagprof.collect.hooks.tf_profile import tf_config_rank
from dagprof.collect.hooks.xplane_window import StepWindow, kernel_hz, run_forked, run_forked_retrying
from dagprof.traces.window_cpu import WindowCpu
from dagprof.traces.xplane_layout import FORMAT, RANK_FORMAT


def window(tmp_path, calls, start=None, steps=range(2, 4), rank=1):
    def default_start(logdir):
        calls.append(("start", logdir))

    return StepWindow(tmp_path, steps, rank, 2, "tensorflow", "2.21.0", start or default_start, lambda: calls.append(("stop",)))


def test_window_starts_before_its_first_step_and_stops_when_the_next_begins(tmp_path):
    calls = []
    w = window(tmp_path, calls)
    for step in range(6):
        w.step_begin(step)
        calls.append(("step", step, w.active))
        w.step_end(step)
    w.close()
    assert calls == [("step", 0, False), ("step", 1, False), ("start", os.path.join(str(tmp_path), "rank1")),
                     ("step", 2, True), ("step", 3, True), ("stop",), ("step", 4, False), ("step", 5, False)]
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert info["format"] == RANK_FORMAT and info["rank"] == 1 and info["steps_profiled"] == [2, 3]
    assert info["logdir"] == "rank1" and not info["warnings"]
    assert info["cpus"] == len(os.sched_getaffinity(0)) and info.get("kernel_hz") == kernel_hz()  # absent where the kernel did not say
    assert json.loads((tmp_path / "manifest.json").read_text())["format"] == FORMAT


def test_training_that_ends_inside_the_window_is_written_with_a_warning(tmp_path):
    calls = []
    w = window(tmp_path, calls, steps=range(1, 10))
    for step in range(3):
        w.step_begin(step)
        w.step_end(step)
    w.close()
    assert calls[-1] == ("stop",)
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert info["steps_profiled"] == [1, 2] and "training ended first" in info["warnings"][0]


def test_a_profiler_that_fails_never_stops_training(tmp_path):
    def broken(logdir):
        raise RuntimeError("another profiler is running")

    w = window(tmp_path, [], start=broken)
    with pytest.warns(UserWarning, match="training continues without profiling"):
        for step in range(5):
            w.step_begin(step)
            w.step_end(step)
    w.close()
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert info["steps_profiled"] == [] and "did not start" in info["warnings"][0]


def test_tf_config_rank(monkeypatch):
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    assert tf_config_rank() == (2, 3)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    assert tf_config_rank() == (0, 3)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert tf_config_rank() is None
    monkeypatch.delenv("TF_CONFIG")
    assert tf_config_rank() is None


def test_the_profiler_stops_after_the_workers_settle_and_every_worker_joins_the_barrier(tmp_path):
    calls = []
    w = window(tmp_path / "a", calls)
    w.settle = lambda: calls.append(("settle",))
    for step in range(5):
        w.step_begin(step)
        w.step_end(step)
    w.close()
    assert calls[-2:] == [("settle",), ("stop",)] and calls.count(("settle",)) == 1
    # a worker whose profiler never started still joins the barrier its peers wait in
    joined = []

    def broken(logdir):
        raise RuntimeError("another profiler is running")

    w = window(tmp_path / "b", [], start=broken)
    w.settle = lambda: joined.append(1)
    with pytest.warns(UserWarning):
        for step in range(5):
            w.step_begin(step)
            w.step_end(step)
    assert joined == [1]
    # a barrier that fails is a warning, and the profiler still stops
    calls = []
    w = window(tmp_path / "c", calls)

    def dead_peer():
        raise RuntimeError("peer gone")

    w.settle = dead_peer
    for step in range(5):
        w.step_begin(step)
        w.step_end(step)
    info = json.loads((tmp_path / "c" / "rank1.json").read_text())
    assert calls[-1] == ("stop",) and "could not be waited for" in info["warnings"][0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_stop_run_forked_that_crashes_or_hangs_leaves_this_process_running(tmp_path):
    """TensorFlow's collection can abort natively (a double free in its host tracer): stopped in a
    forked child, the crash ends the child and this process learns how it ended."""
    out = tmp_path / "written"
    seen = []
    assert run_forked(lambda: out.write_text("xplane"), 60, in_parent=lambda: seen.append(os.getpid())) == 0
    assert out.read_text() == "xplane" and seen == [os.getpid()]  # the child wrote; in_parent ran here
    for sig in (signal.SIGSEGV, signal.SIGABRT):  # faulthandler (on under pytest) off: no dump of the child's stack
        assert run_forked(lambda: (faulthandler.disable(), os.kill(os.getpid(), sig)), 60) == -sig

    def fail():
        raise RuntimeError("collection failed")
    assert run_forked(fail, 60) == 1
    t0 = time.monotonic()
    assert run_forked(lambda: time.sleep(60), 0.5) is None  # killed at the timeout
    assert time.monotonic() - t0 < 30


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_collection_that_crashes_from_this_process_state_is_retried_in_fresh_children_with_that_state_changed(tmp_path):
    """TensorFlow's host tracer crashes or not by the order of its threads, the same in every copy of the process:
    each retry's child first changes that state (``before_retry(k)``, in the child only), then collects."""
    out, seen = tmp_path / "written", []

    def collect():  # dies unless the child's state was changed twice
        if state["changed"] < 2:
            faulthandler.disable()
            os.kill(os.getpid(), signal.SIGABRT)
        out.write_text("xplane")

    def change(k):
        state["changed"] = k

    state = {"changed": 0}
    assert run_forked_retrying(collect, 60, in_parent=lambda: seen.append(1), before_retry=change, attempts=5) == [-6, -6, 0]
    assert out.read_text() == "xplane" and state["changed"] == 0 and seen == [1]  # changed in the children; in_parent ran once
    out.unlink()
    assert run_forked_retrying(collect, 60, before_retry=change, attempts=2) == [-6, -6]  # no more children than asked
    assert run_forked_retrying(collect, 60, attempts=5) == [-6]  # nothing to change: the same state would crash again
    assert run_forked_retrying(lambda: time.sleep(60), 0.5, before_retry=change, attempts=5) == [None]  # a stall: not again
    assert not out.exists()


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="needs Linux /proc")
def test_a_forked_child_stuck_on_a_lock_is_stopped_when_its_cpu_time_stands_still():
    """A lock held by another thread at the fork is never released in the child (it has one thread): it
    waits at 0 % CPU. It is stopped after ``stall_s`` without CPU, long before the timeout."""
    import threading

    held, release = threading.Lock(), threading.Event()
    held.acquire()
    holder = threading.Thread(target=release.wait)  # the lock's owner is another thread, as in TensorFlow
    holder.start()
    try:
        t0 = time.monotonic()
        assert run_forked(held.acquire, 120, stall_s=1.0) is None
        assert time.monotonic() - t0 < 60
        assert run_forked(lambda: sum(range(2 * 10**7)), 120, stall_s=5.0) == 0  # busy, not stalled
    finally:
        release.set()
        holder.join()
        held.release()


def test_a_window_lost_on_one_rank_is_profiled_again_by_every_rank(tmp_path):
    """TensorFlow's collection can die on one worker (``stop_in_child``): every worker learns it from the
    agreement after the stop, drops its own profile of the window and profiles the same steps again one
    step later, so the run keeps the same steps on all ranks. Two ranks run in lockstep on two threads."""
    import threading

    world, calls = 2, {0: [], 1: []}
    gate = threading.Barrier(world)
    said: dict[int, bool] = {}
    stops = {0: 0, 1: 0}

    def agree_for(rank):
        def agree(lost):
            said[rank] = lost
            gate.wait()
            lost_ranks = [r for r in range(world) if said[r]]
            gate.wait()
            return lost_ranks
        return agree

    def stop_for(rank):
        def stop():
            stops[rank] += 1
            if rank == 1 and stops[rank] == 1:
                raise RuntimeError("TensorFlow's profiler failed while collecting (signal 6, in a child process)")
            calls[rank].append("stop")
        return stop

    def start_for(rank):
        def start(logdir):
            calls[rank].append("start")
            (tmp_path / f"rank{rank}" / f"session{stops[rank]}.xplane.pb").parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f"rank{rank}" / f"session{stops[rank]}.xplane.pb").write_text("x")
        return start

    def rank_job(rank):
        w = StepWindow(tmp_path, range(2, 4), rank, world, "tensorflow", "2.21.0", start_for(rank), stop_for(rank),
                       settle=gate.wait, agree=agree_for(rank))
        for step in range(10):
            w.step_begin(step)
            w.step_end(step)
        w.finish()

    threads = [threading.Thread(target=rank_job, args=(r,)) for r in range(world)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    for r in range(world):
        info = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert info["steps_profiled"] == [5, 6] and info["steps_requested"] == [2, 4]
        assert list(info["unprofiled_step_times_us"]) == ["0", "1", "4", "7", "8", "9"]  # the lost window's steps ran profiled
        assert "profiled again as 5-6: the profile was lost on rank(s) 1" in info["warnings"][0]
        assert sorted(p.name for p in (tmp_path / f"rank{r}").iterdir()) == ["session1.xplane.pb"]  # the lost window's files are gone
        assert calls[r] == (["start", "stop", "start", "stop"] if r == 0 else ["start", "start", "stop"])  # rank 1's first stop died
    assert "signal 6" in json.loads((tmp_path / "rank1.json").read_text())["warnings"][0]


def test_a_window_kept_everywhere_is_not_profiled_again_and_retries_end(tmp_path):
    """A window every rank kept is written once; a window lost on every try is profiled again at most
    ``retries`` times, then the rank file says why it holds no step."""
    agreed = []
    w = StepWindow(tmp_path / "a", range(2, 4), 0, 2, "tensorflow", "2.21.0", lambda d: None, lambda: None,
                   agree=lambda lost: agreed.append(lost) or [])
    for step in range(10):
        w.step_begin(step)
        w.step_end(step)
    w.close()
    assert agreed == [False] and json.loads((tmp_path / "a" / "rank0.json").read_text())["steps_profiled"] == [2, 3]

    def crash():
        raise RuntimeError("collection failed")

    w = StepWindow(tmp_path / "b", range(2, 4), 0, 2, "tensorflow", "2.21.0", lambda d: None, crash,
                   agree=lambda lost: [0] if lost else [], retries=2)
    for step in range(30):
        w.step_begin(step)
        w.step_end(step)
    w.close()
    info = json.loads((tmp_path / "b" / "rank0.json").read_text())
    assert info["steps_profiled"] == [] and len(info["warnings"]) == 3  # two retries noted, then the last failure
    # a retry that training does not reach: the rank file says so (the reader then refuses the rank in one line)
    w = StepWindow(tmp_path / "c", range(2, 4), 0, 2, "tensorflow", "2.21.0", lambda d: None, lambda: None, agree=lambda lost: [1])
    for step in range(5):
        w.step_begin(step)
        w.step_end(step)
    w.close()
    assert "training ended before step 5" in json.loads((tmp_path / "c" / "rank0.json").read_text())["warnings"][-1]


def test_steps_outside_the_window_are_timed_and_written_when_training_ends(tmp_path):
    """The profiler's own cost is measured against the job's unprofiled steps: those before the window are in
    the rank file as the window closes, those after it once training ends (``finish``)."""
    w = window(tmp_path, [])
    for step in range(7):
        w.step_begin(step)
        time.sleep(0.002)
        w.step_end(step)
        if step == 4:
            info = json.loads((tmp_path / "rank1.json").read_text())
            assert sorted(map(int, info["unprofiled_step_times_us"])) == [0, 1]
    w.finish()
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert sorted(map(int, info["step_times_us"])) == [2, 3]
    unprofiled = {int(s): d for s, d in info["unprofiled_step_times_us"].items()}
    assert sorted(unprofiled) == [0, 1, 4, 5, 6] and min(unprofiled.values()) >= 2000
    assert not info["warnings"]
    w.finish()  # again (Keras calls on_train_end after each fit): nothing said twice
    assert json.loads((tmp_path / "rank1.json").read_text()) == info


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"), reason="the kernel's schedstat is Linux's")
def test_every_step_records_its_thread_and_process_cpu_read_as_a_torch_rank_files(tmp_path):
    """What ranks sharing cores ask of them is their processes' CPU (TF's pools, collective executor and gRPC threads, not
    only the ops on the pools' lanes): every step's, profiled or not, in the rank file as the torch collector writes it,
    and read into the rank's ``train_thread`` / ``unprofiled_train_thread``."""
    from dagprof.traces.meta import step_scheds

    w = window(tmp_path, [])
    for step in range(6):
        w.step_begin(step)
        t = time.thread_time_ns()
        while time.thread_time_ns() - t < 3_000_000:  # 3 ms of this thread's CPU
            pass
        w.step_end(step)
    w.finish()
    info = json.loads((tmp_path / "rank1.json").read_text())
    sched = step_scheds(info["thread_sched_ns"], info["process_cpu_ns"], info["thread_runs"], info["other_threads_ns"],
                        info["named_threads_ns"])
    assert [x.step for x in sched] == list(range(6))
    assert all(x.cpu_us >= 2500 and x.process_cpu_us >= 0.99 * x.cpu_us and x.runs is not None for x in sched), sched
    assert all(x.named is not None for x in sched)  # per thread name too (the lanes' pools apart: ``passes.comm_cpu.rank_cpu``)


@pytest.mark.skipif(not os.path.exists("/proc/net/dev"), reason="the interfaces' counters are Linux's /proc/net/dev")
def test_the_window_counts_the_bytes_its_steps_sent(tmp_path):
    """The bytes the host's interfaces sent over the profiled steps (the bench prices the wire with them): at least
    what the steps themselves sent over the loopback (other jobs on the host may add theirs)."""
    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()
    w = window(tmp_path, [])
    for step in range(5):
        w.step_begin(step)
        if step in (2, 3):
            a.sendall(b"x" * 100_000)
            got = 0
            while got < 100_000:
                got += len(b.recv(1 << 20))
        w.step_end(step)
    w.finish()
    for s in (a, b, server):
        s.close()
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert info["steps_profiled"] == [2, 3] and info["window_tx_bytes"] >= 200_000


def test_the_window_records_its_cores_busy_time_and_its_process_cpu(tmp_path):
    """Over the profiled steps (``traces.window_cpu``, other processes' load beside a JAX job): the wall time, the busy
    time of this process's cores (every process's, ``/proc/stat``: counted at each core's tick, so up to two ticks a core
    off at the ends) and this process's CPU, which holds at least what the steps spun."""
    w = window(tmp_path, [])
    spun = 0
    for step in range(5):
        w.step_begin(step)
        if step in (2, 3):
            t0 = time.process_time_ns()
            while time.process_time_ns() - t0 < 100_000_000:
                pass
            spun += time.process_time_ns() - t0
        w.step_end(step)
    w.finish()
    got = msgspec.convert(json.loads((tmp_path / "rank1.json").read_text())["window_cpu"], WindowCpu)
    assert got.own_cpu_ns >= spun and got.wall_ns >= spun
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    assert got.cores_busy_ns >= got.own_cpu_ns - 2 * len(os.sched_getaffinity(0)) * tick_ns


def test_a_training_that_ends_inside_the_window_warns_once_when_finished(tmp_path):
    w = window(tmp_path, [], steps=range(1, 10))
    for step in range(3):
        w.step_begin(step)
        w.step_end(step)
    w.finish()
    w.finish()
    info = json.loads((tmp_path / "rank1.json").read_text())
    assert len(info["warnings"]) == 1 and list(info["unprofiled_step_times_us"]) == ["0"]
