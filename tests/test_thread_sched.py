"""``collect.hooks.thread_sched.ThreadSched``: the process's other threads' CPU, waits and runs per step, read live."""
from __future__ import annotations

import os
import threading
import time

from dagprof.collect.hooks.thread_sched import ThreadSched, _name
from dagprof.traces.meta import THREAD_NAME_CHARS, UNREAD_NAME, step_scheds, unnamed_thread_key

WORK_NS = 20_000_000


def _worker(go: threading.Event, done: threading.Event, leave: threading.Event) -> None:
    go.wait()
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < WORK_NS:  # its own CPU, however loaded the cores
        pass
    done.set()
    leave.wait()  # alive at the step's end: a thread that ended within a step loses its part


def _named_worker(name: str | None, named: threading.Event, go: threading.Event, done: threading.Event, leave: threading.Event) -> None:
    if name is not None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:  # as TF names its pools' threads
            f.write(name)
    named.set()
    _worker(go, done, leave)


def _step_beside_a_worker(*scheds: ThreadSched, name: str | None = None) -> int:
    """Step 3 of each of ``scheds`` (opened here, closed after) while another thread (named ``name``) burns ``WORK_NS`` of
    its own CPU inside it; that thread's id."""
    named, go, done, leave = (threading.Event() for _ in range(4))
    worker = threading.Thread(target=_named_worker, args=(name, named, go, done, leave))
    worker.start()
    named.wait()
    for s in scheds:
        s.open()
    try:
        for s in scheds:
            s.begin()
        go.set()
        done.wait()
        time.sleep(0.01)  # the worker blocks in ``leave.wait``
        for s in scheds:
            s.end(3)
    finally:
        leave.set()
        worker.join()
        for s in scheds:
            s.close()
    return worker.native_id


def test_another_threads_cpu_and_runs_within_a_step_are_counted_as_others():
    sched = ThreadSched()
    _step_beside_a_worker(sched)
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


def test_by_name_keeps_each_thread_names_cpu_apart_and_the_names_sum_to_the_others():
    """TF's window (``by_name``) keeps the other threads' CPU per thread name, the kernel's 15 characters of it, so a reader
    tells the pools' lanes' threads (``tf_Compute``) from the rest; the names' parts sum to ``others``."""
    sched, plain = ThreadSched(by_name=True), ThreadSched()
    _step_beside_a_worker(sched, plain, name="dp_pool_worker_long")
    assert plain.named == {} and "dp_pool_worker_long" not in sched.named
    ((step, cpu, wait, runs),) = sched.named["dp_pool_worker_"]
    assert step == 3 and cpu >= WORK_NS and runs >= 1
    (_, others_cpu, others_wait, others_runs), = sched.others
    assert [sum(r[i] for rows in sched.named.values() for r in rows) for i in (1, 2, 3)] == [others_cpu, others_wait, others_runs]
    (x,) = step_scheds(sched.steps, sched.process, sched.runs, sched.others, sched.named)
    assert x.named is not None and x.named["dp_pool_worker_"].cpu_us == cpu / 1e3
    (y,) = step_scheds(sched.steps, sched.process, sched.runs, sched.others)
    assert y.named is None  # not recorded by name (torch ranks, older TF files)


def test_a_thread_bearing_its_process_name_is_kept_apart_by_its_id():
    """A thread that never named itself bears its process's name (XLA's PjRt client pool, whose 19-character name the
    kernel refused, is ``python`` beside gloo's threads): each such thread is recorded as ``NAME#TID``, so a reader can
    tell which of them ran a lane (``passes.comm_cpu.lane_threads``)."""
    sched = ThreadSched(by_name=True)
    tid = _step_beside_a_worker(sched)
    own = _name(os.getpid())
    assert own not in sched.named  # every thread bearing it is kept apart, this one under its id
    ((step, cpu, _, runs),) = sched.named[unnamed_thread_key(own, tid)]
    assert step == 3 and cpu >= WORK_NS and runs >= 1


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
    sched.end(0)  # listed: the worker not yet started
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
    # step 1: it ran unseen (its CPU in the process's, not in the watched others'; threads earlier tests left in this
    # process are watched from step 0 and may run a little in any step)
    assert sched.process[1][1] - sched.steps[1][1] - sched.others[1][1] >= 0.9 * WORK_NS
    assert sched.others[2][1] >= WORK_NS and sched.others[2][3] >= 1  # step 2: watched


def test_a_thread_whose_name_does_not_read_is_named_unread_which_no_thread_can_be():
    """A thread that ended between its schedstat's opening and its name's read: its CPU stays in ``named`` under
    ``UNREAD_NAME`` (so the names still sum to ``others``), a name longer than the kernel keeps, so no lane's."""
    named, go, done, leave = (threading.Event() for _ in range(4))
    tid: list[int] = []
    worker = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), _named_worker("dp_named", named, go, done, leave)))
    worker.start()
    named.wait()
    assert _name(tid[0]) == "dp_named"
    go.set()
    leave.set()
    worker.join()
    while os.path.exists(f"/proc/self/task/{tid[0]}"):  # join returns just before the kernel's thread ends
        time.sleep(0.001)
    assert _name(tid[0]) == UNREAD_NAME and len(UNREAD_NAME) > THREAD_NAME_CHARS
