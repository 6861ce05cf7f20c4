"""Hostile inputs on the reading side (issue 17, items 7-9), each built from the vendored data in tests/data.

- The parse cache: an entry planted by another user (a folder owned by someone else, a writable folder, the
  old shared ``$TMPDIR/dagprof-cache``) is never read; a trace changed in place is a miss; a damaged but
  well-formed entry is a miss, never an exception.
- Bounds: a real gzip bomb stops at the cap (``DAGPROF_MAX_TRACE_BYTES`` / ``--max-trace-bytes``); a FIFO or a
  device is refused before any read (so nothing here can hang); a file a run names must lie inside the run.
- The terminal: control characters from a trace are printed escaped; ``--json`` stays exact.
Refusals are checked as exit status 2 and one line naming the file.
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil
import sys
import tempfile
import tracemalloc

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.fsutil import DEFAULT_MAX_BYTES, MAX_BYTES_ENV, read_input, read_input_pieces, read_versioned
from dagprof.traces import cache, kineto_decode
from dagprof.traces.kineto import read_kineto
from dagprof.traces.kineto_dir import read_cached, read_trace_dir
from dagprof.traces.layerwise import read_layer_file

GLOO = DATA / "gloo-windows" / "same"  # two ranks of a real gloo DDP job, Kineto
TRACE = GLOO / "rank-0.pt.trace.json.gz"
OTHER_UID = 54321  # a user other than the one running the tests (root)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, *argv: str, says: str, names: str) -> str:
    """The command exits 2 with one line on stderr naming the file and saying ``says``."""
    code, out, err = _cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert says in lines[0] and names in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def trace(tmp_path) -> pathlib.Path:
    """A private copy of one real rank trace (the tests change it or its cache)."""
    folder = tmp_path / "traces"
    folder.mkdir()
    return pathlib.Path(shutil.copy(TRACE, folder / TRACE.name))


def _forged(t):
    """What a planted entry claims: the same trace with every op 10x longer."""
    t.events.dur = t.events.dur * 10
    return t


# ------------------------------------------------------------------ 7. the parse cache


def _plant(trace: pathlib.Path, folder: pathlib.Path, monkeypatch) -> pathlib.Path:
    """A forged entry with a valid key (predictable: the attacker can read the trace), put into ``folder``."""
    staging = folder.parent / f"staging-{folder.name}"
    monkeypatch.setenv(cache.ENV_VAR, str(staging))
    entry = pathlib.Path(cache.store(str(trace), _forged(read_kineto(trace))))
    assert cache.load_cached(str(trace)) is not None  # the forgery is a valid entry where it was made
    folder.mkdir(parents=True, exist_ok=True)
    planted = folder / entry.name
    shutil.move(entry, planted)
    return planted


def test_an_entry_in_a_folder_of_another_user_is_never_read(trace, tmp_path, monkeypatch):
    honest = read_kineto(trace)
    theirs = tmp_path / "theirs"
    planted = _plant(trace, theirs, monkeypatch)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.chown(planted, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(cache.ENV_VAR, str(theirs))
    assert cache.load_cached(str(trace)) is None
    got = read_cached(str(trace))
    assert np.array_equal(got.events.dur, honest.events.dur)
    assert os.listdir(theirs) == [planted.name]  # and nothing of ours is written there


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_an_entry_in_a_folder_others_can_write_is_never_read(trace, tmp_path, monkeypatch, mode):
    shared = tmp_path / "shared"
    _plant(trace, shared, monkeypatch)
    os.chmod(shared, mode)  # ours, but group or others may write into it
    monkeypatch.setenv(cache.ENV_VAR, str(shared))
    assert cache.load_cached(str(trace)) is None
    assert cache.store(str(trace), read_kineto(trace)) != str(shared)


def test_the_shared_temp_folder_is_never_read_and_the_fallback_is_private(trace, tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)  # like /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    _plant(trace, tmp / "dagprof-cache", monkeypatch)  # where dagprof 0.2 looked
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV_VAR, str(blocker / "cache"))  # cannot be created: the temp fallback is used
    assert cache.load_cached(str(trace)) is None
    where = pathlib.Path(cache.store(str(trace), read_kineto(trace)))
    assert where.parent == tmp / f"dagprof-cache-{os.geteuid()}"
    assert where.parent.stat().st_mode & 0o777 == 0o700
    assert cache.load_cached(str(trace)) is not None
    shutil.rmtree(where.parent)
    (tmp / f"dagprof-cache-{os.geteuid()}").mkdir()  # taken first by another user
    os.chown(tmp / f"dagprof-cache-{os.geteuid()}", OTHER_UID, OTHER_UID)
    assert cache.store(str(trace), read_kineto(trace)) is None


def test_replay_of_a_planted_cache_gives_the_measured_numbers(trace, tmp_path, monkeypatch, capsys):
    code, out, _ = _cli(capsys, "replay", str(trace), "--json", "-o", str(tmp_path / "out1"))
    honest = json.loads(out)["measured_iter_ms"]
    theirs = tmp_path / "theirs"
    planted = _plant(trace, theirs, monkeypatch)
    monkeypatch.setenv(cache.ENV_VAR, str(theirs))
    _, out, _ = _cli(capsys, "replay", str(trace), "--json", "-o", str(tmp_path / "out2"))
    assert json.loads(out)["measured_iter_ms"] > 2 * honest  # the forgery is read while the folder is trusted
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.chown(planted, OTHER_UID, OTHER_UID)
    code, out, _ = _cli(capsys, "replay", str(trace), "--json", "-o", str(tmp_path / "out3"))
    assert code == 0 and json.loads(out)["measured_iter_ms"] == honest


def test_a_trace_changed_in_place_with_its_size_and_mtime_kept_is_a_miss(trace, tmp_path, monkeypatch):
    plain = trace.with_name("rank-0.pt.trace.json")
    text = gzip.decompress(trace.read_bytes())
    plain.write_bytes(text)
    trace.unlink()
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    cache.store(str(plain), read_kineto(plain))
    st = plain.stat()
    i = text.index(b'"dur": ') + len(b'"dur": ')
    plain.write_bytes(text[:i] + (b"9" if text[i:i + 1] != b"9" else b"8") + text[i + 1:])  # one digit, same size
    os.utime(plain, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert plain.stat().st_size == st.st_size and plain.stat().st_mtime_ns == st.st_mtime_ns
    assert cache.load_cached(str(plain)) is None


def _rewrite(entry: str, change) -> None:
    """Decode an entry (magic, header length, JSON header, aligned arrays), ``change`` it, write it back well-formed."""
    raw = pathlib.Path(entry).read_bytes()
    m = len(cache._MAGIC)
    n = int.from_bytes(raw[m:m + 8], "little")
    head, start = json.loads(raw[m + 8:m + 8 + n]), cache._aligned(m + 8 + n)
    arrays = {name: np.frombuffer(raw, np.dtype(d), int(np.prod(s)), start + o).reshape(s).copy() for name, d, s, o in head["arrays"]}
    change(arrays, head)
    layout, body = [], b""
    for name, a in arrays.items():
        layout.append([name, a.dtype.str, list(a.shape), len(body)])
        body += a.tobytes() + bytes(cache._aligned(a.nbytes) - a.nbytes)
    head["arrays"] = head.get("arrays_as", layout)
    blob = json.dumps(head).encode()
    lead = cache._MAGIC + len(blob).to_bytes(8, "little") + blob
    pathlib.Path(entry).write_bytes(lead + bytes(cache._aligned(len(lead)) - len(lead)) + body)


def _del(d, key):
    del d[key]


DAMAGE = {
    "a column cut short": lambda a, h: a.update(dur=a["dur"][:-1]),
    "a column of another dtype": lambda a, h: a.update(name=a["name"].astype(np.float64)),
    "a 2-d column": lambda a, h: a.update(start=a["start"].reshape(-1, 1)),
    "an array missing": lambda a, h: _del(a, "flows"),
    "flows of another shape": lambda a, h: a.update(flows=a["flows"].reshape(-1)),
    "a flow past the last event": lambda a, h: a["flows"].__setitem__((0, 1), len(a["start"]) + 5),
    "a rule per flow missing": lambda a, h: a.update(flow_rule=a["flow_rule"][:-1]),
    "a name index out of range": lambda a, h: a["name"].__setitem__(0, 10**6),
    "a lane index out of range": lambda a, h: a["lane"].__setitem__(0, -1),
    "an unknown kind": lambda a, h: a["kind"].__setitem__(0, 99),
    "a group index out of range": lambda a, h: a["group"].__setitem__(0, 10**4),
    "a header field missing": lambda a, h: _del(h, "names"),
    "a header field of another type": lambda a, h: h.update(rank="zero"),
    "a lane of another shape": lambda a, h: h.update(lanes=[["x"]] + h["lanes"][1:]),
    "an unknown lane kind": lambda a, h: h.update(lanes=[[n, 9, m, p] for n, k, m, p in h["lanes"]]),
    "an array of objects": lambda a, h: h.update(arrays_as=[["name", "|O", [1], 0]] + h["arrays"][1:]),
    "an array past the end": lambda a, h: h.update(arrays_as=[["name", "<i4", [10**9], 0]] + h["arrays"][1:]),
    "a negative shape": lambda a, h: h.update(arrays_as=[["name", "<i4", [-1], 0]] + h["arrays"][1:]),
    "an array twice": lambda a, h: h.update(arrays_as=h["arrays"] + h["arrays"][:1]),
    "an unknown array": lambda a, h: h.update(arrays_as=h["arrays"] + [["extra", "<i4", [1], 0]]),
}


@pytest.mark.parametrize("damage", [*DAMAGE, "cut short", "another magic", "a header length past the end"])
def test_a_damaged_but_well_formed_entry_is_a_miss(trace, tmp_path, monkeypatch, damage):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    fresh = read_kineto(trace)
    entry = pathlib.Path(cache.store(str(trace), fresh))
    _rewrite(entry, lambda a, h: None)
    assert cache.load_cached(str(trace)) is not None  # the test's own writer writes valid entries
    raw = entry.read_bytes()
    m = len(cache._MAGIC)
    if damage == "cut short":
        entry.write_bytes(raw[:-100])
    elif damage == "another magic":
        entry.write_bytes(b"X" + raw[1:])
    elif damage == "a header length past the end":
        entry.write_bytes(raw[:m] + (10**12).to_bytes(8, "little") + raw[m + 8:])
    else:
        _rewrite(entry, DAMAGE[damage])
    assert cache.load_cached(str(trace)) is None
    again = read_trace_dir(trace.parent)  # parsed again, the entry rewritten
    assert np.array_equal(again.ranks[0].events.dur, fresh.events.dur) and again.ranks[0].events.names == fresh.events.names
    assert cache.load_cached(str(trace)) is not None


# ------------------------------------------------------------------ 8. bounds: sizes


def _bomb(path: pathlib.Path, nbytes: int) -> pathlib.Path:
    """A real gzip bomb: ``nbytes`` of one repeated byte (about 1000:1), behind the start of a Kineto trace."""
    chunk = b" " * (1 << 20)
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"schemaVersion": 1, "traceEvents": [')
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)
    return path


def test_a_gzip_bomb_stops_at_the_cap(tmp_path, monkeypatch, capsys):
    cap = 8 << 20
    bomb = _bomb(tmp_path / "rank-0.pt.trace.json.gz", 64 * cap)  # 512 MiB inside about 0.5 MiB
    assert bomb.stat().st_size < 64 * cap // 500
    monkeypatch.setenv(MAX_BYTES_ENV, str(cap))
    tracemalloc.start()
    try:
        with pytest.raises(DagprofError, match="too large to read") as err:
            read_kineto(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * cap, peak  # decompression stopped at the cap, not at 512 MiB
    assert str(bomb) in str(err.value) and "--max-trace-bytes" in str(err.value) and MAX_BYTES_ENV in str(err.value)
    _refused(capsys, "replay", str(bomb), says="over the 8,388,608-byte limit", names=str(bomb))
    _refused(capsys, "analyze", str(tmp_path), says="too large to read", names=str(bomb))  # as a folder of ranks too


def test_the_cap_is_raised_by_the_flag_or_the_environment(tmp_path, monkeypatch, capsys):
    size = len(gzip.decompress(TRACE.read_bytes()))
    monkeypatch.setenv("DAGPROF_CACHE_DIR", str(tmp_path / "cache"))  # a parse cached by an earlier test reads no file
    monkeypatch.setenv(MAX_BYTES_ENV, str(size - 1))
    _refused(capsys, "replay", str(TRACE), "-o", str(tmp_path / "a"), says=f"over the {size - 1:,}-byte limit", names=str(TRACE))
    code, out, err = _cli(capsys, "replay", str(TRACE), "-o", str(tmp_path / "b"), "--max-trace-bytes", str(size))
    assert code == 0, err
    monkeypatch.setenv(MAX_BYTES_ENV, str(size))
    assert len(read_input(TRACE)) == size
    monkeypatch.setenv(MAX_BYTES_ENV, "lots")
    with pytest.raises(DagprofError, match=MAX_BYTES_ENV):
        read_input(TRACE)
    monkeypatch.delenv(MAX_BYTES_ENV)
    assert DEFAULT_MAX_BYTES == 1 << 30
    big = tmp_path / "big.json"  # a plain file over the cap is refused before it is read
    with open(big, "wb") as f:
        f.truncate(64 << 20)
    monkeypatch.setenv(MAX_BYTES_ENV, str(1 << 20))
    with pytest.raises(DagprofError, match="67,108,864 bytes, over the 1,048,576-byte limit"):
        read_input(big)


def test_gzip_members_trailing_zeros_and_garbage_read_as_gzip_does(tmp_path):
    body = gzip.decompress(TRACE.read_bytes())
    multi = tmp_path / "multi.json.gz"
    multi.write_bytes(gzip.compress(body[:1000]) + gzip.compress(body[1000:]) + b"\0" * 16)
    assert read_input(multi) == body == gzip.decompress(multi.read_bytes())
    for name, data in {"cut.json.gz": TRACE.read_bytes()[:-20], "garbage.json.gz": TRACE.read_bytes() + b"junk"}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DagprofError, match="corrupt") as err:
            read_input(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("gunzip", ["isal", "zlib"])
def test_read_in_pieces_as_read_whole(tmp_path, monkeypatch, gunzip):
    """The Kineto reader decodes a file as it is read and gunzipped (``read_input_pieces``): the same bytes, the same
    refusals, in the same words, as ``read_input``; and the same trace, or the same refusal, from ``read_kineto``.
    With ISA-L's gunzip (a dependency where it has wheels) and with zlib's, which other machines use."""
    if gunzip == "zlib":
        monkeypatch.setitem(sys.modules, "isal", None)  # ``from isal import ...`` raises ImportError: zlib's inflate
    else:
        pytest.importorskip("isal")
    body = gzip.decompress(TRACE.read_bytes())
    cases = {"multi.json.gz": gzip.compress(body[:1000]) + gzip.compress(body[1000:]) + b"\0" * 16, "plain.json": body,
             "cut.json.gz": TRACE.read_bytes()[:-20], "garbage.json.gz": TRACE.read_bytes() + b"junk",
             "cut.json": body[:len(body) // 2]}
    monkeypatch.setenv(MAX_BYTES_ENV, str(len(body) + 10))
    for name, data in {**cases, "bomb.json.gz": gzip.compress(body + b" " * 20), "big.json": body + b" " * 20}.items():
        path = tmp_path / name
        path.write_bytes(data)
        try:
            whole = read_input(path)
        except DagprofError as err:
            whole = str(err)
        for size in (1000, 1 << 20):
            try:
                pieces = list(read_input_pieces(path, size))
                assert all(len(p) <= size for p in pieces)
                assert b"".join(pieces) == whole, name
            except DagprofError as err:
                assert str(err) == whole, name
    monkeypatch.setattr(kineto_decode, "CHUNK_BYTES", 4096)  # many pieces, the list's end in the middle of one
    expected = read_kineto(TRACE)
    for name in cases:
        try:
            got = read_kineto(tmp_path / name)
            assert np.array_equal(got.events.start, expected.events.start) and got.events.names == expected.events.names
        except DagprofError as err:
            assert name.startswith(("cut", "garbage")) and str(tmp_path / name) in str(err) and "\n" not in str(err)
            with pytest.raises(DagprofError) as whole_err:
                kineto_decode._whole(read_input(tmp_path / name), str(tmp_path / name))
            assert str(err) == str(whole_err.value)


# ------------------------------------------------------------------ 8. bounds: only regular files


def test_a_fifo_named_like_a_trace_is_refused_before_any_read(tmp_path, capsys):
    fifo = tmp_path / "rank-0.pt.trace.json"
    os.mkfifo(fifo)  # nothing ever writes to it: reading would block forever
    _refused(capsys, "replay", str(fifo), says="a FIFO, not a regular file", names=str(fifo))
    shutil.copy(GLOO / "rank-1.pt.trace.json.gz", tmp_path)  # a real rank beside it
    _refused(capsys, "analyze", str(tmp_path), says="a FIFO", names=str(fifo))
    for read in (read_input, read_kineto, read_layer_file, lambda p: read_versioned(p, dict, "x", range(1, 2), "x", "x")):
        with pytest.raises(DagprofError, match="a FIFO"):
            read(str(fifo))


def test_a_device_is_refused(capsys):
    _refused(capsys, "replay", "/dev/zero", says="a character device, not a regular file", names="/dev/zero")
    _refused(capsys, "sgd", "/dev/zero", says="a character device", names="/dev/zero")


# ------------------------------------------------------------------ 8. bounds: only inside the run folder


def _edit_json(path: pathlib.Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name", ["../../etc/passwd", "/dev/zero", "/etc/passwd", "link.json", "sub/../../outside.json", ""])
def test_a_kineto_file_outside_the_run_folder_is_refused(tmp_path, capsys, name):
    run = pathlib.Path(shutil.copytree(DATA / "run_schema" / "v1", tmp_path / "run"))
    (tmp_path / "outside.json").write_text("{}")
    os.symlink("/etc/passwd", run / "link.json")  # a link inside that leads out
    _edit_json(run / "rank0.json", lambda d: d.update(kineto_file=name))
    if name:
        _refused(capsys, "replay", str(run), says="outside its run folder: refused", names=str(run / "rank0.json"))
    else:
        assert _cli(capsys, "replay", str(run), "--json")[0] == 0  # empty: no Kineto trace, as null


def test_a_kineto_file_that_is_a_fifo_inside_the_run_is_refused(tmp_path, capsys):
    run = pathlib.Path(shutil.copytree(DATA / "run_schema" / "v1", tmp_path / "run"))
    os.mkfifo(run / "rank0.kineto.json")
    _edit_json(run / "rank0.json", lambda d: d.update(kineto_file="rank0.kineto.json"))
    _refused(capsys, "replay", str(run), says="a FIFO", names=str(run / "rank0.kineto.json"))


def test_the_other_run_folders_name_only_their_own_files(tmp_path, capsys):
    hvd = pathlib.Path(shutil.copytree(DATA / "horovod" / "fused", tmp_path / "hvd"))
    _edit_json(hvd / "rank0.horovod.json", lambda d: d.update(timeline="../../../../etc/passwd"))
    _refused(capsys, "replay", str(hvd), says="outside its run folder", names=str(hvd / "rank0.horovod.json"))

    mx = pathlib.Path(shutil.copytree(DATA / "mxnet", tmp_path / "mx"))
    _edit_json(mx / "mxnet-run.json", lambda d: d["files"]["workers"].update({"0": "/dev/zero"}))
    _refused(capsys, "replay", str(mx), says="outside its run folder", names=str(mx / "mxnet-run.json"))

    tf = pathlib.Path(shutil.copytree(DATA / "tf-jax" / "mlp", tmp_path / "tf"))
    _edit_json(tf / "rank0.json", lambda d: d.update(logdir="/"))  # would walk the whole disk
    _refused(capsys, "replay", str(tf), says="outside its run folder", names=str(tf / "rank0.json"))
    tf = pathlib.Path(shutil.copytree(DATA / "tf-jax" / "mlp", tmp_path / "tf2"))
    pb = sorted((tf / "rank1").rglob("*.xplane.pb*"))[-1]
    outside = pathlib.Path(shutil.move(pb, tmp_path / pb.name))
    os.symlink(outside, pb)  # the profile a rank's log folder holds is a link that leads out of the run
    _refused(capsys, "replay", str(tf), says="outside its run folder", names=str(tf / "rank1.json"))


# ------------------------------------------------------------------ 9. the terminal

EVIL = "\x1b[2J\x1b]0;pwned\x07\nforged: iteration 0.00 ms\u202e"


def test_op_names_reach_the_terminal_escaped_and_json_exact(tmp_path, capsys):
    code, out, _ = _cli(capsys, "analyze", str(TRACE), "--json")
    top = next(name for name, _ in json.loads(out)["critical_path_per_iter"]["top_ops_ms"] if not name.startswith("gloo:"))  # a
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))  # collective renamed would be read as no collective
    for e in doc["traceEvents"]:
        if e.get("name") == top:
            e["name"] = top + EVIL
    evil = tmp_path / "rank-0.pt.trace.json"
    evil.write_text(json.dumps(doc))
    code, out, _ = _cli(capsys, "analyze", str(evil), "--json")
    assert code == 0 and top + EVIL in [name for name, _ in json.loads(out)["critical_path_per_iter"]["top_ops_ms"]]  # exact
    code, out, err = _cli(capsys, "analyze", str(evil))
    assert code == 0
    assert not any(c in out + err for c in "\x1b\x07\u202e")
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\nforged" in out
    assert not any(line.startswith("forged") for line in out.splitlines())


def test_diff_and_error_lines_are_escaped_too(tmp_path, capsys):
    a = pathlib.Path(shutil.copytree(GLOO, tmp_path / "a"))
    b = tmp_path / "b"
    b.mkdir()
    for f in a.iterdir():
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and "dur" in e and e.get("name", "").startswith("aten::"):
                e["name"] += EVIL
                e["dur"] = e["dur"] * 3
        (b / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    code, out, err = _cli(capsys, "diff", str(a), str(b), "--no-report")
    assert not any(c in out + err for c in "\x1b\x07\u202e") and not any(line.startswith("forged") for line in (out + err).splitlines())
    missing = tmp_path / ("x" + EVIL + ".json")
    line = _refused(capsys, "replay", str(missing), says="no such file", names="\\x1b[2J")
    assert "\x1b" not in line
