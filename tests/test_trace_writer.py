"""The Perfetto writer: replay skips its traces above a size unless asked, and says so in one warning."""
import json

from testdata import GLOO_WINDOWS

from dagprof import pipeline
from dagprof.cli.main import main

RUN = str(GLOO_WINDOWS / "same")


def test_replay_skips_large_traces_unless_asked(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "LARGE_TRACE_EVENTS", 100)  # the gloo run has a few thousand events
    assert main(["replay", RUN, "--json", "-o", str(tmp_path / "skip")]) == 0
    r = json.loads(capsys.readouterr().out)
    notes = [w for w in r["warnings"] if "Perfetto traces not written" in w]
    assert len(notes) == 1 and "--write-traces" in notes[0]
    assert set(r["files"]) == {"report"} and not (tmp_path / "skip" / "replay.trace.json").exists()

    assert main(["replay", RUN, "--json", "--write-traces", "-o", str(tmp_path / "all")]) == 0
    r = json.loads(capsys.readouterr().out)
    assert not any("Perfetto" in w for w in r["warnings"])
    for name in ("replay.trace.json", "measured.trace.json"):
        doc = json.loads((tmp_path / "all" / name).read_text())
        slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
        assert slices and {(e["pid"], e["tid"]) for e in slices} <= threads
        assert all(e["dur"] >= 0 and isinstance(e["args"], dict) for e in slices)
