"""More damages for ``bench/damage_inputs.py``: what users produce by hand, beyond a cut or a flipped number.

Encodings (a UTF-8 BOM, Windows line ends, a ``.gz`` name on plain JSON and the reverse), a second profiler session
written into the same file (its text appended, or its events appended an hour later), times in another unit,
a step of ten hours, one rank's window begun three steps late, a symbolic-link loop, a run folder left with only its
manifest, a world size a rank file or a manifest gets wrong, every event written twice, non-ASCII op names, another
job's rank file in the folder, and another run's traces of another world size beside the folder's own. Each is
made on the same case copy ``damage_inputs.make_case`` made; ``make`` says whether it applied.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"

DAMAGES = ["bom", "crlf", "gz-swapped", "concat", "two-sessions", "ns-us", "huge", "late-window", "symlink-loop",
           "manifest-only", "world-mismatch", "manifest-extra", "dup-events", "unicode", "mixed-job", "second-world"]

# wrong flags users type, in damage_inputs.FLAGS's form: a fraction of a rank, a rate past a float, NaN, an empty bucket
FLAGS = {
    "flag-workers-frac": (["whatif", "--json", "RUN", "--workers", "1.5", "--no-trace"], ()),
    "flag-bandwidth-huge": (["whatif", "--json", "RUN", "--bandwidth", "1e400Gbit", "--no-trace"], ()),
    "flag-latency-nan": (["whatif", "--json", "RUN", "--latency", "nan", "--no-trace"], ()),
    "flag-bucket0": (["whatif", "--json", "RUN", "--bucket-mb", "0", "--no-trace"], ()),
}

# left as they are by a careful writer's reader (an encoding, a name): an unchanged answer is right
MUST_REFUSE_OR_WARN = set(DAMAGES) - {"bom", "crlf", "gz-swapped", "unicode"}

HOUR_US = 3_600_000_000
HOUR_NS = HOUR_US * 1000

# another job of the same world size (another model): its rank-1 files, relative to DATA, and where they go
MIXED = {
    "ddp": {"ddp-fresh/accum/rank1.json": "rank1.json"},
    "kineto-dir": {next(iter(sorted((DATA / "ddp-fresh/tutorial-noshapes").glob("rank1.*")))).relative_to(DATA).as_posix():
                   "rank-1.pt.trace.json.gz"},
    "fsdp": {"fsdp/keep4/rank1.json": "rank1.json"},
    "fsdp1": {"fsdp/accum-root/rank1.json": "rank1.json"},
    "tf": {"tf/fit/rank1.json": "rank1.json", "tf/fit/rank1": "rank1"},
    "jax": {"tf-jax/mlp/rank1.json": "rank1.json", "tf-jax/mlp/rank1": "rank1"},
    "horovod": {"horovod/text/rank1.horovod.json": "rank1.horovod.json", "horovod/text/rank1.json": "rank1.json"},
    "mxnet": {"mxnet/user_lstm/worker1.json.gz": "worker1.json.gz"},
}


def _get(path: Path) -> tuple[bytes, bool]:
    raw = path.read_bytes()
    return (gzip.decompress(raw), True) if raw[:2] == b"\x1f\x8b" else (raw, False)


def _put(path: Path, data: bytes, gz: bool) -> None:
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def _json(path: Path):
    data, gz = _get(path)
    try:
        return json.loads(data), gz
    except ValueError:
        return None, gz


def _events(obj) -> list | None:
    if isinstance(obj, dict):
        ev = obj.get("traceEvents", obj.get("events"))
        return ev if isinstance(ev, list) else None
    return obj if isinstance(obj, list) else None


def _is_step(e) -> bool:
    return isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")


def _times(obj, scale, shift_after: float | None = None, shift: float = 0) -> int:
    """Scale every event's ``ts``/``dur`` (or a rank file's ns times), or shift those after ``shift_after``."""
    n = 0
    ev = _events(obj)
    if ev is not None:
        for e in ev:
            if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
                if shift_after is None:
                    e["ts"] = e["ts"] * scale
                    if isinstance(e.get("dur"), (int, float)):
                        e["dur"] = e["dur"] * scale
                elif e["ts"] > shift_after:
                    e["ts"] += shift
                n += 1
        return n
    if isinstance(obj, dict):
        for row in obj.get("step_times_ns", []):
            for i in (1, 2):
                if shift_after is None:
                    row[i] = int(row[i] * scale)
                elif row[i] > shift_after:
                    row[i] += shift
            n += 1
        for key in ("records", "enqueues"):
            for row in obj.get(key, []):
                if shift_after is None:
                    row[3] = int(row[3] * scale)
                elif row[3] > shift_after:
                    row[3] += shift
                n += 1
    return n


def _huge(obj) -> bool:
    """The middle step lasts ten hours more: everything after its start moves on (a rank that stalled)."""
    ev = _events(obj)
    if ev is not None:
        steps = sorted((e for e in ev if _is_step(e) and isinstance(e.get("dur"), (int, float))), key=lambda e: e["ts"])
        if len(steps) < 3:
            return False
        mid = steps[len(steps) // 2]
        cut = mid["ts"] + mid["dur"] / 2
        _times(obj, 1, cut, 10 * HOUR_US)
        mid["dur"] += 10 * HOUR_US
        return True
    rows = obj.get("step_times_ns") if isinstance(obj, dict) else None
    if not rows or len(rows) < 3:
        return False
    mid = rows[len(rows) // 2]
    cut = (mid[1] + mid[2]) / 2
    _times(obj, 1, cut, 10 * HOUR_NS)
    return True


def _late(obj) -> bool:
    """ProfilerStep#N read as #N+3: this rank's window began three steps after the others'."""
    ev = _events(obj)
    n = 0
    for e in ev or []:
        if _is_step(e):
            head, num = e["name"].split("#", 1)
            if num.isdigit():
                e["name"] = f"{head}#{int(num) + 3}"
                n += 1
    return n > 0


def _two_sessions(obj) -> bool:
    """The file holds a second session an hour later: its events appended (a profiler re-entered, one file kept)."""
    if isinstance(obj, list) and obj:  # a Horovod timeline: the second session's metadata too, its epoch an hour on
        again = json.loads(json.dumps(obj))
        for e in again:
            args = e.get("args") if isinstance(e, dict) else None
            if isinstance(args, dict) and "start_time_since_epoch_in_micros" in args:
                args["start_time_since_epoch_in_micros"] += HOUR_US
        obj.extend(again)
        return True
    ev = _events(obj)
    if ev:
        ev.extend(json.loads(json.dumps([e for e in ev if isinstance(e, dict) and "ts" in e])))
        _times({"traceEvents": ev[len(ev) // 2:]}, 1, float("-inf"), HOUR_US)
        return True
    if isinstance(obj, dict) and obj.get("records"):
        for key in ("step_times_ns", "records", "enqueues"):
            rows = obj.get(key) or []
            again = json.loads(json.dumps(rows))
            _times({key: again}, 1, float("-inf"), HOUR_NS)
            rows.extend(again)
        return True
    return False


def _world(obj, by: int) -> bool:
    if not isinstance(obj, dict):
        return False
    for holder in (obj.get("distributedInfo"), obj):
        if isinstance(holder, dict):
            for key in ("world_size", "size", "num_workers"):
                if isinstance(holder.get(key), int):
                    holder[key] += by
                    return True
    return False


_KEEP = ("all_reduce", "allreduce", "nccl", "gloo", "c10d", "ProfilerStep", "broadcast", "gather", "scatter", "send",
         "recv", "barrier", "Optimizer", "backward", "Backward", "autograd", "DistributedDataParallel", "record_param",
         "reducer")  # framework ops known by name (DDP's copy_bucket_to_grad is its wait): renamed, they are other ops


def _unicode(obj) -> bool:
    n = 0
    for e in _events(obj) or []:
        if isinstance(e, dict) and e.get("cat") == "cpu_op" and isinstance(e.get("name"), str) \
                and not any(k in e["name"] for k in _KEEP):
            e["name"] += " ünï✓😀\u202e"
            n += 1
    return n > 0


def make(kind, damage: str, case: Path, t: Path, arg: Path) -> tuple[Path, str] | None:
    """Damage ``t`` (rank 1's file in ``case``, or the single input) in place; the input path and the file, or None."""
    text_like = not t.name.endswith((".pb", ".pb.gz"))
    if damage in ("bom", "crlf", "concat") and t.is_file():
        data, gz = _get(t)
        if damage == "bom":
            if not text_like:
                return None
            data = b"\xef\xbb\xbf" + data
        elif damage == "crlf":
            if not text_like:
                return None
            if b"\n" not in data.strip():
                obj = json.loads(data)
                data = json.dumps(obj, indent=1).encode()
            data = data.replace(b"\n", b"\r\n")
        else:
            data = data + data
        _put(t, data, gz)
    elif damage == "gz-swapped":
        data, gz = _get(t)
        _put(t, data, not gz)
    elif damage in ("two-sessions", "ns-us", "huge", "late-window", "dup-events", "world-mismatch"):
        obj, gz = _json(t)
        if obj is None:
            return None
        if damage == "ns-us":
            # Kineto/Horovod/MXNet events in ns where us are meant; a dagprof rank file's ns times in us
            done = _times(obj, 1000 if _events(obj) is not None else 0.001) > 0
        elif damage == "dup-events":
            ev = _events(obj)
            rows = ev if ev else (obj.get("records") if isinstance(obj, dict) else None)
            done = bool(rows)
            if done:
                rows[:] = [r for r in rows for _ in (0, 1)]
        elif damage == "world-mismatch":
            done = _world(obj, 2)
        else:
            done = {"two-sessions": _two_sessions, "huge": _huge, "late-window": _late}[damage](obj)
        if not done:
            return None
        _put(t, json.dumps(obj).encode(), gz)
    elif damage == "unicode":
        files = [p for p in case.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))] \
            if case.is_dir() else [t]
        changed = False
        for p in files:
            obj, gz = _json(p)
            if obj is not None and _unicode(obj):
                _put(p, json.dumps(obj, ensure_ascii=False).encode(), gz)
                changed = True
        if t.suffix == ".csv":
            lines = t.read_text().splitlines()
            t.write_text("\n".join([lines[0]] + ["ü✓" + x for x in lines[1:]]) + "\n", encoding="utf-8")
            changed = True
        if not changed:
            return None
    elif damage == "symlink-loop":
        if not t.is_file():
            return None
        t.unlink()
        t.symlink_to(t.name)
    elif damage in ("manifest-only", "manifest-extra"):
        man = next((case / n for n in ("manifest.json", "mxnet-run.json") if (case / n).is_file()), None)
        if man is None:
            return None
        if damage == "manifest-only":
            for p in case.iterdir():
                if p != man:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        else:
            obj, gz = _json(man)
            if not _world(obj, 1):
                return None
            _put(man, json.dumps(obj).encode(), gz)
        t = man
    elif damage == "mixed-job":
        if kind.name not in MIXED:
            return None
        for src, dst in MIXED[kind.name].items():
            s, d = DATA / src, case / dst
            shutil.rmtree(d) if d.is_dir() else d.unlink(missing_ok=True)
            shutil.copytree(s, d) if s.is_dir() else shutil.copy(s, d)
    elif damage == "second-world":
        if not kind.named_by_content or not case.is_dir():
            return None
        other = DATA / ("hybrid-dp-tp" if kind.name != "hybrid-kineto" else "gloo-windows/same")
        for p in sorted(other.glob("*.pt.trace.json.gz")):
            shutil.copy(p, case / f"older-{p.name}")
    else:
        return None
    return arg, str(t)
