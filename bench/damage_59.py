"""Damages that ``damage_inputs``/``damage_more``/``damage_58`` do not make: a user's real mistakes and real corruption.

Of rank 1's file (or the single input): NUL bytes after the JSON (a crash after the file was preallocated), names in
Latin-1 (not UTF-8), ``ts`` written as strings, ``traceEvents`` nested one level deeper, every ``args`` empty, no
``distributedInfo``, ``deviceProperties`` of a GPU in a CPU trace, ``pid``/``tid`` as strings, steps numbered one on
(0 and 1 based ranks), one collective lasting 1e12 us, the step marker alone lasting 1e12 us, ``dur`` left out of
every fifth op. Of the folder: a README, ``.DS_Store``, ``Thumbs.db`` and macOS ``._`` files beside the ranks; rank
1's file again as ``rank1 (1).json`` (a copy the file manager named); dagprof's own outputs (``analyze --json``'s
answer, ``replay.trace.json``, ``report.html``, ``strategy.json``) in the folder, or given as the input. Of the output:
``-o`` an existing file, a read-only folder, a 64 KiB disk that fills. Flags: one worker, 1e30 bit/s, an unknown unit,
a step window reaching past the trace, a strategy or an nccl-tests folder where a link model is read, a strategy as a
topology, ``--link-from`` a calibration of another link, ``diff`` against another model's run, and ``sgd`` given the wrong file for each of its file flags::

    python bench/damage_59.py [--kinds ddp,fsdp] [--damages nul-tail] [--all-commands] [--json FILE] [--src DIR]
    python bench/damage_59.py --compare BEFORE.json AFTER.json

Output damages mount tmpfs folders (root) under ``--out`` and unmount them at the end.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_58 as d58  # noqa: E402  (its sweep, judge and table; damage_inputs' kinds, runner and classes)
import damage_inputs as di  # noqa: E402

DATA = di.DATA
STRATEGY = str(DATA / "strategy/v1.json")

FILE_DAMAGES = ["nul-tail", "latin1", "ts-strings", "nested-events", "empty-args", "no-distinfo", "devprops-nogpu",
                "tid-strings", "steps-plus1", "coll-dur-1e12", "step-dur-1e12", "no-dur"]
FOLDER_DAMAGES = ["stray-files", "appledouble", "dup-renamed", "own-outputs", "fed-analyze-json", "fed-replay-trace"]
OUT_DAMAGES = ["out-file", "out-readonly", "out-full"]
DAMAGES = FILE_DAMAGES + FOLDER_DAMAGES + OUT_DAMAGES

# another model's run of the same world size, for ``diff`` (a profile of another training)
OTHER = {"ddp": "ddp-fresh/accum", "fsdp": "fsdp/accum-root", "fsdp1": "fsdp/accum-root", "tf": "tf/fit", "jax": "tf-jax/mlp",
         "horovod": "horovod/text", "mxnet": "mxnet/user_lstm", "kineto-dir": "ddp-fresh/tutorial-noshapes"}

FLAGS = {
    "flag-workers1": (["whatif", "--json", "RUN", "--workers", "1", "--no-trace"], ("*",)),  # one rank: no communication
    "flag-bandwidth-1e30": (["whatif", "--json", "RUN", "--bandwidth", "1e30bit", "--no-trace"], ("*",)),  # a free link
    "flag-bandwidth-unit": (["whatif", "--json", "RUN", "--bandwidth", "10Gbaud", "--no-trace"], ()),
    "flag-steps-past": (["analyze", "--json", "--steps", "0:100000", "RUN"], ()),  # more steps asked than held: say so
    "flag-link-model-strategy": (["whatif", "--json", "RUN", "--link-model", STRATEGY, "--no-trace"], ()),
    "flag-link-model-nccl-dir": (["whatif", "--json", "RUN", "--link-model", str(DATA / "nccl-tests-lut/a100"), "--no-trace"], ()),
    "flag-topology-strategy": (["whatif", "--json", "RUN", "--topology", STRATEGY, "--no-trace"], ()),
    "flag-diff-other-model": (["diff", "--json", "OTHER", "RUN", "--no-report"], ()),
    # a calibration of another link (unshaped) given as the one the run was profiled on (1 Gbit/s): ddp only
    "flag-link-from-other": (["whatif", "--json", "RUN", "--link-from", str(DATA / "ddp-testbed/unshaped-overlap.json"),
                              "--link-to", str(DATA / "ddp-testbed/1gbit-overlap.json"), "--no-trace"], ()),
}

# sgd's file flags given the wrong file, on the layer-time kinds
SGD_FLAGS = {
    "sgd-osu-strategy": ["--osu", STRATEGY],
    "sgd-osu-kineto": ["--osu", str(DATA / "gloo-windows/same/rank-0.pt.trace.json.gz")],
    "sgd-link-model-log": ["--link-model", str(DATA / "bcaffe-k80-googlenet/tmp4comm.log")],
    "sgd-comm-log-kineto": ["--comm-log", str(DATA / "gloo-windows/same/rank-0.pt.trace.json.gz")],
    "sgd-comm-log-strategy": ["--comm-log", STRATEGY],
    "sgd-iter-time-neg": ["--iter-time-1", "-1"],
}

# an unchanged answer is right (the reader keeps to its own files, or reads the quirk as written); a one-line refusal
# naming the file is good too where marked in REFUSAL_OK
UNCHANGED = {"latin1", "ts-strings", "devprops-nogpu", "tid-strings", "stray-files", "appledouble", "own-outputs", "no-distinfo"}
REFUSAL_OK = {"nul-tail", "latin1", "ts-strings", "tid-strings", "no-distinfo"}
MUST_REFUSE_OR_WARN = set(DAMAGES) - UNCHANGED - {"empty-args"} | set(SGD_FLAGS)

_mounts: list[Path] = []


def _unmount_all() -> None:
    for m in reversed(_mounts):
        subprocess.run(["umount", "-l", str(m)], check=False, capture_output=True)
    _mounts.clear()


atexit.register(_unmount_all)


def _ev(obj):
    return d58._ev(obj)


def _ops(ev, cats=("cpu_op", "kernel")) -> list[dict]:
    return [e for e in d58._timed(ev) if e.get("ph") == "X" and e.get("cat") in cats]


def _edit(damage: str, obj) -> bool:
    """Change ``obj`` (a decoded rank file) in place; whether the damage applied."""
    ev = _ev(obj)
    if damage == "nested-events":
        if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
            return False
        obj["traceEvents"] = {"traceEvents": obj["traceEvents"]}
        return True
    if damage == "no-distinfo":
        return isinstance(obj, dict) and obj.pop("distributedInfo", None) is not None
    if damage == "devprops-nogpu":
        if not isinstance(obj, dict) or ev is None or obj.get("deviceProperties") or any(e.get("cat") == "kernel" for e in d58._timed(ev)):
            return False
        obj["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000,
                                    "computeMajor": 8, "computeMinor": 0, "numSms": 108}]
        return True
    if damage == "steps-plus1":
        if ev is not None:
            n = 0
            for e in ev:
                if d58.di.damage_more._is_step(e):
                    head, num = e["name"].split("#", 1)
                    if num.isdigit():
                        e["name"] = f"{head}#{int(num) + 1}"
                        n += 1
            return n > 0
        return bool(d58.shift_steps(obj, 1))
    if ev is None:
        return False
    if damage == "ts-strings":
        for e in d58._timed(ev):
            e["ts"] = repr(float(e["ts"]))
        return True
    if damage == "tid-strings":
        n = 0
        for e in ev:
            if isinstance(e, dict) and isinstance(e.get("tid"), int):
                e["pid"], e["tid"] = str(e.get("pid")), str(e["tid"])
                n += 1
        return n > 0
    if damage == "empty-args":
        n = 0
        for e in ev:
            if isinstance(e, dict) and isinstance(e.get("args"), dict) and e.get("ph") != "M":
                e["args"] = {}
                n += 1
        return n > 0
    if damage == "coll-dur-1e12":
        calls = [e for e in _ops(ev, ("cpu_op", "user_annotation", "kernel")) if any(k in str(e.get("name", "")) for k in d58._COLL)]
        if not calls:
            return False
        calls[len(calls) // 2]["dur"] = 1e12
        return True
    if damage == "step-dur-1e12":
        steps = [e for e in d58._timed(ev) if str(e.get("name", "")).startswith("ProfilerStep#")]
        if len(steps) < 2:
            return False
        steps[len(steps) // 2]["dur"] = 1e12
        return True
    if damage == "no-dur":
        ops = _ops(ev)
        for e in ops[::5]:
            e.pop("dur", None)
        return bool(ops)
    return False


def _rewrite_text(path: Path, change) -> bool:
    data, gz = di.damage_more._get(path)
    new = change(data)
    if new is None:
        return False
    di.damage_more._put(path, new, gz)
    return True


def _latin1(data: bytes) -> bytes | None:
    """Op names given a Latin-1 suffix: bytes that are not UTF-8 (a writer that encoded with the locale's code page)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    ev = _ev(obj)
    if ev is None:
        return None
    n = 0
    for e in _ops(ev, ("cpu_op",)):
        if not any(k in str(e.get("name", "")) for k in di.damage_more._KEEP):
            e["name"] = str(e["name"]) + " caf\u00e9"
            n += 1
    return json.dumps(obj, ensure_ascii=False).encode("latin-1", errors="replace") if n else None


def _outputs(kind: di.Kind, root: Path) -> Path | None:
    """dagprof's own outputs on the clean fixture (analyze --json's answer, replay's traces, the report), made once."""
    out = root / "_outputs" / kind.name
    if (out / "done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    made = di.make_case(kind, "clean", root / "_outputs_src")
    if made is None:
        return None
    arg = str(made[0])
    rc, so, _ = di.run_cli(["analyze", "--json", arg], out / "analyze", 300)
    if rc != 0:
        return None
    (out / "analyze.json").write_text(so)
    di.run_cli(["replay", arg, "-o", str(out)], out / "replay", 300)
    di.run_cli(["report", arg, "-o", str(out)], out / "report", 300)
    (out / "done").write_text("")
    return out


def make(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    """A damaged copy of ``kind``'s fixture (``damage`` one of this file's); its input path and the file damaged, or None."""
    copied = d58.clean_copy(kind, damage, root)
    if copied is None:
        return None
    case, arg = copied
    t = case / kind.target
    folder = case.is_dir() and not kind.src.is_file()
    if damage in FILE_DAMAGES:
        if not t.is_file() or t.name.endswith((".pb", ".pb.gz", ".log", ".csv")):
            return None
        if damage == "nul-tail":
            return (arg, str(t)) if _rewrite_text(t, lambda d: d + b"\0" * 4096) else None
        if damage == "latin1":
            return (arg, str(t)) if _rewrite_text(t, _latin1) else None
        obj, gz = di.damage_more._json(t)
        if obj is None or not _edit(damage, obj):
            return None
        di.damage_more._put(t, json.dumps(obj).encode(), gz)
        return arg, str(t)
    if damage in ("stray-files", "appledouble", "dup-renamed", "own-outputs"):
        if not folder:
            return None
        if damage == "stray-files":
            (case / "README.md").write_text("# run of 2026-12-06\nprofiled with dagprof profile\n")
            (case / "notes.txt").write_text("lr 0.1, batch 32\n")
            (case / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(2048))
            (case / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(512))
            return arg, str(case / ".DS_Store")
        if damage == "appledouble":  # what a copy to a FAT/exFAT stick from a Mac leaves beside every file
            for p in sorted(q for q in case.rglob("*") if q.is_file()):
                (p.parent / f"._{p.name}").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(4000))
            return arg, str(t.parent / f"._{t.name}")
        if damage == "dup-renamed":
            if not t.is_file():
                return None
            stem, dot, ext = t.name.partition(".")
            copy = t.with_name(f"{stem} (1){dot}{ext}")
            shutil.copy(t, copy)
            return arg, str(copy)
        outs = _outputs(kind, root)
        if outs is None:
            return None
        for p in sorted(outs.glob("*")):
            if p.is_file() and p.name != "done":
                shutil.copy(p, case / p.name)
        shutil.copy(STRATEGY, case / "strategy.json")
        return arg, str(case / "analyze.json")
    if damage in ("fed-analyze-json", "fed-replay-trace"):
        outs = _outputs(kind, root)
        name = "analyze.json" if damage == "fed-analyze-json" else "replay.trace.json"
        if outs is None or not (outs / name).is_file():
            return None
        if folder:  # the file given where the run folder was meant
            shutil.copy(outs / name, case / name)
            return case / name, str(case / name)
        shutil.copy(outs / name, t)  # the single input replaced by dagprof's own output, its name kept
        return arg, str(t)
    if damage in OUT_DAMAGES:
        out = root / "outs" / kind.name / damage
        subprocess.run(["umount", "-l", str(out)], check=False, capture_output=True)
        shutil.rmtree(out, ignore_errors=True)
        if damage == "out-file":
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("a file where the output folder was meant\n")
            return arg, str(out)
        out.mkdir(parents=True)
        opts = "ro,size=64k" if damage == "out-readonly" else "size=64k"
        if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(out)], capture_output=True).returncode != 0:
            return None
        _mounts.append(out)
        return arg, str(out)
    return None


def make_case(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    if damage in DAMAGES:
        if kind.name in ("layerwise", "layer-csv") and damage not in ("nul-tail", "latin1", "out-file", "out-full", "out-readonly"):
            return None
        if damage in ("nul-tail", "latin1") and kind.name in ("layerwise", "layer-csv"):
            made = make(di.Kind("x", kind.src, kind.target), "out-file", root)  # a plain copy
            if made is None:
                return None
            t = Path(made[0])
            data = t.read_bytes()
            t.write_bytes(data + b"\0" * 4096 if damage == "nul-tail" else data.replace(b"\n", " caf\u00e9\n".encode("latin-1"), 3))
            return made[0], str(t)
        return make(kind, damage, root)
    if damage in SGD_FLAGS:
        if kind.name not in ("layerwise", "layer-csv"):
            return None
        return _make58(kind, "clean", root)
    if damage == "flag-diff-other-model" and kind.name not in OTHER or damage == "flag-link-from-other" and kind.name != "ddp":
        return None
    return _make58(kind, damage, root)


def commands(kind: di.Kind, damage: str, arg: Path, out: Path, all_commands: bool) -> list[list[str]]:
    a = str(arg)
    if damage in SGD_FLAGS:
        return [["sgd", "--json", a, "--workers", "1,4", "--net", "10gbe", *SGD_FLAGS[damage]]]
    if damage == "flag-diff-other-model":
        return [["diff", "--json", str(DATA / OTHER[kind.name]), a, "--no-report"]]
    if damage in OUT_DAMAGES:
        root = Path(out).parents[2]
        o = str(root / "outs" / kind.name / damage)
        if kind.name in ("layerwise", "layer-csv"):
            return [["sgd", "--json", a, "--workers", "1,4", "--net", "10gbe", "--svg", "--trace", "-o", o]]
        cmds = [["replay", "--json", a, "-o", o], ["report", "--json", a, "-o", o],
                ["whatif", "--json", a, "--bandwidth", "1Gbit", "-o", o]]
        if kind.ddp:
            cmds.append(["optimize", "--json", a, "--budget", "2", "-o", o])
        return cmds
    return _base_commands(kind, damage, arg, out, all_commands)


_base_commands, _make58, _judge58 = di.commands, d58.make_case, d58.judge  # what register() replaces, kept for the rest


def register() -> None:
    """Add this file's damages and flags to the tables ``damage_58``'s sweep and judge read."""
    d58.register()
    d58.FLAGS.update(FLAGS)
    di.FLAGS.update({k: v for k, v in FLAGS.items() if k not in di.FLAGS})
    di.MUST_REFUSE_OR_WARN |= MUST_REFUSE_OR_WARN
    d58.UNCHANGED |= UNCHANGED
    d58.make_case = make_case
    di.commands = commands


def judge(row: dict) -> dict:
    """``damage_58.judge``, and: a refusal naming the file is good where the quirk may be refused (REFUSAL_OK); a damage
    whose answer must stay the clean one and did not is bad; an unchanged output damage (nothing written) is bad."""
    row = _judge58(row)
    damage, cls = row["damage"], row["class"]
    files = [w for w in FLAGS.get(damage, ([],))[0] + SGD_FLAGS.get(damage, []) if w.startswith("/")]
    if cls == "refused-vague" and any(f in row["stderr"] for f in files) and "error" in row["stderr"]:
        row["class"], row["verdict"] = "refused", "good"  # the flag's file named
    if damage in REFUSAL_OK and cls == "refused":
        row["verdict"] = "good"
    if damage in UNCHANGED and damage not in REFUSAL_OK and cls.startswith("refused"):
        row["verdict"] = "bad"  # a stray file beside the ranks, or one the reader may read as written, refused
    if damage in OUT_DAMAGES and cls in ("accepted", "unread"):
        row["verdict"] = "bad"
    if damage == "flag-diff-other-model" and cls == "accepted":
        row["verdict"] = "good?"  # diff prints the share of ops matched (over 50 %: compared), judge it by hand
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/badinput59/cases")
    ap.add_argument("--kinds", help="default: every kind of damage_inputs and damage_58")
    ap.add_argument("--damages", default=",".join([*DAMAGES, *FLAGS, *SGD_FLAGS]))
    ap.add_argument("--all-commands", action="store_true")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--src", default=str(di.REPO / "src"))
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args()
    register()
    d58.judge = judge  # the sweep and --compare judge every row through it
    if a.compare:
        sys.argv = [sys.argv[0], "--compare", *a.compare]
        return d58.main()
    os.environ.setdefault("DAGPROF_CACHE_DIR", str(Path(a.out).parent / "cache"))
    sys.path.insert(0, a.src)
    import dagprof.cli.main  # noqa: F401  (imported once, before forking)
    names = a.kinds.split(",") if a.kinds else [k.name for k in di.KINDS]
    try:
        rows = d58.sweep([k for k in di.KINDS if k.name in names], a.damages.split(","), Path(a.out), a.all_commands,
                         a.timeout, a.json_out)
    finally:
        _unmount_all()
    print("\n".join(d58.table(rows)))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("good", "good?", "bad")}
    print(f"{len(rows)} runs {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
