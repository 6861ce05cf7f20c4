"""Decoding TensorFlow/JAX profiles (``*.xplane.pb``): dagprof's decoder against protobuf's, in one run.

    python bench/bench_xplane.py [FILE] [--scale N] [--rounds R] [--pb2 PATH/TO/xplane_pb2.py]

FILE defaults to the Keras-fit fixture (rank 0); ``--scale N`` repeats each of its threads N
times (the bytes of real lines, re-framed) to reach the few-MB files a real job writes. The
peer is the protobuf runtime (upb) with the ``xplane_pb2.py`` that TensorFlow ships, turning the
events into the same numpy columns; it runs only where ``google.protobuf`` is importable and the
generated module is found (``--pb2``, or inside an installed ``tensorflow``, which is not imported).
Rounds alternate the contenders (A B A B ...); medians and the spread are printed. The machine may
be shared: compare ratios, not absolute times.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dagprof.traces import xplane_decode  # noqa: E402
from dagprof.traces.tf_xplane import read_xplane  # noqa: E402
from dagprof.traces.xplane_run import xplane_files  # noqa: E402


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def scaled(buf: bytes, n: int) -> bytes:
    """The same XSpace with every line of every plane repeated ``n`` times."""
    if n <= 1:
        return buf
    out = bytearray()
    for num, wt, v in xplane_decode.fields(buf, 0, len(buf)):
        if num != 1:
            out += _varint(num << 3 | wt) + _varint(v[1] - v[0]) + buf[v[0]:v[1]]
            continue
        plane = bytearray()
        for pn, pwt, pv in xplane_decode.fields(buf, *v):
            field = _varint(pn << 3 | pwt) + (_varint(pv) if pwt == 0 else _varint(pv[1] - pv[0]) + buf[pv[0]:pv[1]])
            plane += field * (n if pn == 3 else 1)
        out += _varint(1 << 3 | 2) + _varint(len(plane)) + plane
    return bytes(out)


def find_pb2(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    spec = importlib.util.find_spec("tensorflow")  # locates the package without importing it
    if spec and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "tsl", "profiler", "protobuf", "xplane_pb2.py")
        return path if os.path.exists(path) else None
    return None


def protobuf_decoder(pb2_path: str | None):
    if not pb2_path or importlib.util.find_spec("google.protobuf") is None:
        return None
    spec = importlib.util.spec_from_file_location("xplane_pb2", pb2_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def decode(buf: bytes) -> int:
        space = mod.XSpace()
        space.ParseFromString(buf)
        n = 0
        for p in space.planes:
            for line in p.lines:
                ev = line.events
                np.fromiter((e.metadata_id for e in ev), np.int64, len(ev))
                np.fromiter((e.offset_ps for e in ev), np.int64, len(ev))
                np.fromiter((e.duration_ps for e in ev), np.int64, len(ev))
                n += len(ev)
        return n
    return decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=None)
    ap.add_argument("--scale", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pb2", default=None, help="path of a generated xplane_pb2.py (default: the installed TensorFlow's)")
    args = ap.parse_args()
    path = args.file or xplane_files(str(ROOT / "tests" / "data" / "tf" / "fit" / "rank0"))[0]
    raw = pathlib.Path(path).read_bytes()
    buf = scaled(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, args.scale)
    tmp = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "dagprof-bench.xplane.pb"
    tmp.write_bytes(buf)
    events = sum(len(x.metadata_id) for p in xplane_decode.decode_xspace(buf).planes for x in p.lines)  # also compiles
    contenders = {"dagprof decode": lambda: xplane_decode.decode_xspace(buf),
                  "dagprof read_xplane (decode + semantics)": lambda: read_xplane(tmp, rank=0, world_size=2)}
    peer = protobuf_decoder(find_pb2(args.pb2))
    if peer is not None:
        contenders["protobuf (upb) parse + columns"] = lambda: peer(buf)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    print(f"{path} x{args.scale}: {len(buf) / 1e6:.1f} MB, {events:,} events; {args.rounds} interleaved rounds")
    base = statistics.median(times["dagprof decode"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:42s} median {med * 1e3:8.1f} ms  (min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})  "
              f"{events / med / 1e6:6.2f} M events/s  {med / base:5.2f}x dagprof decode")
    if peer is None:
        print("  protobuf peer skipped: needs google.protobuf and TensorFlow's xplane_pb2.py (--pb2)")
    tmp.unlink()


if __name__ == "__main__":
    main()
