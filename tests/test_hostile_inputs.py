"""Hostile and damaged inputs (issue 17, items 5, 6, 10-12): each is refused in one line with exit status 2,
or handled correctly; nothing is half-written. Every case is built from the vendored data in tests/data."""
from __future__ import annotations

import json
import os
import pathlib

import pytest
from testdata import DATA, folded_lines

STRATEGY = DATA / "strategy" / "v1.json"  # model a.weight (6), a.bias (2); recomputes blocks.1; PowerSGD, 2 micro-batches


# --- item 6: dagprof.apply validates the whole strategy file against the model before changing it ----------

def _model():
    """The model the vendored strategy file was written for: ``a`` = Linear(3, 2), ``blocks.1`` to recompute."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(3, 2)
            self.blocks = torch.nn.Sequential(torch.nn.Identity(), torch.nn.ReLU())

        def forward(self, x):
            return self.blocks(self.a(x))

    torch.manual_seed(0)
    return Net()


def _hostile(tmp_path, change) -> str:
    doc = json.loads(STRATEGY.read_text())
    change(doc)
    path = tmp_path / "strategy.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _set(**kw):
    return lambda d: d.update(kw)


@pytest.mark.parametrize("change,message", [
    (_set(accumulate=0), "invalid strategy: accumulate is 0, expected 1..1024"),
    (_set(accumulate=-1), "invalid strategy: accumulate is -1"),
    (_set(partition=0), "invalid strategy: partition is 0"),
    (_set(partition=10**9), "invalid strategy: partition is 1000000000, expected 1..1024"),
    (_set(world_size=0), "invalid strategy: world_size is 0"),
    (lambda d: d["buckets"][0]["params"].append("a.nope"), "bucket 0 names parameter 'a.nope', which is not in the strategy's model"),
    (lambda d: d["buckets"].pop(), "the buckets leave out 1 of 2 parameters, e.g. 'a.weight'"),
    (lambda d: d["buckets"][1]["params"].append("a.bias"), "parameter 'a.bias' is in more than one bucket (again in bucket 1)"),
    (lambda d: d["buckets"][0].update(params=[]), "bucket 0 holds no parameter"),
    (lambda d: d["buckets"][0].update(nbytes=-8), "bucket 0 has -8 bytes"),
    (lambda d: d["model"][0].__setitem__(1, -6), "parameter 'a.weight' has -6 elements"),
    (lambda d: d["model"].append(["a.bias", 2]), "parameter 'a.bias' is listed twice"),
    (lambda d: d["model"].append(["b.weight", 4]), "strategy does not match the model: parameter 'b.weight' is not in this model"),
    (lambda d: d["model"][1].__setitem__(1, 3), "parameter 'a.bias' has 3 elements in the strategy, 2 here"),
    (lambda d: d["compression"].update(rank=0), "PowerSGD rank is 0"),
    (_set(recompute=["blocks.7"]), "it recomputes module 'blocks.7', which this model does not have"),
    (_set(recompute=["blocks.1", "blocks.1"]), "module 'blocks.1' is recomputed twice"),
])
def test_apply_refuses_a_strategy_that_does_not_fit_before_changing_anything(tmp_path, one_rank_group, change, message):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import apply
    from dagprof.errors import DagprofError

    path = _hostile(tmp_path, change)
    model = _model()
    ddp = DDP(model)
    config, reducer = ddp._bucket_config, ddp.reducer
    with pytest.raises(DagprofError) as err:
        apply(ddp, path)
    text = str(err.value)
    assert text.startswith(path + ": ") and message in text and "\n" not in text
    # nothing changed: no plan, the same bucket limits and reducer, no checkpointed forward, no comm hook
    assert getattr(ddp, "_dagprof_applied", None) is None
    assert ddp._bucket_config is config and ddp.reducer is reducer and not ddp._comm_hooks
    assert "forward" not in model.blocks[1].__dict__


def test_apply_accepts_the_vendored_strategy_and_trains(tmp_path, one_rank_group):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import apply

    model = _model()
    ddp = DDP(model)
    with pytest.warns(RuntimeWarning, match="found for 2 ranks, this job has 1"):
        plan = apply(ddp, str(STRATEGY))
    assert plan.micro_batches == 2 and "forward" in model.blocks[1].__dict__ and len(ddp._comm_hooks) == 1
    for _ in range(3):
        for i in range(plan.micro_batches):
            with plan.sync(i):
                ddp(torch.randn(4, 3)).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    del ddp, plan


# --- CLI: exit status 2 and one line; outputs as one unit ----------------------------------------------------

RUN = DATA / "run_schema" / "v1"  # a real 2-rank gloo DDP run folder (3 steps)
TRACE = DATA / "gloo-windows" / "same" / "rank-0.pt.trace.json.gz"  # a real stock torch.profiler trace


def cli(capsys, *argv) -> tuple[int, str, str]:
    from dagprof.cli.main import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv, message: str) -> str:
    """The command ends with status 2 and one line on stderr that contains ``message``."""
    code, _, err = cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and message in err and "internal error" not in err, err
    return err


def listing(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_optimize_refuses_a_memory_budget_nothing_fits(capsys, tmp_path):
    """A DDP search whose budget nothing fits printed "DDP's defaults stand" (exit 0), the budget unmentioned, and 64 (bytes,
    no unit) read "fits 0 MB": one line naming the flag and the least reachable peak, exit 2, as an FSDP search refuses it."""
    err = refused(capsys, "optimize", DATA / "ddp-testbed" / "run", "--budget", "2", "--memory-budget", "64", "-o", tmp_path / "o",
                  message="--memory-budget: no strategy fits 64 bytes per rank: the least dagprof can reach is")
    assert " MB (parameters, gradients and optimizer state" in err and not (tmp_path / "o").exists()


def test_optimize_keeps_the_defaults_when_nothing_gains(capsys, tmp_path):
    """Item 5: the vendored run's best layout is predicted no faster (56.93 ms either way): one line, exit 0, no file."""
    out = tmp_path / "opt"
    code, text, _ = cli(capsys, "optimize", RUN, "--budget", "3", "-o", out)
    assert code == 0
    [line] = [ln for ln in folded_lines(text, "DDP's defaults stand") if "defaults stand" in ln]
    assert line.startswith("DDP's defaults stand: no strategy is predicted to gain the 2 %") and "no strategy file written" in line
    assert "written:" not in text and "faster" not in text
    code, text, _ = cli(capsys, "optimize", RUN, "--budget", "3", "-o", out, "--json")
    r = json.loads(text)
    assert code == 0 and r["strategy_file"] is None and r["recommendation"] == r["summary"] == line
    assert not r["worth_applying"] and r["best"]["predicted_iter_ms"] == r["baseline"]["predicted_iter_ms"]
    assert not out.exists()  # nothing to write: not even the folder


def test_output_path_that_is_a_file_is_refused_before_the_work(capsys, tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    refused(capsys, "replay", RUN, "-o", f, message="is a file, not a folder")
    refused(capsys, "report", RUN, "-o", f / "sub", message="is a file, not a folder")
    refused(capsys, "calibrate", "--nccl-tests", DATA / "nccl-tests-lut" / "a100", "-o", tmp_path, message="is a folder")
    assert f.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs (as root) with the given options; unmounted afterwards."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def mount(options: str) -> pathlib.Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def test_unwritable_and_full_output_folders_are_refused_before_the_work(capsys, tmpfs):
    ro, tiny = tmpfs("ro,size=1m"), tmpfs("size=1m")
    refused(capsys, "replay", RUN, "-o", ro / "out", message="cannot write the outputs here (Read-only file system)")
    refused(capsys, "whatif", RUN, "--workers", "4", "-o", ro, message="cannot write the outputs here")
    refused(capsys, "sgd", RUN, "--svg", "-o", ro, message="cannot write the outputs here")
    refused(capsys, "profile", "-o", ro / "run", "--", "true", message="cannot write the outputs here")
    refused(capsys, "replay", RUN, "-o", tiny / "out", message="no space for the outputs (1024 KiB free on its file system, 16 MiB needed)")
    assert listing(tiny) == {}


def test_a_disk_that_fills_while_writing_leaves_the_previous_outputs_alone(capsys, tmpfs, monkeypatch):
    """Item 12: outputs are staged and published together; a failure leaves the folder as the last run left it."""
    from dagprof import fsutil

    fs = tmpfs("size=256k")
    out = fs / "out"
    monkeypatch.setattr(fsutil, "MIN_FREE_BYTES", 0)  # let it start on a small disk
    code, _, _ = cli(capsys, "replay", RUN, "-o", out)
    assert code == 0
    before = listing(out)
    assert {"replay.trace.json", "measured.trace.json", "report.html"} <= set(before)
    free = os.statvfs(fs)
    (fs / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 8192))  # a few KiB left: less than a report
    refused(capsys, "replay", RUN, "-o", out, "--template", message="no space left for the outputs (No space left on device); nothing was written")
    assert listing(out) == before and sorted(p.name for p in fs.iterdir()) == ["filler", "out"]


def test_failure_leaves_no_new_file_and_no_empty_folder(capsys, tmp_path):
    """Item 12: a command that fails after starting to write leaves nothing behind, in a new folder or an old one."""
    out = tmp_path / "new" / "deeper"
    refused(capsys, "whatif", RUN, "--workers", "4", "--topology", tmp_path / "missing.json", "-o", out, message="missing.json")
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old"
    old.mkdir()
    (old / "whatif0.trace.json").write_text("the previous run's")
    refused(capsys, "whatif", RUN, "--workers", "4", "--topology", tmp_path / "missing.json", "-o", old, message="missing.json")
    assert listing(old) == {"whatif0.trace.json": b"the previous run's"}


def test_outputs_replace_the_previous_run_as_one_unit(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("not ours")
    (out / "replay.trace.json").write_text("stale")
    code, text, _ = cli(capsys, "replay", RUN, "-o", out, "--json")
    files = json.loads(text)["files"]
    assert code == 0 and all(pathlib.Path(p).parent == out and pathlib.Path(p).exists() for p in files.values())
    assert (out / "keep.txt").read_text() == "not ours" and (out / "replay.trace.json").read_text() != "stale"
    assert not [p for p in out.iterdir() if p.name.startswith(".dagprof-out-")]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_nested_100k_deep_is_one_line(capsys, tmp_path):
    import gzip
    import shutil

    doc = json.loads(gzip.open(TRACE).read())
    text = json.dumps(doc)
    deep = tmp_path / "deep.json"  # the real trace with one event's args nested 100k deep
    deep.write_text(text.replace('"args": {', '"args": {"deep": ' + _deep(100_000) + ", ", 1))
    refused(capsys, "replay", deep, "-o", tmp_path / "o1", message="deep.json: JSON nested too deeply to read")
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(manifest)[:-1] + ', "extra": ' + _deep(100_000) + "}")
    refused(capsys, "analyze", run, message="JSON nested too deeply to read")
    (tmp_path / "topo.json").write_text(_deep(100_000))
    refused(capsys, "whatif", RUN, "--topology", tmp_path / "topo.json", "--no-trace", message="JSON nested too deeply to read")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.json", "run", "topo.json"]


def test_an_input_too_large_for_memory_says_how_large_and_what_helps(tmp_path):
    """A real trace repeated to 118 MiB, read under an address-space limit 64 MiB above what dagprof needs loaded."""
    import gzip
    import subprocess
    import sys

    doc = json.loads(gzip.open(TRACE).read())
    doc["traceEvents"] = doc["traceEvents"] * 400
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    del doc
    limited = ("import resource, sys\nimport dagprof.pipeline, dagprof.replay, dagprof.analysis\nfrom dagprof.cli.main import main\n"
               "vm = int([ln for ln in open('/proc/self/status') if ln.startswith('VmSize')][0].split()[1]) * 1024\n"
               "resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), vm + (64 << 20)))\nsys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), DAGPROF_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", limited, "replay", str(big), "-o", str(tmp_path / "out")], capture_output=True, text=True, env=env)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stderr
    assert last.startswith(f"dagprof replay: error: {big}: out of memory (117.7 MiB of input on disk") and "--steps A:B" in last
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,message", [
    (["optimize", RUN, "--budget", "nan"], "argument --budget: expected a number > 0 and <= 604800, got 'nan'"),
    (["optimize", RUN, "--budget", "inf"], "got 'inf'"),
    (["optimize", RUN, "--budget", "0"], "got '0'"),
    (["optimize", RUN, "--budget", "-1"], "got '-1'"),
    (["optimize", RUN, "--memory-budget", "nanGB"], "size must be positive and finite"),
    (["optimize", RUN, "--overlap-slowdown", "nan"], "--overlap-slowdown"),
    (["demo", "--budget", "nan"], "argument --budget"),
    (["whatif", RUN, "--workers", "65537"], "expected a whole number >= 1 and <= 65536, got '65537'"),
    (["whatif", RUN, "--workers", "1e9"], "got '1e9'"),
    (["whatif", RUN, "--workers", "5000", "--cores", "4"], "with --cores every rank is replayed"),
    (["whatif", RUN, "--compute-speed", "inf"], "--compute-speed"),
    (["whatif", RUN, "--latency", "1e308"], "--latency"),
    (["whatif", RUN, "--bandwidth", "1e308Gbit"], "bandwidth must be positive and finite"),
    (["whatif", RUN, "--bandwidth", "10"], "bandwidth '10' has no unit"),  # was 10 bit/s, meant 10 Gbit/s
    (["whatif", RUN, "--link-from", DATA / "fsdp" / "testbed-calibrate" / "1gbit.json"], "--link-from: is read only with --link-to"),
    (["whatif", RUN, "--first-bucket-mb", "nan"], "--first-bucket-mb"),
    (["replay", RUN, "--explain-threshold", "nan"], "--explain-threshold"),
    (["sgd", RUN, "--iter-time-1", "1e308"], "argument --iter-time-1"),
    (["sgd", RUN, "--workers", "100000"], "got '100000'"),
    (["sgd", RUN, "--net", "1e308Gbit"], "'1e308Gbit'"),
    (["calibrate", "--max-mb", "nan"], "--max-mb"),
    (["calibrate", "--kinds", "broadcast"], "collective kinds are all_reduce, all_gather, reduce_scatter"),
])
def test_numbers_are_bounded(capsys, argv, message):
    refused(capsys, *argv, message=message)


def test_layer_times_are_bounded(capsys, tmp_path):
    """``sgd`` took a 1e308 us layer and printed Infinity and NaN."""
    f = tmp_path / "layers.csv"
    f.write_text("layer,forward_us,backward_us,grad_bytes\nconv1,1e308,4000,40000\nfc,500,1000,100\n")
    refused(capsys, "sgd", f, "--net", "10gbe", message="line 2: forward_us must be a number from 0 to 1e12, got '1e308'")


def test_json_output_never_holds_nan_or_infinity():
    """One place at the JSON edge: NaN and infinities become null, and the result says where each was."""
    import numpy as np

    from dagprof.cli.main import finite_json

    r = finite_json({"a": 1.0, "rows": [{"x": float("nan")}, {"x": np.float64("inf")}], "arr": np.array([1.0, -np.inf])})
    assert r == {"a": 1.0, "rows": [{"x": None}, {"x": None}], "arr": [1.0, None],
                 "non_finite": ["$.rows[0].x was nan", "$.rows[1].x was inf", "$.arr[1] was -inf"]}
    json.dumps(r, allow_nan=False)


@pytest.mark.parametrize("text,why", [('{"format": "dagprof-overlap", "slowdown": "fast"}', "not a dagprof overlap measurement"),
                                      ('{"slowdown": 0.5', "damaged overlap measurement: not JSON")])
def test_a_damaged_overlap_measurement_is_refused_not_ignored(tmp_path, text, why):
    """Ignoring it would price the search as if compute never slowed beside collectives."""
    from dagprof.collect.measure.overlap import FILE, load_overlap
    from dagprof.errors import DagprofError

    (tmp_path / FILE).write_text(text)
    with pytest.raises(DagprofError, match=why):
        load_overlap(str(tmp_path))


@pytest.mark.parametrize("change,why", [
    ({"beta_us_per_byte": float("nan")}, "link beta_us_per_byte must be a finite number >= 0, got nan"),
    ({"alpha_us": "fast"}, "link alpha_us must be a finite number >= 0, got 'fast'"),
    ({"beta_us_per_byte": -0.01}, "link beta_us_per_byte must be a finite number >= 0, got -0.01"),
    ({"points": [[4096, -5.0]]}, "points must be [bytes, us] pairs of finite numbers >= 0, got [4096, -5.0]"),
    ({"points": 7}, "points must be a list of [bytes, us] pairs"),
])
def test_a_damaged_link_model_names_the_file_and_field(tmp_path, capsys, change, why):
    """NaN was read as the link (every collective then priced NaN, printed as null); a string was an internal error;
    a negative figure named no file; a negative sweep point was dropped from the fits unseen."""
    doc = json.loads((DATA / "fsdp" / "testbed-calibrate" / "1gbit.json").read_text())
    bad = tmp_path / "link.json"
    bad.write_text(json.dumps({**doc, **change}))
    refused(capsys, "whatif", RUN, "--link-model", bad, message=f"{bad}: {why}")


@pytest.mark.parametrize("manifest", ["run_schema/v1/manifest.json", "mxnet/mxnet-run.json"])
def test_a_run_folders_manifest_given_as_the_run_names_the_folder(capsys, manifest):
    """It was read as a Kineto trace ("no 'traceEvents' list")."""
    refused(capsys, "analyze", DATA / manifest, message="this looks like the manifest of a dagprof run folder")


@pytest.mark.parametrize("run,framework", [("horovod/fused", "horovod"), ("mxnet", "mxnet")])
def test_optimize_of_another_frameworks_run_says_what_it_searches(capsys, tmp_path, run, framework):
    """A Horovod run failed on "no parameter of the DDP buckets belongs to a profiled layer", MXNet's asked whether the
    model was wrapped in DistributedDataParallel."""
    refused(capsys, "optimize", DATA / run, "--budget", "5", "-o", tmp_path / "out",
            message=f"dagprof optimize searches PyTorch DDP and FSDP jobs (what dagprof.apply changes); this is a {framework} run")


def test_a_utf8_byte_order_mark_is_read_as_json_and_csv_allow(capsys, tmp_path):
    """A BOM (a Windows editor's save, Excel's UTF-8 CSV) made a layer CSV lack its 'layer' column and a rank file
    'corrupt or truncated'; the same file without it reads the same."""
    bom = b"\xef\xbb\xbf"
    csv = b"layer,forward_us,backward_us,grad_bytes\nconv1,100,200,40000\nfc,50,100,1000\n"
    for name, body in (("plain.csv", csv), ("bom.csv", bom + csv)):
        (tmp_path / name).write_bytes(body)
    plain, marked = (cli(capsys, "sgd", tmp_path / n, "--net", "10gbe", "--workers", "2", "--json") for n in ("plain.csv", "bom.csv"))
    assert plain[0] == marked[0] == 0 and json.loads(plain[1])["rows"] == json.loads(marked[1])["rows"]
    run = tmp_path / "run"
    run.mkdir()
    for f in RUN.iterdir():
        (run / f.name).write_bytes(bom + f.read_bytes())
    code, out, _ = cli(capsys, "replay", run, "--json", "-o", tmp_path / "out")
    assert code == 0 and json.loads(out)["measured_iter_ms"] > 0


@pytest.mark.parametrize("field,value,why", [("unit_forward_us", float("nan"), "unit_forward_us must be a finite number >= 0, got nan"),
                                             ("copy_out_us_per_byte", -1e-3, "copy_out_us_per_byte must be a finite number >= 0"),
                                             ("world", 0, "world must be a finite number >= 1, got 0")])
def test_a_damaged_fsdp_calibration_names_the_field(tmp_path, field, value, why):
    """NaN priced every FSDP unit NaN (printed as null), a negative copy-out made copies gain time."""
    from dagprof.costmodel.fsdp_costs import FsdpCosts, StepFit
    from dagprof.costmodel.topology import read_link_model
    from dagprof.errors import DagprofError

    doc = json.loads((DATA / "fsdp" / "testbed-calibrate" / "1gbit.json").read_text())
    fsdp = FsdpCosts(2, StepFit(10.0, 1e-4), StepFit(30.0, 2e-4), 1e-4, 50.0, 80.0).to_dict()
    path = tmp_path / "link.json"
    path.write_text(json.dumps(doc | {"version": 3, "fsdp": fsdp}))
    assert read_link_model(path).fsdp is not None
    path.write_text(json.dumps(doc | {"version": 3, "fsdp": fsdp | {field: value}}))
    with pytest.raises(DagprofError, match=f"^{path}: bad fsdp entry: {why}"):
        read_link_model(path)


def test_a_topology_file_out_of_range_names_the_file(tmp_path):
    from dagprof.costmodel.topology import parse_topology
    from dagprof.errors import DagprofError

    path = tmp_path / "topo.json"
    path.write_text('{"hosts": 2, "inter": {"bandwidth": "10Gbit"}, "overhead_us": -500}')
    with pytest.raises(DagprofError, match=f"^{path}: collective overhead must be >= 0 us, got -500.0$"):
        parse_topology(str(path), 4)


def test_a_folder_another_rank_creates_meanwhile_is_no_file(tmp_path, monkeypatch):
    """Two ranks write their step times into one new folder: the folder one made between the other's two looks was
    read as a file on the way, and the second rank stopped its training (the demo's verification round)."""
    import os

    from dagprof import fsutil

    times = tmp_path / "round2-B" / "times"
    real = os.path.isdir
    looks = []

    def isdir(p):  # the other rank creates the folder right after this rank's first look finds none
        if os.fspath(p) == os.fspath(times) and not looks:
            looks.append(p)
            times.mkdir(parents=True)
            return False
        return real(p)

    monkeypatch.setattr(fsutil.os.path, "isdir", isdir)
    with fsutil.atomic_open(times / "rank1.json") as f:
        f.write("{}")
    assert (times / "rank1.json").read_text() == "{}"
