"""Free the user's dropped DDP models while Python is still fully alive at exit.

A DDP model that dagprof touched sits in reference cycles (its reducer holds a Python comm hook;
``dagprof.apply`` keeps its plan on the model), so dropping it frees it only at the next garbage
collection. If that is the one inside interpreter finalization, its process group goes down
there, and gloo's threads release the comm hook's Python-owned tensors without a GIL: the process
aborts (std::terminate) after training has finished. One ``gc.collect()`` at exit, before
finalization, frees them in time.
"""
from __future__ import annotations

import atexit
import gc


def collect_cycles_at_exit() -> None:
    atexit.unregister(gc.collect)  # once, however many models ask
    atexit.register(gc.collect)
