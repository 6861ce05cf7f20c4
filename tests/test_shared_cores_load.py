"""Ranks sharing one host's cores that waited for them beyond all the job's CPU there: ``whatif`` says so in one line
(``analysis.foreign_cpu.shared_cores_load_note``), since the op times and every row carry that load.

``tests/data/ddp-fresh/dqn-loaded`` was profiled on loopback at load 13-18 (tests/data/README.md): its training threads
waited for a core 59-62 % of a step beyond the job's own CPU; ``ddp-fresh/gat-log-1g`` was profiled inside the exclusive
lock (0 %)."""
import json
import os
import shutil

from dagprof.analysis.foreign_cpu import NOTE_SHARE, shared_cores_load_note, shared_foreign_cpu
from dagprof.cli.main import main
from dagprof.pipeline import open_run

DATA = os.path.join(os.path.dirname(__file__), "data", "ddp-fresh")
LOADED, QUIET = os.path.join(DATA, "dqn-loaded"), os.path.join(DATA, "gat-log-1g")


def _meta(path: str):
    return open_run(path).graph.meta


def test_the_loaded_profile_names_each_rank_wait_and_share():
    meta = _meta(LOADED)
    f = shared_foreign_cpu(meta)
    assert f is not None and f.share >= NOTE_SHARE and set(f.foreign_us) == {0, 1}
    note = shared_cores_load_note(meta)
    assert note is not None and "\n" not in note
    for r in (0, 1):
        assert f"rank {r} " in note and f"{f.foreign_us[r] / 1e3:.1f} ms ({100 * f.foreign_us[r] / f.step_us[r]:.0f} %)" in note
    assert "--cores queues the ranks again" in note and "profile again on quiet cores" in note


def test_a_quiet_profile_gets_no_note():
    meta = _meta(QUIET)
    f = shared_foreign_cpu(meta)
    assert f is not None and f.share < NOTE_SHARE
    assert shared_cores_load_note(meta) is None


def test_whatif_json_carries_it_in_notes(tmp_path, capsys):
    for name, path, said in (("loaded", LOADED, 1), ("quiet", QUIET, 0)):
        run = tmp_path / name
        shutil.copytree(path, run)
        assert main(["whatif", str(run), "--workers", "4", "--cores", "2", "--json"]) == 0
        notes = json.loads(capsys.readouterr().out)["notes"]
        assert sum("waited for a core in the profiled steps" in n for n in notes) == said
