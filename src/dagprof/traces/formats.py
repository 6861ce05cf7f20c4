"""What kind of trace a file or folder is, from its first bytes: one registry for every reader.

``traces.load`` dispatches on it, and every reader given a foreign file names what the file
looks like in its one-line error (``expect``), so a Horovod timeline handed to the Kineto
reader says "looks like a Horovod timeline", not "no schemaVersion".

Adding a format is one ``Format(...)`` line in ``FORMATS``: a name, what to call it in messages,
a sniffer over the file's first 64 KiB (decompressed when gzipped; ``str`` for text, ``bytes``
otherwise) and the reader ``load`` uses, as ``"module:function"`` (path -> ``Run``), or ``""``
when dagprof recognises the format but does not read it (the hint says what to do instead).
More specific formats come first. The sniffers look at bytes only: no reader is imported.
"""
from __future__ import annotations

import glob
import importlib
import json
import os
import zlib
from dataclasses import dataclass
from typing import Callable

from ..errors import DagprofError
from ..fsutil import open_input

_HEAD = 64 * 1024
MXNET_MANIFEST = "mxnet-run.json"  # written by collect.hooks.mxnet_ps beside the workers' and servers' traces


@dataclass(frozen=True)
class Format:
    name: str
    title: str  # "a Horovod timeline": reads well after "looks like"
    sniff: Callable[[bytes, str], bool]  # (first bytes, path) -> is it
    reader: str = ""  # "module:function" taking a path, returning a Run; "" = recognised, not read
    hint: str = ""  # what to do with such a file
    folder: bool = False  # sniffs folders (``head`` is then the manifest's bytes, or b"")


def _text(head: bytes) -> str:
    return head.decode("utf-8", "replace")


def _json_has(*keys: str, all_of: tuple[str, ...] = ()) -> Callable[[bytes, str], bool]:
    def sniff(head: bytes, path: str) -> bool:
        t = _text(head)
        return t.lstrip()[:1] in ("{", "[") and any(k in t for k in keys) and all(k in t for k in all_of)
    return sniff


def _xplane(head: bytes, path: str) -> bool:
    """An XSpace starts with its first plane (field 1) whose name (XPlane field 2) comes within a few bytes."""
    if path.endswith((".xplane.pb", ".xplane.pb.gz")):
        return True
    return head[:1] == b"\x0a" and any(s in head[:96] for s in (b"/host:", b"/device:", b"Task Environment"))


def _manifest_format(fmt: str) -> Callable[[bytes, str], bool]:
    """A JSON object whose ``format`` is ``fmt`` (dagprof's manifests and rank files)."""
    def sniff(head: bytes, path: str) -> bool:
        try:
            return json.loads(head).get("format") == fmt
        except (ValueError, AttributeError):  # not JSON, or longer than the head: look for the key
            return f'"format": "{fmt}"' in _text(head) or f'"format":"{fmt}"' in _text(head)
    return sniff


def _xplane_logdirs(head: bytes, path: str) -> bool:
    for _root, _dirs, files in os.walk(path):
        if any(f.endswith((".xplane.pb", ".xplane.pb.gz")) for f in files):
            return True
    return False


def _layer_csv(head: bytes, path: str) -> bool:
    for line in _text(head).splitlines():
        s = line.strip().lower()
        if s and not s.startswith("#"):
            cells = [c.strip() for c in s.split(",")]
            return "layer" in cells and "backward_us" in cells
    return False


_ARCHIVES = (b"PK\x03\x04", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd", b"7z\xbc\xaf\x27\x1c")  # zip, xz, zstd, 7z


def _archive(head: bytes, path: str) -> bool:
    """A zip, tar (gunzipped: a .tar.gz), bzip2, xz, zstd or 7z file: a tar.gz of a run folder sniffed as the rank file
    its first member is ("one rank file of a dagprof run folder"), a zip as corrupt JSON."""
    return head[257:262] == b"ustar" or head.startswith(_ARCHIVES) or head[:3] == b"BZh" and head[4:10] == b"1AY&SY"


FORMATS: list[Format] = [
    # folders
    Format("horovod-run", "a dagprof run folder (Horovod)", lambda head, path: bool(glob.glob(os.path.join(path, "rank*.horovod.json"))),
           "dagprof.traces.horovod:read_horovod_run", folder=True),
    Format("dagprof-run", "a dagprof run folder (PyTorch)", _manifest_format("dagprof-run"),
           "dagprof.traces.dagprof_run:read_run", folder=True),
    Format("xplane-run", "a dagprof run folder (TensorFlow/JAX)", _manifest_format("dagprof-xplane-run"),
           "dagprof.traces.xplane_run:read_xplane_run", folder=True),
    Format("xplane-logdirs", "TensorFlow/JAX profiler log folders", _xplane_logdirs,
           "dagprof.traces.xplane_run:read_xplane_run", folder=True),
    Format("mxnet-run", "an MXNet parameter-server run folder", lambda head, path: os.path.exists(os.path.join(path, MXNET_MANIFEST)),
           "dagprof.traces.mxnet:read_mxnet_run", folder=True),
    # files
    Format("archive", "an archive (zip, tar, bzip2, xz, zstd or 7z)", _archive,
           hint="unpack it and give dagprof the run folder or the trace inside; it reads plain and gzipped files"),
    Format("xplane", "a TensorFlow/JAX profiler trace (XPlane protobuf)", _xplane,
           "dagprof.traces.xplane_run:read_xplane_file"),
    Format("horovod", "a Horovod timeline",
           _json_has("NEGOTIATE_ALLREDUCE", "start_time_since_epoch_in_micros", "MEMCPY_IN_FUSION_BUFFER", "NEGOTIATE_BROADCAST"),
           hint="it holds rank 0's communication only, no compute and no other rank: profile the job with "
                "dagprof.collect.horovod (see docs/frameworks.md) and give dagprof the run folder"),
    Format("mxnet", "an MXNet mx.profiler trace",
           _json_has("MXKVStorePushPull", "KVStoreDistDefaultStoragePushPull", '"_backward_', "MXNDArray", "MXExecutor"),
           hint="give dagprof the run folder written by dagprof.collect.mxnet_ps, which holds every worker's and server's trace"),
    Format("xplane-json", "a TensorFlow/JAX profiler trace converted to Chrome JSON",
           _json_has('"/host:CPU"', '"/device:', "TraceMe", all_of=("traceEvents",)),
           hint="give dagprof the *.xplane.pb written beside it"),
    Format("dagprof-timeline", "a timeline dagprof wrote (replay, measured, what-if or diff, for Perfetto)",
           lambda head, path: b'"producer":"dagprof' in head or b'"producer": "dagprof' in head
           or b'"clock_offset_us"' in head and b'"residual_skew_us"' in head,
           hint="give dagprof the run it was drawn from"),
    Format("kineto", "a torch.profiler (Kineto) trace",
           _json_has('"schemaVersion"', '"distributedInfo"', '"deviceProperties"', '"cpu_op"', '"python_function"',
                     all_of=("traceEvents",)),
           "dagprof.traces.load:kineto_file"),
    Format("pytorch-et", "a PyTorch execution trace (Chakra ET)", _json_has('"execution_trace', '"rf_id"', all_of=('"nodes"', '"schema"')),
           hint="it has no durations: give dagprof the Kineto trace recorded with it"),
    Format("dagprof-rank", "one rank file of a dagprof run folder", _manifest_format("dagprof-rank"),
           hint="give dagprof the run folder that holds it"),
    Format("dagprof-manifest", "the manifest of a dagprof run folder",
           lambda head, path: any(_manifest_format(f)(head, path) for f in ("dagprof-run", "dagprof-xplane-run", "dagprof-mxnet-run")),
           hint="give dagprof the run folder that holds it"),
    Format("strategy", "a dagprof strategy file", _manifest_format("dagprof-strategy"),
           hint="dagprof.apply(model, path) deploys it in the training script"),
    Format("link-model", "a dagprof calibrate link model", _json_has('"beta_us_per_byte"', all_of=('"alpha_us"',)),
           hint="give it with --link-model, --link-from or --link-to"),
    Format("dagprof-answer", "a dagprof --json answer",
           lambda head, path: _json_has('"predicted_iter_ms"', '"model_iter_ms"', '"measured_delta_ms"')(head, path) and b'"traceEvents"' not in head,
           hint="give dagprof the run it answered for"),
    Format("layer-csv", "a layer-wise CSV (dagprof sgd --layers)", _layer_csv, hint="use it with `dagprof sgd --layers`"),
    Format("bcaffe", "a B-Caffe layer log (dagprof sgd --layers)",
           lambda head, path: "distributed.cpp:" in _text(head), hint="use it with `dagprof sgd --layers`"),
    # last: any other Chrome JSON goes to the Kineto reader (old Kineto traces carry no schema keys up front)
    Format("chrome-json", "a Chrome/Perfetto trace of unknown origin", _json_has("traceEvents"), "dagprof.traces.load:kineto_file"),
]


def head_of(path: str) -> bytes:
    """The first 64 KiB of a file, decompressed when it is gzipped (b"" when a read fails).

    A path that is missing or not a regular file (a FIFO would block the sniff forever) is refused in one
    line by ``open_input``, the one opener of every input.
    """
    with open_input(path) as f:
        try:
            raw = f.read(_HEAD)
        except OSError:
            return b""
    if raw[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, _HEAD)
        except zlib.error:
            return b""
    return raw


def sniff(path: str | os.PathLike[str]) -> Format | None:
    """The first registered format that claims ``path`` (a file or a folder), else None."""
    p = os.fspath(path)
    if os.path.isdir(p):
        manifest = os.path.join(p, "manifest.json")
        head = head_of(manifest) if os.path.exists(manifest) else b""
        return next((f for f in FORMATS if f.folder and f.sniff(head, p)), None)
    head = head_of(p)
    return next((f for f in FORMATS if not f.folder and f.sniff(head, p)), None)


def by_name(name: str) -> Format:
    return next(f for f in FORMATS if f.name == name)


def expect(path: str | os.PathLike[str], expected: str | tuple[str, ...], want: str = "") -> None:
    """Raise the one-line error for a reader of ``expected`` (a format's name, or several) given a file that sniffs as
    another known format; ``want`` names what the reader takes where no format is registered for it."""
    names = (expected,) if isinstance(expected, str) else expected
    f = sniff(path)
    if f is not None and f.name not in names and f.name != "chrome-json":
        want = want or by_name(names[0]).title
        raise DagprofError(f"not {want}: it looks like {f.title}" + (f" ({f.hint})" if f.hint else ""), path)


def read(path: str | os.PathLike[str], fmt: Format):
    """Read ``path`` with ``fmt``'s reader (-> Run); a format without one is a one-line error."""
    if not fmt.reader:
        raise DagprofError(f"this looks like {fmt.title}, which dagprof does not read" + (f" ({fmt.hint})" if fmt.hint else ""), path)
    module, func = fmt.reader.split(":")
    return getattr(importlib.import_module(module), func)(os.fspath(path))


__all__ = ["FORMATS", "Format", "sniff", "expect", "read", "head_of", "by_name"]
