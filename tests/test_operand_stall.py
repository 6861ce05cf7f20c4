"""A JAX all-reduce's per-operand stall on gloo (``analysis.operand_stall``), on real 2-worker recordings (tests/data/tf-jax):
the operands a step read from the programs' HLO, the host's cores and tick, the note and the interval of a link what-if,
nothing elsewhere."""
import json
import shutil

import pytest
from testdata import DATA, folded_lines

from dagprof.analysis.interval import PredictionInterval
from dagprof.analysis.operand_stall import (
    EVEN_ODDS,
    TICK_US,
    held_us,
    stall_bound_us,
    stall_halfwidth_us,
    stall_note,
    stall_outweighs,
    stall_risk,
    thread_share,
)
from dagprof.errors import DagprofError
from dagprof.graph.meta import CoreGroup
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.events import Kind


@pytest.mark.parametrize(("run", "arrays"), [("tf-jax/mlp", 6), ("tf-jax/pmap", 12)])
def test_operands_a_step_come_from_the_hlo_tuple(run, arrays):
    # the arrays of the result tuples of the all-reduces each step ran, read from the programs' HLO
    g = open_run(str(DATA / run)).graph
    assert g.meta.collective_operands_per_step == arrays
    assert stall_bound_us(g) == arrays * TICK_US


@pytest.mark.parametrize("run", ["tf-jax/mlp", "tf-jax/pmap", "tf-jax/pmap-margins"])
def test_recordings_without_their_cores_or_tick_are_taken_as_contended_at_the_assumed_tick(run):
    g = open_run(str(DATA / run)).graph
    assert g.meta.host_cpus == {} and g.meta.host_tick_us == {}
    risk = stall_risk(g)
    assert risk.hosts is None and risk.tick_us == TICK_US and not risk.tick_recorded
    assert "4 ms assumed" in stall_note(g) and "did not record the cores" in stall_note(g)


def test_a_recording_with_its_host_says_its_cores_and_tick():
    # tf-jax/pmap-host: 2 ranks on this 2-core host (CONFIG_HZ=250), recorded by the collector that writes both
    g = open_run(str(DATA / "tf-jax" / "pmap-host")).graph
    assert g.meta.host_cpus == {"vm": CoreGroup(2, 2)} and g.meta.host_tick_us == {"vm": 4000.0}
    risk = stall_risk(g)
    assert risk.hosts == ("vm",) and risk.tick_recorded and stall_bound_us(g) == 12 * 4000.0
    assert "(4 ms, the host kernel's) on contended cores (vm: 2 ranks x 2 threads on 2 cores)" in stall_note(g)


def test_the_stall_takes_the_recorded_tick_and_needs_contended_cores():
    g = open_run(str(DATA / "tf-jax" / "pmap-host")).graph
    assert stall_bound_us(g.replace(meta=g.meta.replace(host_tick_us={"vm": 1000.0}))) == 12 * 1000.0  # a CONFIG_HZ=1000 kernel
    unsaid = g.replace(meta=g.meta.replace(host_tick_us={}))
    assert stall_bound_us(unsaid) == 12 * TICK_US and "4 ms assumed" in stall_note(unsaid)
    roomy = g.replace(meta=g.meta.replace(host_cpus={"vm": CoreGroup(2, 4)}))  # a core for each rank's poller and poster
    assert stall_risk(roomy) is None and stall_bound_us(roomy) == 0.0 and stall_note(roomy) is None
    res = evaluate(roomy, [Scenario(bandwidth="100Mbit")], tolerance_pct=None, raw=True)
    assert "operand_stall" not in res["scenarios"][0].interval.terms


@pytest.mark.parametrize(("key", "value"), [("cpus", "2"), ("kernel_hz", -250)])
def test_a_damaged_core_count_or_tick_is_refused_naming_the_rank_file(tmp_path, key, value):
    run = tmp_path / "run"
    shutil.copytree(DATA / "tf-jax" / "pmap-host", run)
    info = json.loads((run / "rank1.json").read_text())
    (run / "rank1.json").write_text(json.dumps(info | {key: value}))
    with pytest.raises(DagprofError, match=rf"rank1.json.*\$\.{key}"):
        open_run(str(run))


def test_tf_runs_have_no_operand_stall():
    g = open_run(str(DATA / "tf" / "loop")).graph
    assert g.meta.collective_operands_per_step is None and stall_bound_us(g) == 0.0


def test_a_link_what_if_says_so_and_widens_by_the_stall_only_there():
    g = open_run(str(DATA / "tf-jax" / "mlp")).graph
    res = evaluate(g, [Scenario(), Scenario(bandwidth="100Mbit")], tolerance_pct=None, raw=True)
    same, slower = res["scenarios"]
    assert "operand_stall" not in same.interval.terms
    assert "operand_stall" in slower.interval.terms
    assert sum("one gloo call each" in n for n in res["notes"]) == 1
    alone = evaluate(g, [Scenario()], tolerance_pct=None, raw=True)
    assert not any("one gloo call each" in n for n in alone["notes"])


def test_the_stall_widens_both_sides_in_quadrature():
    base = PredictionInterval(100e3, 90e3, 110e3)
    half = stall_halfwidth_us(6 * TICK_US, 0.9)
    assert half == pytest.approx(6 * TICK_US * (1 - 0.1**0.5))
    w = base.with_stall(half)
    assert w.lo_us == pytest.approx(100e3 - (10e3**2 + half**2) ** 0.5) and w.hi_us == pytest.approx(100e3 + (10e3**2 + half**2) ** 0.5)
    assert base.with_stall(0.0) is base


def test_below_the_point_no_more_than_the_stall_it_holds():
    base = PredictionInterval(100e3, 90e3, 110e3)
    w = base.with_stall(20e3, held_us=5e3)
    assert w.lo_us == pytest.approx(100e3 - (10e3**2 + 5e3**2) ** 0.5) and w.hi_us == pytest.approx(100e3 + (10e3**2 + 20e3**2) ** 0.5)


def test_the_held_stall_is_the_collectives_time_beyond_the_profiled_wire():
    from dagprof.search.scenario import Cluster, profiled_at

    g = open_run(str(DATA / "tf-jax" / "pmap")).graph
    assert held_us(g) is None  # no profiled wire: nothing tells it
    comm = (g.kind == Kind.COMM) & (g.rank < 0) & (g.step >= 0)
    most = max(g.dur[comm & (g.step == s)].sum() for s in g.meta.steps)
    assert 0 < held_us(profiled_at(g, Cluster(profiled_bandwidth="10Gbit"))) <= most
    assert held_us(profiled_at(g, Cluster(profiled_bandwidth="1Mbit"))) == 0.0  # the wire alone would take longer


def test_a_link_row_that_changes_the_step_less_than_the_stall_moves_one_is_marked_and_counted():
    # tf-jax/pmap-host: 12 arrays a step on 2 contended cores, 0-48 ms; at even odds two steps' stalls differ by 14 ms
    g = open_run(str(DATA / "tf-jax" / "pmap-host")).graph
    half = stall_halfwidth_us(stall_bound_us(g), EVEN_ODDS)
    assert half == pytest.approx(48e3 * (1 - 0.5**0.5))
    res = evaluate(g, [Scenario(), Scenario(bandwidth="300Mbit"), Scenario(bandwidth="100Mbit"), Scenario(compute_speed=1.1)],
                   tolerance_pct=None, raw=True)
    same, near, far, faster = res["scenarios"]
    model = res["model_iter_ms"] * 1e3
    assert 0 < near.predicted_iter_ms * 1e3 - model < half and "not told apart" in near.stall_outweighs
    assert far.predicted_iter_ms * 1e3 - model > half and far.stall_outweighs is None
    assert same.stall_outweighs is None and faster.stall_outweighs is None  # not link rows: their intervals hold no stall either
    assert [n for n in res["notes"] if "even odds" in n] == [n for n in res["notes"] if n.startswith("1 of 4 rows (marked ~)")]


def test_no_stall_no_mark():
    g = open_run(str(DATA / "tf-jax" / "pmap-host")).graph
    roomy = g.replace(meta=g.meta.replace(host_cpus={"vm": CoreGroup(2, 4)}))  # a core for each rank's poller and poster
    assert stall_outweighs(roomy, 1.0) is None and stall_outweighs(g, 1.0) is not None
    assert stall_outweighs(g, -20e3) is None  # a change either way larger than the stall's even odds


def test_the_table_marks_such_a_row(capsys):
    from dagprof.cli.main import main

    assert main(["whatif", str(DATA / "tf-jax" / "pmap-host"), "--bandwidth", "300Mbit,100Mbit", "--raw", "--no-trace", "--allow-model-error"]) == 0
    rows = [line for line in folded_lines(capsys.readouterr().out, "2 ") if "Mbit " in line and "median step" in line]  # 2 workers
    assert [line.endswith(" ~") for line in rows] == [True, False]  # its link fit is weak too: both rows also carry *


def test_a_weak_fit_names_the_flag_that_gives_the_wire(capsys):
    """fresh64f's JAX LRU: a plain --bandwidth what-if read a 50 Mbit/s shaper as 22.4 (-37 %); the caution now says how
    to give the wire, and not once it is given."""
    from dagprof.cli.main import main

    args = ["whatif", str(DATA / "tf-jax" / "pmap-host"), "--bandwidth", "100Mbit", "--raw", "--no-trace", "--allow-model-error"]
    assert main(args) == 0
    words = " ".join(capsys.readouterr().out.split())  # the terminal folds long lines
    assert "rows marked * extrapolate it; if you know the wire it ran on, --profiled-bandwidth RATE says it" in words
    assert main(args + ["--profiled-bandwidth", "1Gbit"]) == 0
    assert "RATE says it" not in " ".join(capsys.readouterr().out.split())


def test_steps_whose_collectives_ran_past_the_bound_are_counted_in_the_note():
    """jax_gnn_jit's all-reduce of 14 arrays took 6-155 ms beyond a 4.5 ms wire, past its 0-56 ms bound: more than a tick
    an array where other processes kept the cores busy. The note counts such profiled steps instead of keeping quiet:
    pmap-host's 12 arrays (0-48 ms) ran 51 ms beyond a 10 Gbit/s wire in one of its 8 steps."""
    from dagprof.search.scenario import Cluster, profiled_at

    g = profiled_at(open_run(str(DATA / "tf-jax" / "pmap-host")).graph, Cluster(profiled_bandwidth="10Gbit"))
    assert "0-48 ms a step" in stall_note(g)
    assert "in 1 of 8 profiled steps the collectives ran beyond the wire by more than that (the most 51 ms)" in stall_note(g)
    assert "profiled steps" not in stall_note(g.replace(meta=g.meta.replace(host_tick_us={"vm": 10000.0})))  # 0-120 ms
    assert "profiled steps" not in stall_note(open_run(str(DATA / "tf-jax" / "pmap-host")).graph)  # no wire: nothing tells


def test_the_collectives_time_splits_by_whether_the_job_s_host_threads_ran_beside_it():
    """What the xplane recorded on the host's threads while each collective ran: XLA's kernels and Python's ops of either
    rank (the job's own threads holding the cores) or nothing (gloo's poller, the runtime, other processes)."""
    import numpy as np

    g = open_run(str(DATA / "tf-jax" / "pmap-host")).graph
    share = thread_share(g)
    work = np.flatnonzero((g.rank >= 0) & np.isin(g.kind, [int(Kind.KERNEL), int(Kind.OTHER)]) & (g.dur > 0))
    own, total = [], []
    for step in g.meta.steps:  # sampled every 5 us: the time each step's collectives ran beside recorded work
        comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dur > 0) & (g.step == step))
        grid = np.arange(g.order[comm].min(), (g.order[comm] + g.dur[comm]).max(), 5.0)
        busy = np.zeros(len(grid), bool)
        for v in work:
            busy |= (grid >= g.order[v]) & (grid < g.order[v] + g.dur[v])
        own.append(sum(5.0 * (busy & (grid >= g.order[v]) & (grid < g.order[v] + g.dur[v])).sum() for v in comm))
        total.append(g.dur[comm].sum())
    assert share.own_us == pytest.approx(np.median(own), rel=0.05, abs=50.0) and share.collective_us == pytest.approx(np.median(total))
    assert 0 < share.own_us < share.collective_us and share.wire_us is None
    note = stall_note(g)
    assert "the job's own host threads ran recorded work" in note and "(the wire's share in it not known)" in note
    wired = g.replace(meta=g.meta.replace(wire_bytes_per_s=1e9))
    assert thread_share(wired).wire_us > 0 and "beyond the wire's" in stall_note(wired)
    assert thread_share(g.replace(meta=g.meta.replace(host_cpus={"a": CoreGroup(1, 2), "b": CoreGroup(1, 2)}))) is None  # whose threads meet whose: not known
