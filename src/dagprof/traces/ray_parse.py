"""Rank traces parsed as Ray tasks on a cluster's workers, for trace sets one machine parses too slowly.

Used instead of the local process pool when ``$DAGPROF_RAY_ADDRESS`` is set (``--ray [ADDRESS]`` sets
it). The files must be readable at the same path on every worker (a shared filesystem): only paths go
out, and each parsed ``RankTrace`` comes back through Ray's object store, where its numpy columns are
out-of-band buffers (no Python object per event is pickled). Ray is an optional extra, imported only
here and only when asked for.
"""
from __future__ import annotations

import os
import socket
from dataclasses import replace
from typing import Callable, NamedTuple

import numpy as np

from ..errors import DagprofError
from ..progress import progress
from .events import RankTrace

ENV_VAR = "DAGPROF_RAY_ADDRESS"


def ray_address() -> str | None:
    """The cluster to parse on (``auto``: the one ``ray start`` runs on this machine), or None: parse locally."""
    return os.environ.get(ENV_VAR) or None


def _ray():
    try:
        import ray
    except ImportError:
        raise DagprofError("Ray is not installed: pip install 'dagprof[ray]'", f"--ray / ${ENV_VAR}") from None
    return ray


def _reachable(address: str) -> None:
    """A HOST:PORT nobody answers at is one line now (Ray itself retries for minutes, logging every second)."""
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except OSError as err:
            raise DagprofError(f"no Ray cluster answers there ({err.strerror or err})", address) from None


class _Failed(NamedTuple):
    """A task's ``DagprofError``, returned rather than raised so that the driver reports it in one line."""

    problem: str


def _parse_task(parse: Callable[[str, bool], RankTrace | str], path: str, use_cache: bool) -> RankTrace | str | _Failed:
    try:
        return parse(path, use_cache)
    except DagprofError as err:
        return _Failed(err.problem)


def _owned(trace: RankTrace) -> RankTrace:
    """The trace with its arrays copied out of the object store: ``ray.get`` gives read-only views that pin the
    object in the store (unspillable) for as long as they live, and the rest of dagprof expects ordinary arrays."""
    ev = trace.events
    events = replace(ev, **{c: np.array(getattr(ev, c)) for c in ev.COLUMNS})
    return replace(trace, events=events, flows=np.array(trace.flows), flow_rule=np.array(trace.flow_rule))


def parse_on_ray(files: list[str], address: str, parse: Callable[[str, bool], RankTrace | str], use_cache: bool = True) -> dict[str, RankTrace | str]:
    """``parse(file, use_cache)`` (``kineto_dir.parse_file``: handed in, so that this module knows no reader) of every
    file as one Ray task (one CPU) each, keyed by file; at most two tasks per cluster CPU in flight, so the driver
    holds a bounded number of finished, unfetched results."""
    ray = _ray()
    if not ray.is_initialized():
        _reachable(address)
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise DagprofError(f"cannot connect to the Ray cluster: {str(err).splitlines()[0]}", address) from None
    task = ray.remote(num_cpus=1, max_retries=1)(_parse_task)
    window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))

    def finished():
        pending: dict = {}
        todo = iter(files)
        while True:
            for f in todo:
                pending[task.remote(parse, os.path.abspath(f), use_cache)] = f
                if len(pending) >= window:
                    break
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            f = pending.pop(done[0])
            try:
                r = ray.get(done[0])
            except ray.exceptions.RayError as err:
                raise DagprofError(f"a Ray worker failed: {str(err).strip().splitlines()[-1]}", f) from None
            if isinstance(r, _Failed):
                raise DagprofError(r.problem, f)
            yield f, _owned(r) if isinstance(r, RankTrace) else r

    return dict(progress(finished(), "parsing rank traces on Ray", len(files), "rank"))
