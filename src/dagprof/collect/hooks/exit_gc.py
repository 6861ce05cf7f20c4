"""Free the user's dropped DDP and FSDP models while Python is still fully alive at exit, and their gloo groups where the
GIL can be released.

A distributed model sits in reference cycles (DDP's reducer holds a Python comm hook, FSDP's
modules and hooks hold each other; ``dagprof.apply`` keeps its plan on the model), so dropping it
frees it, and the last reference to its gloo process group, only at the next garbage collection.
Until then gloo's worker threads live on, and one may still be releasing a finished collective
(it holds a Python object: a comm hook's tensors, or the context torch stashes in the backward's
thread-local state) when interpreter finalization starts: that thread cannot take the GIL any
more and the process aborts ("terminate called without an active exception") after training
finished. ``destroy_process_group()`` does not join those threads while a model still holds the
group. One ``gc.collect()`` at exit, before finalization, frees the model and its group; the
group's destructor joins the threads, which finish their releases first.

Where DDP's reducer is a gloo group's last holder (the user freed the model after ``destroy_process_group()``), the
group's destructor joins gloo's threads with the GIL held, and a thread that still needs it to free a comm hook's future
callback or the thread-local state a collective stashed deadlocks the process (pytorch/pytorch#56297; torch's hazard,
with dagprof or without: ``bench/ddp_fresh/hook_exit_loop.py``'s sweep hung within 5 to 51 trials; dagprof's hook chains
a callback on every bucket). So every DDP model's group is also held here (``hold_group``) while the model lives, and
let go once it is gone: at the end of the garbage collection that freed it, on the main thread (``_after_collection``),
else at the next model's attach, or at exit after the collection. The group's Python object releases the GIL before it
joins the threads. So a group's threads and sockets last as long as without dagprof (until the collection that frees its
model), not until the next model or exit: a sweep that destroys its group and makes another keeps one group alive, not two.
"""
from __future__ import annotations

import atexit
import gc
import threading
import weakref
from typing import Any

_held: list[tuple[weakref.ref, Any]] = []  # (a DDP model, its process group's Python object)


def hold_group(ddp: Any) -> None:
    """Hold ``ddp``'s process group until the model is gone (module docstring); the groups of models gone since are let
    go now. ``release_at_exit``, which the collector's close registers (``collect_cycles_at_exit``) or calls, lets the
    rest go: registered now, it would run before the launcher's close, which lets the model go."""
    _let_go_of_dead()
    _held.append((weakref.ref(ddp), ddp.process_group))
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)


def _let_go_of_dead() -> None:
    _held[:] = [(model, group) for model, group in _held if model() is not None]


def _after_collection(phase: str, info: dict) -> None:
    """At the end of a collection, the groups of the models it freed go (their reducers went in it: the group's Python
    object is the last holder and joins gloo's threads with the GIL released). On the main thread only: a collection a
    comm hook's callback set off runs on a gloo thread, which would join itself."""
    if phase == "stop" and _held and threading.current_thread() is threading.main_thread():
        _let_go_of_dead()


def collect_cycles_at_exit() -> None:
    """Collect (and let the held groups go) once at exit, however many models ask. Too late inside an atexit handler
    (atexit skips what is registered while it runs): there, call ``release_at_exit()`` directly."""
    atexit.unregister(release_at_exit)
    atexit.register(release_at_exit)


def release_at_exit() -> None:
    """Free the dropped models, then every held group: one no model holds any more is destroyed now, with the GIL
    released while gloo's threads finish."""
    gc.collect()
    _held.clear()
    if _after_collection in gc.callbacks:  # nothing left to let go; finalization's collections need no callback
        gc.callbacks.remove(_after_collection)
