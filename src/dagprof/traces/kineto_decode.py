"""Bytes -> typed Kineto structs: fast when the file is regular, tolerant when it is not.

The typed ``msgspec`` decode skips every field dagprof does not read, in C, and checks the
bounds of every number it keeps (``kineto_schema``). A file that fails it is decoded again,
from the fastest decode that can succeed to the slowest:

1. the same structs with numbers written as strings accepted (TraceLens/ROCm, vLLM and
   SGLang traces write ``"bytes": "1"``), still one pass in C;
2. generic JSON, converted to the structs in one C call;
3. event by event: a value of a foreign type is converted when it means the same thing
   (``"7"`` -> 7, ``7`` -> ``"7"``, ``2.0`` -> 2) and dropped otherwise; an event whose time
   cannot be read is dropped and counted (``Trace.notes``).

Bytes that are not UTF-8 (a stray byte in a name) become U+FFFD, also noted.

Kineto's first JSON (PyTorch 1.8), a bare list of events, is read too. Whatever cannot be
read at all is a ``DagprofError`` naming the file: never another exception.
"""
from __future__ import annotations

import math
from typing import Any

import msgspec

from ..errors import DagprofError
from . import kineto_schema as ks
from .kineto_schema import raw_value

_EVENT_FIELDS = {f: ks.Event.__struct_encode_fields__[i] for i, f in enumerate(ks.Event.__struct_fields__)}
_ARG_FIELDS = {f: ks.Args.__struct_encode_fields__[i] for i, f in enumerate(ks.Args.__struct_fields__)}
_RAW_TOP = ("distributedInfo", "schemaVersion", "deviceProperties")
_MAX_RANKS = 1 << 20  # a rank or world size beyond this is not a real job (and would size arrays by it)
_PROFILER_MARKS = ("PyTorch Profiler", "Iteration Start: PyTorch Profiler")


def decode_trace(data: bytes, path: str) -> ks.Trace:
    """A Kineto trace, checked to be one; ``DagprofError`` for anything else."""
    try:
        trace = ks.TRACE_DECODER.decode(data)
    except msgspec.ValidationError:
        trace = _tolerant(data, path)
    except msgspec.DecodeError as e:
        if "UTF-8" not in str(e):
            raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
        return _text_replaced(data, path)
    if not all(_is_text(getattr(trace, key)) for key in _RAW_TOP):  # kept raw by the typed decode: not yet checked
        return _text_replaced(data, path)
    if trace.traceEvents is None:
        raise DagprofError("not a Kineto trace: no 'traceEvents' list", path)
    if not (len(trace.schemaVersion) or len(trace.distributedInfo) or len(trace.deviceProperties) or _profiler_marked(trace)
            or _profiler_events(trace)):
        raise DagprofError("not a Kineto trace: no schemaVersion, distributedInfo or deviceProperties", path)
    if not any(e.ph == "X" and e.cat not in ks.SKIP_CATS and type(e.pid) is int for e in trace.traceEvents):
        raise DagprofError("no profiled ops in this trace (no complete events on a process)", path)  # stops at the first op
    if len(trace.distributedInfo):
        trace.distributedInfo = _distributed_info(trace.distributedInfo)
    return trace


def _is_text(raw: msgspec.Raw) -> bool:
    if not len(raw):
        return True
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return False
    return True


def _text_replaced(data: bytes, path: str) -> ks.Trace:
    """A stray byte that is not UTF-8 (in a name, say) becomes U+FFFD, and the trace is read."""
    fixed = data.decode("utf-8", "replace").encode()
    if fixed == data:
        raise DagprofError("not valid JSON text", path)
    trace = decode_trace(fixed, path)
    trace.notes.append("bytes that are not UTF-8 text replaced by U+FFFD")
    return trace


# ---------------------------------------------------------------- the tolerant path
def _tolerant(data: bytes, path: str) -> ks.Trace:
    try:
        return ks.LAX_DECODER.decode(data)
    except msgspec.ValidationError:
        pass
    if data.lstrip()[:1] == b"[":  # Kineto's first JSON: the events alone
        try:
            return ks.Trace(traceEvents=ks.EVENTS_DECODER.decode(data))
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass  # the generic decode below tells which
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise DagprofError(f"not a Kineto trace: the top level is a {type(doc).__name__}, not an object", path)
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise DagprofError("not a Kineto trace: no 'traceEvents' list", path)
    top = {k: msgspec.Raw(msgspec.json.encode(doc[k])) for k in _RAW_TOP if k in doc and doc[k] is not None}
    base = _int(doc.get("baseTimeNanoseconds"), 2**62)
    host = doc.get("host_name")
    try:
        out = msgspec.convert(events, list[ks.Event], strict=False)
        notes = []
    except msgspec.ValidationError:
        out, notes = _events(events)
    return ks.Trace(traceEvents=out, baseTimeNanoseconds=base, host_name=_str(host) or "", notes=notes, **top)


def _events(events: list[Any]) -> tuple[list[ks.Event], list[str]]:
    out = []
    bad = 0
    for e in events:
        try:
            out.append(msgspec.convert(e, ks.Event, strict=False))
            continue
        except msgspec.ValidationError:
            pass
        ev = _event(e) if isinstance(e, dict) else None
        if ev is None:
            bad += 1
        else:
            out.append(ev)
    notes = [f"{bad} of {len(events)} events unreadable (no valid ph, ts or dur): skipped"] if bad else []
    return out, notes


def _event(e: dict[str, Any]) -> ks.Event | None:
    """One event, field by field: what is meant is kept, what is foreign dropped; None without a usable time."""
    ts, dur = _float(e.get("ts", 0.0)), _float(e.get("dur", 0.0))
    ph = _str(e.get("ph", ""))
    if ts is None or dur is None or ph is None:
        return None
    args = e.get("args")
    return ks.Event(ph=ph, name=_str(e.get("name")) or "", cat=_str(e.get("cat")) or "",
                    pid=_id(e.get("pid")), tid=_id(e.get("tid")), ts=ts, dur=dur,
                    args=_args(args) if isinstance(args, dict) else None)


def _args(args: dict[str, Any]) -> ks.Args:
    clean = {}
    for field, key in _ARG_FIELDS.items():
        if key not in args:
            continue
        value = args[key]
        try:
            msgspec.convert({key: value}, ks.Args, strict=False)
        except msgspec.ValidationError:
            value = _coerce(value, ks.Args.__annotations__[field])
            if value is None:
                continue
        clean[key] = value
    try:
        return msgspec.convert(clean, ks.Args, strict=False)
    except msgspec.ValidationError:  # a combination no single field showed: keep nothing rather than guess
        return ks.Args()


def _coerce(value: Any, annotation: Any) -> Any:
    """A foreign value as the field's type when it means the same thing, else None (dropped)."""
    text = str(annotation)
    if "str" in text and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if "int" in text.lower():
        return _int(value, 2**53)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) and abs(x) <= 9e15 else None


def _int(value: Any, bound: int) -> int | None:
    x = _float(value)
    if x is None or x != int(x) or abs(x) > bound:
        return None
    return int(value) if isinstance(value, int) else int(x)


def _str(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _id(value: Any) -> int | str:
    """pid / tid: ints, or the names some writers use; anything else becomes its text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    x = _int(value, 2**63 - 1)
    return x if x is not None and not isinstance(value, str) else str(value)


# ---------------------------------------------------------------- checks the reader relies on
def _profiler_marked(trace: ks.Trace) -> bool:
    """A file without Kineto's top-level keys (its first JSON had none) is still one if torch.profiler marked it."""
    return any(e.name.startswith(_PROFILER_MARKS) for e in trace.traceEvents or () if e.cat == "Trace" or e.ph == "i")


def _profiler_events(trace: ks.Trace) -> bool:
    """An event list without Kineto's header (its first JSON): does it hold PyTorch profiler events?"""
    kinds = {"cpu_op", "kernel", "cuda_runtime", "user_annotation"}
    return any(e.ph == "X" and ks.OLD_CATS.get(e.cat, e.cat) in kinds for e in (trace.traceEvents or [])[:1000])


def _distributed_info(raw: msgspec.Raw) -> msgspec.Raw:
    """``distributedInfo`` with the fields the reader uses in their documented types (dropped when they cannot be)."""
    info = raw_value(raw)
    if not isinstance(info, dict):
        return msgspec.Raw()
    out = dict(info)
    for key in ("rank", "world_size"):
        if key in out:
            value = _int(out[key], _MAX_RANKS)
            if value is None or value < 0:
                del out[key]
            else:
                out[key] = value
    if "backend" in out:
        out["backend"] = _str(out["backend"]) or ""
    groups = out.get("pg_config")
    if groups is not None:
        out["pg_config"] = [_group(g) for g in groups if isinstance(g, dict) and "pg_name" in g] if isinstance(groups, list) else []
    return msgspec.Raw(msgspec.json.encode(out))


def _group(g: dict[str, Any]) -> dict[str, Any]:
    out = dict(g, pg_name=_str(g["pg_name"]) if _str(g["pg_name"]) is not None else msgspec.json.encode(g["pg_name"]).decode())
    ranks = [_int(r, _MAX_RANKS) for r in g.get("ranks") or []] if isinstance(g.get("ranks"), list) else []
    out["ranks"] = [r for r in ranks if r is not None and r >= 0]
    size = _int(g.get("pg_size", 0), _MAX_RANKS)
    out["pg_size"] = size if size is not None and size >= 0 else 0
    return out
