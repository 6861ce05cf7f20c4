"""Format sniffing: every input goes to its reader, and a file given to the wrong one is a one-line error naming what it looks like.

The Horovod / MXNet / Chrome heads below are the opening bytes those tools write (field names as in
the field guide, section 9); the TF/JAX files are the real fixtures.
"""
import gzip
import json
import pathlib

import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.traces import formats
from dagprof.traces.load import load
from dagprof.traces.xplane_run import xplane_files

TF_LOOP = DATA / "tf" / "loop"
JAX = DATA / "tf-jax" / "mlp"

HEADS = {
    "horovod": '[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "allreduce.fc.weight"}},\n'
               '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n'
               '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1, "pid": 0},\n'
               '{"ph": "M", "name": "process_labels", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1700000000000000}}\n',
    "mxnet": '{"traceEvents": [{"name": "MXKVStorePushPull", "cat": "operator", "ph": "B", "ts": 1, "pid": 0, "tid": 0},'
             '{"name": "_backward_Convolution", "cat": "operator", "ph": "B", "ts": 2, "pid": 0, "tid": 0}],'
             '"displayTimeUnit": "ms"}',
    "kineto": json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
                          "traceEvents": []}),
    "layer-csv": "# io_us=10\nlayer,forward_us,backward_us,grad_bytes\nconv1,1,2,3\n",
    "bcaffe": "I0101 00:00:00.0 1 distributed.cpp:112] [0, 864, 0.1, 0.2]\n",
    "pytorch-et": '{\n  "schema": "1.0.1", "pid": 1, "time": "2023-07-14 11:53:07", "start_ts": 1,\n  "nodes": [\n    '
                  '{"name": "[pytorch|profiler|execution_trace|thread]", "id": 2, "rf_id": 0, "parent": 1}]}',
    "chrome-json": json.dumps({"traceEvents": [{"ph": "X", "name": "x", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]}),
}


@pytest.fixture
def files(tmp_path):
    out = {}
    for name, text in HEADS.items():
        p = tmp_path / f"{name}.json"
        p.write_text(text)
        out[name] = p
    out["xplane"] = pathlib.Path(xplane_files(str(TF_LOOP))[0])
    plain = tmp_path / "vm.bin"  # an XPlane file without the usual name: sniffed by its bytes
    plain.write_bytes(gzip.decompress(out["xplane"].read_bytes()))
    out["xplane-bytes"] = plain
    jax_json = next(JAX.rglob("*.trace.json.gz"))
    out["xplane-json"] = jax_json
    return out


def test_every_format_is_recognised(files):
    for name, path in files.items():
        expected = "xplane" if name == "xplane-bytes" else name
        assert formats.sniff(path).name == expected, name


def test_folders(tmp_path):
    assert formats.sniff(TF_LOOP).name == "xplane-run"
    assert formats.sniff(TF_LOOP / "rank0").name == "xplane-logdirs"
    assert formats.sniff(tmp_path) is None


@pytest.mark.parametrize("name, words", [
    ("horovod", "looks like a Horovod timeline"),
    ("mxnet", "looks like an MXNet mx.profiler trace"),
    ("xplane-json", "give dagprof the *.xplane.pb"),
    ("layer-csv", "dagprof sgd --layers"),
    ("bcaffe", "dagprof sgd --layers"),
    ("pytorch-et", "execution trace"),
])
def test_recognised_but_unread_formats_are_one_line_errors(files, name, words):
    with pytest.raises(DagprofError) as e:
        load(files[name])
    msg = str(e.value)
    assert words in msg and str(files[name]) in msg and "\n" not in msg


def test_a_file_given_to_another_readers_is_named(files):
    with pytest.raises(DagprofError, match="not a TensorFlow/JAX profiler trace .*: it looks like a Horovod timeline"):
        formats.expect(files["horovod"], "xplane")
    with pytest.raises(DagprofError, match="not a torch.profiler .Kineto. trace: it looks like a TensorFlow/JAX profiler trace"):
        formats.expect(files["xplane"], "kineto")
    formats.expect(files["kineto"], "kineto")  # its own format: no error
    with pytest.raises(DagprofError, match="it looks like an MXNet mx.profiler trace"):
        formats.expect(files["mxnet"], "kineto")


def test_cli_prints_one_line(files, capsys):
    assert main(["replay", str(files["horovod"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Horovod timeline" in err


def test_registry_is_open_for_one_more_line(monkeypatch, tmp_path):
    """Another reader plugs in with one Format line."""
    p = tmp_path / "x.trace"
    p.write_text("MYFORMAT v1\n")
    fmt = formats.Format("mine", "my trace", lambda head, path: head.startswith(b"MYFORMAT"), "dagprof.traces.load:kineto_file")
    monkeypatch.setattr(formats, "FORMATS", [fmt, *formats.FORMATS])
    assert formats.sniff(p) is fmt
