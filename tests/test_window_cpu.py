"""Other processes' CPU on a JAX job's cores over its profiled window (``traces.window_cpu``), read from the rank files and
said beside the ring pace (``passes.ring_pace``), not priced. Recording: ``tf-jax/shardmap-threads`` (its rank
files predate the figure: a copy is given one); a real job's: ``test_frameworks_integration.py`` (opt-in)."""
from __future__ import annotations

import json
import shutil

import pytest

from dagprof.passes.comm_cpu import keep_comm_cpu
from dagprof.passes.compute import ring_pace_note, share_cores
from dagprof.passes.ring_pace import pace_us, ring_pace
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.window_cpu import WindowCpu, other_cores

RUN = "tests/data/tf-jax/shardmap-threads"


def _window(busy: float, own: float) -> WindowCpu:
    """A one-second window whose cores ran ``busy`` cores' worth, ``own`` of them this rank's process."""
    return WindowCpu(wall_ns=1_000_000_000, cores_busy_ns=int(busy * 1e9), own_cpu_ns=int(own * 1e9))


def test_a_hosts_other_load_is_its_cores_busy_share_less_every_ranks_own():
    """Two ranks on one host's cores: the mean busy share less both ranks' own; none where a rank did not record it or the
    ranks were pinned apart (each would see other cores); never below 0 (the busy time is counted at the ticks)."""
    assert other_cores([("vm", "0-1", _window(1.9, 0.65)), ("vm", "0-1", _window(1.8, 0.65))]) == pytest.approx({"vm": 0.55})
    assert other_cores([("vm", "0-1", _window(1.9, 0.65)), ("vm", "0-1", None)]) == {}
    assert other_cores([("vm", "0", _window(0.9, 0.65)), ("vm", "1", _window(0.9, 0.65))]) == {}
    assert other_cores([("vm", "0-1", _window(1.0, 0.6)), ("vm", "0-1", _window(1.0, 0.5))]) == {"vm": 0.0}
    assert other_cores([("a", "0-1", _window(1.0, 0.5)), ("b", "0-1", _window(1.5, 0.5))]) == pytest.approx({"a": 0.5, "b": 1.0})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The recording as it is (no figure) and a copy whose ranks say 0.6 of a core of other processes' CPU."""
    loaded = tmp_path_factory.mktemp("loaded") / "run"
    shutil.copytree(RUN, loaded)
    for r in (0, 1):
        path = loaded / f"rank{r}.json"
        info = json.loads(path.read_text())
        info["window_cpu"] = {"wall_ns": 1_000_000_000, "cores_busy_ns": 1_900_000_000, "own_cpu_ns": 650_000_000}
        path.write_text(json.dumps(info))
    return open_run(RUN).graph, open_run(str(loaded)).graph


def test_the_load_is_read_and_said_beside_the_pace_but_not_priced(runs):
    """0.6 of a core read from the rank files; ``--workers 4 --cores 2`` says it beside the pace (tick / 4 still: priced on
    the cores it leaves, it moved 4 of 5 cells away, jax69), the recording without the figure says nothing of it."""
    quiet, loaded = runs
    assert quiet.meta.host_other_cores == {} and loaded.meta.host_other_cores == pytest.approx({"vm": 0.6})
    assert ring_pace(loaded, 4, 2).step_us == ring_pace(quiet, 4, 2).step_us == pace_us(ring_pace(quiet, 4, 2).tick_us, 2)
    note = ring_pace_note(loaded, 4, 2)
    assert note.startswith(ring_pace_note(quiet, 4, 2))
    assert "other processes took 0.60 of a core beside the profiled window, which the pace does not price" in note
    assert "other processes" not in ring_pace_note(quiet, 4, 2) and ring_pace_note(loaded, 2, 2) is None


def test_the_answer_does_not_move_with_the_recorded_load(runs):
    """The same collectives and waits with the figure as without it, at 4 workers on 2 cores."""
    quiet, loaded = runs

    def lasts(g):
        out = share_cores(scale_workers(keep_comm_cpu(g), 4), 2, replayer=replay)
        return [float(out.gap[i]) + float(out.dur[i]) for i in range(len(out))]
    assert lasts(loaded) == lasts(quiet)
