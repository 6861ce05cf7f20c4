"""The run-file format: one typed schema, versioned; old files are read or refused in one line."""
import json
import os
import pathlib
import shutil

import msgspec
import pytest

from dagprof.errors import DagprofError
from dagprof.traces import run_schema as rs
from dagprof.traces.dagprof_run import read_run

FIXTURES = pathlib.Path(__file__).parent / "data" / "run_schema"


def _one_line(err: DagprofError) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize("folder", sorted(FIXTURES.iterdir()), ids=lambda p: p.name)
def test_every_recorded_version_is_read_or_refused_in_one_line(folder):
    """A folder written by an earlier format version: the current reader reads it, or says in one line why not."""
    version = int(folder.name.removeprefix("v"))
    try:
        run = read_run(folder)
    except DagprofError as err:
        assert version < rs.MIN_VERSION and "older dagprof" in _one_line(err)
        return
    assert rs.MIN_VERSION <= version <= rs.VERSION
    assert run.world_size == 2 and [t.rank for t in run.ranks] == [0, 1]
    assert run.meta.ddp and run.meta.manifest.backend == "gloo"


def test_v1_content():
    run = read_run(FIXTURES / "v1")
    t = run.ranks[0]
    assert t.meta.steps_profiled == [1, 2] and t.layers == ["0", "1", "2"]
    assert t.meta.layer_grad_bytes == {"0": (8 * 16 + 16) * 4, "2": (16 * 2 + 2) * 4}
    assert sum(b.nbytes for b in t.buckets) == ((8 * 16 + 16) + (16 * 2 + 2)) * 4


def test_writer_and_reader_share_the_structs():
    """What the reader decodes, the writer's encoder writes back identically: one definition of every field."""
    for name, kind in (("manifest.json", rs.Manifest), ("rank0.json", rs.RankFile)):
        doc = rs.read_file(FIXTURES / "v1" / name, kind)
        assert msgspec.json.decode(rs.encode(doc), type=kind) == doc
    assert rs.encode(rs.read_file(FIXTURES / "v1" / "rank0.json", rs.RankFile)).startswith(b'{"format":"dagprof-rank"')


def _copy(tmp_path, edit_rank0) -> pathlib.Path:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "v1", run)
    data = json.loads((run / "rank0.json").read_text())
    edit_rank0(data)
    (run / "rank0.json").write_text(json.dumps(data))
    return run


def test_a_newer_version_is_refused_in_one_line(tmp_path):
    run = _copy(tmp_path, lambda d: d.update(version=rs.VERSION + 1, records="a format we do not know"))
    with pytest.raises(DagprofError) as e:
        read_run(run)
    msg = _one_line(e.value)
    assert "rank0.json" in msg and f"format version {rs.VERSION + 1}" in msg and "upgrade dagprof" in msg


def test_an_added_field_keeps_the_version(tmp_path):
    """The compatible way to extend the format: a new field with a default; readers that do not know it skip it."""
    run = _copy(tmp_path, lambda d: d.update(gpu_clock_ns=[1, 2, 3]))
    assert read_run(run).world_size == 2


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d.pop("records"), "missing required field `records`"),
    (lambda d: d.update(records=[[0, 1, 2]]), "$.records[0]"),
    (lambda d: d.update(steps_requested="1:3"), "$.steps_requested"),
    (lambda d: d.update(format="something-else"), "not a dagprof rank file"),
])
def test_a_broken_rank_file_is_one_line_naming_file_and_field(tmp_path, edit, problem):
    run = _copy(tmp_path, edit)
    with pytest.raises(DagprofError) as e:
        read_run(run)
    msg = _one_line(e.value)
    assert os.path.join("run", "rank0.json") in msg and problem in msg


def test_truncated_file(tmp_path):
    run = _copy(tmp_path, lambda d: None)
    (run / "manifest.json").write_bytes((run / "manifest.json").read_bytes()[:40])
    with pytest.raises(DagprofError, match="truncated"):
        read_run(run)
