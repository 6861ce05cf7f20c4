"""Bytes -> typed Kineto structs, a chunk of events at a time: fast when the file is regular,
tolerant per event when it is not.

The file is decoded as it is read and gunzipped, ``CHUNK_BYTES`` at a time (``TraceStream``): each
chunk of the event list, cut at an event boundary, is decoded by ``msgspec`` into structs that list
only the fields dagprof reads (unknown keys skipped in C, every kept number bounds-checked). So no
Python object per event outlives its chunk unless the reader keeps it, and the decompressed file
is never held whole. The top level (``kineto_schema.Head``) is decoded last, around the event list
(``_close``). A cut that lands inside a string or a nested value cannot decode (the chunk would end
inside it): the chunk then grows by the next piece. A trace that cannot be read this way is decoded
whole (``Reopened``), its top level first, which says what is wrong with it.

A chunk that fails the typed decode is decoded again, from the fastest decode that can succeed
to the slowest:

1. the same structs with numbers written as strings accepted (TraceLens/ROCm, vLLM and
   SGLang traces write ``"bytes": "1"``), still one pass in C;
2. event by event, each through 1., and an event that still fails field by field: a value of a
   foreign type is converted when it means the same thing (``"7"`` -> 7, ``7`` -> ``"7"``,
   ``2.0`` -> 2) and that field dropped otherwise; every other field of that event, and every
   other event, keeps all it has (argument lists, process groups, thread names). Counted in
   ``notes``.

A missing ``ts`` or ``dur`` decodes as NaN (``ks.NO_TIME``): the reader drops complete events without
a usable time, or longer than ``MAX_OP_US``, and ``finish()`` counts them: never read as 0 or clamped. Bytes that are not UTF-8
(a stray byte in a name) become U+FFFD, also noted.

Kineto's first JSON (PyTorch 1.8), a bare list of events, is read too. Whatever cannot be
read at all is a ``DagprofError`` naming the file: never another exception.
"""
from __future__ import annotations

import itertools
import math
import re
import secrets
from typing import Any, Callable, Iterable, Iterator

import msgspec

from ..errors import DagprofError
from ..fsutil import read_input, read_input_pieces
from . import kineto_schema as ks
from .kineto_schema import raw_value
from .meta import RunWarning

_ARG_FIELDS = {f: ks.Args.__struct_encode_fields__[i] for i, f in enumerate(ks.Args.__struct_fields__)}
_RAW_TOP = ("distributedInfo", "schemaVersion", "deviceProperties")
_MAX_RANKS = 1 << 20  # a rank or world size beyond this is not a real job (and would size arrays by it)
_PROFILER_MARKS = ("PyTorch Profiler", "Iteration Start: PyTorch Profiler")


CHUNK_BYTES = 1 << 20  # smaller than 8 MiB: less to page in (a sixth less CPU cold, a quarter less peak); no gain below
MAX_OP_US = 86_400e6  # one op longer than a day is a corrupt record, not a profile
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
_LEADING_WS = re.compile(rb"[ \t\r\n]*")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_TAIL_BYTES = 1 << 20  # what Kineto writes after the event list (log lines, device properties) is a few KB
_LIST_END = re.compile(rb"\}[ \t\r\n]*\]")  # a list whose last value is an object
_RAWS_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_ARG_FIELDS = tuple(f for f in ks.Args.__struct_fields__ if "Raw" in str(ks.Args.__annotations__[f]))
_RAW_ARGS = frozenset(k for f, k in _ARG_FIELDS.items() if "Raw" in str(ks.Args.__annotations__[f]))


_TOO_DEEP = "JSON nested too deeply to read (a damaged or hostile file)"  # as cli.main says of every other decoder


def open_trace(path: str) -> TraceStream:
    """A Kineto trace, decoded as its file is read: its events a chunk at a time (``chunks()``), then its top level
    (``head``). ``DagprofError`` from ``chunks()`` for anything else."""
    return TraceStream(path)


def _whole(data: bytes, path: str) -> TraceStream:
    """The trace decoded as one document: its top level through the event list, then the events a chunk at a time."""
    try:
        return _open(data, path)
    except RecursionError:
        raise DagprofError(_TOO_DEEP, path) from None


class Reopened(Exception):  # noqa: N818 (not an error: the reader starts again with .stream)
    """The streamed trace is not one whose event list can be read as it comes: the trace opened again, decoded whole."""

    def __init__(self, stream: TraceStream):
        super().__init__("reopened")
        self.stream = stream


def _open(data: bytes, path: str) -> TraceStream:
    at = _LEADING_WS.match(data).end()
    if data[at:at + 1] == b"[":  # Kineto's first JSON: the events alone
        end = len(data)
        while end > at and data[end - 1] in _WS:
            end -= 1
        head = ks.Head(traceEvents=msgspec.Raw(memoryview(data)[at:end]))
    else:
        try:
            try:
                head = ks.HEAD_DECODER.decode(data)
            except msgspec.ValidationError:  # (checked before the rest was parsed: the lax decode may find it broken)
                head = _lax_head(data, path)
        except msgspec.DecodeError as e:
            if "UTF-8" not in str(e):
                raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", path) from None
            return _text_replaced(data, path)
    if not all(_is_text(getattr(head, key)) for key in _RAW_TOP):  # kept raw by the typed decode: not yet checked
        return _text_replaced(data, path)
    if bytes(memoryview(head.traceEvents)[:1]) != b"[":
        raise DagprofError("not a Kineto trace: no 'traceEvents' list", path)
    return TraceStream(path, _typed_info(head))


def _typed_info(head: ks.Head) -> ks.Head:
    if len(head.distributedInfo):
        head.distributedInfo = _distributed_info(head.distributedInfo)
    return head


def _known(head: ks.Head | None) -> bool:
    return head is not None and bool(len(head.schemaVersion) or len(head.distributedInfo) or len(head.deviceProperties))


class TraceStream:
    """The events of one trace, decoded a chunk at a time; ``finish()`` after the last chunk checks the whole
    with what the reader found (its complete events, and those it dropped for their times).

    Streamed (no ``head`` given): the file is read and gunzipped a chunk at a time, and each chunk decoded as it
    comes, so the decompressed file is never held nor paged in whole (a fifth of a cold load). Where the event list
    ends is known only at the end of the file: a chunk decodes only if it lies inside the list (the list's ``]``
    would close the chunk's own), and the top level is decoded last, around the list (``_close``). A trace that
    cannot be read this way (no event list near its start, a damaged event, a list that ends elsewhere) is read
    again whole (``Reopened``), which says what is wrong with it."""

    def __init__(self, path: str, head: ks.Head | None = None):
        self.head, self.path = head, path  # head: a streamed trace's, once its events are read
        self.notes: list[RunWarning] = []
        self._seen = self._repaired = self._unreadable = 0
        self._streamed = head is None
        self._known = _known(head)
        self._marked = self._profiler_cats = self._not_utf8 = False

    def chunks(self) -> Iterator[list[ks.Event]]:
        if self._streamed:
            yield from self._stream()
            return
        yield from self._cut(_slices((memoryview(self.head.traceEvents)[1:-1],)), len)  # inside the [ ]

    def _stream(self) -> Iterator[list[ks.Event]]:
        pieces = read_input_pieces(self.path, CHUNK_BYTES)
        try:
            before, m = b"", None
            for piece in pieces:  # the top level up to its event list's [
                before += piece
                if before.lstrip(_WS)[:1] not in (b"", b"{") or (m := _EVENTS_KEY.search(before)) or len(before) > _TAIL_BYTES:
                    break
            if m is None:
                self._unguess()
            start = m.end() - 1
            first, before = memoryview(before)[start + 1:], before[:start]
            try:  # the keys before the list: a trace that has them needs no profiler marks (``_checked``)
                self._known = _known(ks.HEAD_DECODER.decode(before + b"[]}"))
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                pass
            yield from self._cut(_slices(itertools.chain((first,), pieces)), lambda rest: self._close(before, rest))
        finally:
            pieces.close()

    def _cut(self, pieces: Iterator[bytes | memoryview], close: Callable[[bytes], int]) -> Iterator[list[ks.Event]]:
        """The events of a list read in ``pieces`` (from after its ``[``), decoded about ``CHUNK_BYTES`` at a time: a
        chunk ends at a piece's last event boundary, with no copy but its own. A cut inside a string or a nested value
        cannot decode (the chunk would end inside it): the chunk then grows by the next piece. A chunk that holds the
        list's end cannot decode either (that ``]`` closes the chunk's own, and more follows): what is left of the
        pieces then holds it, and ``close`` says where in that rest the list ends."""
        parts: list[bytes | memoryview] = []
        size = 0
        for piece in pieces:
            piece = memoryview(piece)
            parts.append(piece)
            size += len(piece)
            if size < CHUNK_BYTES or (m := _last_boundary(piece)) is None:
                continue
            try:
                events = self._events(b"".join((b"[", *parts[:-1], piece[:m.start() + 1], b"]")))
            except msgspec.DecodeError as e:
                if str(e).startswith("Input data was truncated"):  # the cut fell inside a value: grow
                    continue
                parts += pieces  # the list ends in this chunk (or it is damaged): the rest, to find where
                break
            parts, size = [piece[m.end() - 1:]], len(piece) - m.end() + 1
            yield self._checked(events)
        rest = b"".join(parts)
        end = close(rest)
        pos = _LEADING_WS.match(rest).end()
        while end > pos and rest[end - 1] in _WS:
            end -= 1
        if pos < end:
            try:
                events = self._events(b"".join((b"[", memoryview(rest)[pos:end], b"]")))
            except msgspec.DecodeError as e:
                self._unguess()
                raise DagprofError(f"not valid JSON, truncated or foreign file ({e})", self.path) from None
            yield self._checked(events)

    def _close(self, before: bytes, rest: bytes) -> int:
        """The streamed list's end in ``rest`` (what is left of the file once read, from an event's start)
        and the top level, decoded around the list (a tenth of the parse). The list ends at the leftmost ``]`` after
        an event's ``}`` after which the top level decodes with a random token as ``traceEvents``: a ``]`` inside the
        list leaves an unbalanced rest, the ones after it close later keys' lists (TraceLens's ``deviceProperties``).
        Read whole (``Reopened``) when none does; a wrong guess is found as the last events are decoded."""
        token = b'"dagprof:' + secrets.token_hex(16).encode() + b'"'
        view, found = memoryview(rest), None
        ends = [m.end() - 1 for m in _LIST_END.finditer(rest, max(0, len(rest) - _TAIL_BYTES))]
        for end in ends[:-17:-1]:  # decodes tried: a hostile run of "}]" costs 16, not one per bracket
            if found is not None and found[1] - end > _TAIL_BYTES // 16:
                break
            try:
                head = ks.HEAD_DECODER.decode(b"".join((before, token, view[end + 1:])))
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                continue
            if bytes(head.traceEvents) == token:
                found = (head, end)
        if found is None or not all(_is_text(getattr(found[0], key)) for key in _RAW_TOP):
            self._unguess()
        head, end = found
        head.traceEvents = msgspec.Raw()
        self.head = _typed_info(head)
        self._known = _known(head)
        return end

    def _unguess(self) -> None:
        """A streamed trace that cannot be read as it comes: read again, decoded whole (``Reopened``), which says what is
        wrong with it (its ``DagprofError``, a damaged file's before any other), or reads where the list really ends."""
        if self._streamed:
            raise Reopened(_whole(read_input(self.path), self.path))

    def finish(self, ops: int, untimed: int = 0, too_long: int = 0, python_calls: int = 0) -> None:
        """``ops``: complete events on a process with a usable time; ``untimed`` / ``too_long``: those dropped for it;
        ``python_calls``: Python-call events, which ``with_stack=True`` records and whose cost no stock trace measures."""
        path = self.path
        if not (self._known or self._marked or self._profiler_cats):
            raise DagprofError("not a Kineto trace: no schemaVersion, distributedInfo or deviceProperties", path)
        if not ops:
            raise DagprofError("no profiled ops in this trace (no complete events on a process)", path)
        if self._not_utf8:
            self.notes.append(RunWarning("bytes that are not UTF-8 text replaced by U+FFFD"))
        counted = [(self._repaired, "events had fields of a foreign type: converted, or that field dropped"),
                   (self._unreadable, "events unreadable (not an event object): skipped"),
                   (untimed, "complete events unreadable (no valid ts or dur: missing, negative or not a number): skipped"),
                   (too_long, f"events longer than {MAX_OP_US / 3.6e9:g} hours: skipped as corrupt")]
        self.notes += [RunWarning(what, n, self._seen) for n, what in counted if n]
        if python_calls:
            self.notes.append(RunWarning(
                f"{python_calls} Python-call events (recorded with with_stack=True or Python tracing): the profiler timed "
                "every Python call, which can make the traced steps several times the job's own, and predictions start "
                "from those op times; record without with_stack, or profile with dagprof, which measures its own cost"))

    @staticmethod
    def detach(events: list[ks.Event]) -> list[ks.Event]:
        """The events with their raw argument values copied out of the chunk: a decoded raw value is a view that
        would keep the chunk's whole buffer alive for as long as the reader keeps the event."""
        for e in events:
            a = e.args
            if a is not None:
                for f in _RAW_ARG_FIELDS:
                    raw = getattr(a, f)
                    if len(raw):
                        setattr(a, f, msgspec.Raw(bytes(raw)))
        return events

    def release(self) -> None:
        """Let the file's bytes go once the events are read: the header's raw values are views into them."""
        h = self.head
        self.head = ks.Head(distributedInfo=msgspec.Raw(bytes(h.distributedInfo)), baseTimeNanoseconds=h.baseTimeNanoseconds,
                            schemaVersion=msgspec.Raw(bytes(h.schemaVersion)), deviceProperties=msgspec.Raw(bytes(h.deviceProperties)),
                            host_name=h.host_name)

    def _events(self, chunk: bytes) -> list[ks.Event]:
        """``_decode``; a list nested deeper than the decoder goes is refused in one line, after a streamed trace is read
        whole (``_unguess``: a damaged file's own refusal comes first)."""
        try:
            return self._decode(chunk)
        except RecursionError:
            self._unguess()
            raise DagprofError(_TOO_DEEP, self.path) from None

    def _decode(self, piece: bytes) -> list[ks.Event]:
        try:
            return ks.EVENTS_DECODER.decode(piece)
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError as e:
            if "UTF-8" not in str(e):
                raise
            self._not_utf8 = True
            return self._decode(piece.decode("utf-8", "replace").encode())
        try:
            return ks.LAX_EVENTS_DECODER.decode(piece)
        except msgspec.ValidationError:
            pass
        out = []
        for raw in _RAWS_DECODER.decode(piece):
            try:
                out.append(ks.LAX_EVENT_DECODER.decode(raw))
                continue
            except msgspec.ValidationError:
                pass
            e = msgspec.json.decode(raw)
            if isinstance(e, dict) and not (isinstance(ph := e.get("ph"), str) and ph in ks.PHASES):
                out.append(ks.IGNORED)  # no phase, or one not in the format: nothing dagprof reads
                continue
            try:
                out.append(ks.LAX_EVENT_DECODER.decode(msgspec.json.encode(_event(e))))
                self._repaired += 1
            except (msgspec.ValidationError, TypeError):  # not an event object at all
                self._unreadable += 1
        return out

    def _checked(self, events: list[ks.Event]) -> list[ks.Event]:
        """The trace-wide checks, updated with one chunk."""
        if self._seen < 1000:
            self._profiler_cats = self._profiler_cats or _profiler_events(events[:1000 - self._seen])
        self._seen += len(events)
        if not (self._known or self._marked):
            self._marked = _profiler_marked(events)
        return events


def _slices(pieces: Iterable[bytes | memoryview]) -> Iterator[memoryview]:
    """The pieces cut into ``CHUNK_BYTES`` views (no copy)."""
    for piece in pieces:
        view = memoryview(piece)
        for i in range(0, len(view), CHUNK_BYTES):
            yield view[i:i + CHUNK_BYTES]


def _last_boundary(piece: memoryview) -> re.Match[bytes] | None:
    """The last event boundary in ``piece``, looked for near its end first."""
    for back in (1 << 14, len(piece)):
        found = [*_BOUNDARY.finditer(piece, max(0, len(piece) - back))]
        if found or back >= len(piece):
            return found[-1] if found else None
    return None


def _is_text(raw: msgspec.Raw) -> bool:
    if not len(raw):
        return True
    try:
        msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def _text_replaced(data: bytes, path: str) -> TraceStream:
    """A stray byte that is not UTF-8 (in a name, say) becomes U+FFFD, and the trace is read."""
    fixed = data.decode("utf-8", "replace").encode()
    if fixed == data:
        raise DagprofError("not valid JSON text", path)
    stream = _open(fixed, path)
    stream._not_utf8 = True
    return stream


# ---------------------------------------------------------------- the tolerant path
def _lax_head(data: bytes, path: str) -> ks.Head:
    """The top level when a key the reader uses has a foreign type: each converted when it means the same, else dropped."""
    try:
        doc = _TOP_DECODER.decode(data)
    except msgspec.ValidationError:
        kind = type(msgspec.json.decode(data)).__name__
        raise DagprofError(f"not a Kineto trace: the top level is a {kind}, not an object", path) from None
    top = {k: doc[k] for k in _RAW_TOP if k in doc and bytes(doc[k]) != b"null"}
    events = doc.get("traceEvents", msgspec.Raw())
    base = _int(raw_value(doc["baseTimeNanoseconds"]), 2**62) if "baseTimeNanoseconds" in doc else None
    host = _str(raw_value(doc["host_name"])) if "host_name" in doc else None
    return ks.Head(traceEvents=events, baseTimeNanoseconds=base, host_name=host or "", **top)


def _event(e: Any) -> dict[str, Any]:
    """One event, field by field: what is meant is kept, a foreign value dropped (a missing time drops the event later)."""
    if not isinstance(e, dict):
        raise TypeError("not an event object")
    out: dict[str, Any] = {}
    for key in ("ph", "name", "cat"):
        if _str(e.get(key)) is not None:
            out[key] = _str(e[key])
    for key in ("pid", "tid"):
        if key in e:
            out[key] = _id(e[key])
    for key in ("ts", "dur"):
        x = _float(e.get(key))
        if x is not None:
            out[key] = x
    if isinstance(e.get("args"), dict):
        out["args"] = _args(e["args"])
    return out


def _args(args: dict[str, Any]) -> dict[str, Any]:
    clean = {}
    for field, key in _ARG_FIELDS.items():
        if key not in args:
            continue
        value = args[key]
        if key not in _RAW_ARGS:
            try:
                ks.LAX_ARGS_DECODER.decode(msgspec.json.encode({key: value}))
            except (msgspec.ValidationError, msgspec.EncodeError, TypeError):
                value = _coerce(value, ks.Args.__annotations__[field])
                if value is None:
                    continue
        clean[key] = value
    return clean


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
def _profiler_marked(events: list[ks.Event]) -> bool:
    """A file without Kineto's top-level keys (its first JSON had none) is still one if torch.profiler marked it."""
    return any(e.name.startswith(_PROFILER_MARKS) for e in events
               if type(e) is ks.InstantEvent or (type(e) is ks.Event and e.cat == "Trace"))


def _profiler_events(events: list[ks.Event]) -> bool:
    """An event list without Kineto's header (its first JSON): does it hold PyTorch profiler events?"""
    kinds = {"cpu_op", "kernel", "cuda_runtime", "user_annotation"}
    return any(type(e) is ks.Event and ks.OLD_CATS.get(e.cat, e.cat) in kinds for e in events)


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
