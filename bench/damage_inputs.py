"""Audit every reader against damaged copies of the vendored fixtures: each CLI command on each damage, classified.

The project's rule for bad input is "refuse in one line naming the file and the problem, or warn with a count";
a traceback, an internal error, a hang or exit 0 with a number that should have been refused breaks it. This
makes damaged copies of one fixture per reader under ``--out`` (default /tmp/badinput/cases), runs the commands
on each (in a forked child of this process, so nothing is imported twice; a child past ``--timeout`` is a hang)
and prints one line per (case, command) and the counts per class::

    python bench/damage_inputs.py [--kinds ddp,fsdp] [--damages trunc50,missing] [--all-commands] [--json FILE]

Classes: ``refused`` (exit 2, one line naming a file of the case), ``refused-vague`` (exit 2, naming none),
``warned`` (exit 0 and a warning with a count), ``accepted`` (exit 0, no warning: good only where the damage
leaves the answer right, see ``EXPECT``), ``internal`` (exit 3), ``traceback``, ``hang``, ``nonfinite``
(a NaN or infinity reached the JSON output). ``verdict`` says good or bad.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_more  # noqa: E402  (the damages users make by hand: encodings, second sessions, units, mixed jobs)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


@dataclass(frozen=True)
class Kind:
    """One reader's fixture: the input given to the CLI, the rank-1 file damaged, rank 0's file and its next rank's name."""

    name: str
    src: Path
    target: str  # relative to src (or the file itself when src is a file)
    rank0: str | None = None
    next_rank: str | None = None  # a name the reader takes for another rank (duplicated-file case)
    ddp: bool = False  # whether optimize applies
    named_by_content: bool = False  # ranks are who their files say (distributedInfo), whatever the names: a swap is no damage
    only: tuple[str, ...] = ()  # the damages worth its time (all when empty): a reader already audited on another kind
    unread: tuple[str, ...] = ()  # damages of the target that leave the answer alone: the reader takes that part from elsewhere


# wrong flags on an undamaged fixture: damage -> (command and flags, the input's place marked "RUN"; whether a fixture may
# take it: the flag is a valid what-if there, so an answer is right). Every reading command is given one it must refuse.
FLAGS = {
    "flag-workers0": (["whatif", "--json", "RUN", "--workers", "0", "--no-trace"], ()),
    "flag-bandwidth-neg": (["whatif", "--json", "RUN", "--bandwidth", "-1Gbit", "--no-trace"], ()),
    "flag-latency-neg": (["whatif", "--json", "RUN", "--latency", "-5", "--no-trace"], ()),
    "flag-mesh": (["whatif", "--json", "RUN", "--mesh", "2x3", "--no-trace"], ("fsdp", "hsdp")),  # FSDP2: a 6-rank what-if
    "flag-mesh-zero": (["whatif", "--json", "RUN", "--mesh", "0x2", "--no-trace"], ()),
    "flag-mesh-workers": (["whatif", "--json", "RUN", "--mesh", "1x2", "--workers", "2", "--no-trace"], ()),
    "flag-tp": (["whatif", "--json", "RUN", "--tp-degree", "3", "--no-trace"], ()),
    "flag-ranks-per-host": (["whatif", "--json", "RUN", "--ranks-per-host", "2", "--no-trace"], ()),
    "flag-steps-empty": (["analyze", "--json", "--steps", "4:4", "RUN"], ()),
    "flag-max-bytes0": (["analyze", "--json", "--max-trace-bytes", "0", "RUN"], ()),
    "flag-explain-neg": (["replay", "--json", "RUN", "--explain", "--explain-threshold", "-1", "-o", "OUT"], ()),
    "flag-engine": (["replay", "--json", "RUN", "--engine", "gpu", "-o", "OUT"], ()),
    "flag-report-steps": (["report", "--json", "--steps", "0:x", "RUN", "-o", "OUT"], ()),
    "flag-diff-top": (["diff", "--json", "ORIG", "RUN", "--top", "-1", "-o", "OUT"], ()),
    "flag-budget0": (["optimize", "--json", "RUN", "--budget", "0", "-o", "OUT"], ()),
    "flag-memory-neg": (["optimize", "--json", "RUN", "--memory-budget", "-1GB", "--budget", "1", "-o", "OUT"], ()),
    **damage_more.FLAGS,
}

KINDS = [
    Kind("ddp", DATA / "ddp-testbed/run", "rank1.json", "rank0.json", "rank2.json", ddp=True),
    # a run's steps are the hooks' step times in rank<R>.json; its Kineto trace is read for the collectives inside them only
    Kind("dagprof-kineto", DATA / "hybrid-dp-tp-dagprof", "rank1.kineto.json.gz", "rank0.kineto.json.gz",
         "rank4.kineto.json.gz", unread=("nosteps", "onestep", "late-window")),
    Kind("hybrid-kineto", DATA / "hybrid-dp-tp", "rank-1.pt.trace.json.gz", "rank-0.pt.trace.json.gz", "rank-4.pt.trace.json.gz",
         named_by_content=True, only=("clean", "trunc50", "missing", "dup", "dupover", "swap", "swapids", "nosteps", "onestep",
                                      "collsize", "neg", "skew", *FLAGS, "late-window", "ns-us", "second-world")),
    Kind("kineto-dir", DATA / "gloo-windows/same", "rank-1.pt.trace.json.gz", "rank-0.pt.trace.json.gz",
         "rank-2.pt.trace.json.gz", named_by_content=True),
    Kind("kineto-8", DATA / "kineto-corpus/param/dlrm_kineto", "worker1_step_12.1694128201556.pt.trace.json.gz",
         "worker0_step_12.1694128201545.pt.trace.json.gz", "worker8_step_12.1694128201545.pt.trace.json.gz",
         only=("clean", "missing", "dup", "swap", "swapids", "nosteps", "onestep", "collsize", "skew", "neg"),
         named_by_content=True),
    Kind("kineto-file", DATA / "kineto-public/nccl_parser_config/nccl_data.json.gz", "nccl_data.json.gz",
         unread=("late-window",)),  # one trace: its step numbers are labels, with no other rank's to disagree with
    Kind("fsdp", DATA / "fsdp/reshard", "rank1.json", "rank0.json", "rank2.json"),
    Kind("hsdp", DATA / "fsdp/hsdp", "rank1.json", "rank0.json", "rank4.json"),
    Kind("fsdp1", DATA / "fsdp/fsdp1", "rank1.json", "rank0.json", "rank2.json"),
    Kind("tf", DATA / "tf/text", "rank1.json", "rank0.json", "rank2.json"),
    Kind("jax", DATA / "tf-jax/pmap-host", "rank1.json", "rank0.json", "rank2.json"),
    # the XPlane itself, beside the rank file that says its rank
    Kind("tf-xplane", DATA / "tf/text", "rank1/plugins/profile/2026_12_02_01_16_53/vm.xplane.pb.gz",
         "rank0/plugins/profile/2026_12_02_01_16_53/vm.xplane.pb.gz", only=("clean", "trunc50", "truncgz", "empty", "garbage", "missing",
                                                                         "dupover", "concat", "gz-swapped", "symlink-loop"),
         unread=("concat",)),  # a protobuf written twice merges into one: its planes twice, read once
    Kind("jax-xplane", DATA / "tf-jax/pmap-host", "rank1/plugins/profile/2026_12_03_10_29_30/vm.xplane.pb.gz",
         "rank0/plugins/profile/2026_12_03_10_29_30/vm.xplane.pb.gz", only=("clean", "trunc50", "missing", "dupover")),
    Kind("horovod", DATA / "horovod/sparse-gru", "rank1.horovod.json", "rank0.horovod.json", "rank2.horovod.json"),
    Kind("horovod-timeline", DATA / "horovod/sparse-gru", "horovod_timeline.json"),
    # the manifest's step times bound what is read: a second session's events an hour on are outside them
    Kind("mxnet", DATA / "mxnet/user_mlp", "worker1.json.gz", "worker0.json.gz", "worker2.json.gz", unread=("two-sessions",)),
    Kind("mxnet-manifest", DATA / "mxnet/user_mlp", "mxnet-run.json"),
    Kind("layerwise", DATA / "bcaffe-k80-googlenet/tmp4comm.log", "tmp4comm.log", unread=("concat",)),  # its last dump is read
    Kind("layer-csv", DATA / "bcaffe-k80-googlenet/tmp4comm.log", "layers.csv"),  # made from the log, below
]

# damages every answer must refuse (exit 2) or flag (a warning with a count); the others may be read as they are
# when the answer stays right (a huge clock skew is undone by alignment; an extension is only a name)
MUST_REFUSE_OR_WARN = {"trunc10", "trunc50", "trunc99", "truncgz", "empty", "garbage", "missing", "dup", "swap",
                       "swapids", "nosteps", "collsize", "nan", "neg", "foreign", "shape-empty", "shape-types",
                       "version-new", "version-old", "emptydir", "onestep", "kineto-as-rank", "isdir", "inf",
                       "steps-out", "steps-reversed", "dupover", "mesh-world", "mesh-rank", "unit-renamed", "unit-missing",
                       *damage_more.MUST_REFUSE_OR_WARN}


def must_flag(kind: Kind, damage: str) -> bool:
    """Whether the damage must be refused or flagged on this kind (else an unchanged answer is right)."""
    if damage in FLAGS:
        return kind.name not in FLAGS[damage][1]
    if damage in kind.unread or kind.named_by_content and damage in ("swap", "swapids"):
        return False
    return damage in MUST_REFUSE_OR_WARN


def _load(path: Path):
    raw = path.read_bytes()
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    return json.loads(text)


def _dump(path: Path, obj, gz: bool) -> None:
    text = json.dumps(obj).encode()  # NaN / Infinity written as Python writes them: what a careless writer does
    path.write_bytes(gzip.compress(text, mtime=0) if gz else text)


def _rewrite(path: Path, edit) -> bool:
    """Apply ``edit`` (which changes the object in place and says whether it changed anything) to a JSON file."""
    gz = path.read_bytes()[:2] == b"\x1f\x8b"
    obj = _load(path)
    if not edit(obj):
        return False
    _dump(path, obj, gz)
    return True


def _events(obj) -> list:
    if isinstance(obj, dict):
        return obj.get("traceEvents") or obj.get("events") or []
    return obj if isinstance(obj, list) else []


def _walk_numbers(obj, keys: set[str], change, limit: int) -> int:
    """Change at most ``limit`` numbers stored under ``keys`` (anywhere in the object); how many were changed."""
    done = 0
    stack = [obj]
    while stack and done < limit:
        x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                if k in keys and isinstance(v, (int, float)) and not isinstance(v, bool) and done < limit and v:
                    x[k] = change(v)
                    done += 1
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(x, list):
            stack.extend(v for v in x if isinstance(v, (dict, list)))
    return done


def _records_change(obj, change, limit: int) -> int:
    """dagprof rank files: times inside record rows ``[kind, step, layer, t_ns, ...]`` and step rows."""
    done = 0
    for row in obj.get("step_times_ns", [])[:limit]:
        row[2] = change(row[2])
        done += 1
    for key in ("step_times_us",):
        for s in list(obj.get(key, {}))[:limit]:
            obj[key][s] = change(obj[key][s])
            done += 1
    for row in obj.get("records", [])[5:5 + limit]:  # hook records [code, a, b, t_ns, x]
        row[3] = change(row[3])
        done += 1
    for row in obj.get("enqueues", [])[:limit]:
        row[3] = change(row[3])
        done += 1
    return done


TIME_KEYS = {"dur", "duration", "duration_us", "backward_us", "forward_us", "t_ns", "issued_ns", "ts"}


def _bad_numbers(value):
    def edit(obj) -> bool:
        change = {"nan": lambda v: float("nan"), "neg": lambda v: -abs(v) - 1, "inf": lambda v: float("inf")}[value]
        n = _walk_numbers(obj, {"dur", "duration"}, change, 5)
        if isinstance(obj, dict):
            n += _records_change(obj, change, 3)
            if "steps" in obj and isinstance(obj["steps"], dict):  # MXNet manifest: [step, start, end] per worker
                for rows in obj["steps"].values():
                    rows[0][2] = change(rows[0][2])
                    n += 1
        return n > 0
    return edit


def shift_epochs(obj, us: float) -> int:
    """Move every epoch-looking time of the file by ``us`` microseconds (ns clocks by as many ns); how many moved."""
    n = 0

    def fix(x):
        nonlocal n
        if isinstance(x, dict):
            for k, v in x.items():
                x[k] = fix(v)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                x[i] = fix(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            if 1.5e18 < x < 2.1e18:
                n += 1
                return x + int(us * 1000)
            if 1.5e15 < x < 2.1e15:
                n += 1
                return x + us
        return x
    fix(obj)
    return n


def _skew(obj) -> bool:
    """Move every epoch-looking time of the file an hour later (ns or us clocks)."""
    return shift_epochs(obj, 3_600_000_000) > 0


def _no_steps(obj) -> bool:
    if isinstance(obj, dict):
        for key in ("step_times_ns", "enqueues"):
            if obj.get(key):
                obj[key] = []
                return True
        if obj.get("step_times_us"):
            obj["step_times_us"] = {}
            return True
        if isinstance(obj.get("steps"), dict):
            obj["steps"] = {k: [] for k in obj["steps"]}
            return True
    ev = _events(obj)
    kept = [e for e in ev if not (isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep"))]
    if len(kept) == len(ev):
        return False
    ev[:] = kept
    return True


def _one_step(obj) -> bool:
    if isinstance(obj, dict):
        for key in ("step_times_ns",):
            if len(obj.get(key) or []) > 1:
                obj[key] = obj[key][:1]
                return True
        if len(obj.get("step_times_us") or {}) > 1:
            first = next(iter(obj["step_times_us"]))
            obj["step_times_us"] = {first: obj["step_times_us"][first]}
            return True
    ev = _events(obj)
    steps = [e for e in ev if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep")]
    if len(steps) < 2:
        return False
    drop = {id(e) for e in steps[1:]}
    ev[:] = [e for e in ev if id(e) not in drop]
    return True


def _coll_size(obj) -> bool:
    """One collective's size doubled on this rank only."""
    if isinstance(obj, dict):
        f = obj.get("fsdp")
        if f and f.get("collectives"):
            f["collectives"][0]["nbytes"] *= 2
            return True
        issued = [r for r in obj.get("records", []) if r[0] == 8]  # ENQ_END: a=bucket, b=seq, x=bytes
        if issued:
            issued[0][4] *= 2
            return True
        if obj.get("enqueues"):
            obj["enqueues"][0][4] *= 2
            return True
        if obj.get("grad_bytes") and obj.get("framework") != "jax":  # JAX sizes its collectives from the HLO: grad_bytes unread
            obj["grad_bytes"] *= 2
            return True
    for e in _events(obj):
        args = e.get("args") if isinstance(e, dict) else None
        if isinstance(args, dict):
            for k in ("In msg nelems", "Out msg nelems"):  # traces of the old schema size no collective: not applicable
                if isinstance(args.get(k), (int, str)) and str(args[k]).isdigit() and int(args[k]) > 0:
                    args[k] = int(args[k]) * 2
                    return True
    return False


def _swap_ids(path0: Path, path1: Path) -> bool:
    def rank_of(obj):
        if isinstance(obj, dict):
            if "rank" in obj:
                return obj, "rank"
            di = obj.get("distributedInfo")
            if isinstance(di, dict) and "rank" in di:
                return di, "rank"
        return None, None
    objs = [_load(p) for p in (path0, path1)]
    holders = [rank_of(o) for o in objs]
    if any(h[0] is None for h in holders):
        return False
    (a, ka), (b, kb) = holders
    a[ka], b[kb] = b[kb], a[ka]
    for p, o in zip((path0, path1), objs):
        _dump(p, o, p.read_bytes()[:2] == b"\x1f\x8b")
    return True


def _fsdp_edit(case: Path, target: Path, damage: str) -> bool:
    """FSDP rank files: every rank's mesh unlike its world (``mesh-world``), rank 1's mesh unlike the others' (``mesh-rank``),
    one of rank 1's units renamed (``unit-renamed``) or its last unit gone with its collectives and records (``unit-missing``)."""
    obj = _load(target)
    if not isinstance(obj, dict) or not obj.get("fsdp"):
        return False
    if damage == "mesh-world":
        for p in sorted(case.glob("rank*.json")):
            _rewrite(p, lambda o: any(u.update(mesh=[3] * len(u["mesh"])) for u in o["fsdp"]["units"]) or True)
        return True

    def edit(o) -> bool:
        f = o["fsdp"]
        if damage == "mesh-rank":
            for u in f["units"]:
                u["mesh"] = [1, *u["mesh"]] if len(u["mesh"]) == 1 else [1, u["mesh"][0] * u["mesh"][1]]
        elif damage == "unit-renamed":
            f["units"][-1]["name"] += "_x"
        else:
            gone = len(f["units"]) - 1
            f["units"].pop()
            new = {}
            for k, c in enumerate(f["collectives"]):
                if c["unit"] != gone:
                    new[k] = len(new)
            f["collectives"] = [c for c in f["collectives"] if c["unit"] != gone]
            for c in f["collectives"]:
                c["prefetched_by"] = -1 if c["prefetched_by"] == gone else c["prefetched_by"]
            rows = []
            for r in o["records"]:
                if r[0] in (16, 17):  # FSDP_COLL_BEGIN/END: a = collective
                    if r[1] not in new:
                        continue
                    r[1] = new[r[1]]
                elif r[0] in (18, 19, 20, 21) and r[1] == gone:  # copy-out, reshard: a = unit
                    continue
                rows.append(r)
            o["records"] = rows
        return True
    return _rewrite(target, edit)


def _truncate(path: Path, frac: float) -> None:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        text = gzip.decompress(raw)
        path.write_bytes(gzip.compress(text[: int(len(text) * frac)], mtime=0))
    else:
        path.write_bytes(raw[: int(len(raw) * frac)])


def _layer_csv(log: Path, out: Path) -> None:
    """A dagprof layer CSV built from the B-Caffe log's last dump (one line per blob: enough for a reader test)."""
    rows = [line.split("[", 1)[1].rstrip("]\n").split(",") for line in log.read_text().splitlines() if "[" in line]
    rows = rows[-128:]
    lines = ["layer,forward_us,backward_us,grad_bytes,allreduce_us"]
    lines += [f"b{r[0].strip()},{float(r[2]) / 2:.1f},{float(r[2]):.1f},{int(r[1]) * 4},{float(r[3]):.1f}" for r in rows]
    out.write_text("\n".join(lines) + "\n")


DAMAGES = ["clean", "trunc10", "trunc50", "trunc99", "truncgz", "empty", "garbage", "missing", "dup", "swap",
           "swapids", "nosteps", "onestep", "collsize", "nan", "neg", "inf", "skew", "wrongext", "foreign",
           "kineto-as-rank", "shape-empty", "shape-types", "version-new", "version-old", "isdir", "emptydir",
           "steps-out", "steps-reversed", "dupover", "mesh-world", "mesh-rank", "unit-renamed", "unit-missing", *FLAGS,
           *damage_more.DAMAGES]


def make_case(kind: Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    """A damaged copy of ``kind``'s fixture; its input path and the file damaged, or None when it does not apply."""
    case = root / kind.name / damage
    shutil.rmtree(case, ignore_errors=True)
    case.parent.mkdir(parents=True, exist_ok=True)
    if damage == "emptydir":
        case.mkdir()
        return case, str(case)
    if kind.src.is_file():
        case.mkdir()
        if kind.name == "layer-csv":
            _layer_csv(kind.src, case / kind.target)
        else:
            shutil.copy(kind.src, case / kind.target)
        arg = case / kind.target
    else:
        shutil.copytree(kind.src, case, ignore=shutil.ignore_patterns("*.html", "measured.trace.json",
                                                                      "replay.trace.json", "dagprof-out"))
        arg = case
    t = case / kind.target
    r0 = case / kind.rank0 if kind.rank0 else None
    if (damage.startswith("steps-") or damage in FLAGS) and kind.src.suffix == ".log":
        return None  # sgd takes no --steps, nor the other commands' flags
    if damage in ("clean", "steps-out", "steps-reversed") or damage in FLAGS and (kind.ddp or "optimize" not in FLAGS[damage][0]):
        return arg, str(t)
    if damage in FLAGS:
        return None
    if damage in damage_more.DAMAGES:
        return damage_more.make(kind, damage, case, t, arg)
    if damage.startswith("trunc") and damage != "truncgz":
        _truncate(t, int(damage[5:]) / 100)
    elif damage == "truncgz":
        raw = t.read_bytes()
        if raw[:2] != b"\x1f\x8b":
            return None
        t.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        t.write_bytes(b"")
    elif damage == "garbage":
        t.write_bytes(random.Random(1).randbytes(4096))
    elif damage == "missing":
        if r0 is None and kind.name not in ("horovod-timeline", "mxnet-manifest"):
            return None
        t.unlink()
    elif damage in ("dup", "swap", "swapids", "dupover"):
        if r0 is None:
            return None
        if damage == "dupover":  # rank 1's file replaced by a copy of rank 0's
            shutil.copy(r0, t)
        elif damage == "dup":
            shutil.copy(r0, case / kind.next_rank)
        elif damage == "swap":
            tmp = case / "swap.tmp"
            r0.rename(tmp)
            t.rename(r0)
            tmp.rename(t)
        elif not _swap_ids(r0, t):
            return None
    elif damage in ("nosteps", "onestep", "collsize", "nan", "neg", "inf", "skew"):
        if t.suffix == ".log" or t.suffix == ".csv":
            if damage not in ("nan", "neg", "inf"):
                return None
            text = t.read_text().splitlines()
            word = {"nan": "nan", "neg": "-5", "inf": "inf"}[damage]
            i = len(text) - 3
            if t.suffix == ".csv":
                parts = text[i].split(",")
                parts[2] = word
                text[i] = ",".join(parts)
            else:
                head, body = text[i].split("[", 1)
                parts = body.rstrip("]").split(",")
                parts[2] = " " + word
                text[i] = head + "[" + ",".join(parts) + "]"
            t.write_text("\n".join(text) + "\n")
            return arg, str(t)
        edit = {"nosteps": _no_steps, "onestep": _one_step, "collsize": _coll_size, "skew": _skew}.get(damage) \
            or _bad_numbers(damage)
        if not _rewrite(t, edit):
            return None
    elif damage == "wrongext":
        name = t.name
        new = name.replace(".json.gz", ".json") if name.endswith(".json.gz") else name + ".txt"
        if name.endswith((".log", ".csv")):
            new = t.stem + ".json"
        t.rename(t.with_name(new))
        if kind.src.is_file():
            arg = t.with_name(new)
    elif damage == "foreign":
        shutil.copy(DATA / "bcaffe-k80-googlenet/allreduce4.log", t)
    elif damage == "kineto-as-rank":
        src = DATA / "gloo-windows/same/rank-1.pt.trace.json.gz"
        if t.name.endswith(".gz") or t.suffix in (".log", ".csv"):
            if t.suffix in (".log", ".csv"):
                shutil.copy(DATA / "ddp-testbed/run/rank0.json", t)  # a dagprof rank file where a log is read
            else:
                shutil.copy(DATA / "ddp-testbed/run/rank1.json", t)
        else:
            t.write_bytes(gzip.decompress(src.read_bytes()))
    elif damage == "shape-empty":
        obj = _load(t) if t.suffix != ".log" and t.suffix != ".csv" else None
        if obj is None:
            return None
        _dump(t, [] if isinstance(obj, dict) else {}, t.name.endswith(".gz"))
    elif damage == "shape-types":
        if t.suffix in (".log", ".csv"):
            return None

        def types(obj) -> bool:
            if isinstance(obj, list):
                obj[:] = [{"x": 1}] * 3
                return True
            changed = False
            for k, v in obj.items():
                if k in ("format", "version", "rank", "world_size", "framework"):
                    continue
                if isinstance(v, list):
                    obj[k] = {"a": v[:1]}
                    changed = True
                elif isinstance(v, dict):
                    obj[k] = [v]
                    changed = True
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    obj[k] = str(v)
                    changed = True
            return changed
        if not _rewrite(t, types):
            return None
    elif damage in ("version-new", "version-old"):
        man = next((case / n for n in ("manifest.json", "mxnet-run.json") if (case / n).exists()), None)
        if man is None or kind.rank0 is None and kind.name != "mxnet-manifest":
            return None
        v = 99 if damage == "version-new" else 0

        def ver(obj) -> bool:
            obj["version"] = v
            return True
        _rewrite(man, ver)
        t = man
    elif damage in ("mesh-world", "mesh-rank", "unit-renamed", "unit-missing"):
        if t.suffix != ".json" or not _fsdp_edit(case, t, damage):
            return None
    elif damage == "isdir":  # root reads any file whatever its mode: a folder where the file should be is what fails
        t.unlink()
        t.mkdir()
    return arg, str(t)


def commands(kind: Kind, damage: str, arg: Path, out: Path, all_commands: bool) -> list[list[str]]:
    a = str(arg)
    if damage in FLAGS:
        return [[{"RUN": a, "ORIG": str(kind.src), "OUT": str(out / "flag")}.get(w, w) for w in FLAGS[damage][0]]]
    flags = {"steps-out": ["--steps", "90:95"], "steps-reversed": ["--steps", "5:3"]}.get(damage, [])
    if kind.name in ("layerwise", "layer-csv"):
        return [["sgd", a, "--workers", "1,4", "--net", "10gbe"], ["sgd", "--json", a, "--workers", "1,4", "--net", "10gbe"]]
    base = [["analyze", "--json", *flags, a]]
    if not all_commands:
        return base
    orig = str(kind.src)
    more = [["replay", *flags, a, "-o", str(out / "replay")],
            ["replay", "--json", *flags, a, "-o", str(out / "replay")],
            ["replay", "--template", *flags, a, "-o", str(out / "template")],
            ["analyze", *flags, a],
            ["whatif", *flags, a, "--bandwidth", "1Gbit", "-o", str(out / "wb"), "--no-trace"],
            ["whatif", "--json", *flags, a, "--bandwidth", "1Gbit", "-o", str(out / "wb"), "--no-trace"],
            ["whatif", *flags, a, "--workers", "4", "-o", str(out / "ww"), "--no-trace"],
            ["whatif", "--json", *flags, a, "--workers", "4", "-o", str(out / "ww"), "--no-trace"],
            ["report", *flags, a, "-o", str(out / "report")],
            ["report", "--json", *flags, a, "-o", str(out / "report")],
            ["diff", orig, a, "-o", str(out / "diff")],
            ["diff", "--json", orig, a, "-o", str(out / "diff")]]
    if kind.ddp:
        more.append(["optimize", "--json", *flags, a, "--budget", "2", "-o", str(out / "opt")])
    return base + more


def run_cli(argv: list[str], out: Path, timeout: float) -> tuple[int | str, str, str]:
    """Run ``dagprof ARGV`` in a forked child; (exit status or "hang", stdout, stderr)."""
    out.mkdir(parents=True, exist_ok=True)
    so, se = out / "stdout", out / "stderr"
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            fd1, fd2 = os.open(so, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), os.open(se, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd1, 1)
            os.dup2(fd2, 2)
            from dagprof.cli.main import main
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc: int | str = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            rc = "hang"
            break
        time.sleep(0.05)
    return rc, so.read_text(errors="replace"), se.read_text(errors="replace")


def headline(stdout: str) -> float | None:
    try:
        obj = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except (json.JSONDecodeError, IndexError):
        obj = None
    if isinstance(obj, dict):
        for k in ("predicted_iter_ms", "measured_iter_ms"):
            if isinstance(obj.get(k), (int, float)):
                return obj[k]
        rows = obj.get("rows")
        if isinstance(rows, list) and rows and isinstance(rows[-1], dict):  # sgd: the largest worker count's iteration
            return rows[-1].get("iter_time_s")
    m = re.search(r"predicted[^\d-]*(-?[\d.]+)\s*ms", stdout)
    return float(m.group(1)) if m else None


def classify(kind: Kind, damage: str, rc, stdout: str, stderr: str, case: Path, clean: float | None) -> tuple[str, str]:
    err_lines = [x for x in stderr.splitlines() if x.strip()]
    if rc == "hang":
        return "hang", "bad"
    if "Traceback" in stderr or "Traceback" in stdout:
        return "traceback", "bad"
    if rc == 3:
        return "internal", "bad"
    if rc == 2:
        last = err_lines[-1] if err_lines else ""
        flag = damage in FLAGS and any(w.startswith("--") and w in last for w in FLAGS[damage][0] if w != "--json")
        names = str(case) in last or "/tmp/badinput" in last or "argument --" in last or flag  # a file, or the flag
        return ("refused", "good") if names and "error" in last else ("refused-vague", "bad")
    if rc != 0:
        return f"exit{rc}", "bad"
    if "non_finite" in stdout or re.search(r"\bnan\b|\binf\b", stdout.lower().replace("inference", "")):
        return "nonfinite", "bad"
    said = err_lines + [x for x in stdout.splitlines() if x.startswith("warning")]  # text output says its warnings first
    warned = any(re.search(r"warn|partial|dropped|skipped|ignored|refus", x, re.I) and re.search(r"\d", x) for x in said)
    try:
        obj = json.loads(stdout.strip().splitlines()[-1])
        if isinstance(obj, dict) and (obj.get("warnings") or obj.get("partial")):
            warned = True
    except (json.JSONDecodeError, IndexError):
        pass
    number = headline(stdout)
    same = number is None or clean is not None and abs(number - clean) <= 1e-3 * abs(clean)
    if warned:  # good when the number is right: the same as undamaged, or (good?) judged by hand
        return "warned", "good" if same else "good?"
    if must_flag(kind, damage):
        return "accepted", "bad"
    if damage in FLAGS:  # a what-if this kind takes (its answer is another setup's, no damaged one)
        return "accepted", "good"
    return "accepted", "good" if same else "good?"


def compare(before_json: str, after_json: str) -> None:
    """Counts of two audits' ``analyze --json``/``sgd`` rows by verdict, what changed and what is still not good.

    A ``warned`` row counts as warned only when its warnings differ from the undamaged fixture's (a standing warning of
    the fixture says nothing about the damage): otherwise it was ``accepted``."""
    def key(r):
        return r["kind"], r["damage"], r["argv"].split()[0], "--json" in r["argv"]

    def said(r):
        root = r["file"].split(f"/{r['kind']}/{r['damage']}")[0]
        try:
            return json.loads(Path(f"{root}/out/{r['kind']}/{r['damage']}/c0/stdout").read_text()).get("warnings")
        except (OSError, ValueError):
            return None

    def read(path):
        rows = [r for r in json.loads(Path(path).read_text()) if r["argv"].startswith(("analyze --json", "sgd")) or r["damage"] in FLAGS]
        clean = {r["kind"]: said(r) for r in rows if r["damage"] == "clean" and r["argv"].startswith("analyze")}
        for r in rows:
            if r["class"] == "warned" and r["argv"].startswith("analyze") and said(r) == clean.get(r["kind"]):
                must = must_flag(next(k for k in KINDS if k.name == r["kind"]), r["damage"])
                r["class"], r["verdict"] = "accepted", "bad" if must else r["verdict"]
        return {key(r): r for r in rows}
    b, a = read(before_json), read(after_json)
    common = sorted(set(b) & set(a))
    for name, rows in (("before", b), ("after", a)):
        got = [rows[k] for k in common]
        counts = {v: sum(r["verdict"] == v for r in got) for v in ("good", "good?", "bad")}
        classes = {c: sum(r["class"] == c for r in got if r["verdict"] != "good") for c in {r["class"] for r in got}}
        print(f"{name}: {len(got)} runs, {counts}; not good: { {c: n for c, n in classes.items() if n} }")
    for k in common:
        if a[k]["verdict"] != "good":
            print(f"  still {a[k]['verdict']}: {k[0]} {k[1]} {k[2]}{' --json' if k[3] else ''} ({a[k]['class']}, number {a[k]['number']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/badinput/cases")
    ap.add_argument("--kinds", default=",".join(k.name for k in KINDS))
    ap.add_argument("--damages", default=",".join(DAMAGES))
    ap.add_argument("--all-commands", action="store_true", help="every command (default: analyze --json)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", dest="json_out", help="write every row here")
    ap.add_argument("--src", default=str(REPO / "src"), help="the dagprof source to audit (e.g. an older commit's)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"), help="compare two audits' --json files")
    a = ap.parse_args()
    if a.compare:
        compare(*a.compare)
        return 0
    os.environ.setdefault("DAGPROF_CACHE_DIR", str(Path(a.out).parent / "cache"))
    sys.path.insert(0, a.src)
    import dagprof.cli.main  # noqa: F401  (imported once, before forking)
    root = Path(a.out)
    kinds = [k for k in KINDS if k.name in a.kinds.split(",")]
    rows = []
    counts: dict[str, int] = {}
    for kind in kinds:
        if not kind.src.exists():
            print(f"{kind.name}: {kind.src} missing, skipped")
            continue
        clean: dict[int, float | None] = {}  # the undamaged fixture's number per command
        for damage in a.damages.split(","):
            if kind.only and damage not in kind.only:
                continue
            made = make_case(kind, damage, root)
            if made is None:
                continue
            arg, damaged = made
            case = root / kind.name / damage
            refused_first = False
            for i, argv in enumerate(commands(kind, damage, arg, root / "out" / kind.name / damage, a.all_commands)):
                if refused_first and i > 1:
                    continue  # every command reads through the same readers: a refused input is checked on two of them
                rc, so, se = run_cli(argv, root / "out" / kind.name / damage / f"c{i}", a.timeout)
                refused_first = refused_first or (i == 0 and rc == 2)
                if damage == "clean":
                    clean[i] = headline(so)
                cls, verdict = classify(kind, damage, rc, so, se, case, clean.get(i))
                if damage == "clean":
                    cls, verdict = ("clean-ok", "good") if rc == 0 else (cls, "bad")
                last = [x for x in se.splitlines() if x.strip()][-1:] or [""]
                row = {"kind": kind.name, "damage": damage, "command": i, "argv": " ".join(argv[:2]), "rc": rc, "class": cls,
                       "verdict": verdict, "number": headline(so), "stderr": last[0][:300], "file": damaged}
                rows.append(row)
                counts[verdict] = counts.get(verdict, 0) + 1
                print(f"{kind.name:16} {damage:14} {row['argv']:22} rc={rc!s:4} {cls:13} {verdict:5} "
                      f"{row['number'] if row['number'] is not None else '':<10} {row['stderr'][:160]}", flush=True)
    print(json.dumps(counts))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
