"""Damaged Kineto events lose only themselves, and never a silent wrong time (issue 17, items 3 and 4).

Built from the vendored 2-rank gloo recording (tests/data/gloo-windows/same: CPU ops with input shapes,
a process group in ``distributedInfo``, named threads): one event of rank 0 is damaged in tmp_path, rank 1
stays as recorded, and the run must still match its collectives with every size and thread name intact.
"""
from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest
from testdata import GLOO_WINDOWS, copy_fixture, load_refused

import dagprof
from dagprof.errors import DagprofError
from dagprof.traces.events import Kind
from dagprof.traces.kineto import read_kineto

SAME = GLOO_WINDOWS / "same"
RANK0 = SAME / "rank-0.pt.trace.json.gz"


def _doc():
    with gzip.open(RANK0, "rt") as f:
        return json.load(f)


def _plain_op(doc, k: int = 0) -> dict:
    """The k-th complete CPU op that is no collective (its loss must not touch the collectives)."""
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op" and str(e["name"]).startswith("aten::")]
    return ops[k]


def _folder(tmp_path, doc) -> str:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank-0.pt.trace.json").write_text(json.dumps(doc))
    shutil.copy(SAME / "rank-1.pt.trace.json.gz", folder / "rank-1.pt.trace.json.gz")
    return str(folder)


def _collectives(trace):
    ev = trace.events
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    return ev.nbytes[comm].tolist(), ev.seq[comm].tolist(), [trace.groups[g] for g in ev.group[comm].tolist()]


@pytest.fixture(scope="module")
def clean():
    return read_kineto(RANK0)


@pytest.mark.parametrize("damage", ["name", "dur", "arg"])
def test_one_odd_event_keeps_every_other_field(tmp_path, clean, damage):
    doc = _doc()
    op = _plain_op(doc)
    if damage == "name":
        op["name"] = 12345  # an op named by an integer: its text
    elif damage == "dur":
        op["dur"] = 1e300  # a duration no profile has: that event dropped, counted
    else:
        op.setdefault("args", {})["correlation"] = {"not": "an id"}  # an argument of a foreign type: that argument dropped
    t = read_kineto(_folder(tmp_path, doc) + "/rank-0.pt.trace.json")
    assert _collectives(t) == _collectives(clean)  # sizes from input shapes, groups and order all kept
    assert [lane.name for lane in t.lanes] == [lane.name for lane in clean.lanes]  # thread names kept
    assert t.group_ranks == clean.group_ranks
    warnings = " | ".join(map(str, t.meta.warnings))
    if damage == "dur":
        assert len(t.events) == len(clean.events) - 1 and "1 of" in warnings and "unreadable" in warnings
    else:
        assert len(t.events) == len(clean.events) and "1 of" in warnings and "foreign type" in warnings
    if damage == "name":
        assert "12345" in t.events.names


def test_events_of_no_phase_or_a_foreign_one_are_read_as_nothing(tmp_path, clean):
    """Each phase decodes into its own struct; an event with no ``ph``, or one the trace format does not define,
    is read as nothing (as any phase dagprof does not read), not counted as damage, and the rest stays whole."""
    doc = _doc()
    doc["traceEvents"] += [{"name": "no phase", "ts": 1, "dur": 2, "pid": 1, "tid": 1}, {"ph": "Z", "name": "foreign"},
                           {"ph": 7, "cat": "cpu_op"}]
    t = read_kineto(_folder(tmp_path, doc) + "/rank-0.pt.trace.json")
    assert len(t.events) == len(clean.events) and np.array_equal(t.events.start, clean.events.start)
    assert _collectives(t) == _collectives(clean) and not t.meta.warnings


def test_a_damaged_rank_still_matches_its_collectives(tmp_path):
    """One integer name and one 1e300 duration on rank 0 used to drop every raw field there: 'mismatched collectives'."""
    doc = _doc()
    _plain_op(doc, 1)["dur"] = 1e300
    _plain_op(doc, 0)["name"] = 7
    run = dagprof.load(_folder(tmp_path, doc))
    dagprof.build_graph(run)  # matches the ranks' collectives, or refuses in one line
    assert len(run.ranks) == 2
    clean = dagprof.load(str(SAME))
    assert _collectives(run.ranks[0]) == _collectives(clean.ranks[0])


def test_missing_negative_and_absurd_times_are_dropped_and_counted(tmp_path, clean):
    doc = _doc()
    a, b, c = (_plain_op(doc, k) for k in range(3))
    a.pop("ts")  # once read as 0: the trace then spanned 60 days
    b["dur"] = -5.0  # once clamped to 0 without a word
    c["dur"] = 31 * 365 * 86_400e6  # a 31-year op, once kept
    t = read_kineto(_folder(tmp_path, doc) + "/rank-0.pt.trace.json")
    assert len(t.events) == len(clean.events) - 3
    span = (t.events.start + t.events.dur).max() - t.events.start.min()
    assert span <= (clean.events.start + clean.events.dur).max() - clean.events.start.min()
    warnings = " | ".join(map(str, t.meta.warnings))
    assert "2 of" in warnings and "no valid ts or dur" in warnings
    assert "1 of" in warnings and "longer than 24 hours" in warnings
    assert _collectives(t) == _collectives(clean)


def test_a_timestamp_from_another_epoch_is_refused_in_one_line(tmp_path):
    doc = _doc()
    _plain_op(doc, 0)["ts"] = 0  # explicit, but 60 days before every other event
    path = _folder(tmp_path, doc) + "/rank-0.pt.trace.json"
    with pytest.raises(DagprofError, match="span") as err:
        read_kineto(path)
    assert "\n" not in str(err.value) and path in str(err.value)


def test_json_nested_too_deep_is_one_line(tmp_path):
    doc = _doc()
    text = json.dumps(doc).replace('"traceEvents": [', '"traceEvents": [{"ph": "i", "args": {"Input Dims": ' + "[" * 100_000
                                   + "]" * 100_000 + "}}, ", 1)
    path = tmp_path / "rank-0.json"
    path.write_text(text)
    with pytest.raises(DagprofError, match="nested too deeply") as err:
        read_kineto(path)
    assert "\n" not in str(err.value)


def test_events_cut_into_chunks_read_as_one(tmp_path, clean, monkeypatch):
    """Chunks of a few events, cut also inside names that look like event boundaries, give the same table."""
    from dagprof.traces import kineto_decode

    doc = _doc()
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["name"].startswith("aten::")]
    for e in ops[:5]:
        e["args"]["Input type"] = ['}, {"ph": "X"', "float"]  # a boundary inside a string
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps(doc, indent=1))
    whole = read_kineto(path)
    monkeypatch.setattr(kineto_decode, "CHUNK_BYTES", 300)
    chunked = read_kineto(path)
    for c in whole.events.COLUMNS:
        assert np.array_equal(getattr(whole.events, c), getattr(chunked.events, c)), c
    assert np.array_equal(whole.flows, chunked.flows) and whole.meta == chunked.meta
    assert _collectives(whole) == _collectives(clean)


def _same_trace(a, b) -> bool:
    ea, eb = a.events, b.events
    return (ea.names == eb.names and all(np.array_equal(getattr(ea, c), getattr(eb, c)) for c in ("name", "kind", "lane", "start", "dur", "depth"))
            and np.array_equal(a.flows, b.flows) and a.lanes == b.lanes)


@pytest.mark.parametrize("case", ["a later list of objects", "two traceEvents keys", "log lines after the events"])
def test_what_follows_the_event_list_is_read_as_a_whole_decode_reads_it(tmp_path, case):
    """The top level is decoded around where the event list seems to end; when it ends elsewhere, the trace is
    read as if decoded whole (the last of two traceEvents keys wins, as in any JSON decode)."""
    doc = _doc()
    if case == "a later list of objects":
        doc["traceEvents"].append(1)  # the list's last value is no event object: the guess takes the later list's end
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps(doc))
    if case == "two traceEvents keys":
        text = '{"traceEvents": [{"ph": "X", "name": "gone", "pid": 1, "tid": 1, "ts": 1, "dur": 1}], ' + json.dumps(doc)[1:]
    elif case == "a later list of objects":
        text = json.dumps({**doc, "devices": [{"name": "A100", "totalGlobalMem": 1}]})
    else:
        text = json.dumps({**doc, "logs": ["INFO cpp:333] counts", "cpp:1] done"], "traceName": "t"})
    trace = tmp_path / "rank-0.json"
    trace.write_text(text)
    got, want = read_kineto(trace), read_kineto(expected)
    assert _same_trace(got, want) and "gone" not in got.events.names


def test_a_step_number_marking_two_windows_is_refused(tmp_path):
    """Two ProfilerStep#2 windows split the step's ops and the run failed as 'mismatched collectives' naming neither."""
    doc = _doc()
    steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    steps[1]["name"] = steps[0]["name"]
    path = tmp_path / "rank-0.pt.trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DagprofError, match=f"^{path}: {steps[0]['name']} marks 2 windows: a damaged trace, or two profiler sessions"):
        read_kineto(str(path))


def test_a_stray_byte_in_a_string_the_header_skips_is_one_line_naming_the_file(tmp_path):
    """A manifest whose ``backend`` string holds an invalid UTF-8 byte: the format/version header skips that field, so the
    full decode meets it; refused in one line naming the file (found by the fuzzer on a freshly recorded run)."""
    run = copy_fixture(tmp_path, "habits")
    manifest = run / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"backend": "gloo"', b'"backend": "\xc0"'))
    why = load_refused(run, "corrupt", "not valid JSON")
    assert "manifest.json" in why
