"""Make a JAX ``*.xplane.pb`` small enough to vendor as a test recording: drop the Python tracer's events (names that
start with ``$``: most of a file whose window holds a compile) and the metadata plane's programs that no op of the
host plane ran (their ``program_id``). The reader labels the main thread's host time by those events, nothing else.

    python bench/frameworks/slim_xplane.py IN.xplane.pb OUT.xplane.pb.gz [--compiles]

``--compiles`` (a window whose steps compile, TF's ``jit_compile=True``): also drop what XLA's compiler records inside its
outermost ranges (its passes, the codegen threads' fusions: most of such a file), keeping those ranges, which the reader
counts (``traces.tf_xplane.XLA_COMPILE``, read from there so the two name the same ranges).
TensorFlow's ``xplane_pb2`` is the protobuf (run it with TensorFlow's Python).
"""
import gzip
import os
import sys

from tensorflow.tsl.profiler.protobuf import xplane_pb2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
from dagprof.traces.tf_xplane import XLA_COMPILE  # noqa: E402


def slim(space: xplane_pb2.XSpace) -> None:
    ran = set()
    for plane in space.planes:
        prog = {k for k, m in plane.stat_metadata.items() if m.name == "program_id"}
        python = {k for k, m in plane.event_metadata.items() if m.name.startswith("$")}
        for line in plane.lines:
            kept = [e for e in line.events if e.metadata_id not in python]
            ran.update(s.int64_value or s.uint64_value for e in kept for s in e.stats if s.metadata_id in prog)
            del line.events[:]
            line.events.extend(kept)
        for k in python:
            del plane.event_metadata[k]
    for plane in space.planes:
        if plane.name == "/host:metadata":
            prog = {k for k, m in plane.stat_metadata.items() if m.name == "program_id"}
            for k, m in list(plane.event_metadata.items()):
                if not {s.int64_value or s.uint64_value for s in m.stats if s.metadata_id in prog} & ran:
                    del plane.event_metadata[k]


def slim_compiles(space: xplane_pb2.XSpace) -> None:
    """Drop every event that lies inside one of XLA's outermost compile ranges on its line, and the codegen threads' events."""
    for plane in space.planes:
        outer = {k for k, m in plane.event_metadata.items() if m.name in XLA_COMPILE}
        for line in plane.lines:
            if "xla-cpu-codegen" in line.name:
                del line.events[:]
                continue
            spans = [(e.offset_ps, e.offset_ps + e.duration_ps) for e in line.events if e.metadata_id in outer]
            kept = [e for e in line.events if e.metadata_id in outer
                    or not any(a <= e.offset_ps and e.offset_ps + e.duration_ps <= b for a, b in spans)]
            del line.events[:]
            line.events.extend(kept)


if __name__ == "__main__":
    space = xplane_pb2.XSpace()
    with open(sys.argv[1], "rb") as f:
        space.ParseFromString(f.read())
    slim(space)
    if "--compiles" in sys.argv[3:]:
        slim_compiles(space)
    with gzip.open(sys.argv[2], "wb") as f:
        f.write(space.SerializeToString())
