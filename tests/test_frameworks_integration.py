"""Opt-in: re-record the TensorFlow and JAX fixtures from scratch (real 2-worker CPU jobs) and replay them.

Skipped by default: TensorFlow (1.6 GB) and JAX are not dagprof dependencies. Point these variables
at Pythons that have them, then select the marker::

    python3 -m venv /opt/tf  && /opt/tf/bin/pip install tensorflow-cpu tf-keras numpy msgspec numba
    python3 -m venv /opt/jax && /opt/jax/bin/pip install jax numpy msgspec numba
    DAGPROF_TF_PYTHON=/opt/tf/bin/python DAGPROF_JAX_PYTHON=/opt/jax/bin/python .venv/bin/python -m pytest -m frameworks

Each job runs ``dagprof.collect.jobs.tf_train`` / ``jax_train`` from this checkout (``PYTHONPATH=src``, so
those Pythons need dagprof's own dependencies too, as a training environment with dagprof installed has),
about 30-60 s on 2 cores. ``DAGPROF_UPDATE_FIXTURES=1`` also replaces tests/data/tf*/ with the new
recordings (``*.xplane.pb`` gzipped), as they were made.
"""
import gzip
import os
import pathlib
import shutil
import subprocess

import pytest

from dagprof.align.matching import match_collectives
from dagprof.pipeline import open_run
from dagprof.traces.cpu_sets import cpu_list
from dagprof.traces.load import load
from dagprof.traces.xplane_run import xplane_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOBS = {
    "tf-loop": ("DAGPROF_TF_PYTHON", ["-m", "dagprof.collect.jobs.tf_train", "--mode", "loop"], ROOT / "tests/data/tf/loop"),
    "tf-fit": ("DAGPROF_TF_PYTHON", ["-m", "dagprof.collect.jobs.tf_train", "--mode", "fit"], ROOT / "tests/data/tf/fit"),
    "jax": ("DAGPROF_JAX_PYTHON", ["-m", "dagprof.collect.jobs.jax_train"], ROOT / "tests/data/tf-jax/mlp"),
}

pytestmark = pytest.mark.frameworks


@pytest.mark.parametrize("name", sorted(JOBS))
def test_rerecord_and_replay(name, tmp_path):
    env_var, args, fixture = JOBS[name]
    python = os.environ.get(env_var)
    if not python:
        pytest.skip(f"needs {env_var}: a Python with {'tensorflow-cpu and tf-keras' if 'TF' in env_var else 'jax'} (see this file)")
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([python, *args, "--out", str(out), "--timeout", "300"], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load(out)
    assert [t.rank for t in run.ranks] == [0, 1]
    assert all(t.meta.unprofiled_step_times_us for t in run.ranks)  # the steps outside the window, for the profiler's cost
    assert {t.meta.cpu_set for t in run.ranks} == {cpu_list(os.sched_getaffinity(0))}  # each rank's affinity set, inherited
    m = match_collectives(run)
    assert m.instances and not m.problems
    prof = open_run(out)
    print(f"{name}: measured {prof.analysis.measured_us / 1e3:.2f} ms, replayed {prof.analysis.predicted_us / 1e3:.2f} ms "
          f"({prof.analysis.error_pct:+.2f} %)")
    assert abs(prof.analysis.error_pct) < 5
    if os.environ.get("DAGPROF_UPDATE_FIXTURES") == "1":
        _store(out, fixture)


def _store(run: pathlib.Path, fixture: pathlib.Path) -> None:
    shutil.rmtree(fixture, ignore_errors=True)
    fixture.mkdir(parents=True)
    for f in ["manifest.json", *(p.name for p in run.glob("rank*.json"))]:
        shutil.copy(run / f, fixture / f)
    for f in xplane_files(str(run)):
        dst = fixture / pathlib.Path(f).relative_to(run)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.with_name(dst.name + ".gz").write_bytes(gzip.compress(pathlib.Path(f).read_bytes(), mtime=0))


LOOPED_FIT = """
import os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
from dagprof.collect.hooks.tf_profile import keras_callback
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu", input_shape=(8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=int(sys.argv[2]))
x, y = np.random.rand(64, 8).astype("float32"), np.random.rand(64, 1).astype("float32")
model.fit(x, y, batch_size=8, verbose=0, callbacks=[keras_callback(sys.argv[1], steps=(1, 3), rank=0, world_size=1)])
print("trained")
"""


@pytest.mark.parametrize("spe", [2, 1])
def test_fit_with_several_steps_per_execution_is_told_at_profile_time(spe, tmp_path):
    """``compile(steps_per_execution=N > 1)`` over replicas loops the collectives under one key each, which the reader
    refuses only once training is over: the callback says so in one line on stderr when ``fit`` begins, and training goes on."""
    python = os.environ.get("DAGPROF_TF_PYTHON")
    if not python:
        pytest.skip("needs DAGPROF_TF_PYTHON: a Python with tensorflow-cpu and tf-keras (see this file)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([python, "-c", LOOPED_FIT, str(tmp_path / "run"), str(spe)], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and proc.stdout.strip() == "trained", proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("dagprof: compile(steps_per_execution")]
    assert said == ([] if spe == 1 else ["dagprof: compile(steps_per_execution=2) on 2 replicas runs 2 batches per call in a loop whose "
                                         "collectives reuse their keys: this profile will be refused when read; profile with "
                                         "steps_per_execution=1"])


def test_a_custom_loop_with_packed_all_reduces_sizes_each_pack(tmp_path):
    """``bench/frameworks/tf_mobilenet_accum.py``: a custom loop under a strategy with ``CommunicationOptions(bytes_per_pack=64 kB)``,
    whose gradients (267,816 B) TF all-reduces as 3 packs. The collector, handed no step function, sizes every traced
    ``tf.function``'s collectives before the window: each pack carries its own bytes (once: all on the first, 0 B on
    the others)."""
    out = _launched(tmp_path, "DAGPROF_TF_PYTHON", "a Python with tensorflow-cpu", "tf_mobilenet_accum", 400,
                    ("--steps", "9", "--window", "6:8"))
    run = load(str(out))
    for trace in run.ranks:
        ev = trace.events
        packs = {}
        for i in range(len(ev)):
            if ev.step[i] == 6 and ev.name_of(i).startswith("sgd/CollectiveReduceV2"):
                packs[ev.name_of(i)] = int(ev.nbytes[i])
        assert packs == {"sgd/CollectiveReduceV2": 142376, "sgd/CollectiveReduceV2_1": 71168, "sgd/CollectiveReduceV2_2": 54272}
    assert abs(open_run(str(out)).analysis.error_pct) < 1.0


@pytest.mark.parametrize("batch", [64, 8])
def test_a_sparse_gradient_of_a_dynamic_row_count_is_sized_in_each_step(batch, tmp_path):
    """``bench/frameworks/tf_bilstm_tagger_fit.py`` (Keras ``fit``, an ``Embedding`` over ``Input((None,))`` int64 ids,
    ``padded_batch``), as ``tests/data/tf/bilstm-rows`` (batch 64) and ``bilstm-ids`` (batch 8) were recorded: the
    collector reads the bytes per row of the sparse gradient's all-gathers and the lookup whose ids they gather from
    ``fit``'s traced step, and every profiled step's rows' and indices' gathers have bytes (``batch`` x 10 ids per
    worker, 2 workers: rows of 64 float32, int64 indices; at batch 8 under the memory tracer's floor), none unsized."""
    out = _launched(tmp_path, "DAGPROF_TF_PYTHON", "a Python with tensorflow-cpu and tf-keras", "tf_bilstm_tagger_fit", 600,
                    ("--epochs", "1", "--window", "3:5", "--maxlen", "10", "--batch", str(batch)))
    run = load(str(out))
    rows = 2 * batch * 10
    for trace in run.ranks:
        ev = trace.events
        for step in (3, 4):
            gathers = {ev.name_of(i): int(ev.nbytes[i]) for i in range(len(ev))
                       if ev.step[i] == step and ev.name_of(i).startswith("cond/then/")}
            assert gathers == {"cond/then/_0/cond/CollectiveGatherV2": rows * 64 * 4, "cond/then/_0/cond/CollectiveGatherV2_1": rows * 8}
    assert not any("have no size" in str(w) or "int32" in str(w) for w in run.meta.warnings)


@pytest.mark.parametrize("name", ["tf_recsys_ragged", "tf_textcls_buckets"])
def test_a_custom_loop_of_dynamic_shapes_sizes_every_gather_by_the_rows_the_script_looked_up(name, tmp_path):
    """``bench/frameworks/tf_recsys_ragged.py`` (a ragged history looked up in two tables with the same ids) and
    ``tf_textcls_buckets.py`` (bucketed lengths, ``reduce_retracing``: the step traced first with static shapes, then
    with a dynamic length), custom loops that log the ids each worker looked up in each step: every all-gather of a
    sparse gradient (mostly TF's branch that pads the workers' unequal row counts) carries workers x the most rows any
    worker looked up (``tf_gather_rows``), none unsized."""
    out = _launched(tmp_path, "DAGPROF_TF_PYTHON", "a Python with tensorflow-cpu", name, 600, ("--steps", "10", "--window", "5:8"))
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "bench" / "frameworks"))
    from tf_gather_rows import main as gather_rows  # noqa: PLC0415

    assert gather_rows(str(out)) == 0
    assert not any("have no size" in str(w) for w in load(str(out)).meta.warnings)


def test_a_jax_profile_records_other_processes_load_and_the_pace_note_says_it(tmp_path):
    """A 2-worker ``jax_train`` job beside a busy loop: each rank records its window's cores' busy and own CPU
    (``traces.window_cpu``), the host's other load holds the loop's share of a core, and a what-if with more ranks than
    cores says the figure beside gloo's ring pace (not priced)."""
    python = os.environ.get("DAGPROF_JAX_PYTHON")
    if not python:
        pytest.skip("needs DAGPROF_JAX_PYTHON: a Python with jax (see this file)")
    import sys  # noqa: PLC0415

    from dagprof.passes.compute import ring_pace_note  # noqa: PLC0415
    from dagprof.passes.ring_pace import ring_pace  # noqa: PLC0415

    out = tmp_path / "run"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc = subprocess.run([python, "-m", "dagprof.collect.jobs.jax_train", "--out", str(out), "--timeout", "300"],
                              env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=400)
    finally:
        hog.kill()
        hog.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(t.meta.window_cpu is not None for t in load(out).ranks)
    g = open_run(out).graph
    (host, other), = g.meta.host_other_cores.items()
    cores = g.meta.host_cpus[host].cores
    assert other >= 0.25  # the loop ran beside the window, whatever else the host ran
    pace = ring_pace(g, cores + 2, cores)
    assert pace.step_us == pytest.approx(pace.tick_us / (2 * cores))
    assert f"other processes took {other:.2f} of a core beside the profiled window" in ring_pace_note(g, cores + 2, cores)


def test_a_zero_style_shard_map_job_sees_its_reduce_scatters_and_all_gathers_with_their_bytes(tmp_path):
    """``bench/frameworks/jax_zero_rs.py`` recorded afresh (``tests/test_jax_reduce_scatter.py`` reads the vendored
    recording): every step's 3 all-gathers carry the gathered parameters, its 3 reduce-scatters the whole gradients,
    as ``CommKind.event_bytes`` counts them, on both ranks, matched across them."""
    out = _launched(tmp_path, "DAGPROF_JAX_PYTHON", "a Python with jax", "jax_zero_rs", 400, ("--steps", "10"))
    import numpy as np  # noqa: PLC0415

    from dagprof.traces.events import CommKind, Kind  # noqa: PLC0415

    run = load(str(out))
    params = (256 * 512 + 512 * 512 + 512 * 16) * 4
    for trace in run.ranks:
        ev = trace.events
        comm = np.flatnonzero((ev.kind == Kind.COMM) & (ev.step == 6))
        sized = {k: int(ev.nbytes[comm][ev.comm_kind[comm] == k].sum()) for k in (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER)}
        assert sized == {CommKind.ALL_GATHER: params, CommKind.REDUCE_SCATTER: params}
    m = match_collectives(run)
    assert m.instances and not m.problems


def test_strategy_gather_of_per_replica_tensors_is_sized_as_sent(tmp_path):
    """``bench/frameworks/tf_kws_specaug_gather.py``: ``strategy.gather`` of each replica's worst loss (1 float) and of its
    16 predictions and labels (int32) every step. TF pads each worker's tensor to the most any has (their shapes first),
    so the gathers' inputs have no static shape: sized per row, with no rows counted for them, all three went at 0 B.
    The padded tensors' own shapes are static (every worker's program fixes them): each gathers as that shape."""
    out = _launched(tmp_path, "DAGPROF_TF_PYTHON", "a Python with tensorflow-cpu", "tf_kws_specaug_gather", 400,
                    ("--steps", "9", "--window", "6:8"))
    for trace in load(str(out)).ranks:
        ev = trace.events
        sent = sorted(int(ev.nbytes[i]) for i in range(len(ev)) if ev.step[i] == 6 and ev.name_of(i).startswith("allgather")
                      and ev.name_of(i).endswith("CollectiveGatherV2_1"))
        assert sent == [8, 128, 128]  # 2 workers' 1 float, 16 int32 predictions, 16 int32 labels


def _launched(tmp_path, env: str, needs: str, script: str, timeout: int, args: tuple) -> pathlib.Path:
    """``bench_frameworks.launch`` of a user-style ``script`` on 2 processes into ``tmp_path/run``, both exiting 0;
    skipped without the framework's Python (``env``, ``needs``)."""
    python = os.environ.get(env)
    if not python:
        pytest.skip(f"needs {env}: {needs} (see this file)")
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_frameworks import launch  # noqa: PLC0415  (it sets a Keras script's TF_USE_LEGACY_KERAS)

    out = tmp_path / "run"
    out.mkdir()
    codes = launch(script, python, str(out), 2, timeout, script_args=args)
    assert codes == [0, 0], (out / "log1.txt").read_text()[-3000:]
    return out
