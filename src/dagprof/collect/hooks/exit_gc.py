"""Free the user's dropped DDP and FSDP models while Python is still fully alive at exit.

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
"""
from __future__ import annotations

import atexit
import gc


def collect_cycles_at_exit() -> None:
    """Collect once at exit, however many models ask. Too late inside an atexit handler (atexit skips what is
    registered while it runs): there, call ``gc.collect()`` directly."""
    atexit.unregister(gc.collect)
    atexit.register(gc.collect)
