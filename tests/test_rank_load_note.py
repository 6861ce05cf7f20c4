"""The searched profile's ranks waiting for a core far apart: ``optimize`` says it in one line (``measured.rank_load_note``).

``tests/data/rank-load/twotower`` is the held-out two-tower's searched profile of branch psgdpace (docs/evidence.md): its
rank 0 ran beside another load (its training thread waited 42.5 ms a step for a core, rank 1's 16.4), hidden behind the
defaults' wire wait; the overlap-control round's defaults are a quiet profile (2.0 / 2.3 ms)."""
import os

from dagprof.cli.cmd_optimize import verification_lines
from dagprof.cli.main import main
from dagprof.closeloop import Checked
from dagprof.pipeline import open_run
from dagprof.search.measured import RANK_WAIT_APART_MS, rank_load_note

DATA = os.path.join(os.path.dirname(__file__), "data")
LOADED = os.path.join(DATA, "rank-load", "twotower")
QUIET = os.path.join(DATA, "overlap-control", "w0-2", "lossy", "verify", "round0-A", "run")


def _waits(path: str) -> dict[int, float]:
    run = open_run(path).run
    return {r.rank: sum(s.wait_us for s in r.meta.train_thread) / len(r.meta.train_thread) / 1e3 for r in run.ranks}


def test_the_loaded_rank_is_named_with_its_wait_a_step():
    waits = _waits(LOADED)
    assert waits[0] - waits[1] > RANK_WAIT_APART_MS  # the recording: rank 0 beside another load
    note = rank_load_note(open_run(LOADED).run)
    assert note is not None and "\n" not in note
    assert f"rank 0 waited {waits[0]:.1f} ms a step" in note and f"{waits[1]:.1f} ms on rank 1" in note


def test_a_quiet_profile_says_nothing():
    waits = _waits(QUIET)
    assert abs(waits[0] - waits[1]) <= RANK_WAIT_APART_MS
    assert rank_load_note(open_run(QUIET).run) is None


def test_optimize_prints_it_as_a_note(capsys, tmp_path):
    assert main(["optimize", LOADED, "--budget", "1", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "waited" in ln and "for a core on its training thread" in ln]
    assert len(lines) == 1 and lines[0].startswith("note: the searched profile's rank 0 ")


def test_the_verification_printout_says_it_too():
    note = rank_load_note(open_run(LOADED).run)
    v = {"speedup_per_round": [2.0], "predicted_speedup_per_round": [1.8], "rounds": 1, "measured_baseline_ms": 300.0,
         "measured_strategy_ms": 150.0, "measured_speedup": 2.0, "spread": [2.0, 2.0], "predicted_speedup": 1.8, "confirmed": True,
         "median_prediction_error_per_round_pct": -10.0, "where_it_departs": [], "searched_profile_rank_load": note}
    assert f"  {note}" in verification_lines(v)
    assert "rank_load" in Checked.__dataclass_fields__
