"""The few XPlane protobuf messages the profilers of TensorFlow and JAX write, decoded without protobuf.

Why hand-written: ``*.xplane.pb`` is a serialized ``tensorflow.profiler.XSpace``
(tsl/profiler/protobuf/xplane.proto, stable since 2020). Decoding it with the
protobuf runtime needs generated code whose version must match the runtime's, and
TensorFlow itself must never be imported by dagprof's core. The wire format of five
messages is a page of code; the bulk (events) is decoded straight into numpy columns
and the per-event stats are kept as byte ranges, decoded only for the few events a
reader asks about.

Schema (field numbers) as decoded here::

    XSpace       planes=1 errors=2 warnings=3 hostnames=4
    XPlane       id=1 name=2 lines=3 event_metadata=4 (map<int64, XEventMetadata>)
                 stat_metadata=5 (map<int64, XStatMetadata>) stats=6
    XLine        id=1 name=2 timestamp_ns=3 events=4 duration_ps=9 display_id=10 display_name=11
    XEvent       metadata_id=1 offset_ps=2 duration_ps=3 stats=4 num_occurrences=5
    XStat        metadata_id=1 double=2 uint64=3 int64=4 str=5 bytes=6 ref=7
    XEventMetadata  id=1 name=2 metadata=3 display_name=4 stats=5 child_id=6
    XStatMetadata   id=1 name=2 description=3

Times: an event starts at ``line.timestamp_ns * 1000 + offset_ps`` picoseconds; after
the profiler's normalisation ``timestamp_ns`` counts from the ``Task Environment``
plane's ``profile_start_time`` (Unix ns).
"""
from __future__ import annotations

import struct
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DagprofError

_DOUBLE = struct.Struct("<d")


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def fields(buf: bytes, pos: int, end: int):
    """(field number, wire type, value) of one message; length-delimited values as (start, stop)."""
    while pos < end:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 2:
            n, pos = _varint(buf, pos)
            val = (pos, pos + n)
            pos += n
        elif wt == 1:
            val = buf[pos:pos + 8]
            pos += 8
        elif wt == 5:
            val = buf[pos:pos + 4]
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wt}")
        if pos > end:
            raise WireError("field runs past the end of its message")
        yield num, wt, val


def _text(buf: bytes, span: tuple[int, int]) -> str:
    return buf[span[0]:span[1]].decode("utf-8", "replace")


@dataclass
class XLine:
    id: int
    name: str
    display_name: str
    timestamp_ns: int
    metadata_id: np.ndarray  # int64 per event
    offset_ps: np.ndarray  # int64
    duration_ps: np.ndarray  # int64
    stats_span: np.ndarray  # (n, 2) byte range of each event's stats in the file buffer; (0, 0) none


@dataclass
class XPlane:
    id: int
    name: str
    lines: list[XLine]
    event_names: dict[int, str]  # event metadata id -> name
    event_display: dict[int, str]  # event metadata id -> display name (TF: the op type)
    stat_names: dict[int, str]  # stat metadata id -> name
    stats: dict[str, Any]  # plane-level stats by name
    stat_ids: dict[str, list[int]] = field(default_factory=dict)  # stat name -> its metadata ids
    event_meta_stats: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # event metadata id -> its stats' byte ranges

    def __post_init__(self) -> None:
        for k, v in self.stat_names.items():
            self.stat_ids.setdefault(v, []).append(k)


@dataclass
class XSpace:
    planes: list[XPlane]
    hostnames: list[str]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    buf: bytes = b""  # the file, for lazy stat decoding

    def plane(self, name: str) -> XPlane | None:
        return next((p for p in self.planes if p.name == name), None)

    def event_stats(self, plane: XPlane, line: XLine, i: int) -> dict[str, Any]:
        """The stats of event ``i`` of ``line``, by stat name (ref values resolved to names)."""
        a, b = line.stats_span[i]
        return _stats(self.buf, int(a), int(b), plane.stat_names) if b > a else {}

    def metadata_stats(self, plane: XPlane, mid: int) -> dict[str, Any]:
        """The stats of event metadata ``mid`` (what holds for every event of it: JAX's ``Hlo Proto``), by name."""
        return dict(_stat(self.buf, s, e, plane.stat_names) for s, e in plane.event_meta_stats.get(mid, []))

    def int_stat(self, plane: XPlane, line: XLine, rows: np.ndarray, name: str) -> np.ndarray:
        """The integer stat ``name`` of events ``rows`` of ``line`` (``MISSING`` where absent), in bulk."""
        out = np.full(len(rows), MISSING, dtype=np.int64)
        ids = plane.stat_ids.get(name, [])
        if not ids or not len(rows):
            return out
        scan = _compiled()[1]
        data = self.buf if scan is _scan_int_stat else np.frombuffer(self.buf, dtype=np.uint8)
        spans = np.ascontiguousarray(line.stats_span[rows])
        for sid in ids:
            if scan(data, spans, sid, out) < 0:
                raise DagprofError("corrupt XPlane protobuf (malformed stat)")
        return out


def _stat(buf: bytes, start: int, stop: int, names: dict[int, str]) -> tuple[str, Any]:
    mid, val = 0, None
    for num, wt, v in fields(buf, start, stop):
        if num == 1:
            mid = v
        elif num == 2 and wt == 1:
            val = _DOUBLE.unpack(v)[0]
        elif num == 3:
            val = v
        elif num == 4:
            val = _signed(v)
        elif num == 5:
            val = _text(buf, v)
        elif num == 6:
            val = buf[v[0]:v[1]]
        elif num == 7:
            val = names.get(v, v)
    return names.get(mid, str(mid)), val


def _stats(buf: bytes, start: int, stop: int, names: dict[int, str]) -> dict[str, Any]:
    """A run of consecutive ``stats`` fields (tag 4 or 5 of the owner) -> {name: value}."""
    out = {}
    for _num, wt, v in fields(buf, start, stop):
        if wt == 2:
            k, val = _stat(buf, v[0], v[1], names)
            out[k] = val
    return out


_U63 = 0x7FFFFFFFFFFFFFFF


def _varint_at(buf: np.ndarray, pos: int, stop: int) -> tuple[int, int]:
    """(value as int64, next position) of the varint at ``pos``; next position -1 when it is malformed
    or runs past ``stop``. The one varint reader of the scanners: numba compiles it with them and inlines it."""
    v = 0
    shift = 0
    while True:
        if pos >= stop or shift > 63:
            return 0, -1
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if v > _U63:  # plain Python only: a negative int64 (numba wraps by itself)
        v = v - _U63 - _U63 - 2
    return v, pos


def _scan_line(buf: np.ndarray, start: int, stop: int, md: np.ndarray, off: np.ndarray, dur: np.ndarray,
               st: np.ndarray, hdr: np.ndarray, fill: bool) -> int:
    """The hot loop: count (``fill=False``) or decode every XEvent of one XLine.

    Calls only ``_varint_at``, so that numba compiles the two together and, should numba fail,
    the same functions run as plain Python. Stats are not decoded: their byte range is
    kept. ``hdr[f]`` receives the line's other fields: (value, -1) for varints, (start,
    stop) for bytes. Returns the event count, or -1 when the bytes are malformed. Every
    read is bounds-checked here: numba does not check indices.
    """
    n = 0
    pos = start
    while pos < stop:
        key, pos = _varint_at(buf, pos, stop)
        if pos < 0:
            return -1
        wt = key & 7
        num = key >> 3
        v = 0
        if wt == 0 or wt == 2:
            v, pos = _varint_at(buf, pos, stop)
            if pos < 0:
                return -1
        elif wt == 1 or wt == 5:
            pos += 8 if wt == 1 else 4
            continue
        else:
            return -1
        if wt == 0:
            if num < 32:
                hdr[num, 0] = v
                hdr[num, 1] = -1
            continue
        end = pos + v
        if v < 0 or end > stop:
            return -1
        if num != 4:
            if num < 32:
                hdr[num, 0] = pos
                hdr[num, 1] = end
            pos = end
            continue
        if fill:
            s0 = 0
            s1 = 0
            p = pos
            # This field walk and _scan_int_stat's stay inline on purpose: a shared field reader
            # (key, value, next position) cost 3-6 % of decoding even inlined by numba (measured).
            while p < end:
                kp = p
                k = buf[p]
                p += 1
                wt2 = k & 7
                x = 0
                if wt2 == 0 or wt2 == 2:
                    x, p = _varint_at(buf, p, end)
                    if p < 0:
                        return -1
                if k == 0x08:
                    md[n] = x
                elif k == 0x10:
                    off[n] = x
                elif k == 0x18:
                    dur[n] = x
                elif k == 0x22:  # a stat: keep the byte range of the run of stats
                    if x < 0:
                        return -1
                    if s1 == 0:
                        s0 = kp
                    p += x
                    s1 = p
                elif wt2 == 2:
                    if x < 0:
                        return -1
                    p += x
                elif wt2 == 1:
                    p += 8
                elif wt2 == 5:
                    p += 4
                elif wt2 != 0 or k >= 0x80:
                    return -1
            if p != end:
                return -1
            st[n, 0] = s0
            st[n, 1] = s1
        n += 1
        pos = end
    return n if pos == stop else -1


MISSING = -(2**63)  # int_stat's value for events without the stat


def _scan_int_stat(buf: np.ndarray, spans: np.ndarray, stat_id: int, out: np.ndarray) -> int:
    """For each stats byte range ``spans[i]``: the integer value (int64, uint64 or ref) of the
    stat whose metadata id is ``stat_id`` into ``out[i]`` (left as is when absent).
    Bounds-checked for numba, like ``_scan_line`` (the ranges come from it).
    Returns -1 on malformed bytes, else 0."""
    for i in range(spans.shape[0]):
        pos = spans[i, 0]
        stop = spans[i, 1]
        while pos < stop:
            if buf[pos] != 0x22:
                return -1
            ln, pos = _varint_at(buf, pos + 1, stop)
            if pos < 0:
                return -1
            end = pos + ln
            if ln < 0 or end > stop:
                return -1
            mid = -1
            val = 0
            has = False
            p = pos
            while p < end:
                k = buf[p]
                p += 1
                wt = k & 7
                x = 0
                if wt == 0 or wt == 2:
                    x, p = _varint_at(buf, p, end)
                    if p < 0:
                        return -1
                    if wt == 2:
                        if x < 0:
                            return -1
                        p += x
                elif wt == 1:
                    p += 8
                elif wt == 5:
                    p += 4
                else:
                    return -1
                if k == 0x08:
                    mid = x
                elif k == 0x18 or k == 0x20 or k == 0x38:
                    val = x
                    has = True
            if p != end:
                return -1
            if mid == stat_id and has:
                out[i] = val
            pos = end
    return 0


def _compiled() -> tuple:
    """(``_scan_line``, ``_scan_int_stat``) compiled by numba (cached on disk; they read a uint8
    array), else the plain functions (they read ``bytes``, whose items are Python ints)."""
    global _SCAN
    if _SCAN is None:
        try:
            from numba import njit  # noqa: PLC0415  (compiling costs ~2 s once; cached afterwards)

            jit = njit(cache=True, nogil=True)
            # the scanners' own copies see the compiled varint reader (numba cannot call a plain function);
            # inlined in numba's IR: as a call it cost ~2 % of decoding, inlined nothing (bench/bench_xplane.py)
            env = {**globals(), "_varint_at": njit(cache=True, nogil=True, inline="always")(_varint_at)}
            line, stat = (jit(types.FunctionType(f.__code__, env, f.__name__, f.__defaults__)) for f in (_scan_line, _scan_int_stat))
            # XEvent{metadata_id=5, stats=[XStat{metadata_id=1, int64=7}]} inside an XLine
            probe = np.frombuffer(bytes([0x22, 0x08, 0x08, 0x05, 0x22, 0x04, 0x08, 0x01, 0x20, 0x07]), dtype=np.uint8)
            md, st, got = np.zeros(1, np.int64), np.zeros((1, 2), np.int64), np.zeros(1, np.int64)
            ok = line(probe, 0, len(probe), md, md.copy(), md.copy(), st, np.zeros((32, 2), np.int64), True) == 1
            ok = ok and stat(probe, st, 1, got) == 0 and md[0] == 5 and got[0] == 7
            if not ok:
                raise RuntimeError("numba decoder gave a wrong answer")
            _SCAN = (line, stat)
        except Exception:  # noqa: BLE001  (a broken numba must not stop reading traces)
            _SCAN = (_scan_line, _scan_int_stat)
    return _SCAN


_SCAN: tuple | None = None


def _line(buf: bytes, arr: np.ndarray, start: int, stop: int) -> XLine:
    scan = _compiled()[0]
    data = buf if scan is _scan_line else arr
    hdr = np.zeros((32, 2), np.int64)
    empty = np.zeros(0, np.int64)
    n = scan(data, start, stop, empty, empty, empty, np.zeros((0, 2), np.int64), hdr, False)
    if n < 0:
        raise WireError("malformed XLine")
    md, off, dur = (np.zeros(n, np.int64) for _ in range(3))
    st = np.zeros((n, 2), np.int64)
    if scan(data, start, stop, md, off, dur, st, hdr, True) != n:
        raise WireError("malformed XEvent")

    def text(f: int) -> str:
        a, b = int(hdr[f, 0]), int(hdr[f, 1])
        return buf[a:b].decode("utf-8", "replace") if b > a else ""

    return XLine(int(hdr[1, 0]), text(2), text(11), int(hdr[3, 0]), md, off, dur, st)


def _map_entry(buf: bytes, start: int, stop: int) -> tuple[int, tuple[int, int] | None]:
    key, val = 0, None
    for num, _wt, v in fields(buf, start, stop):
        if num == 1:
            key = _signed(v)
        elif num == 2:
            val = v
    return key, val


def _plane(buf: bytes, arr: np.ndarray, start: int, stop: int) -> XPlane:
    pid, name = 0, ""
    line_spans, ev_meta, stat_meta, stat_spans = [], [], [], []
    for num, _wt, v in fields(buf, start, stop):
        if num == 3:
            line_spans.append(v)
        elif num == 4:
            ev_meta.append(v)
        elif num == 5:
            stat_meta.append(v)
        elif num == 6:
            stat_spans.append(v)
        elif num == 1:
            pid = _signed(v)
        elif num == 2:
            name = _text(buf, v)
    stat_names: dict[int, str] = {}
    for s, e in stat_meta:
        key, val = _map_entry(buf, s, e)
        if val is not None:
            stat_names[key] = next((_text(buf, x) for n, _w, x in fields(buf, *val) if n == 2), "")
    event_names: dict[int, str] = {}
    event_display: dict[int, str] = {}
    meta_stats: dict[int, list[tuple[int, int]]] = {}
    for s, e in ev_meta:
        key, val = _map_entry(buf, s, e)
        if val is None:
            continue
        for n, _w, x in fields(buf, *val):
            if n == 2:
                event_names[key] = _text(buf, x)
            elif n == 4:
                event_display[key] = _text(buf, x)
            elif n == 5:
                meta_stats.setdefault(key, []).append(x)
    stats = dict(_stat(buf, s, e, stat_names) for s, e in stat_spans)
    return XPlane(pid, name, [_line(buf, arr, s, e) for s, e in line_spans], event_names, event_display, stat_names, stats,
                  event_meta_stats=meta_stats)


def decode_xspace(buf: bytes, path: str = "") -> XSpace:
    """Decode a whole ``XSpace``; malformed bytes are a one-line ``DagprofError``."""
    planes, hosts, errors, warnings = [], [], [], []
    arr = np.frombuffer(buf, dtype=np.uint8)
    try:
        for num, wt, v in fields(buf, 0, len(buf)):
            if wt != 2:
                raise WireError(f"field {num} of XSpace has wire type {wt}")
            if num == 1:
                planes.append(_plane(buf, arr, *v))
            elif num == 4:
                hosts.append(_text(buf, v))
            elif num == 2:
                errors.append(_text(buf, v))
            elif num == 3:
                warnings.append(_text(buf, v))
    except (WireError, IndexError) as err:
        raise DagprofError(f"corrupt or truncated XPlane protobuf ({err or type(err).__name__})", path or None) from None
    return XSpace(planes, hosts, errors, warnings, buf)
