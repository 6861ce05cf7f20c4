"""Bytes -> typed Kineto structs, fast when the file is regular and lenient when it is not.

The typed ``msgspec`` decode skips every field dagprof does not read, in C. A trace with a
field of an unexpected type (a string where ints are usual, say) fails that decode as a
whole, so it is retried field by field, dropping only the foreign values.
"""
from __future__ import annotations

import gzip
import zlib
from typing import Any

import msgspec

from ..errors import DagprofError
from . import kineto_schema as ks


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DagprofError(f"cannot read trace: {e.strerror or e}", path) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DagprofError(f"corrupt or truncated gzip ({e})", path) from None
    return data


def decode_trace(data: bytes, path: str) -> ks.Trace:
    try:
        return ks.TRACE_DECODER.decode(data)
    except msgspec.ValidationError:
        pass  # an unexpected field type somewhere: take the lenient path below
    except msgspec.DecodeError as e:
        raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
    if not isinstance(doc, dict):
        raise DagprofError("not a Kineto trace: top level is not an object", path)
    return _lenient(doc, path)


def _lenient(doc: dict[str, Any], path: str) -> ks.Trace:
    """Field by field conversion, dropping only the values whose type is foreign."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise DagprofError("not a Kineto trace: no 'traceEvents' list", path)
    out = []
    arg_fields = {f: ks.Args.__struct_encode_fields__[i] for i, f in enumerate(ks.Args.__struct_fields__)}
    for e in events:
        if not isinstance(e, dict):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        clean = {}
        for key in arg_fields.values():
            if key in args:
                try:
                    msgspec.convert({key: args[key]}, ks.Args, strict=False)
                    clean[key] = args[key]
                except msgspec.ValidationError:
                    pass
        base = {k: e[k] for k in ("ph", "name", "cat", "pid", "tid", "ts", "dur") if k in e}
        try:
            ev = msgspec.convert(base, ks.Event, strict=False)
        except msgspec.ValidationError:
            continue
        ev.args = msgspec.convert(clean, ks.Args, strict=False)  # "1" where 1 was expected: the lenient path converts
        out.append(ev)
    raw = {k: msgspec.Raw(msgspec.json.encode(doc[k])) for k in ("distributedInfo", "schemaVersion", "deviceProperties") if k in doc}
    base_ns = doc.get("baseTimeNanoseconds")
    return ks.Trace(traceEvents=out, baseTimeNanoseconds=base_ns if isinstance(base_ns, int) else None,
                    host_name=str(doc.get("host_name", "")), **raw)


def raw_value(value: msgspec.Raw) -> Any:
    """A lazily decoded field; None when the trace did not have it."""
    return msgspec.json.decode(value) if len(value) else None
