"""``collect.hooks.thread_sched.ThreadSched``: the process's other threads' CPU, waits and runs per step, read live."""
from __future__ import annotations

import threading
import time

from dagprof.collect.hooks.thread_sched import ThreadSched
from dagprof.traces.meta import step_scheds

WORK_NS = 20_000_000


def _worker(go: threading.Event, done: threading.Event, leave: threading.Event) -> None:
    go.wait()
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < WORK_NS:  # its own CPU, however loaded the cores
        pass
    done.set()
    leave.wait()  # alive at the step's end: a thread that ended within a step loses its part


def test_another_threads_cpu_and_runs_within_a_step_are_counted_as_others():
    go, done, leave = threading.Event(), threading.Event(), threading.Event()
    worker = threading.Thread(target=_worker, args=(go, done, leave))
    worker.start()
    sched = ThreadSched()
    sched.open()
    try:
        sched.begin()
        go.set()
        done.wait()
        time.sleep(0.01)  # the worker blocks in ``leave.wait``: switched out, its schedstat is current
        sched.end(3)
    finally:
        leave.set()
        worker.join()
        sched.close()
    assert [s for s, *_ in sched.others] == [3] == [s for s, *_ in sched.steps]
    _, cpu, wait, runs = sched.others[0]
    assert cpu >= WORK_NS and wait >= 0 and runs >= 1
    (x,) = step_scheds(sched.steps, sched.process, sched.runs, sched.others)
    assert x.others is not None and x.others.cpu_us == cpu / 1e3 and x.others.runs == runs


def test_a_step_begun_on_another_thread_records_nothing_and_old_records_load_without_others():
    sched = ThreadSched()
    sched.open()
    t = threading.Thread(target=sched.begin)
    t.start()
    t.join()
    sched.end(0)
    sched.close()
    assert sched.others == [] == sched.steps
    (x,) = step_scheds([(0, 1000, 0)], [(0, 2000)], [(0, 1)])
    assert x.others is None


def _bursts(go: list[threading.Event], done: list[threading.Event], leave: threading.Event) -> None:
    for g, d in zip(go, done):
        _worker(g, d, _set())
    leave.wait()


def _set() -> threading.Event:
    e = threading.Event()
    e.set()
    return e


def test_a_thread_born_after_the_listing_is_watched_from_the_step_after_it_ran_unseen():
    """The task list is re-read only after a step whose process CPU passed its watched threads' (``UNSEEN_NS``)."""
    sched = ThreadSched()
    sched.open()
    sched.begin()
    sched.end(0)  # listed: no other thread yet
    go, done, leave = [threading.Event(), threading.Event()], [threading.Event(), threading.Event()], threading.Event()
    worker = threading.Thread(target=_bursts, args=(go, done, leave))
    try:
        for step in (1, 2):
            sched.begin()  # step 2: listed again
            if step == 1:
                worker.start()
            go[step - 1].set()
            done[step - 1].wait()
            time.sleep(0.01)
            sched.end(step)
    finally:
        leave.set()
        worker.join()
        sched.close()
    assert sched.others[1][1] == 0 and sched.process[1][1] - sched.steps[1][1] >= WORK_NS  # step 1: it ran unseen
    assert sched.others[2][1] >= WORK_NS and sched.others[2][3] >= 1  # step 2: watched
