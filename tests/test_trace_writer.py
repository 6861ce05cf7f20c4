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


def test_rows_chunk_by_chunk_equal_the_whole_columns(monkeypatch):
    """``chrome_trace.rows`` lists a chunk of rows at a time: across chunk edges the rows are those of the whole columns."""
    import numpy as np

    from dagprof.report import chrome_trace

    monkeypatch.setattr(chrome_trace, "_CHUNK", 7)
    a, b = np.arange(50, dtype=np.int32) * 3, np.linspace(0.0, 1.0, 50)
    index = np.argsort(-a, kind="stable")[:47]
    got = list(chrome_trace.rows(index, lambda k: (a[k], b[k] + 1.0)))
    assert got == list(zip(a[index].tolist(), (b[index] + 1.0).tolist()))
    assert all(type(x) is int and type(y) is float for x, y in got)
    assert list(chrome_trace.rows(index[:0], lambda k: (a[k],))) == []
