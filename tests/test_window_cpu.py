"""Other processes' CPU on a JAX job's cores over its profiled window (``traces.window_cpu``), read from the rank files and
pricing the ring pace on the cores they leave (``passes.ring_pace``). Recording: ``tf-jax/shardmap-threads`` (its rank
files predate the figure: a copy is given one); a real job's: ``test_frameworks_integration.py`` (opt-in)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dagprof.passes.comm_cpu import keep_comm_cpu
from dagprof.passes.compute import ring_pace_note, share_cores
from dagprof.passes.ring_pace import pace_us, ring_pace
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind
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


def test_the_pace_is_priced_on_the_cores_other_processes_leave(runs):
    """4 ranks on 2 cores beside 0.6 of a core: tick / (2 x 1.4); the recording without the figure keeps tick / 4, and the
    pace never counts less than one core's ticks."""
    quiet, loaded = runs
    assert quiet.meta.host_other_cores == {} and loaded.meta.host_other_cores == pytest.approx({"vm": 0.6})
    bare, paced = ring_pace(quiet, 4, 2), ring_pace(loaded, 4, 2)
    assert bare.other_cores is None and bare.step_us == pace_us(bare.tick_us, 2) == bare.tick_us / 4
    assert paced.free_cores == pytest.approx(1.4) and paced.step_us == pytest.approx(paced.tick_us / 2.8)
    crowded = loaded.replace(meta=loaded.meta.replace(host_other_cores={"vm": 1.7}))
    assert ring_pace(crowded, 4, 2).step_us == pytest.approx(paced.tick_us / 2)
    assert ring_pace(loaded, 2, 2) is None  # within the cores the profile holds its own pace, loaded or not


def test_the_note_says_the_load_it_priced_and_the_collectives_wait_the_pace_it_sets(runs):
    """The note names the cores left and the load. ``--workers 4 --cores 2`` on a 16 ms tick, where the pace outlasts
    every collective: each collective's wait for a core makes it last its ring steps at the loaded pace exactly, 2 / 1.4
    times the quiet pace's; at 2 workers the load moves nothing."""
    quiet, loaded = runs
    note = ring_pace_note(loaded, 4, 2)
    assert "1.40 cores left of 2 by the 0.60 of a core other processes took in the profiled window" in note
    assert "1.43 ms" in note and "other processes" not in ring_pace_note(quiet, 4, 2)

    def lasts(g, workers):
        g = scale_workers(keep_comm_cpu(g), workers)
        g = g.replace(meta=g.meta.replace(host_tick_us={h: 4 * t for h, t in g.meta.host_tick_us.items()}))
        out = share_cores(g, 2, replayer=replay)
        waits = {out.node_name(i).removesuffix(" (off-lane cpu waits for a core)"): float(out.gap[i]) for i in range(len(out))
                 if out.node_name(i).endswith("waits for a core)")}
        comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
        return np.array([float(g.dur[c]) + waits.get(g.node_name(c), 0.0) for c in comm.tolist()])
    assert lasts(loaded, 4) == pytest.approx(lasts(quiet, 4) * 2 / 1.4)
    assert lasts(loaded, 2) == pytest.approx(lasts(quiet, 2))
