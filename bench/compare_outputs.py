"""Do two source trees of dagprof answer the same? A refactor's check: same commands, same vendored runs, one table.

Runs ``analyze``, ``whatif`` sweeps and ``replay`` with ``--json`` on the runs in ``tests/data`` (copied to a
temporary folder, so nothing is written into the repository), once with each tree's ``src`` first on
PYTHONPATH, and prints per command whether the two JSON answers are the same, ignoring timings and paths;
where they differ, the keys that do and both values. Both trees run in the same interpreter (this one).

    python bench/compare_outputs.py --before ../old-checkout --after .
    python bench/compare_outputs.py --before ../old-checkout --readers ../shared/data

``--readers DIR`` compares the readers instead: every file and folder under DIR that dagprof reads (``formats.sniff``:
Kineto traces, run folders of every framework, XPlane files...) loaded by ``traces.load`` with each tree (missing ranks
allowed, no parse cache), whole ``Run`` against whole ``Run`` (every column's bytes, flows, lanes, metadata and warnings,
by a digest; empty fields and all-zero columns left out, so a field or column added with an empty default does not count), or
the same one-line refusal.

    python bench/compare_outputs.py --before ../old-checkout --readers tests/data

``--notes [RUN ...]`` measures what a user reads instead: every command (replay, analyze, the what-ifs a user asks first,
optimize, diff, report; ``NOTE_COMMANDS``) in its text form on a handful of vendored recordings (``NOTE_RUNS``), per
command each tree's exit code and its longest line (a note or legend a user must read in one go), and the ``--json``
answers of the conversions and the mesh compared as above, their text left out: a change to the notes' wording, checked to move no number.

    python bench/compare_outputs.py --before ../old-checkout --notes

``--skip-column NAME`` leaves a field or column of that name out of both trees' digests: one a change adds with values
that are not all empty (``comm_kind``: every collective's kind), whose own test checks it.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

DATA = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data"
IGNORED = {"seconds", "source", "path", "out", "report", "traces", "measured_trace", "replay_trace", "cache"}
WHATIF = ["--bandwidth", "1Gbit,10Gbit", "--latency", "5,50", "--allow-model-error", "--no-trace"]
RUNS = ["run_schema/v1", "hybrid-dp-tp", "hybrid-dp-tp-dagprof", "horovod/fused", "horovod/text", "fsdp/reshard",
        "fsdp/hsdp", "mxnet", "kineto-public/nccl_parser_config", "tf/fit", "tf-jax/mlp", "fsdp/testbed-1gbit"]
TEMPLATE = ["run_schema/v1", "fsdp/reshard", "fsdp/hsdp", "fsdp/testbed-1gbit"]  # what-ifs from the averaged iteration too
COMMANDS = [c for r in RUNS for c in (["analyze", r], ["whatif", r, *WHATIF])] + [
    ["whatif", "run_schema/v1", "--bucket-mb", "1,inf", "--compute-speed", "2", "--allow-model-error", "--no-trace"],
    ["whatif", "run_schema/v1", "--workers", "4,16", "--scheme", "ring,tree", "--allow-model-error", "--no-trace"],
    ["whatif", "run_schema/v1", "--fine", "--workers", "64", "--allow-model-error", "--no-trace"],
    ["whatif", "horovod/fused", "--fusion-mb", "0,64", "--cycle-ms", "1,10", "--allow-model-error", "--no-trace"],
    ["whatif", "fsdp/reshard", "--reshard-after-forward", "on,off", "--workers", "4", "--allow-model-error", "--no-trace"],
    ["whatif", "fsdp/ddp", "--data-parallel", "fsdp,fsdp:keep", "--workers", "2,4", "--allow-model-error", "--no-trace"],
    ["replay", "run_schema/v1"], ["replay", "hybrid-dp-tp"],
    *[["whatif", r, "--template", "--bandwidth", "200Mbit,10Gbit", "--allow-model-error", "--no-trace"] for r in TEMPLATE],
]
NO_TRACE = ["--no-trace", "--allow-model-error"]
NOTE_RUNS = ["lora-clip/ddp-0", "fsdp-fresh/tiedlm-wake", "fsdp/hsdp", "tf/fit", "tf-jax/mlp", "horovod/fused",
             "mxnet/user_sparse_mf", "hybrid-dp-tp-dagprof"]
NOTE_COMMANDS = {"replay": ["replay"], "analyze": ["analyze"], "bandwidth": ["whatif", "--bandwidth", "100Mbit,10Gbit", *NO_TRACE],
                 "workers": ["whatif", "--workers", "4", "--cores", "2", *NO_TRACE],
                 "to-fsdp": ["whatif", "--data-parallel", "fsdp", *NO_TRACE], "to-ddp": ["whatif", "--data-parallel", "ddp", *NO_TRACE],
                 "mesh": ["whatif", "--mesh", "2x2", *NO_TRACE], "speed": ["whatif", "--compute-speed", "2", *NO_TRACE],
                 "optimize": ["optimize", "--budget", "1"], "diff": ["diff"], "report": ["report"]}
NOTE_JSON = ("to-fsdp", "to-ddp", "mesh")  # also compared as --json answers


def _clean(o):
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items() if k not in IGNORED}
    return [_clean(v) for v in o] if isinstance(o, list) else o


_DIGEST = r"""
import dataclasses, enum, hashlib, json, os, sys, tempfile
os.environ["DAGPROF_CACHE_DIR"] = tempfile.mkdtemp()  # every input parsed by this tree
import msgspec, numpy as np
from dagprof.errors import DagprofError
from dagprof.traces import formats
from dagprof.traces.load import load

def feed(h, x):
    if isinstance(x, np.ndarray):
        h.update(f"nd{x.dtype}{x.shape}".encode()); h.update(np.ascontiguousarray(x).tobytes())
    elif dataclasses.is_dataclass(x) or isinstance(x, msgspec.Struct):
        names = [f.name for f in dataclasses.fields(x)] if dataclasses.is_dataclass(x) else x.__struct_fields__
        h.update(type(x).__name__.encode())
        for f in names:  # an empty field is left out: a field added with an empty default reads the same on older inputs
            v = getattr(x, f)  # (a column too: one all 0, as an added column's default, is left out in both trees)
            if f in SKIP:
                continue
            if v.any() if isinstance(v, np.ndarray) else not (v is None or v is False or (isinstance(v, (str, int, float, dict, list, tuple)) and not v)):
                h.update(f.encode()); feed(h, v)
    elif isinstance(x, dict):
        h.update(b"{%d" % len(x))
        for k, v in x.items():
            feed(h, k); feed(h, v)
    elif isinstance(x, (list, tuple)):
        h.update(b"[%d" % len(x))
        for v in x:
            feed(h, v)
    elif isinstance(x, enum.Enum):
        h.update(f"E{type(x).__name__}.{x.name}".encode())
    elif isinstance(x, (str, int, float, bool, type(None), bytes)):
        h.update(repr((type(x).__name__, x)).encode())
    else:
        raise TypeError(type(x))

out = {}
root, SKIP = sys.argv[1], set(sys.argv[2:])
for folder, dirs, files in os.walk(root):
    dirs.sort()
    for p in [folder] + [os.path.join(folder, f) for f in sorted(files)]:
        fmt = formats.sniff(p)
        if fmt is None or not fmt.reader:
            continue
        try:
            h = hashlib.sha256(); feed(h, load(p, allow_missing_ranks=True)); out[os.path.relpath(p, root)] = h.hexdigest()
        except DagprofError as e:
            out[os.path.relpath(p, root)] = "refused: " + str(e)
print(json.dumps(out))
"""


def reader_digests(tree: pathlib.Path, folder: pathlib.Path, skip: list[str]) -> dict[str, str]:
    """Per input under ``folder``: a digest of the ``Run`` that ``tree``'s ``traces.load`` makes of it (fields named in
    ``skip`` left out), or its refusal."""
    path = os.pathsep.join([str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])  # what else is set (ISA-L) too
    p = subprocess.run([sys.executable, "-c", _DIGEST, str(folder), *skip], env={**os.environ, "PYTHONPATH": path},
                       capture_output=True, text=True, timeout=3600)
    if p.returncode:
        raise SystemExit(f"{tree}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout)


def compare_readers(before: pathlib.Path, after: pathlib.Path, folder: pathlib.Path, skip: list[str]) -> int:
    a, b = reader_digests(before, folder, skip), reader_digests(after, folder, skip)
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):
            print(f"DIFFERS  {name}: {str(a.get(name))[:100]} -> {str(b.get(name))[:100]}")
    read = [k for k in a if not a[k].startswith("refused")]
    print(f"{sum(a[k] == b.get(k) for k in read)} of {len(read)} inputs read identically; "
          f"{sum(a[k] == b.get(k) for k in a if k not in read)} of {len(a) - len(read)} refused alike")
    return 0


def _dagprof(tree: pathlib.Path, argv: list[str], work: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "DAGPROF_CACHE_DIR": str(work / f"cache-{tree.name}")}
    return subprocess.run([sys.executable, "-m", "dagprof.cli.main", *argv], cwd=work, env=env, capture_output=True, text=True, timeout=600)


def answer(tree: pathlib.Path, cmd: list[str], work: pathlib.Path) -> object:
    p = _dagprof(tree, [*cmd, "--json"], work)
    try:
        return _clean(json.loads(p.stdout))
    except json.JSONDecodeError:
        return {"exit": p.returncode, "stderr": p.stderr.strip().splitlines()[-1:]}


def numbers(o):
    """``o`` without its text: what a change to the wording of notes must leave the same."""
    if isinstance(o, dict):
        return {k: numbers(v) for k, v in o.items() if not isinstance(v, str)}
    return [numbers(v) for v in o if not isinstance(v, str)] if isinstance(o, list) else o


def differences(a: object, b: object, at: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys()) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at or '.'}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"]


def note_argv(name: str, run: str, work: pathlib.Path, tree: pathlib.Path) -> list[str]:
    """``NOTE_COMMANDS[name]`` on ``run``: ``diff`` of the run against itself, ``report`` into a folder of the tree's own."""
    head, *rest = NOTE_COMMANDS[name]
    tail = [run] if name == "diff" else ["-o", str(work / f"report-{tree.name}" / run)] if name == "report" else []
    return [head, run, *rest, *tail]


def compare_notes(before: pathlib.Path, after: pathlib.Path, runs: list[str]) -> int:
    """Per run and command: exit code and longest text line, before -> after; the ``NOTE_JSON`` answers' numbers compared."""
    longest = {before: 0, after: 0}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for run in runs:
            shutil.copytree(DATA / run, work / run)  # optimize and report write beside their input
        for run in runs:
            for name in NOTE_COMMANDS:
                got = {}
                for tree in (before, after):
                    p = _dagprof(tree, note_argv(name, run, work, tree), work)
                    got[tree] = (p.returncode, max((len(line) for line in (p.stdout + p.stderr).splitlines()), default=0))
                    longest[tree] = max(longest[tree], got[tree][1])
                diff = differences(numbers(answer(before, note_argv(name, run, work, before), work)),
                                   numbers(answer(after, note_argv(name, run, work, after), work))) if name in NOTE_JSON else []
                (rb, lb), (ra, la) = got[before], got[after]
                json_said = "" if name not in NOTE_JSON else "  --json same" if not diff else f"  --json DIFFERS: {'; '.join(diff[:3])}"
                print(f"exit {rb} -> {ra}  longest {lb:5d} -> {la:5d}  {run} {name}{json_said}", flush=True)
    print(f"longest line over every command: {longest[before]} -> {longest[after]} characters")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=pathlib.Path, required=True, help="a checkout (its src/ is used)")
    ap.add_argument("--after", type=pathlib.Path, default=pathlib.Path("."), help="a checkout (default: here)")
    ap.add_argument("--readers", type=pathlib.Path, help="compare the readers on every input under this folder instead")
    ap.add_argument("--notes", nargs="*", metavar="RUN", help="measure each command's exit code and longest text line on "
                    f"these vendored runs instead (none named: {', '.join(NOTE_RUNS)})")
    ap.add_argument("--skip-column", action="append", default=[], metavar="NAME",
                    help="with --readers: leave this field or column out of both digests (repeatable)")
    args = ap.parse_args()
    for tree in (args.before, args.after):  # a tree without src/dagprof would leave the editable install to answer for it
        if not (tree / "src" / "dagprof" / "__init__.py").is_file():
            ap.error(f"{tree}: not a dagprof checkout (no src/dagprof); pass the folder that holds src/")
    if args.notes is not None:
        return compare_notes(args.before.resolve(), args.after.resolve(), args.notes or NOTE_RUNS)
    if args.readers:
        return compare_readers(args.before.resolve(), args.after.resolve(), args.readers.resolve(), args.skip_column)
    same = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for run in sorted({cmd[1] for cmd in COMMANDS}):  # every input a command names (fsdp/ddp is in no RUNS entry)
            shutil.copytree(DATA / run, work / run)
        for cmd in COMMANDS:
            diff = differences(answer(args.before.resolve(), cmd, work), answer(args.after.resolve(), cmd, work))
            same += not diff
            print(f"{'same' if not diff else 'DIFFERS':8} dagprof {' '.join(cmd)}")
            for d in diff[:6]:
                print(f"           {d}")
            if len(diff) > 6:
                print(f"           (+{len(diff) - 6} more)")
    print(f"{same} of {len(COMMANDS)} commands answer the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
