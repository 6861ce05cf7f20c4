"""A reviewer's damages that ``damage_inputs``/``damage_more`` do not make, and the sweep that runs them all in one command.

Damages of rank 1's file (or the single input): one collective fewer than the other ranks (``coll-drop``), a clock
seconds off (``skew-sec``), a trace that stops mid-step in a well-formed file (``stop-mid``), zero-length ops
(``zero-dur``), events out of order (``shuffle``, a careful reader's answer is unchanged), empty op names, times past
float precision (``ts-huge``), negative and NaN start times, one op of a day (``dur-huge``), another step window
(``other-window``), the folder as links to the originals (``symlinks``, unchanged). Kinds beside ``damage_inputs``'s:
a one-rank Kineto trace and an inference trace (no backward, no collective). Flags: a mesh of 9 ranks on 4, a template
of one step, a zero link, negative workers. Prints one table damage x command -> outcome; ``--compare`` prints two
sweeps' tables side by side (before -> after)::

    python bench/damage_58.py [--kinds ddp,fsdp] [--damages coll-drop] [--all-commands] [--json FILE] [--src DIR]
    python bench/damage_58.py --compare BEFORE.json AFTER.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import damage_inputs as di  # noqa: E402  (the kinds, commands, fork runner and classes are shared)

DATA = di.DATA

DAMAGES = ["coll-drop", "skew-sec", "stop-mid", "zero-dur", "shuffle", "empty-names", "ts-huge", "neg-ts", "nan-ts",
           "dur-huge", "other-window", "symlinks"]

FLAGS = {
    "flag-mesh-3x3": (["whatif", "--json", "RUN", "--mesh", "3x3", "--no-trace"], ("fsdp", "hsdp")),  # FSDP2: a 9-rank what-if
    "flag-template-onestep": (["replay", "--json", "RUN", "--template", "--steps", "5", "-o", "OUT"], ("*",)),  # one step's mean: itself
    "flag-bandwidth0": (["whatif", "--json", "RUN", "--bandwidth", "0Gbit", "--no-trace"], ()),
    "flag-workers-neg": (["whatif", "--json", "RUN", "--workers", "-4", "--no-trace"], ()),
    "flag-workers4": (["whatif", "--json", "RUN", "--workers", "4", "--no-trace"], ("*",)),  # a what-if every kind may take
}

# an unchanged answer is right: the reader orders events, alignment takes a skew of seconds, a link is its file
UNCHANGED = {"shuffle", "symlinks", "skew-sec"}
MUST_REFUSE_OR_WARN = set(DAMAGES) - UNCHANGED - {"empty-names"}

KINDS = [
    di.Kind("kineto-1rank", DATA / "kineto-public/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
            "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
    di.Kind("inference", DATA / "kineto-corpus/tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
            "sglang_Qwen3-8B_decode.json.gz", only=("clean",)),
]

_COLL = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "broadcast", "alltoall", "SendRecv")


def _ev(obj) -> list | None:
    if isinstance(obj, dict):
        ev = obj.get("traceEvents", obj.get("events"))
        return ev if isinstance(ev, list) else None
    return obj if isinstance(obj, list) else None


def _timed(ev) -> list[dict]:
    return [e for e in ev if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))]


def _coll_drop(obj) -> bool:
    """Rank 1 lost one collective call (everything nested in the first one, and its kernels by correlation)."""
    ev = _ev(obj)
    if ev is not None:
        calls = [e for e in _timed(ev) if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
                 and any(k in str(e.get("name", "")) for k in _COLL) and isinstance(e.get("dur"), (int, float))]
        if not calls:
            return False
        c = max(calls, key=lambda e: e["dur"] if str(e["name"]).startswith(("c10d::", "nccl:", "gloo:")) else -1)
        lo, hi = c["ts"], c["ts"] + c["dur"]
        inside = [e for e in _timed(ev) if e.get("pid") == c.get("pid") and e.get("tid") == c.get("tid")
                  and lo <= e["ts"] <= hi and e["ts"] + (e.get("dur") or 0) <= hi]
        corr = {(e.get("args") or {}).get("correlation") for e in inside} - {None}
        drop = {id(e) for e in inside} | {id(e) for e in ev if isinstance(e, dict)
                                          and (e.get("args") or {}).get("correlation") in corr}
        ev[:] = [e for e in ev if id(e) not in drop]
        return True
    if isinstance(obj, dict) and obj.get("enqueues"):  # Horovod: [step, tensor, enqueued_ns, done_ns, bytes]
        obj["enqueues"] = obj["enqueues"][1:]
        return True
    if isinstance(obj, dict) and obj.get("records"):
        rec = obj["records"]
        for begin, codes in ((7, (7, 8, 9)), (16, (16, 17))):  # a DDP bucket's enqueue/issue/done, an FSDP call/return
            first = next((r for r in rec if r[0] == begin), None)
            if first is not None:
                key = (first[1], first[2])
                obj["records"] = [r for r in rec if not (r[0] in codes and (r[1], r[2]) == key)]
                return True
    return False


def _last_step_cut(obj) -> float | None:
    ev = _ev(obj)
    if ev is not None:
        steps = sorted((e for e in _timed(ev) if str(e.get("name", "")).startswith("ProfilerStep#")
                        and isinstance(e.get("dur"), (int, float))), key=lambda e: e["ts"])
        return steps[-1]["ts"] + steps[-1]["dur"] / 2 if steps else None
    rows = obj.get("step_times_ns") if isinstance(obj, dict) else None
    prof = set(obj.get("steps_profiled") or []) if isinstance(obj, dict) else set()
    rows = [r for r in rows or [] if not prof or r[0] in prof]
    return (rows[-1][1] + rows[-1][2]) / 2 if rows else None


def _stop_mid(obj) -> bool:
    """Rank 1 stopped half-way through its last step; its file is well formed (the profiler flushed what it had)."""
    if isinstance(obj, dict) and isinstance(obj.get("step_times_us"), dict) and len(obj["step_times_us"]) > 1:
        last = list(obj["step_times_us"])[-1]  # an XPlane rank's last step time never written
        del obj["step_times_us"][last]
        return True
    if isinstance(obj, dict) and obj.get("enqueues"):  # Horovod: its last step's second half never enqueued
        last = max(r[0] for r in obj["enqueues"])
        rows = [r for r in obj["enqueues"] if r[0] == last]
        obj["enqueues"] = [r for r in obj["enqueues"] if r not in rows[len(rows) // 2:]]
        return True
    cut = _last_step_cut(obj)
    if cut is None:
        return False
    ev = _ev(obj)
    if ev is not None:
        ev[:] = [e for e in ev if not (isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) and e["ts"] > cut)]
        for e in _timed(ev):
            if isinstance(e.get("dur"), (int, float)) and e["ts"] + e["dur"] > cut:
                e["dur"] = cut - e["ts"]
        return True
    obj["records"] = [r for r in obj.get("records", []) if r[3] <= cut]
    obj["step_times_ns"] = [r for r in obj["step_times_ns"] if r[2] <= cut]
    return True


def _zero_dur(obj) -> bool:
    """Every third op lasts nothing (kineto ``dur`` 0; a run's collectives done as they are issued)."""
    ev = _ev(obj)
    if ev is not None:
        ops = [e for e in _timed(ev) if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "kernel")]
        for e in ops[::3]:
            e["dur"] = 0
        return bool(ops)
    rec = obj.get("records") if isinstance(obj, dict) else None
    if not rec:
        return False
    issued = {(r[1], r[2]): r[3] for r in rec if r[0] == 8}
    n = 0
    for r in rec:
        if r[0] == 9 and (r[1], r[2]) in issued:
            r[3] = issued[(r[1], r[2])]
            n += 1
        elif r[0] == 5:  # a layer's backward ends as it begins
            r[3] = next((b[3] for b in rec if b[0] == 4 and (b[1], b[2]) == (r[1], r[2])), r[3])
            n += 1
    return n > 0


def _shuffle(obj) -> bool:
    ev = _ev(obj)
    rows = ev if ev is not None else (obj.get("records") if isinstance(obj, dict) else None)
    if not rows:
        return False
    random.Random(58).shuffle(rows)
    return True


def _empty_names(obj) -> bool:
    n = 0
    for e in _ev(obj) or []:
        if isinstance(e, dict) and e.get("cat") in ("cpu_op", "kernel") and not any(k in str(e.get("name", "")) for k in di.damage_more._KEEP):
            e["name"] = ""
            n += 1
    return n > 0


def _ts_huge(obj) -> bool:
    """Every start moved to 1e18 us: past float64's integer range a microsecond is no longer kept."""
    ev = _ev(obj)
    if ev is None:
        if isinstance(obj, dict) and obj.get("records"):
            for r in obj["records"]:
                r[3] += 9 * 10 ** 18 - 2 * 10 ** 18
            return True
        return False
    for e in _timed(ev):
        e["ts"] += 1e18
    return True


def _bad_ts(value) -> "callable":
    def edit(obj) -> bool:
        ev = _ev(obj)
        if ev is None:
            rec = obj.get("records") if isinstance(obj, dict) else None
            if not rec or value != "neg":
                return False
            for r in rec[10:13]:
                r[3] = -r[3]
            return True
        ops = [e for e in _timed(ev) if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "kernel")]
        for e in ops[len(ops) // 2:len(ops) // 2 + 3]:
            e["ts"] = -e["ts"] if value == "neg" else float("nan")
        return bool(ops)
    return edit


def _dur_huge(obj) -> bool:
    """One op inside a step lasts a day (its end written as a garbage time); nothing else moves."""
    ev = _ev(obj)
    if ev is None:
        return False
    ops = [e for e in _timed(ev) if e.get("ph") == "X" and e.get("cat") == "cpu_op"
           and not any(k in str(e.get("name", "")) for k in di.damage_more._KEEP)]  # a compute op, not a framework one
    if not ops:
        return False
    ops[len(ops) // 2]["dur"] = 86_400e6
    return True


def shift_steps(obj, k: int) -> bool | None:
    """A dagprof rank file's (or Horovod's, MXNet's) step numbers ``k`` later, its times unchanged; None where ``obj`` is
    none of those (a Kineto trace: its step markers are named, not numbered in fields)."""
    if isinstance(obj, dict) and isinstance(obj.get("step_times_us"), dict) and obj["step_times_us"]:
        obj["step_times_us"] = {str(int(s) + k): v for s, v in obj["step_times_us"].items()}
        obj["steps_profiled"] = [s + k for s in obj.get("steps_profiled") or []]
        return True
    if isinstance(obj, dict) and obj.get("enqueues"):
        for r in obj["enqueues"]:
            r[0] += k
        return True
    if not isinstance(obj, dict) or not obj.get("step_times_ns"):
        return None
    for r in obj["step_times_ns"]:
        r[0] += k
    for r in obj.get("records", []):
        if r[0] in (0, 1):
            r[1] += k
    if isinstance(obj.get("steps_profiled"), list):
        obj["steps_profiled"] = [s + k for s in obj["steps_profiled"]]
    return True


def _other_window(obj) -> bool:
    """Rank 1's steps are 3 later than the others' (its window began later), its times unchanged."""
    shifted = shift_steps(obj, 3)
    return di.damage_more._late(obj) if shifted is None else shifted


EDITS = {"coll-drop": _coll_drop, "skew-sec": lambda o: di.shift_epochs(o, 3e6) > 0, "stop-mid": _stop_mid,
         "zero-dur": _zero_dur, "shuffle": _shuffle, "empty-names": _empty_names, "ts-huge": _ts_huge,
         "neg-ts": _bad_ts("neg"), "nan-ts": _bad_ts("nan"), "dur-huge": _dur_huge, "other-window": _other_window}


def make(kind: di.Kind, damage: str, case: Path, t: Path, arg: Path) -> tuple[Path, str] | None:
    """Damage ``t`` in ``case`` (a copy); the input path and the file damaged, or None when the damage does not apply."""
    if damage == "symlinks":
        if not case.is_dir() or kind.src.is_file():
            return None
        for p in sorted(case.rglob("*")):
            if p.is_file() and not p.is_symlink():
                p.unlink()
                p.symlink_to(kind.src / p.relative_to(case))
        return arg, str(t)
    if damage == "zero-dur" and t.suffix == ".csv":  # a layer file of a warm-up: every layer 0 us
        lines = t.read_text().splitlines()
        t.write_text("\n".join([lines[0]] + [",".join([r.split(",")[0], "0", "0", *r.split(",")[3:4], "0"]) for r in lines[1:]])
                     + "\n")
        return arg, str(t)
    if not t.is_file() or t.name.endswith((".pb", ".pb.gz", ".log", ".csv")):
        return None
    obj, gz = di.damage_more._json(t)
    if obj is None or not EDITS[damage](obj):
        return None
    di.damage_more._put(t, json.dumps(obj, ensure_ascii=False).encode(), gz)
    return arg, str(t)


def clean_copy(kind: di.Kind, damage: str, root: Path) -> tuple[Path, Path] | None:
    """An undamaged copy of ``kind``'s fixture at ``root/KIND/DAMAGE``, to damage there: the case folder and the input path."""
    made = di.make_case(kind, "clean", root / "_copy")
    if made is None:
        return None
    case = root / kind.name / damage
    shutil.rmtree(case, ignore_errors=True)
    case.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(root / "_copy" / kind.name / "clean"), case)
    return case, case / Path(made[0]).relative_to(root / "_copy" / kind.name / "clean")


def make_case(kind: di.Kind, damage: str, root: Path) -> tuple[Path, str] | None:
    if damage not in DAMAGES:
        return di.make_case(kind, damage, root)
    copied = clean_copy(kind, damage, root)
    return None if copied is None else make(kind, damage, copied[0], copied[0] / kind.target, copied[1])


def register() -> None:
    """Add this file's kinds, damages and flags to ``damage_inputs``'s tables (its classifier then judges them)."""
    for k in KINDS:
        if k.name not in {x.name for x in di.KINDS}:
            di.KINDS.append(k)
    di.FLAGS.update({k: v for k, v in FLAGS.items() if k not in di.FLAGS})
    di.MUST_REFUSE_OR_WARN |= MUST_REFUSE_OR_WARN


SHORT = {"refused": "ok-ref", "warned": "ok-warn", "accepted": "acc", "clean-ok": "clean", "traceback": "TRACE",
         "internal": "INTERNAL", "hang": "HANG", "nonfinite": "NONFIN", "refused-vague": "vague", "unread": "same",
         "refused-model": "ok-model"}


def table(rows: list[dict], before: list[dict] | None = None) -> list[str]:
    """damage x command -> outcome, one line per (kind, damage): ``!`` marks a bad verdict, ``?`` one to judge by hand;
    with ``before``, a changed cell reads ``BEFORE>AFTER``."""
    def cells(rs: list[dict]) -> dict[tuple[str, str], dict[str, str]]:
        by: dict[tuple[str, str], dict[str, str]] = {}
        for r in rs:
            cell = SHORT.get(r["class"], r["class"]) + ("" if r["verdict"] == "good" else "!" if r["verdict"] == "bad" else "?")
            by.setdefault((r["kind"], r["damage"]), {})[r["argv"] + (" J" if r.get("json") else "")] = cell
        return by
    cmds = list(dict.fromkeys(r["argv"] + (" J" if r.get("json") else "") for r in rows))
    now, then = cells(rows), cells(before or [])
    width = 19 if before else 12
    out = [f"{'kind':14} {'damage':22} " + " ".join(f"{c[:width]:{width}}" for c in cmds)]
    for key, got in now.items():
        was = then.get(key, {})
        line = [got.get(c, "-") if was.get(c, got.get(c)) == got.get(c) else f"{was.get(c, '-')}>{got.get(c, '-')}" for c in cmds]
        out.append(f"{key[0]:14} {key[1]:22} " + " ".join(f"{x:{width}}" for x in line))
    return out


def judge(row: dict) -> dict:
    """``damage_inputs.classify``'s verdict, refined: a what-if every kind may take, an answer the damage left unchanged
    (``unread``: the part is read elsewhere, or not at all), and a damage whose answer had to stay the undamaged one."""
    damage, cls, number, ref = row["damage"], row["class"], row["number"], row["clean"]
    same = number is not None and ref is not None and abs(number - ref) <= 1e-3 * abs(ref)
    if damage in FLAGS:
        if cls == "accepted" and (row["kind"] in FLAGS[damage][1] or "*" in FLAGS[damage][1]):
            row["verdict"] = "good"
        elif cls == "refused-vague" and "not predicting:" in row["stderr"]:  # the what-if refused: its model misses the run
            row["class"], row["verdict"] = "refused-model", "good"
    elif cls == "accepted" and same and damage != "clean":
        row["class"], row["verdict"] = "unread", "good"
    elif damage in UNCHANGED and cls in ("accepted", "warned"):
        row["verdict"] = "good" if number is None or same else "bad"  # no number printed: nothing to judge
    return row


def sweep(kinds: list[di.Kind], damages: list[str], root: Path, all_commands: bool, timeout: float,
          json_out: str | None = None) -> list[dict]:
    """Run every command on each damage of each kind; the rows (written to ``json_out`` after each case, so a sweep cut
    short by its time limit keeps what it ran)."""
    rows = []
    for kind in kinds:
        if not kind.src.exists():
            continue
        clean: dict[int, float | None] = {}
        for damage in ["clean", *damages]:
            if kind.only and damage not in kind.only and damage != "clean" and damage not in FLAGS:
                continue
            made = make_case(kind, damage, root)
            if made is None:
                continue
            arg, damaged = made
            case = root / kind.name / damage
            argvs = di.commands(kind, damage, arg, root / "out" / kind.name / damage, all_commands)
            refused = False
            for i, argv in enumerate(argvs):
                if refused and i > 1:
                    continue
                rc, so, se = di.run_cli(argv, root / "out" / kind.name / damage / f"c{i}", timeout)
                refused = refused or (i == 0 and rc == 2)
                if damage == "clean":
                    clean[i] = di.headline(so)
                cls, verdict = di.classify(kind, damage, rc, so, se, case, clean.get(i))
                if damage == "clean":
                    cls, verdict = ("clean-ok", "good") if rc == 0 else (cls, "bad")
                last = [x for x in se.splitlines() if x.strip()][-1:] or [""]
                rows.append(judge({"kind": kind.name, "damage": damage, "argv": argv[0], "json": "--json" in argv, "rc": rc,
                                   "class": cls, "verdict": verdict, "number": di.headline(so), "clean": clean.get(i),
                                   "stderr": last[0][:300], "file": damaged}))
                cls, verdict = rows[-1]["class"], rows[-1]["verdict"]
                print(f"{kind.name:14} {damage:22} {argv[0]:8}{' J' if '--json' in argv else '  '} rc={rc!s:4} {cls:13} "
                      f"{verdict:5} {rows[-1]['number'] if rows[-1]['number'] is not None else '':<10} "
                      f"(clean {clean.get(i)}) {last[0][:150]}", flush=True)
            if json_out:
                Path(json_out).write_text(json.dumps(rows, indent=1))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/badinput58/cases")
    ap.add_argument("--kinds", help="default: every kind of damage_inputs and this file")
    ap.add_argument("--damages", default=",".join([*DAMAGES, *FLAGS]))
    ap.add_argument("--all-commands", action="store_true")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--src", default=str(di.REPO / "src"))
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args()
    register()
    if a.compare:
        before, after = ([judge(r) for r in json.loads(Path(p).read_text())] for p in a.compare)
        key = lambda r: (r["kind"], r["damage"], r["argv"], r["json"])  # noqa: E731
        b = {key(r): r for r in before}
        for r in after:
            old = b.get(key(r))
            if old is not None and (old["class"], old["verdict"]) != (r["class"], r["verdict"]):
                print(f"{r['kind']:14} {r['damage']:22} {r['argv']:8}{' J' if r['json'] else '  '} "
                      f"{old['class']}/{old['verdict']} -> {r['class']}/{r['verdict']}  {r['stderr'][:140]}")
        print("\n".join(table(after, before)))
        for name, rows in (("before", before), ("after", after)):
            counts = {v: sum(r["verdict"] == v for r in rows) for v in ("good", "good?", "bad")}
            print(f"{name}: {len(rows)} runs {counts}")
        return 0
    os.environ.setdefault("DAGPROF_CACHE_DIR", str(Path(a.out).parent / "cache"))
    sys.path.insert(0, a.src)
    import dagprof.cli.main  # noqa: F401  (imported once, before forking)
    names = a.kinds.split(",") if a.kinds else [k.name for k in di.KINDS]
    rows = sweep([k for k in di.KINDS if k.name in names], a.damages.split(","), Path(a.out), a.all_commands, a.timeout,
                 a.json_out)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
