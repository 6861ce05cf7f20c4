"""Fuzzed readers: real traces, run folders and layer logs, mutated (truncated, wrong types, missing keys, garbage
bytes, corrupt gzip, huge or negative numbers, duplicated or shuffled events). Every outcome is a parsed trace or
a one-line ``DagprofError`` naming the file, never another exception.

Seeds are the vendored files in tests/data; hypothesis runs derandomized (the same examples on every run).
A longer random campaign: ``DAGPROF_FUZZ_EXAMPLES=3000 pytest tests/test_fuzz_readers.py`` (random seeds each run).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from testdata import DATA, GLOO_WINDOWS, KINETO_CORPUS, KINETO_PUBLIC

from dagprof.errors import DagprofError
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.kineto import read_kineto
from dagprof.traces.kineto_dir import read_trace_dir
from dagprof.traces.layerwise import read_layer_file

_CAMPAIGN = int(os.environ.get("DAGPROF_FUZZ_EXAMPLES", "0"))
# no shrinking: a failure prints its (reproducible) example at once instead of minutes later
FUZZ = settings(max_examples=_CAMPAIGN or 120, deadline=None, derandomize=not _CAMPAIGN, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])

SEEDS = {
    "gloo": GLOO_WINDOWS / "same" / "rank-0.pt.trace.json.gz",  # CPU, gloo, distributedInfo with groups
    "cuda_sync": KINETO_PUBLIC / "critical_path" / "cuda_event_sync_multi_stream" / "event_sync_trace.json.gz",
    "nccl": KINETO_CORPUS / "param" / "dlrm_kineto" / "worker0_step_12.1694128201545.pt.trace.json.gz",
    "drift": KINETO_CORPUS / "tracelens" / "inference" / "graph_full" / "graph_execution.json.gz",
    "cpu_only": KINETO_PUBLIC / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "array": KINETO_CORPUS / "kineto" / "tb_plugin_samples" / "resnet50_num_workers_0" / "worker0.pt.trace.json.gz",
}
_DOCS: dict[str, str] = {}


def _copied(value):
    """A deep copy of JSON content, parsed again from its text: as ``copy.deepcopy`` gives, several times faster (the
    copies were half of this file's time)."""
    return json.loads(json.dumps(value))


def _doc(name: str):
    """The seed as JSON (the large ones cut to their first 600 events: mutations need variety, not bulk), a fresh copy."""
    if name not in _DOCS:
        with gzip.open(SEEDS[name], "rt") as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        events[:] = events[:600]
        _DOCS[name] = json.dumps(doc)
    return json.loads(_DOCS[name])


# ------------------------------------------------------------------ values and mutations
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**62, max_value=2**80), st.integers(max_value=-(2**62)),
    st.floats(allow_nan=False), st.sampled_from([1e308, -1e308, 1e300, -0.0, 5e-324]),
    st.text(max_size=12), st.sampled_from(["7", "-1", "1.5", "1e400", "nan", "inf", "", "ProfilerStep#3", "0x10", "²"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=8)
EVENT_KEYS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "id"]
ARG_KEYS = ["correlation", "bytes", "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
            "Process Group Name", "Process Group Ranks", "Seq", "Input Dims", "Input type", "wait_on_stream",
            "wait_on_cuda_event_record_corr_id", "stream", "device", "name", "labels", "External id"]
TOP_KEYS = ["traceEvents", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "deviceProperties", "host_name"]
DIST_KEYS = ["rank", "world_size", "backend", "pg_config"]


@st.composite
def mutated_doc(draw, name: str):
    doc = _doc(name)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for _ in range(draw(st.integers(1, 6))):
        how = draw(st.sampled_from(["event", "arg", "top", "dist", "pg", "drop", "dup", "shuffle", "replace", "retype", "deep",
                                    "big"]))
        if how in ("event", "arg", "drop", "dup", "replace", "retype", "deep", "big") and events:
            i = draw(st.integers(0, len(events) - 1))
            e = events[i]
            if how == "event" and isinstance(e, dict):
                key = draw(st.sampled_from(EVENT_KEYS))
                if draw(st.booleans()):
                    e.pop(key, None)
                else:
                    e[key] = draw(VALUES)
            elif how == "arg" and isinstance(e, dict):
                args = e.setdefault("args", {})
                if isinstance(args, dict):
                    args[draw(st.sampled_from(ARG_KEYS))] = draw(VALUES)
            elif how == "retype" and isinstance(e, dict) and e:  # a present field, given another type
                key = draw(st.sampled_from(sorted(e)))
                e[key] = _retyped(e[key], draw)
            elif how == "deep" and isinstance(e, dict):  # nesting from a few levels to far past any decoder's limit
                depth = draw(st.sampled_from([3, 60, 600, 100_000]))
                e.setdefault("args", {})[draw(st.sampled_from(["Input Dims", "name", "Collective name"]))] = f"{_DEEP}{depth}"
            elif how == "big" and isinstance(e, dict):  # sizes: a long name, a long shape list, many events
                what = draw(st.sampled_from(["name", "dims", "copies"]))
                n = draw(st.sampled_from([10, 1000, 100_000]))
                if what == "name":
                    e["name"] = "x" * n
                elif what == "dims":
                    e.setdefault("args", {})["Input Dims"] = [[2] * 4] * n
                else:
                    events[i:i] = [_copied(e) for _ in range(min(n, 20_000))]
            elif how == "drop":
                del events[i]
            elif how == "dup":
                events.insert(draw(st.integers(0, len(events))), _copied(e))
            else:
                events[i] = draw(VALUES)
        elif how == "shuffle":
            events.reverse() if draw(st.booleans()) else events.sort(key=lambda e: str(e)[:40])
        elif how == "top" and isinstance(doc, dict):
            key = draw(st.sampled_from(TOP_KEYS))
            if draw(st.booleans()):
                doc.pop(key, None)
            else:
                doc[key] = draw(VALUES)
        elif how in ("dist", "pg") and isinstance(doc, dict):
            info = doc.setdefault("distributedInfo", {})
            if not isinstance(info, dict):
                continue
            if how == "dist":
                info[draw(st.sampled_from(DIST_KEYS))] = draw(VALUES)
            else:
                pgs = info.setdefault("pg_config", [{"pg_name": "0", "ranks": [0, 1], "pg_size": 2}])
                if isinstance(pgs, list) and pgs and isinstance(pgs[0], dict):
                    pgs[0][draw(st.sampled_from(["pg_name", "ranks", "pg_size"]))] = draw(VALUES)
    return doc


def _retyped(value, draw):
    """The same content as another JSON type: text, number, list, object or null."""
    kind = draw(st.sampled_from(["str", "num", "list", "dict", "null", "bool"]))
    if kind == "str":
        return json.dumps(value)
    if kind == "num":
        return len(value) if isinstance(value, (str, list, dict)) else 1e300
    if kind == "list":
        return [value]
    if kind == "dict":
        return {"value": value}
    return None if kind == "null" else True


_DEEP = "@deep@"  # a placeholder _encode writes as nested lists (Python's json cannot nest that deep)
_DEEP_AT = re.compile(rf'"{_DEEP}(\d+)"')


def _encode(doc) -> bytes:
    try:
        text = json.dumps(doc)  # Python writes NaN / Infinity, as some writers do
    except (ValueError, OverflowError):
        return b"{}"
    return _DEEP_AT.sub(lambda m: "[" * int(m.group(1)) + "0" + "]" * int(m.group(1)), text).encode()


def _bytes_mutation(data: bytes, draw) -> bytes:
    how = draw(st.sampled_from(["truncate", "garbage", "overwrite", "gzip-cut", "gzip-flip", "nul"]))
    k = draw(st.integers(0, max(len(data) - 1, 0)))
    if how == "truncate":
        return data[:k]
    if how == "garbage":
        return data[:k] + draw(st.binary(min_size=1, max_size=64)) + data[k:]
    if how == "overwrite":
        junk = draw(st.binary(min_size=1, max_size=16))
        return data[:k] + junk + data[k + len(junk):]
    if how == "nul":
        return data.replace(b'"ts"', b'"\x00s"', 1)
    z = gzip.compress(data, compresslevel=1, mtime=0)
    k = draw(st.integers(0, len(z) - 1))
    return z[:k] if how == "gzip-cut" else z[:k] + bytes([z[k] ^ 0xFF]) + z[k + 1:]


def _check_trace(path: str) -> None:
    try:
        t = read_kineto(path)
    except DagprofError as e:
        assert "\n" not in str(e) and path in str(e)
        return
    ev = t.events
    n = len(ev)
    assert all(len(getattr(ev, c)) == n for c in ev.COLUMNS)
    assert np.all(np.isfinite(ev.start)) and np.all(ev.dur >= 0)
    assert not len(t.flows) or (t.flows.min() >= 0 and t.flows.max() < n)
    assert 0 <= t.rank < t.world_size
    msgspec.json.encode(t.meta)


# ------------------------------------------------------------------ Kineto traces
@pytest.mark.parametrize("seed", sorted(SEEDS))
@FUZZ
@given(data=st.data())
def test_mutated_kineto_traces(seed, data, tmp_path):
    doc = data.draw(mutated_doc(seed))
    raw = _encode(doc)
    if data.draw(st.booleans()):
        raw = _bytes_mutation(raw, data.draw)
    path = tmp_path / f"rank-0.{seed}.json"
    path.write_bytes(gzip.compress(raw, mtime=0) if data.draw(st.booleans()) else raw)
    _check_trace(str(path))


@FUZZ
@given(data=st.data())
def test_mutated_rank_folder(data, tmp_path_factory):
    """A folder of two ranks, one mutated: loads (with the good rank) or fails in one line naming a file or the folder."""
    folder = tmp_path_factory.mktemp("ranks")
    shutil.copy(GLOO_WINDOWS / "same" / "rank-1.pt.trace.json.gz", folder / "rank-1.pt.trace.json.gz")
    (folder / "rank-0.pt.trace.json").write_bytes(_encode(data.draw(mutated_doc("gloo"))))
    try:
        run = read_trace_dir(folder, use_cache=False, jobs=1)
    except DagprofError as e:
        assert "\n" not in str(e) and str(folder) in str(e)
        return
    assert run.ranks


# ------------------------------------------------------------------ dagprof run folders
RUN_KEYS = ["format", "rank", "world_size", "records", "steps_requested", "steps_profiled", "steps_completed", "layers",
            "layer_grad_bytes", "bucket_layouts", "step_times_ns", "kineto_file", "warnings", "host", "pid"]
MANIFEST_KEYS = ["format", "version", "world_size", "steps_requested", "backend"]


@FUZZ
@given(data=st.data())
def test_mutated_dagprof_run(small_ddp_run, data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    shutil.copytree(small_ddp_run, folder, dirs_exist_ok=True)
    target = data.draw(st.sampled_from(["rank0.json", "manifest.json", "rank0.kineto.json.gz"]))
    path = folder / target
    if target.endswith(".gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
    else:
        doc = json.loads(path.read_text())
    keys = MANIFEST_KEYS if target == "manifest.json" else RUN_KEYS if target == "rank0.json" else TOP_KEYS
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(keys))
        how = data.draw(st.sampled_from(["value", "drop", "record"]))
        if how == "drop":
            doc.pop(key, None)
        elif how == "record" and isinstance(doc.get("records"), list) and doc["records"]:
            i = data.draw(st.integers(0, len(doc["records"]) - 1))
            doc["records"][i] = data.draw(st.one_of(VALUES, st.lists(st.integers(-2**70, 2**70), min_size=5, max_size=5)))
        else:
            doc[key] = data.draw(VALUES)
    raw = _encode(doc)
    if data.draw(st.integers(0, 4)) == 0:
        raw = _bytes_mutation(raw, data.draw)
    path.write_bytes(gzip.compress(raw, mtime=0) if target.endswith(".gz") else raw)
    try:
        run = read_run(folder)
    except DagprofError as e:
        assert "\n" not in str(e) and str(folder) in str(e)
        return
    assert len(run.ranks) == 2


# ------------------------------------------------------------------ layer-wise logs
LAYER_CSV = """# io_us=1200, h2d_us=300, update_us=5000, workers=8
layer,forward_us,backward_us,grad_bytes,allreduce_us
conv1,1000,2000,37888,404
conv2,800,1600,921856,1210
fc,300,650,4100096,8119
"""


@FUZZ
@given(data=st.data())
def test_mutated_layer_files(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("layers")
    kind = data.draw(st.sampled_from(["csv", "bcaffe"]))
    text = LAYER_CSV if kind == "csv" else (DATA / "bcaffe-k80-googlenet" / "tmp8ocomm.log").read_text()
    lines = text.splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        how = data.draw(st.sampled_from(["cell", "drop", "insert", "dup"]))
        if how == "cell":
            cells = lines[i].split(",")
            j = data.draw(st.integers(0, len(cells) - 1))
            cells[j] = data.draw(st.one_of(st.sampled_from(["", "-5", "1e400", "nan", "inf", "x", "9" * 30, "1.5", " ", "]", "\x00"]),
                                           st.integers().map(str), st.floats().map(str)))
            lines[i] = ",".join(cells)
        elif how == "drop":
            del lines[i]
        elif how == "dup":
            lines.insert(i, lines[i])
        else:
            lines.insert(i, data.draw(st.text(max_size=40)) + "\n")
    raw = "".join(lines).encode("utf-8", "surrogatepass")
    if data.draw(st.integers(0, 4)) == 0:
        raw = _bytes_mutation(raw, data.draw)
    path = folder / ("layers.csv" if kind == "csv" else "tmp8ocomm.log")
    path.write_bytes(raw)
    try:
        prof = read_layer_file(path)
    except DagprofError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    assert prof.num_layers > 0 and np.all(np.isfinite(prof.backward_us))


def test_seeds_are_readable():
    """The unmutated seeds parse (so the fuzzers start from valid input)."""
    for name, path in SEEDS.items():
        assert len(read_kineto(path).events) > 0, name
    assert os.path.isdir(GLOO_WINDOWS)
