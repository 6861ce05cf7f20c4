"""Loaded by ``bench/tf_profiler_ab.py``'s dry jobs (on PYTHONPATH, ``DAGPROF_BENCH_DRY_WINDOW=1``): TensorFlow's profiler
start and stop become no-ops, so dagprof's window runs every step of its own (step marks, barrier at its end, the forked
stop, the per-step schedstat reads) without the profiler: the job's pace with the window's work and none of the recording."""
import os

if os.environ.get("DAGPROF_BENCH_DRY_WINDOW") == "1":
    import tensorflow as tf

    tf.profiler.experimental.start = lambda *args, **kwargs: None
    tf.profiler.experimental.stop = lambda *args, **kwargs: None
