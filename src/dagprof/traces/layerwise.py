"""Layer-wise profiles: per-layer forward/backward time and gradient size, the input of the S-SGD DAG model.

Three sources give one ``LayerProfile`` (layers in FORWARD order, times in us):

1. dagprof's layer CSV (``read_layer_csv``)::

       # io_us=1200, h2d_us=300, update_us=5000, workers=8
       layer,forward_us,backward_us,grad_bytes,allreduce_us
       conv1,1000,2000,37888,404
       fc,300,650,4100096,8119

   Required columns: ``layer``, ``backward_us``, ``grad_bytes``; optional ``forward_us``
   and ``allreduce_us`` (measured all-reduce of that layer's gradient). Column order is
   free. Lines starting with ``#`` are comments; a comment made only of ``key=value``
   pairs (comma separated) sets per-iteration terms: ``io_us``, ``h2d_us``, ``update_us``,
   ``iter_us`` (a measured iteration on ``workers`` workers) and ``workers`` (the worker
   count ``allreduce_us``/``iter_us`` were measured at).

2. B-Caffe logs (``read_bcaffe_log``, S. Shi's ``distributed.cpp:112`` glog lines
   ``[id, size, compute_time, communication_time(, merged_time)]``): one line per blob,
   weight then bias of each layer; ``size`` is fp32 elements; ``compute_time`` is the
   BACKWARD time of the owning layer (same on weight and bias); communication is summed
   over the layer's blobs. A file may hold several dumps: the last one is used, and an
   all-zero dump (a warm-up) is refused. ``tmp8comm.log`` means 8 workers.

3. dagprof's own runs (``layer_profile_from_run``): FORWARD/BACKWARD events carrying
   ``layer``; per step sums, median over steps (the per-step tables kept for ``sgd.replay_jitter``).

``read_layer_file`` picks the reader from the path. Every malformed input raises
``DagprofError`` naming the file and the line.
"""
from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import DagprofError
from ..fsutil import missing, read_input
from . import formats
from .completeness import require_complete
from .dagprof_run import read_run
from .events import Kind, Run
from .profiling_mark import require_finished
from .steps import iteration_us


@dataclass(frozen=True)
class LayerMeta:
    """What a layer-wise reader or the S-SGD anchoring knows beyond the per-layer arrays."""

    blobs: int | None = None  # B-Caffe: blobs in the timed dump
    params: int | None = None  # B-Caffe: parameters counted from the dump
    first_line: int | None = None  # B-Caffe: the log line the timed dump starts at
    merged_groups: list[tuple[int, int, float]] | None = None  # B-Caffe's merged all-reduces (lo, hi, us); None: a 4-column log
    warnings: list[str] = field(default_factory=list)  # the reader's notes, shown to the user
    anchored: str | None = None  # sgd.predict: which part absorbed the measured single-worker iteration


@dataclass(frozen=True)
class LayerProfile:
    """One worker's iteration, layer by layer in forward order (times in us)."""

    names: list[str]
    backward_us: np.ndarray
    grad_bytes: np.ndarray  # int64
    forward_us: np.ndarray | None = None  # None: not recorded (B-Caffe logs)
    allreduce_us: np.ndarray | None = None  # measured per-layer all-reduce at ``workers``
    workers: int | None = None  # worker count of allreduce_us / iter_us
    io_us: float = 0.0
    h2d_us: float = 0.0
    update_us: float = 0.0
    iter_us: float | None = None  # a measured iteration time at ``workers``
    # per profiled step (dagprof runs only): steps x layers forward/backward times, and the update term per step
    step_forward_us: np.ndarray | None = None
    step_backward_us: np.ndarray | None = None
    step_update_us: np.ndarray | None = None
    source: str = ""
    meta: LayerMeta = field(default_factory=LayerMeta)

    def __post_init__(self) -> None:
        n = len(self.names)
        for name in ("backward_us", "grad_bytes", "forward_us", "allreduce_us"):
            arr = getattr(self, name)
            if arr is not None and np.shape(arr) != (n,):
                raise DagprofError(f"{name} has {np.shape(arr)} entries for {n} layers", self.source or None)
        steps = [a for a in (self.step_forward_us, self.step_backward_us) if a is not None]
        if steps and (any(a.ndim != 2 or a.shape[1] != n or a.shape != steps[0].shape for a in steps)
                      or self.step_update_us is None or np.shape(self.step_update_us) != (steps[0].shape[0],)):
            raise DagprofError(f"per-step times must be steps x {n} layers (forward, backward) and one update per step", self.source or None)
        if n == 0:
            raise DagprofError("no layers", self.source or None)

    @property
    def num_layers(self) -> int:
        return len(self.names)

    @property
    def params_bytes(self) -> int:
        return int(self.grad_bytes.sum())

    def forward_or_zero(self) -> np.ndarray:
        return np.zeros(self.num_layers) if self.forward_us is None else self.forward_us

    def with_(self, **changes) -> "LayerProfile":
        return replace(self, **changes)


# ---------------------------------------------------------------- CSV

_REQUIRED = ("layer", "backward_us", "grad_bytes")
_OPTIONAL = ("forward_us", "allreduce_us")
_SCALARS = {"io_us", "h2d_us", "update_us", "iter_us", "workers"}


def read_layer_csv(path: str | os.PathLike[str]) -> LayerProfile:
    path = os.fspath(path)
    scalars: dict[str, float] = {}
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    for lineno, line in _lines(path):
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            scalars.update(_key_values(text[1:], path, lineno))
            continue
        cells = next(csv.reader([text]))
        if header is None:
            header = [c.strip().lower() for c in cells]
            missing = [c for c in _REQUIRED if c not in header]
            unknown = [c for c in header if c not in _REQUIRED + _OPTIONAL]
            if missing or unknown:
                raise DagprofError(
                    f"line {lineno}: header needs {', '.join(_REQUIRED)} (optional {', '.join(_OPTIONAL)}); "
                    + (f"missing {', '.join(missing)}" if missing else f"unknown column {', '.join(unknown)}"),
                    path,
                )
            continue
        if len(cells) != len(header):
            raise DagprofError(f"line {lineno}: {len(cells)} cells, header has {len(header)}", path)
        rows.append((lineno, [c.strip() for c in cells]))
    if header is None or not rows:
        raise DagprofError("no layer rows (expected a header 'layer,forward_us,backward_us,grad_bytes[,allreduce_us]' and one row per layer)", path)
    col = {c: i for i, c in enumerate(header)}
    names = [r[col["layer"]] for _, r in rows]
    seen: dict[str, int] = {}
    for lineno, r in rows:
        name = r[col["layer"]]
        if not name or name in seen:
            raise DagprofError(f"line {lineno}: layer name {name!r} " + ("is empty" if not name else f"repeats line {seen[name]}"), path)
        seen[name] = lineno

    def column(name: str, integer: bool = False) -> np.ndarray | None:
        if name not in col:
            return None
        out = np.empty(len(rows), dtype=np.int64 if integer else np.float64)
        for k, (lineno, r) in enumerate(rows):
            out[k] = _number(r[col[name]], name, path, lineno, integer)
        return out

    workers = scalars.pop("workers", None)
    iter_us = scalars.pop("iter_us", None)
    if iter_us is not None and workers is None:  # read as nothing before: neither the anchor (1 worker) nor a check
        raise DagprofError("iter_us= needs workers= (the worker count it was measured on) in the same file", path)
    if workers == 0 or iter_us == 0:  # a count of no workers, an iteration of no time: nothing measured them
        raise DagprofError(f"{'workers' if workers == 0 else 'iter_us'}=0: a measured " +
                           ("worker count is at least 1" if workers == 0 else "iteration takes time"), path)
    forward, backward = column("forward_us"), column("backward_us")
    if not backward.any() and (forward is None or not forward.any()) and not any(scalars.values()):
        raise DagprofError(f"every layer's forward and backward time is 0 (lines {rows[0][0]}-{rows[-1][0]}), and no io, h2d or "
                           "update time: no computation to model (a warm-up's dump?)", path)
    return LayerProfile(
        names=names,
        forward_us=forward,
        backward_us=backward,
        grad_bytes=column("grad_bytes", integer=True),
        allreduce_us=column("allreduce_us"),
        workers=None if workers is None else int(workers),
        iter_us=iter_us,
        source=path,
        **scalars,
    )


def _key_values(text: str, path: str, lineno: int) -> dict[str, float]:
    """'io_us=1200, workers=8' -> values; a comment that is not all key=value pairs is prose."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(re.fullmatch(r"[A-Za-z_]\w*\s*=\s*\S+", p) for p in parts):
        return {}
    out = {}
    for p in parts:
        key, value = (s.strip() for s in p.split("=", 1))
        if key not in _SCALARS:
            raise DagprofError(f"line {lineno}: unknown setting {key!r}; known: {', '.join(sorted(_SCALARS))}", path)
        out[key] = _number(value, key, path, lineno, integer=key == "workers")
    return out


def _number(text: str, what: str, path: str, lineno: int, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise DagprofError(f"line {lineno}: {what} {text!r} is not {'an integer' if integer else 'a number'}", path) from None
    if integer and not 0 <= value < 2**53:  # counts go into int64 columns
        raise DagprofError(f"line {lineno}: {what} must be an integer from 0 to 2**53, got {text!r}", path)
    if not integer and not (np.isfinite(value) and 0 <= value <= 1e12):  # 1e12 us is 11 days: more is a damaged file
        raise DagprofError(f"line {lineno}: {what} must be a number from 0 to 1e12, got {text!r}", path)
    return value


def _lines(path: str) -> Iterator[tuple[int, str]]:
    formats.expect(path, ("layer-csv", "bcaffe"), "a layer file (a B-Caffe log or a layer CSV)")  # a Kineto trace read "cut short"
    try:
        text = read_input(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise DagprofError(f"cannot read: {err}", path) from None
    if "\0" in text:  # a crash after the file's blocks were allocated, or a binary file: read as "cut short" before
        raise DagprofError(f"{text.count(chr(0))} NUL bytes from character {text.index(chr(0))} on: the file was not written out "
                           "whole (a crash or a full disk), or is not a text file", path)
    if text.strip() and not text.endswith(("\n", "\r")):  # a file cut inside a row reads as a smaller model, every number valid
        raise DagprofError(f"line {text.count(chr(10)) + 1}, the last, has no end of line: the file was cut short "
                           "(if it is whole, end it with a newline)", path)
    return enumerate(io.StringIO(text, newline=None), start=1)  # universal newlines, as a text-mode file


# ---------------------------------------------------------------- B-Caffe

_BCAFFE = re.compile(r"distributed\.cpp:\d+\]\s*\[([^\]]*)\]")
_BCAFFE_WORKERS = re.compile(r"tmp(\d+)o?comm")


def read_bcaffe_log(path: str | os.PathLike[str], workers: int | None = None, blobs_per_layer: int = 2) -> LayerProfile:
    """The last non-warm-up dump of a B-Caffe layer-wise log; ``workers`` defaults to the digits in 'tmpNcomm'."""
    path = os.fspath(path)
    dumps: list[list[tuple[int, list[float]]]] = []
    for lineno, line in _lines(path):
        m = _BCAFFE.search(line)
        if not m:
            if line.strip():
                raise DagprofError(f"line {lineno}: not a B-Caffe 'distributed.cpp:112] [id, size, compute, comm(, merged)]' line", path)
            continue
        cells = [c.strip() for c in m.group(1).split(",")]
        if len(cells) not in (4, 5):
            raise DagprofError(f"line {lineno}: expected 4 or 5 values in [...], got {len(cells)}", path)
        values = [_number(c, ("id", "size", "compute_time", "communication_time", "merged_time")[i], path, lineno, integer=i < 2) for i, c in enumerate(cells)]
        blob = int(values[0])
        if blob == 0:
            dumps.append([])
        elif not dumps or blob != dumps[-1][-1][1][0] + 1:
            raise DagprofError(f"line {lineno}: blob id {blob} does not follow the previous line's id", path)
        dumps[-1].append((lineno, values))
    if not dumps:
        raise DagprofError("no B-Caffe 'distributed.cpp:112]' lines", path)
    dump = dumps[-1]
    first_line = dump[0][0]
    if len(dumps) > 1 and len(dump) < len(dumps[-2]):  # B-Caffe dumps every blob each time: a shorter last one was cut
        raise DagprofError(f"line {first_line}: the last dump has {len(dump)} blobs, the one before {len(dumps[-2])}: the log was cut short", path)
    if len(dump) % blobs_per_layer:
        raise DagprofError(f"line {first_line}: last dump has {len(dump)} blobs, not a multiple of {blobs_per_layer} per layer", path)
    a = np.array([v[:4] for _, v in dump])
    if not a[:, 2:].any():
        raise DagprofError(f"line {first_line}: the last dump is all zeros (a warm-up), no timed dump follows", path)
    per_layer = a.reshape(-1, blobs_per_layer, 4)
    compute = per_layer[:, :, 2]
    bad = np.flatnonzero(~np.all(compute == compute[:, :1], axis=1))
    if len(bad):
        raise DagprofError(f"line {dump[bad[0] * blobs_per_layer][0]}: blobs of one layer disagree on compute_time", path)
    if workers is None:
        m = _BCAFFE_WORKERS.search(Path(path).name)
        workers = int(m.group(1)) if m else None
    merged = np.array([v[4] if len(v) > 4 else 0.0 for _, v in dump])
    meta = LayerMeta(blobs=len(dump), params=int(a[:, 1].sum()), first_line=first_line,
                     merged_groups=_merged_groups(merged, blobs_per_layer) if merged.any() else None)
    return LayerProfile(
        names=[f"layer{i:02d}" for i in range(len(per_layer))],
        backward_us=compute[:, 0].copy(),
        grad_bytes=(per_layer[:, :, 1].sum(axis=1) * 4).astype(np.int64),
        allreduce_us=per_layer[:, :, 3].sum(axis=1),
        workers=workers,
        source=path,
        meta=meta,
    )


def _merged_groups(merged_us: np.ndarray, blobs_per_layer: int) -> list[tuple[int, int, float]]:
    """B-Caffe's merged all-reduces as layer groups ``(lo, hi, us)``, backward order.

    A blob with a merged time heads a message that also carries the higher blobs up to the
    next head (0 = merged away); it is sent when its own (lowest) layer's backward ends.
    Heads inside one layer are ready together and go back to back, so they add up.
    """
    heads = np.flatnonzero(merged_us)
    ends = np.append(heads[1:], len(merged_us))  # one past the last blob of each message
    groups: list[list] = []
    for h, e in zip(heads[::-1], ends[::-1]):
        lo, hi = int(h) // blobs_per_layer, (int(e) - 1) // blobs_per_layer + 1
        if groups and groups[-1][0] == lo:
            groups[-1][2] += float(merged_us[h])
        else:
            groups.append([lo, hi, float(merged_us[h])])
    return [(lo, hi, us) for lo, hi, us in groups]


# ---------------------------------------------------------------- dagprof runs


def layer_profile_from_run(run: Run, rank: int = 0) -> LayerProfile:
    """Median over profiled steps of each layer's summed FORWARD and BACKWARD time on ``rank``.

    The per-step tables are kept too (``sgd.replay_jitter`` draws workers' steps from them).
    Gradient bytes come from BACKWARD events' ``nbytes``; I/O from DATA events; ``update_us`` is the optimizer (UPDATE) plus every other serial
    main-thread gap (OTHER: zero_grad, loss, framework overhead), so one worker's model
    iteration is the measured step minus its communication calls and waits;
    ``iter_us`` from the step markers.
    """
    try:
        trace = run.rank(rank)
    except KeyError:
        raise DagprofError(f"run has no rank {rank}", run.source) from None
    ev = trace.events
    timed = (ev.step >= 0) & (ev.depth == 0)
    layered = timed & (ev.layer >= 0) & np.isin(ev.kind, [Kind.FORWARD, Kind.BACKWARD])
    if not layered.any():
        raise DagprofError("no per-layer FORWARD/BACKWARD events inside profiled steps (were the layer hooks on?)", trace.source)
    steps = np.unique(ev.step[layered])
    layers = np.unique(ev.layer[layered])
    first_fw = {int(l): float(ev.start[layered & (ev.layer == l)].min()) for l in layers}
    order = sorted(layers.tolist(), key=lambda l: first_fw[l])

    position = np.full(int(layers.max()) + 1, -1)
    position[order] = np.arange(len(order))

    def per_step_layer(kind: Kind) -> np.ndarray:
        m = layered & (ev.kind == kind)
        table = np.zeros((len(steps), len(order)))
        np.add.at(table, (np.searchsorted(steps, ev.step[m]), position[ev.layer[m]]), ev.dur[m])
        return table

    def per_step(*kinds: Kind) -> np.ndarray:
        m = timed & np.isin(ev.kind, kinds)
        sums = np.zeros(len(steps))
        keep = np.isin(ev.step[m], steps)
        np.add.at(sums, np.searchsorted(steps, ev.step[m][keep]), ev.dur[m][keep])
        return sums

    names = [trace.layers[l] for l in order]
    grad, warnings = _layer_grad_bytes(trace, layered & (ev.kind == Kind.BACKWARD), order)
    spans = trace.step_spans()
    forward, backward, update = per_step_layer(Kind.FORWARD), per_step_layer(Kind.BACKWARD), per_step(Kind.UPDATE, Kind.OTHER)
    return LayerProfile(
        names=names,
        forward_us=np.median(forward, axis=0),
        backward_us=np.median(backward, axis=0),
        grad_bytes=grad,
        workers=trace.world_size,
        io_us=float(np.median(per_step(Kind.DATA))),
        update_us=float(np.median(update)),
        iter_us=iteration_us(spans) if len(spans) else None,
        step_forward_us=forward,
        step_backward_us=backward,
        step_update_us=update,
        source=trace.source,
        meta=LayerMeta(warnings=warnings),
    )


def _layer_grad_bytes(trace, backward: np.ndarray, order: list[int]) -> tuple[np.ndarray, list[str]]:
    """Per-layer gradient bytes from the BACKWARD events' ``nbytes`` (the readers put them there)."""
    ev = trace.events
    grad = np.zeros(len(order), dtype=np.int64)
    for k, l in enumerate(order):
        nb = ev.nbytes[backward & (ev.layer == l)]
        grad[k] = int(nb.max()) if len(nb) else 0
    if grad.any():
        return grad, []
    return grad, ["the run records no per-layer gradient sizes: all-reduce sizes taken as 0"]


# ---------------------------------------------------------------- dispatch


def read_layer_file(path: str | os.PathLike[str]) -> LayerProfile:
    """A dagprof run folder, a B-Caffe log (any file with 'distributed.cpp:' lines) or a layer CSV."""
    path = os.fspath(path)
    if os.path.isdir(path):
        require_finished(path)
        return layer_profile_from_run(require_complete(read_run(path)))
    if not os.path.exists(path):
        raise missing(path, "file")
    for _, line in _lines(path):
        if line.strip():
            return read_bcaffe_log(path) if _BCAFFE.search(line) else read_layer_csv(path)
    raise DagprofError("empty layer file", path)
