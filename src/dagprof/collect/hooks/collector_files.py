"""Where a collector's output lands and how it is written: the manifest, ``rank<R>.json``, the step log that survives a kill, the gzipped Kineto trace.

The collector decides what each document holds; this module owns the paths and the writes, every one atomic (the step
log: one committed line), so a rank killed at any moment leaves files the reader can trust or tell apart as cut short.
"""
from __future__ import annotations

import gzip
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ...fsutil import atomic_open
from ...traces import cpu_sets
from ...traces.run_schema import (
    MANIFEST,
    STEPS_ENDED,
    STEPS_HEAD,
    STEPS_LOG,
    Ended,
    Manifest,
    RankFile,
    StepPart,
    encode,
    encode_line,
    kineto_file,
    rank_file,
    steps_dir,
)


def process_info() -> dict[str, Any]:
    """This process's rank, world, backend, host and torch: the fields every rank file starts with."""
    import torch

    # torchrun's variables, else horovodrun's (a Horovod job without torch.distributed: two ranks must not both write rank 0)
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", 0)))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("HOROVOD_SIZE", 1)))
    backend = ""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    except Exception:  # noqa: BLE001  (no distributed support: a single process)
        pass
    return {
        "rank": rank, "world_size": world, "backend": backend, "host": socket.gethostname(), "pid": os.getpid(),
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)), "torch": str(torch.__version__),
        "cpus": cpu_sets.usable_cpus(),
        "cpu_set": cpu_sets.this_process(),
    }


def write_manifest(out_dir: str, rank: int, manifest: Manifest) -> bool:
    """Rank 0 always writes it (replacing a stale one); the others only when it is missing. True when written."""
    path = os.path.join(out_dir, MANIFEST)
    if os.path.exists(path) and rank != 0:
        return False
    with atomic_open(path, "wb") as f:
        f.write(encode(manifest))
    return True


def export_kineto(prof: Any, out_dir: str, rank: int) -> None:
    """torch writes the trace to a plain path; gzip it into ``kineto_file(rank)`` atomically."""
    path = os.path.join(out_dir, kineto_file(rank))
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=os.path.dirname(path), prefix=".tmp-kineto-")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as src, atomic_open(path, "wb") as dst, gzip.GzipFile(fileobj=dst, mode="wb", compresslevel=4) as gz:
            shutil.copyfileobj(src, gz)
    finally:
        os.unlink(tmp)


def write_rank_file(out_dir: str, doc: RankFile) -> None:
    """``rank<R>.json``; it holds everything the step files held, so they go."""
    with atomic_open(os.path.join(out_dir, rank_file(doc.rank)), "wb") as f:
        f.write(encode(doc))
    shutil.rmtree(os.path.join(out_dir, steps_dir(doc.rank)), ignore_errors=True)


def start_step_files(out_dir: str, head: RankFile) -> None:
    """``rank<R>.steps/head.json``: everything known at the window's start (an earlier run's step files removed)."""
    folder = os.path.join(out_dir, steps_dir(head.rank))
    shutil.rmtree(folder, ignore_errors=True)
    with atomic_open(os.path.join(folder, STEPS_HEAD), "wb") as f:
        f.write(encode(head))


def append_step_part(out_dir: str, part: StepPart) -> None:
    """One line appended to ``rank<R>.steps/steps.jsonl``: what the step added to the head and the parts before."""
    _append(os.path.join(out_dir, steps_dir(part.rank), STEPS_LOG), encode_line(part))


def write_ended(out_dir: str, rank: int, how: str) -> None:
    """``rank<R>.steps/ended.json`` saying ``how`` the process stops; "" removes it."""
    path = os.path.join(out_dir, steps_dir(rank), STEPS_ENDED)
    if how:
        with atomic_open(path, "wb") as f:
            f.write(encode(Ended(rank=rank, how=how, t_ns=time.time_ns())))
    elif os.path.exists(path):
        os.unlink(path)


@dataclass
class Flushed:
    """Lengths (and the gradient sizes) the step files hold so far; the next part writes what came after."""

    records: int = 0
    layers: int = 0
    grad_bytes: dict[str, int] = field(default_factory=dict)
    warnings: int = 0
    step_times: int = 0
    layouts: int = 0
    sched: int = 0  # entries of ``ThreadSched.steps``


def _append(path: str, line: bytes) -> None:
    """Append one committed line (it ends with its newline; a write cut short by a kill leaves no newline)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
