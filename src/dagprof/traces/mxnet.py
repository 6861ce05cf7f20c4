"""Reader of MXNet ``dist_sync`` parameter-server runs: mx.profiler Chrome traces of workers and servers.

A run folder (``collect/hooks/mxnet_ps.py`` writes one) holds ``mxnet-run.json`` (roles, keys with sizes and
layers, step times in epoch ns), ``worker<R>.json`` and ``server<K>.json``. mx.profiler writes absolute
epoch microseconds, so processes on one host share a clock (hosts with other clocks need aligning).

What the traces hold and how it is read (MXNet 1.9, CPU, ``MXNET_EXEC_BULK_EXEC_TRAIN=0``):
- worker operators run on the engine's ``cpu/0`` thread(s): forward ops by type (``Convolution``),
  backward ops as ``_backward_<type>``, ``CopyCPU2CPU`` (the pulled weights copied into the
  parameters), engine bookkeeping (``DeleteVariable``...). Each becomes a depth-0 event on its lane;
  layers come from the manifest: the q-th forward (and, in reverse, backward) op of a layer type
  in a step is the q-th such layer;
- ``KVStoreDistDefaultStoragePushPull`` on ``cpu pinned/``: one per key and step, from the push
  being issued to the pulled value's arrival. Many are in flight at once, so each goes on one of a
  few ``kvstore`` lanes (no two overlap on one lane). Nothing names the key, and their order is not
  the key order (several engine threads pick them up; the file lists them by completion), so the
  reader keeps them as one exchange per worker and step; ``MXKVStorePushPull`` C-API calls (one per
  key, in key order) go on the ``python`` lane, and so do the calls that hand the engine work (``FRONT_CALLS``: an
  operator, the backward pass, an array filled from numpy), the front end's own time between them;
- a row_sparse key (``gluon.contrib.nn.SparseEmbedding``): ``KVStoreDistRowSparsePush`` after the backward pass (part of
  the step's exchange, its ``MXKVStorePush`` call in key order with the others), and ``KVStoreDistRowSparsePull`` as the
  forward begins (its call ``MXKVStorePullRowSparse``), before that table's ``Embedding`` op; how many rows each carries
  is the manifest's (``PsRecord.rows``, the collector's count per step), the kvstore's own work beside them on its
  pinned-memory threads (``KVStoreUnique``...) is inside their time and dropped;
- servers log ``CopyCPU2CPU`` when a key's first push arrives, ``BinaryOpKernel`` when another is
  summed in (a compressed push: ``DequantizeCPU`` first, each worker's), then the updater's C API calls and ops
  (``*_update``, or a Python optimizer's many small ones), interleaved over keys: the reader keeps each server's busy time
  per step and its engine's part (``Run.meta.ps.server_busy``), which price the servers' work (``graph.build_ps.initial_link``, ``update_us``).
Keys go to servers as ps-lite does (``pslite_placement``); key sizes come from the manifest.
The manifest also holds each worker's CPU time per step, its process's (all threads) and its Python thread's (MXNet's
front end: dispatch, autograd, the Trainer, which the traces do not hold): ``PsRecord.cpu_us`` and ``main_cpu_us``, and
the process's outside the profiled window (``unprofiled_cpu_us``: what the profiler added, ``passes.profiler_cost``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Literal

import msgspec
import numpy as np

from ..errors import DagprofError
from ..fsutil import inside, read_input, read_versioned
from ..intervals import covered
from . import mxnet_mark
from .events import CommKind, CommRole, EventRows, Kind, Lane, LaneKind, RankTrace, Run, nested
from .formats import MXNET_MANIFEST as MANIFEST
from .meta import PsKey, PsRecord, RankMeta, RunMeta, RunWarning, ServerBusy
from .run_schema import CpuList, checked_cpu_set

FORMAT = "dagprof-mxnet-run"
VERSION = 2  # what each version changed: ``MxManifest``
# a row_sparse parameter (``gluon.contrib.nn.SparseEmbedding``) pushes the rows its gradient holds after the backward pass,
# and each forward pulls the batch's rows first (``row_sparse_pull``): the rows per step and key are the collector's (the
# trace does not count them)
ROW_SPARSE_PUSH, ROW_SPARSE_PULL = "KVStoreDistRowSparsePush", "KVStoreDistRowSparsePull"
# 2-bit gradient compression (``kv.set_gradient_compression({"type": "2bit"})``): the workers quantize each gradient
# (``QUANTIZE``, on their engine) and push it as ``COMPRESSED_PUSH``, 16 elements a 4-byte word; each part of a push also
# carries a meta ps-lite key (its original size, no values: the key and its 4-byte length)
COMPRESSED_PUSH, QUANTIZE = "KVStoreDistCompressedPush", "QuantizeCPU"
STOP_CALL = "MXKVStoreGetType"  # the collector's stop asks the kvstore's type just before it stops the profiler (``_check_window``)
EDGE_US = 2.0  # a trace's times are whole microseconds, the manifest's step times nanoseconds (``_check_window``)
KVSTORE = "KVStore"  # the kvstore's engine ops (pushes, pulls, their pinned-memory helpers) begin so
PUSHPULL = ("KVStoreDistDefaultStoragePushPull", "KVStoreDistDefaultPush", "KVStoreDistDefaultStoragePull", COMPRESSED_PUSH,
            ROW_SPARSE_PUSH)
PUSH_CALLS = ("MXKVStorePushPull", "MXKVStorePush")  # the Python thread's push calls, one per key and step, in key order
PULL_CALL = "MXKVStorePullRowSparse"  # a forward's row_sparse_pull
# the Python thread's calls that hand the engine work (``graph.build_ps`` chains them on a ``python`` lane: the front end's own
# time): an operator (an imperative one, or a hybridized block's graph), the backward pass, an array filled from numpy (the
# engine's ``WaitForVar`` runs inside it); calls that wait for the engine (``MXNDArrayWaitAll``...) are left out, their time is
# the engine's
FRONT_CALLS = ("MXImperativeInvokeEx", "MXInvokeCachedOp", "MXInvokeCachedOpEx", "MXAutogradBackwardEx", "MXNDArraySyncCopyFromCPU")
# a server's updater call: wall, process CPU, thread CPU, thread runnable, before and after (``MxManifest.server_updates``);
# len(collect.hooks.mxnet_ps.CLOCKS), which the collector keeps itself: it installs where MXNet's numpy is, importing no dagprof
UPDATE_CLOCKS = 4
PS_INDEX_BYTES = 8  # a row_sparse row travels with its ps-lite key (uint64)
COMPRESSION_FACTOR = 16
COMPRESSED_META_BYTES = PS_INDEX_BYTES + 4
# a server's ops as a push comes in: copied, summed in; a compressed push is first decompressed (each worker's, the sum's
# copy included: its bytes are the full values, priced per byte as the sums are)
DEQUANTIZE = "DequantizeCPU"
RECEIVED = ("CopyCPU2CPU", "BinaryOpKernel", "AccumulateRowSparseGrads", DEQUANTIZE)
# ops that never overlap themselves on a thread: no (de)quantize span began while another of its name was open on its thread
# in the 73 vendored traces (604 spans each; kvstore ops of one name do overlap, thousands of times), and their events carry
# no id, key or size to pair them by
SERIAL = (QUANTIZE, DEQUANTIZE)
# a segment of a hybridized block's graph run as one engine op (``static_alloc`` bulks even with
# MXNET_EXEC_BULK_EXEC_TRAIN=0): no layer, but forward before the step's backward began, backward after (a
# segment still running while the first gradients are pushed is backward, never work that waits for the pulls)
BULK = "ImperativeBulk"
_LAYER_OP = {"Conv2D": "Convolution", "Conv1D": "Convolution", "Conv3D": "Convolution", "Dense": "FullyConnected",
             "BatchNorm": "BatchNorm", "Embedding": "Embedding", "Conv2DTranspose": "Deconvolution", "LayerNorm": "LayerNorm",
             "InstanceNorm": "InstanceNorm", "GroupNorm": "GroupNorm", "GRU": "RNN", "LSTM": "RNN", "RNN": "RNN", "SparseEmbedding": "Embedding"}


def pslite_placement(key: int, elements: int, servers: int, bound: int) -> list[tuple[int, int]]:
    """(server, elements) parts of a key, as MXNet's dist kvstore encodes it for ps-lite: an array
    below ``bound`` elements goes whole to server ``key * 9973 % servers``; a larger one is cut
    evenly over all servers."""
    if servers < 1:
        raise DagprofError(f"parameter server needs >= 1 server, got {servers}")
    if elements < bound:
        return [((key * 9973) % servers, elements)]
    return [(s, elements * (s + 1) // servers - elements * s // servers) for s in range(servers)]


def compressed_parts(key: int, elements: int, servers: int, bound: int) -> list[tuple[int, int, int]]:
    """(server, 4-byte words pushed, elements pulled) parts of a 2-bit compressed key, as MXNet 1.9.1's
    ``KVStoreDist::EncodeCompressedKey`` cuts it: ceil(elements / 16) words, placed as ``pslite_placement`` places a key;
    a big one's words cut evenly (C's rounding) over every server, each part pulling 16 elements a word, the last the rest."""
    words = -(-elements // COMPRESSION_FACTOR)
    if elements < bound:
        return [(pslite_placement(key, elements, servers, bound)[0][0], words, elements)]
    cuts = [math.floor(words / servers * i + 0.5) for i in range(servers)] + [words]
    parts = [(s, cuts[s + 1] - cuts[s], (cuts[s + 1] - cuts[s]) * COMPRESSION_FACTOR) for s in range(servers)]
    return parts[:-1] + [(servers - 1, parts[-1][1], elements - sum(p[2] for p in parts[:-1]))]


def pslite_bytes(ps: PsRecord, key: PsKey, step: int, servers: int) -> list[tuple[int, float, float]]:
    """(server, bytes pushed, bytes pulled) of one worker's exchange of ``key`` in ``step``. A dense key goes as
    ``pslite_placement`` cuts it, 4 bytes an element both ways; 2-bit compressed (``PsRecord.compression``), its pushes
    carry ``compressed_parts``' words and each part's meta key (``COMPRESSED_META_BYTES``), its pulls the full values; a
    row_sparse key carries the rows the workers' gradients held in the step (their mean), ``row_bytes`` each, both ways,
    and a big one is cut as ps-lite cuts it, by row-id range: server ``s`` of ``S`` takes the rows in the ``s``-th ``S``-th
    of the table, counted from the ranges the collector recorded."""
    if not key.row_bytes and ps.compression:
        return [(s, 4.0 * w + COMPRESSED_META_BYTES, 4.0 * e) for s, w, e in compressed_parts(key.key, key.elements, servers, ps.bigarray_bound)]
    if not key.row_bytes:
        return [(s, 4.0 * e, 4.0 * e) for s, e in pslite_placement(key.key, key.elements, servers, ps.bigarray_bound)]
    mine = [r for st, _, k, r in ps.rows if k == key.key and st == step] or [r for _, _, k, r in ps.rows if k == key.key]
    if not mine:
        raise DagprofError(f"row_sparse key {key.key} ({key.name}) has no rows recorded")
    per_range = np.mean(np.asarray(mine, dtype=float), axis=0) * key.row_bytes
    if key.elements < ps.bigarray_bound:  # whole to the server ps-lite places it on
        whole = float(per_range.sum())
        return [(pslite_placement(key.key, key.elements, servers, ps.bigarray_bound)[0][0], whole, whole)]
    edges = np.concatenate([[0.0], np.cumsum(per_range)])  # bytes below each range's edge; a server's cut taken pro rata in a range
    cut = np.interp(np.arange(servers + 1) * len(per_range) / servers, np.arange(len(edges)), edges)
    return [(s, b, b) for s, b in enumerate(np.diff(cut).tolist())]


@dataclass
class _Op:
    name: str
    pid: int
    tid: int
    start: float  # epoch us
    end: float
    lane: str = ""


def _load(path: str) -> dict:
    try:
        doc = json.loads(read_input(path))
    except (ValueError, UnicodeDecodeError) as err:
        raise DagprofError(f"corrupt or truncated file (not valid JSON: {' '.join(str(err).split())[:120]})", path) from None
    if not isinstance(doc, dict):
        raise DagprofError("not an mx.profiler trace (top level is not an object)", path)
    return doc


def _ops(doc: dict, path: str, calls: tuple[str, ...] | None = (*PUSH_CALLS, PULL_CALL, *FRONT_CALLS)
         ) -> tuple[list[_Op], list[_Op], dict[int, str], list[tuple[float, str]]]:
    """Operator spans (B/E pairs, paired first-in first-out per pid, tid and name), the C-API spans (b/e) named in
    ``calls`` (None: every one), and the times and names of the kvstore ops' and ``SERIAL`` ops' begins and ends that pair
    with none (no vendored trace has one: a damaged or renamed event, whose span the pairing drops). A ``SERIAL`` begin
    that meets an open span of its name on its thread closes nothing: the open one lost its end, and is dropped."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise DagprofError("not an mx.profiler trace (no traceEvents list)", path)
    procs = {e.get("pid"): e.get("args", {}).get("name", "") for e in events if isinstance(e, dict) and e.get("ph") == "M"}
    if "operator" not in procs.values() and not any(isinstance(e, dict) and e.get("cat") == "operator" for e in events):
        raise DagprofError("not an mx.profiler trace (no operator events)", path)
    marks = []  # (ts, end?, key, event): paired in time order, as the trace format defines them, whatever the file's order
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph in ("B", "E") and e.get("cat") == "operator" or ph in ("b", "e") and e.get("cat") == "MXNET_C_API" and (calls is None or e.get("name") in calls):
            try:
                key = (ph in ("B", "E"), e["pid"], e["tid"], e["name"])
                ts = float(e["ts"])
            except (KeyError, TypeError, ValueError):
                raise DagprofError(f"event without pid/tid/name/ts: {str(e)[:80]}", path) from None
            if not abs(ts) < 2**53:  # NaN, infinite, or past the microseconds a double holds exactly
                raise DagprofError(f"event with a time that is no microsecond count (ts {e['ts']!r}): {str(e)[:80]}", path)
            marks.append((ts, ph in ("E", "e"), key, e))
    marks.sort(key=lambda m: m[:2])  # at one time a begin first: a zero-length span pairs with itself
    open_: dict[tuple, list] = {}
    ops, api, unpaired = [], [], []
    for ts, end, key, e in marks:
        if not end:
            if key[0] and key[3] in SERIAL and open_.get(key):  # its open one lost its end: each begin would take the next's
                unpaired.append((open_[key].pop(), key[3]))
            open_.setdefault(key, []).append(ts)
        elif open_.get(key):
            span = _Op(e["name"], e["pid"], e["tid"], open_[key].pop(0), ts)
            (ops if e["ph"] == "E" else api).append(span)
        elif key[0] and _counted(key[3]):
            unpaired.append((ts, key[3]))
    unpaired += [(ts, key[3]) for key, left in open_.items() if key[0] and _counted(key[3]) for ts in left]
    ops.sort(key=lambda o: o.start)
    api.sort(key=lambda o: o.start)
    spans = [(o.name, o.pid, o.tid, o.start, o.end) for o in ops if o.end > o.start]
    twice = len(spans) - len(set(spans))
    if twice:  # one thread runs one operator at a time: a span written twice is a file written twice, read before as more work
        raise DagprofError(f"{twice} operator spans appear twice (same name, thread, start and end): a file written twice, or "
                           "two profiler dumps merged", path)
    return ops, api, procs, unpaired


def _counted(name: str) -> bool:
    """An operator whose begins and ends that pair with none are counted (``_ops``): a kvstore op, or a ``SERIAL`` one."""
    return name.startswith(KVSTORE) or name in SERIAL


def _push_kind(name: str) -> CommKind:
    """A kvstore op's kind, from its name (``PUSHPULL``)."""
    return CommKind.PUSH_PULL if name.endswith("PushPull") else CommKind.PUSH if name.endswith("Push") else CommKind.PULL


def _kind(name: str) -> Kind:
    if name in PUSHPULL or name == ROW_SPARSE_PULL:
        return Kind.COMM
    if name.startswith("_backward_"):
        return Kind.BACKWARD
    if name == QUANTIZE:  # a compressed push's own work, no layer's forward
        return Kind.OTHER
    if name == "CopyCPU2CPU":
        return Kind.MEMCPY
    if name.endswith("_update"):
        return Kind.UPDATE
    if name in ("DeleteVariable", "WaitForVar", "SetValueOp", "_zeros_without_dtype", "_zeros", BULK):
        return Kind.OTHER
    return Kind.FORWARD


class MxKey(msgspec.Struct):
    """One kvstore key: a parameter, numbered as ``gluon.Trainer`` does (its parameters sorted by name)."""

    key: int
    nbytes: int
    elements: int
    name: str = ""
    shape: list[int] = []
    layer: str = ""  # the layer whose backward op produces the gradient (``MxLayer.name``)
    stype: str = "default"  # the weight's storage: ``row_sparse`` for a SparseEmbedding's, pulled by rows
    grad_stype: str = "default"  # the gradient's: ``row_sparse`` pushes only its rows (``MxManifest.rows``)


class MxLayer(msgspec.Struct):
    """A Gluon block with parameters, in model order; ``op`` is its class (``Dense``, ``BatchNorm``...)."""

    name: str
    op: str = ""
    keys: list[int] = []


class MxFiles(msgspec.Struct):
    """Trace file names (relative to the run folder) per worker rank and per server, as strings of the number."""

    workers: dict[str, str]
    servers: dict[str, str] = {}


class MxManifest(msgspec.Struct):
    """``mxnet-run.json``: what ``collect.hooks.mxnet_ps`` writes beside the traces (format ``dagprof-mxnet-run``).

    Versioned like the other run files (``run_schema``): a field added with a default keeps ``VERSION``;
    removing, renaming or changing one bumps it (version 2 dropped ``timed_s``, unread: a version 1 file reads the
    same, the field skipped; a newer version is refused in one line naming the file). Step times are epoch ns, ``[step, start, end]`` per step
    as the worker's Python saw them (``profile.step()`` waits for the step's work)."""

    format: str
    version: int
    num_workers: int
    num_servers: int
    keys: list[MxKey]
    profiled_steps: tuple[int, int]  # [first, stop): the steps replayed (the one before pays the profiler's start-up)
    files: MxFiles
    steps: dict[str, list[tuple[int, int, int]]]  # worker rank -> [step, start_ns, end_ns]
    layers: list[MxLayer] = []
    kvstore: str = "dist_sync"
    bigarray_bound: int = 1_000_000  # MXNET_KVSTORE_BIGARRAY_BOUND: keys this big are split over every server
    update_on_kvstore: bool | None = None  # the optimizer runs on the servers (a Trainer's setting; None: a loop that pushes and pulls itself)
    mxnet: str = ""
    command: list[str] = []  # the workers' command
    hosts: dict[str, str] = {}  # worker rank -> its host name
    cpus: dict[str, int] = {}  # worker rank -> cores it could run on
    cpu_sets: dict[str, CpuList] = {}  # worker rank -> which (``traces.cpu_sets``; manifests before 2026-12-06 lack it)
    cpu_s: dict[str, list[float]] = {}  # worker rank -> its process's CPU seconds per step (all threads), as ``steps``
    main_cpu_s: dict[str, list[float]] = {}  # worker rank -> its Python thread's CPU seconds per step (MXNet's front end, untraced), as ``steps``
    # worker rank -> row_sparse key -> per step (as ``steps``), the rows its gradient held in each of ``row_ranges`` ranges of row ids
    rows: dict[str, dict[str, list[list[int]]]] = {}
    row_ranges: int = 840
    # server -> each call of its updater, the collector's clocks before and after it (``collect.hooks.mxnet_ps.CLOCKS``, ns):
    # wall (epoch), the process's CPU, the updater thread's CPU and its time waiting for a core
    server_updates: dict[str, list[list[int]]] = {}


class _Manifest:
    def __init__(self, folder: str):
        path = os.path.join(folder, MANIFEST)
        m = read_versioned(path, MxManifest, FORMAT, range(1, VERSION + 1), "dagprof MXNet run manifest", "profile the job again")
        self.workers, self.servers, self.bound, self.mxnet = m.num_workers, m.num_servers, m.bigarray_bound, m.mxnet
        self.keys = {k.key: k for k in m.keys}
        self.layers = m.layers
        self.steps = {int(r): v for r, v in m.steps.items()}
        backwards = [(r, st) for r, rows in self.steps.items() for st, a, b in rows if b < a or a <= 0]
        if backwards:  # the step spans mark each worker's iterations (and judge the profiler's cost): never one below 0
            raise DagprofError(f"{len(backwards)} step time(s) end before they begin or start at no time (worker {backwards[0][0]}, "
                               f"step {backwards[0][1]}): a damaged manifest", path)
        self.hosts = {int(r): h for r, h in m.hosts.items()}
        self.cpus = {int(r): c for r, c in m.cpus.items()}
        self.cpu_sets = {int(r): checked_cpu_set(c, self.cpus.get(int(r)), path) for r, c in m.cpu_sets.items()}
        self.cpu_s = {int(r): v for r, v in m.cpu_s.items()}
        self.main_cpu_s = {int(r): v for r, v in m.main_cpu_s.items()}
        self.rows, self.row_ranges = m.rows, m.row_ranges
        try:
            self.updates = {int(k): np.asarray(v, dtype=float).reshape(-1, 2 * UPDATE_CLOCKS) / 1e3 for k, v in m.server_updates.items()}
        except ValueError:
            raise DagprofError(f"bad server_updates (not {2 * UPDATE_CLOCKS} clocks a call, under server numbers)", path) from None
        self.profiled = list(range(*m.profiled_steps))
        try:
            self.worker_files = {int(r): inside(folder, f, path) for r, f in m.files.workers.items()}
            self.server_files = {int(s): inside(folder, f, path) for s, f in m.files.servers.items()}
        except ValueError as err:
            raise DagprofError(f"bad manifest (file keys are not numbers: {err})", path) from None
        self.path = path
        if not self.worker_files:
            raise DagprofError("the run profiled no worker (no worker traces listed)", path)
        if sorted(self.worker_files) != list(range(self.workers)):  # the graph has one push per key and worker of num_workers
            raise DagprofError(f"num_workers is {self.workers} but the traces listed are of workers {sorted(self.worker_files)}: "
                               "a damaged manifest, or a worker's trace left out of it", path)
        listed = set(self.worker_files.values())
        extra = sorted(n for n in os.listdir(folder) if _WORKER_NAMED.fullmatch(n) and os.path.join(folder, n) not in listed)
        if extra:  # read before as the listed workers alone, the copy unseen
            raise DagprofError(f"named like a worker's trace, but {MANIFEST} lists workers {sorted(self.worker_files)} with other files: "
                               f"a copy or another run's file ({len(extra)} such here); remove it, or give this run a folder of its own",
                               os.path.join(folder, extra[0]))


_WORKER_NAMED = re.compile(r"worker\d+\.json(?:\.gz)?")


def read_mxnet_run(folder: str) -> Run:
    man = _Manifest(folder)
    ranks, per_worker, seen = [], {}, {}
    for w in sorted(man.worker_files):
        trace, pushes = _read_worker(man, w, seen)
        ranks.append(trace)
        per_worker[w] = pushes
    base_ns = min(t.base_ns for t in ranks)
    compression = _compression(man, per_worker)
    busy, server_warnings = _server_busy(man, per_worker, compression)
    ps = PsRecord(compression=compression,
        framework="mxnet", num_servers=man.servers, num_workers=man.workers, bigarray_bound=man.bound, placement="ps-lite",
        keys=[_ps_key(man, k) for k in sorted(man.keys.values(), key=lambda k: k.key)],
        server_busy=busy, servers_profiled=sorted(man.server_files), base_us=base_ns / 1e3,
        cpu_us=_profiled_us(man, man.cpu_s), unprofiled_cpu_us=_profiled_us(man, man.cpu_s, inside=False),
        main_cpu_us=_profiled_us(man, man.main_cpu_s), rows=_profiled_rows(man), row_ranges=man.row_ranges,
    )
    meta = RunMeta(ps=ps, framework="mxnet", warnings=server_warnings)
    if sorted(man.server_files) != list(range(man.servers)):
        meta.warnings.append(RunWarning(f"server traces present for {sorted(man.server_files)} of {man.servers} servers"))
    return Run(ranks, source=folder, meta=meta)


def _compression(man: _Manifest, per_worker: dict[int, list[dict]]) -> Literal["", "2bit"]:
    """The workers' gradient compression, from their pushes' op names: MXNet pushes every dense key compressed once
    ``set_gradient_compression`` is set (1.x's only type, 2-bit), so a job that pushed some of them plainly is not read."""
    names = [p["name"] for pushes in per_worker.values() for p in pushes
             if p["name"] != ROW_SPARSE_PUSH and _push_kind(p["name"]) != CommKind.PULL]
    compressed = names.count(COMPRESSED_PUSH)
    if not compressed:
        return ""
    if compressed < len(names) or not man.mxnet.startswith("1."):
        raise DagprofError(f"{compressed} compressed pushes ({COMPRESSED_PUSH}) beside {len(names) - compressed} plain ones, MXNet "
                           f"{man.mxnet or 'of no recorded version'}: only MXNet 1.x's 2-bit compression of every dense key is modelled", man.path)
    return "2bit"


def _ps_key(man: _Manifest, k: MxKey) -> PsKey:
    if k.grad_stype != "row_sparse":
        return PsKey(k.key, k.nbytes, k.elements, k.name, k.layer)
    if k.stype != "row_sparse":  # Trainer pushes the rows and pulls the whole table; MXNet 1.9.1's servers abort on the push
        raise DagprofError(f"key {k.key} ({k.name}) has a row_sparse gradient on a dense table (Embedding(sparse_grad=True)), whose "
                           "exchange is not modelled; use gluon.contrib.nn.SparseEmbedding (row_sparse table and gradient)", man.path)
    if not k.shape or not all(str(k.key) in per for per in man.rows.values()) or len(man.rows) < man.workers:
        raise DagprofError(f"row_sparse key {k.key} ({k.name}) has no rows per step recorded: profile the job again with this "
                           "dagprof's collector", man.path)
    return PsKey(k.key, k.nbytes, k.elements, k.name, k.layer, row_bytes=k.nbytes // k.shape[0] + PS_INDEX_BYTES, table_rows=k.shape[0])


def _profiled_rows(man: _Manifest) -> list[tuple[int, int, int, list[int]]]:
    """(step, worker, key, rows per row-id range) for the profiled steps."""
    return [(k, int(w), int(key), r) for w, per in sorted(man.rows.items()) for key, steps in sorted(per.items())
            for (k, _, _), r in zip(man.steps.get(int(w), []), steps) if k in man.profiled]


def _profiled_us(man: _Manifest, per_step_s: dict[int, list[float]], inside: bool = True) -> list[tuple[int, int, float]]:
    """(step, worker, us) for the profiled steps (or, not ``inside``, the others) of per-worker seconds per step listed as
    the manifest's ``steps``."""
    return [(k, w, 1e6 * c) for w, cs in sorted(per_step_s.items()) for (k, _, _), c in zip(man.steps.get(w, []), cs)
            if (k in man.profiled) == inside]


def _read_worker(man: _Manifest, w: int, seen: dict[bytes, tuple[int, str]]) -> tuple[RankTrace, list[dict]]:
    """Worker ``w``'s trace, and its pushes; ``seen``: the workers read so far by a digest of their operator spans."""
    path = man.worker_files[w]
    doc = _load(path)
    marked = _check_rank_mark(doc, w, path)
    ops, api, procs, unpaired = _ops(doc, path)
    _refuse_copy(ops, w, seen, path)
    sparse = sum(o.name in (ROW_SPARSE_PUSH, ROW_SPARSE_PULL) for o in ops)
    if sparse and not any(k.grad_stype == "row_sparse" for k in man.keys.values()):  # how many rows each carries is the collector's
        raise DagprofError(f"{sparse} row_sparse pushes and pulls ({ROW_SPARSE_PUSH}/{ROW_SPARSE_PULL}), but {MANIFEST} names no "
                           "row_sparse key nor the rows each step carried: profile the job again with this dagprof's collector", path)
    steps = [s for s in man.steps.get(w, []) if s[0] in man.profiled]
    if not steps:
        raise DagprofError(f"worker {w} has no step times for the profiled steps {man.profiled}", man.path)
    first_us, last_us = steps[0][1] / 1e3, steps[-1][2] / 1e3
    if ops and (ops[0].start > last_us + 1e6 or max(o.end for o in ops) < first_us - 1e6):  # on one clock with the manifest's steps
        gap = max(ops[0].start - last_us, first_us - max(o.end for o in ops))
        raise DagprofError(f"its operators are {gap / 1e6:.0f} s from worker {w}'s profiled steps in {os.path.basename(man.path)}: "
                           "another run's trace", path)
    if not marked:
        _check_window(doc, man, w, path)
    base_us = steps[0][1] // 1000 - 1000  # a millisecond before the first profiled step
    base_ns = base_us * 1000
    bounds = np.array([[a / 1e3, b / 1e3] for _, a, b in steps])
    step_ids = [s for s, _, _ in steps]

    def step_of(t: float) -> int:
        k = int(np.searchsorted(bounds[:, 0], t, side="right")) - 1
        return step_ids[k] if k >= 0 and t <= bounds[k, 1] + 1.0 else -1

    lanes: list[Lane] = []
    lane_ids: dict[str, int] = {}

    def lane(name: str, kind: LaneKind, main: bool = False) -> int:
        if name not in lane_ids:
            lane_ids[name] = len(lanes)
            lanes.append(Lane(name, kind, main))
        return lane_ids[name]

    rows = EventRows()

    # the kvstore's own work on its pinned-memory threads besides the exchanges (a row_sparse pull's row ids made unique and
    # copied, ``KVStoreUnique``, ``CopyCPU2CPU``, their buffers freed): within the pull's time, no op of the model's
    ops = [o for o in ops if _kind(o.name) == Kind.COMM or not procs.get(o.pid, "").startswith("cpu pinned")]
    compute_tids = sorted({(o.pid, o.tid) for o in ops if _kind(o.name) != Kind.COMM})
    main_tid = max(compute_tids, key=lambda pt: sum(1 for o in ops if (o.pid, o.tid) == pt)) if compute_tids else None
    for step, a, b in steps:  # STEP markers on the main engine thread, like Kineto's ProfilerStep#N
        rows.add(f"step#{step}", Kind.STEP, lane("engine cpu/0", LaneKind.CPU_THREAD, main=True), a / 1e3 - base_us, b / 1e3 - a / 1e3,
                 step=step, depth=-1)
    layers = [lay.name for lay in man.layers]
    by_type: dict[str, list[int]] = {}
    for i, lay in enumerate(man.layers):
        by_type.setdefault(_LAYER_OP.get(lay.op, lay.op), []).append(i)
    fwd_seen: dict[tuple[int, str], int] = {}
    backward_began: set[int] = set()  # steps whose backward pass (or exchange) has begun, by the ops so far (in start order)
    pushes = []
    engine: list[int] = []  # the engine threads' op rows
    kv_free: list[float] = []
    for o in ops:
        step = step_of(o.start)
        if step < 0:
            continue
        if _kind(o.name) == Kind.COMM:
            if o.name != ROW_SPARSE_PULL:  # a forward's row pull comes before the backward pass
                backward_began.add(step)
            slot = next((i for i, t in enumerate(kv_free) if t <= o.start), len(kv_free))
            if slot == len(kv_free):
                kv_free.append(0.0)
            kv_free[slot] = o.end
            ev = rows.add(o.name, Kind.COMM, lane(f"kvstore {slot}", LaneKind.COMM_THREAD), o.start - base_us, o.end - o.start, step=step, group=0,
                          comm_kind=int(_push_kind(o.name)), role=int(CommRole.ROWS if o.name == ROW_SPARSE_PULL else CommRole.PLAIN))
            if o.name != ROW_SPARSE_PULL:  # a forward's row pull: no push, nothing the servers sum
                pushes.append({"event": ev, "step": step, "start": o.start, "end": o.end, "name": o.name})
            continue
        if (o.pid, o.tid) == main_tid:
            ln = lane("engine cpu/0", LaneKind.CPU_THREAD, main=True)
        else:
            ln = lane(f"engine {procs.get(o.pid, o.pid)} thread {compute_tids.index((o.pid, o.tid))}", LaneKind.CPU_THREAD)
        kind = _kind(o.name)
        if kind == Kind.BACKWARD:
            backward_began.add(step)
        elif o.name == BULK:
            kind = Kind.BACKWARD if step in backward_began else Kind.FORWARD
        layer = -1
        base = o.name.removeprefix("_backward_")
        if base in by_type and kind in (Kind.FORWARD, Kind.BACKWARD):
            q = fwd_seen.get((step, o.name), 0)
            fwd_seen[(step, o.name)] = q + 1
            cands = by_type[base] if kind == Kind.FORWARD else by_type[base][::-1]
            if q < len(cands):
                layer = cands[q]
        engine.append(rows.add(o.name, kind, ln, o.start - base_us, o.end - o.start, step=step, layer=layer))
    calls = dict.fromkeys(step_ids, 0)
    within = -np.inf  # the end of the last front-end call kept: one nested in it (``MXInvokeCachedOp`` in its ``Ex``) is left out
    for a in api:  # the Python thread's push calls, in key order, its row_sparse pulls and its front-end calls
        step = step_of(a.start)
        if step >= 0 and a.name in FRONT_CALLS:
            if a.start >= within:
                rows.add(a.name, Kind.OTHER, lane("python", LaneKind.CPU_THREAD), a.start - base_us, a.end - a.start, step=step)
                within = a.end
        elif step >= 0:
            calls[step] += 1
            pull = a.name == PULL_CALL
            rows.add(a.name, Kind.COMM_ENQUEUE, lane("python", LaneKind.CPU_THREAD), a.start - base_us, a.end - a.start, step=step,
                     comm_kind=int(CommKind.PULL if pull else CommKind.UNKNOWN), role=int(CommRole.ROWS if pull else CommRole.PLAIN))
    cols = rows.columns()
    cols["seq"][[p["event"] for p in pushes]] = np.arange(len(pushes))
    _nest(cols, np.array(engine, dtype=np.int64))
    table = rows.table()
    warnings = _misaligned(calls, w, path)
    lost = sum(step_of(t) >= 0 for t, name in unpaired if name.startswith(KVSTORE))
    warnings += _lost_spans([t for t, name in unpaired if name in SERIAL and step_of(t) >= 0], QUANTIZE, path)
    pushed, quantized = (sum(o.name == n and step_of(o.start) >= 0 for o in ops) for n in (COMPRESSED_PUSH, QUANTIZE))
    if quantized < pushed:  # each compressed push quantizes its gradient first (604 of 604 in the vendored traces)
        warnings.append(RunWarning(f"{os.path.basename(path)}: {pushed} compressed pushes ({COMPRESSED_PUSH}) in worker {w}'s "
                                   f"profiled steps but {quantized} {QUANTIZE} spans (removed or renamed events): the pushes "
                                   "wait for no quantize"))
    if lost:  # an exchange dropped unseen moved analyze 243.3 -> 238.9 ms on a 2-bit job (hostile63's ``mx-mixed-push``)
        warnings.append(RunWarning(f"{os.path.basename(path)}: {lost} kvstore op begin/end events in worker {w}'s profiled steps "
                                   "pair with none (renamed or lost events): their pushes and pulls are left out of the exchange"))
    trace = RankTrace(rank=w, world_size=man.workers, source=path, events=table, lanes=lanes, base_ns=base_ns, backend="ps-lite",
                      layers=layers, groups=["ps"], group_ranks={"ps": list(range(man.workers))}, host=man.hosts.get(w, ""),
                      meta=RankMeta(framework="mxnet", cpus=man.cpus.get(w, 0), cpu_set=man.cpu_sets.get(w, ""), steps_profiled=step_ids,
                                    step_times_us={k: (b - a) / 1e3 for k, a, b in steps}, unprofiled_step_times_us=_timed_us(man, w),
                                    warnings=warnings))
    return trace, pushes


def _check_rank_mark(doc: dict, w: int, path: str) -> bool:
    """Refuse a trace whose collector's marks (``mxnet_mark``) name another worker than ``w``, the one the manifest lists it
    as; whether the trace is marked."""
    cat, pattern = mxnet_mark.CATEGORY, mxnet_mark.PATTERN
    events = doc.get("traceEvents") if isinstance(doc.get("traceEvents"), list) else []
    named = {int(m.group(1)) for e in events if isinstance(e, dict) and e.get("cat") == cat
             and (m := pattern.fullmatch(str(e.get("name", ""))))}
    if named and named != {w}:
        raise DagprofError(f"its collector marked it as worker {', '.join(map(str, sorted(named)))}, but {MANIFEST} lists it as "
                           f"worker {w}'s trace: workers' traces swapped or renamed", path)
    return bool(named)


def _refuse_copy(ops: list[_Op], w: int, seen: dict[bytes, tuple[int, str]], path: str) -> None:
    """Refuse worker ``w``'s trace where another worker's holds the same operator spans: a copy of that worker's trace (two
    processes never time every op alike). Compared as read, before the spans are binned into ``w``'s steps from the
    manifest, which tell the copy apart (``completeness.refuse_copies``, after them, read such a copy as the worker)."""
    digest = hashlib.sha256(np.array([(o.start, o.end) for o in ops], dtype=float).tobytes()).digest()
    other, where = seen.setdefault(digest, (w, path))
    if ops and other != w:
        raise DagprofError(f"holds the same operator spans at the same times as {os.path.basename(where)} (worker {other}'s): a "
                           f"copy of that worker's trace, not worker {w}'s; profile the job again", path)


def _check_window(doc: dict, man: _Manifest, w: int, path: str) -> None:
    """Refuse an unmarked trace (collected before ``mxnet_mark``) whose events begin before worker ``w`` started its
    profiler, or end before it stopped it where the trace ends on the stop's own call (``STOP_CALL``). The collector starts
    the profiler just before it times the step before the window (``profiled[0] - 1``) and stops it just after it timed the
    window's last step, on each worker's own clock: the 46 vendored worker traces begin 14-702 us after their own start, the
    44 that end on the stop's call 17-1592 us after their own stop (the first collector's two end on another call, 17-18 us
    before it), and each of the 27 pairs of workers in their 22 runs, swapped, begins or ends before the other worker's
    edge (by 4 us to 160 ms); workers whose edges lie closer than that read alike either way."""
    rows = {k: (a / 1e3, b / 1e3) for k, a, b in man.steps.get(w, [])}
    first, last = rows.get(man.profiled[0] - 1), rows.get(man.profiled[-1])
    timed = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") != "M" and type(e.get("ts")) in (int, float)]
    if not timed or first is None or last is None:
        return
    early = first[0] - min(e["ts"] for e in timed)
    end = max((e for e in timed if e.get("ph") != "C"), key=lambda e: e["ts"], default={})  # not the counters it writes after
    short = last[1] - end["ts"] if end.get("name") == STOP_CALL else 0.0
    if early > EDGE_US:
        raise DagprofError(f"its first event is {early / 1e3:.2f} ms before worker {w} started its profiler (the start of step "
                           f"{man.profiled[0] - 1} in {MANIFEST}): another worker's trace (workers' traces swapped or renamed?)", path)
    if short > EDGE_US:
        raise DagprofError(f"its last event, the profiler's stop, is {short / 1e3:.2f} ms before worker {w} stopped it (the end of "
                           f"step {man.profiled[-1]} in {MANIFEST}): another worker's trace (workers' traces swapped or renamed?)", path)


def _lost_spans(times: list[float], name: str, path: str) -> list[RunWarning]:
    """A warning counting ``name`` begins and ends (``SERIAL`` ops) that paired with none: spans whose end was lost or
    moved, each left out rather than paired with a later span's end (which stretched a server's busy time 12-fold)."""
    if not times:
        return []
    return [RunWarning(f"{os.path.basename(path)}: {len(times)} {name} begin/end events pair with none (lost or moved ends: "
                       f"no two {name} spans overlap on a thread): those spans are left out")]


def _misaligned(calls: dict[int, int], w: int, path: str) -> list[RunWarning]:
    """A worker pushes its keys once per step, each call inside the step its Python timed: profiled steps holding unequal
    numbers of calls mean the trace's clock and the manifest's step times of worker ``w`` disagree, as when two workers'
    traces whose profiler edges lie too close to tell (``_check_window``) are swapped. A warning, not a refusal: such a
    swap moves the answer little."""
    counts = list(calls.values())
    if len(set(counts)) < 2:
        return []
    return [RunWarning(f"{os.path.basename(path)}: its {sum(counts)} push calls fall {', '.join(map(str, counts))} into worker {w}'s "
                       f"{len(counts)} profiled steps, which push alike: the trace does not line up with worker {w}'s step times in "
                       f"{MANIFEST} (another worker's trace?)")]


def _nest(cols: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """An engine op run inside another on its thread (a ``DeleteVariable`` within an ``ImperativeBulk``) is not a node: depth 1."""
    start, end = cols["start"][rows], cols["start"][rows] + cols["dur"][rows]
    order = np.lexsort((start - end, start, cols["lane"][rows]))
    for lane_rows in np.split(order, np.flatnonzero(np.diff(cols["lane"][rows][order])) + 1):
        cols["depth"][rows[lane_rows]] = nested(start[lane_rows], end[lane_rows])


def _timed_us(man: _Manifest, w: int) -> dict[int, float]:
    """Worker ``w``'s steps with the profiler off (the profiler's cost, ``passes.profiler_cost``): before the window and
    after it, so that a job still speeding up (or a load that came or went) shows as a change across the window rather
    than as the profiler's cost; not the step just before the window, which pays the profiler's start-up."""
    first, stop = man.profiled[0], man.profiled[-1] + 1
    return {k: (b - a) / 1e3 for k, a, b in man.steps.get(w, []) if k >= stop or k < first - 1}


def _server_busy(man: _Manifest, per_worker: dict[int, list[dict]], compression: str = "") -> tuple[list[ServerBusy], list[RunWarning]]:
    """Per server and step, the time the server was busy with the step's pushes and, of it, its engine's copies, sums and
    optimizer ops; and a warning per server whose ``DEQUANTIZE`` spans lost ends (``_lost_spans``) or, the pushes compressed,
    are fewer than the parts pushed to it (``_dequantized``).

    A server receives pushes on one thread: it copies or sums each in (``RECEIVED``) and, once a key's last push is in,
    hands the key to the updater (the optimizer Gluon sent it, run by the server's Python) and waits for it. The updater's
    time is mostly Python between its engine calls: dense AdaGrad (``mx_sparse_mf.py``) runs ten ops of about 5 us a key
    over 1-1.5 ms, so the engine's ops held 0.6 ms of a step in which the server was busy about 9 ms. An update is a run of
    the server's C API calls with no push received between them; the server is busy from the receipt before it (or the
    previous update's end, or the latest push a worker issued before it, if later: the engine may run a receipt's sum
    after the update's first call, and the receipt before that was another worker's, 20 ms earlier in a fresh
    ``mx_fasttext_sparse.py`` profile) to its last call, and with every engine op. Where every push issued before an update
    was issued before the previous update began, the server is busy from the previous update's end: the pushes had that
    update's time to arrive, and the gap to the next receipt is the server's own untraced work (ps-lite answering the
    key's pulls and taking the next push in, on threads that used 3 ms of CPU a step beside the updater's 6 ms in a
    loopback ``mx_sparse_mf.py`` run) and its waits for a core, which the link fit took for wire: on the testbed the
    gaps added 1.5 and 1.8 ms a step (medians) at 500 and 200 Mbit/s alike, where wire would take 2.5 times as long at 200 (docs/evidence.md).
    Where the collector timed the updater's calls (``MxManifest.server_updates``), the gap before each update but the step's
    first is split by the server's CPU clock instead: the CPU its threads used in it is work, ending where the updater began
    (``_worked_from``); the rest of the gap its threads waited, for a push's bytes or a core (``ServerBusy.waited_us``)."""
    out, warnings = [], []
    steps = sorted({p["step"] for pushes in per_worker.values() for p in pushes})
    for s, path in sorted(man.server_files.items()):
        ops, calls, _, unpaired = _ops(_load(path), path, calls=None)
        warnings += _lost_spans([t for t, name in unpaired if name in SERIAL], DEQUANTIZE, path)
        parts = sum(1 for k in man.keys.values() for srv, _ in pslite_placement(k.key, k.elements, man.servers, man.bound) if srv == s)
        if compression:
            warnings += _dequantized(man, per_worker, s, [o.start for o in ops if o.name == DEQUANTIZE], path)
        timed = man.updates.get(s)
        timed = timed if timed is not None and len(timed) else None  # none timed: its waits are not known
        for step in steps:
            every = [p for pushes in per_worker.values() for p in pushes if p["step"] == step]
            lo, hi = min(p["start"] for p in every) - 1.0, max(p["end"] for p in every)
            mine = [o for o in ops if lo <= o.start <= hi]
            received = np.array([o.start for o in mine if o.name in RECEIVED])
            spans = [(o.start, o.end) for o in mine]
            update: dict[int, list[float]] = {}  # receipts before it -> its first call's start, its last call's end
            for c in (c for c in calls if lo <= c.start and c.end <= hi):
                at = update.setdefault(int(np.searchsorted(received, c.start)), [c.start, c.end])
                at[1] = max(at[1], c.end)
            issued = np.sort([p["start"] for p in every])
            last, began = lo, lo  # the previous update's end and first call
            waited = 0.0 if timed is not None else -1.0
            for i, (k, (first, end)) in enumerate(sorted(update.items())):
                before = int(np.searchsorted(issued, first))
                pushed = issued[before - 1] if before else first  # the latest push issued before it (none: its first call)
                worked = _worked_from(timed, first, end) if timed is not None and i else None
                if worked is not None:
                    since = max(worked, last)
                    waited += since - last
                else:
                    since = last if pushed < began else max(received[k - 1] if k else first, pushed, last)
                spans.append((since, end))  # empty where a later one began after it
                last, began = max(last, end), first
            counted = sum(o.end - o.start for o in mine if o.name in RECEIVED or o.name.endswith("_update"))
            start, stop = (np.array(x, dtype=float) for x in zip(*spans)) if spans else (np.zeros(0), np.zeros(0))
            out.append(ServerBusy(s, step, covered(start, stop), parts, counted, waited))
    return out, warnings


def _dequantized(man: _Manifest, per_worker: dict[int, list[dict]], s: int, starts: list[float], path: str) -> list[RunWarning]:
    """A warning where server ``s`` dequantized fewer parts in the profiled steps (``DEQUANTIZE`` spans from each step's first
    push to its last) than the workers' compressed pushes put on it: each part of each push is dequantized on its server (86
    and 22 a step, as many as pushed, in the vendored 2-bit runs), so its spans were removed or renamed, and the server's busy
    time is read from its other ops alone."""
    dense = [k for k in man.keys.values() if k.grad_stype != "row_sparse"]
    share = sum(1 for k in dense for srv, _ in pslite_placement(k.key, k.elements, man.servers, man.bound) if srv == s) / max(len(dense), 1)
    by_step: dict[int, list[dict]] = {}
    for p in (p for pushes in per_worker.values() for p in pushes if p["name"] == COMPRESSED_PUSH):
        by_step.setdefault(p["step"], []).append(p)
    at = np.sort(np.asarray(starts, dtype=float))
    pushed = seen = 0
    for every in by_step.values():
        lo, hi = min(p["start"] for p in every) - 1.0, max(p["end"] for p in every)
        pushed += round(len(every) * share)
        seen += int(np.searchsorted(at, hi, side="right") - np.searchsorted(at, lo))
    if seen >= pushed:
        return []
    return [RunWarning(f"{os.path.basename(path)}: {seen} {DEQUANTIZE} spans in the profiled steps, but the workers' 2-bit compressed "
                       f"pushes put {pushed} parts on server {s}, each dequantized there (removed or renamed events): its busy time is "
                       "read without them")]


def _worked_from(timed: np.ndarray, first: float, end: float) -> float | None:
    """Where the server's work before an update (its C API calls from ``first`` to ``end``, us) began: the first updater
    call timed within it (``timed``: the collector's clocks, us; MXNet's wrapper makes its arrays just before it and frees
    them just after), less the CPU the server's threads used since the call before it ended, at most that gap, and no
    later than ``first``; None where no timed call lies within it."""
    j = int(np.searchsorted(timed[:, 0], first - 1.0))
    if j < 1 or j >= len(timed) or timed[j, 0] > end:
        return None
    gap = max(timed[j, 0] - timed[j - 1, 4], 0.0)
    return float(min(timed[j, 0] - min(max(timed[j, 1] - timed[j - 1, 5], 0.0), gap), first))
