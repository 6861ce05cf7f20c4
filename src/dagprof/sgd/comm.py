"""Where an all-reduce's time comes from, for a given worker count.

Three sources, most specific first:
1. measured per-layer all-reduce times at exactly that worker count (a B-Caffe log, a
   CSV ``allreduce_us`` column): used as is for layer-wise communication, and fitted
   into a ring alpha-beta model (``fit_alpha_beta``) to price merged or fused messages;
2. a link model for exactly that worker count (an OSU latency table's fit, a ``dagprof
   calibrate`` file's fit at the worker count it was measured with or its ``by_workers`` fits);
3. a link model for any worker count (an interconnect preset or bandwidth), else the
   fit of the nearest measured worker count, scaled by the ring formula.

``comm_model`` assembles a ``CommModel`` from whatever of these the user has.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

from ..collect.measure.overlap import overlap_from_table
from ..costmodel import AlphaBeta, fit_alpha_beta, parse_bandwidth, preset, ring_allreduce_us
from ..costmodel.osu import read_osu_allreduce
from ..costmodel.topology import read_link_model
from ..errors import DagprofError
from ..traces.layerwise import LayerProfile, read_layer_file
from .contention import Contention


@dataclass(frozen=True)
class CommModel:
    default: AlphaBeta | None = None  # any worker count (preset / bandwidth)
    default_name: str = ""
    links: dict[int, AlphaBeta] = field(default_factory=dict)  # exact worker counts (OSU fits)
    link_names: dict[int, str] = field(default_factory=dict)
    measured: dict[int, np.ndarray] = field(default_factory=dict)  # per-layer measured all-reduce us
    # compute and all-reduces slowing each other, measured with a link (``calibrate --overlap``): per worker count, and
    # for any count (key 0) from a file naming none
    contention: dict[int, Contention] = field(default_factory=dict)

    def with_link(self, workers: int, link: AlphaBeta, name: str) -> "CommModel":
        return replace(self, links={**self.links, workers: link}, link_names={**self.link_names, workers: name})

    def contention_at(self, workers: int) -> Contention | None:
        return None if workers == 1 else self.contention.get(workers, self.contention.get(0))

    def with_measured(self, workers: int, grad_bytes: np.ndarray, allreduce_us: np.ndarray, name: str) -> "CommModel":
        """Measured layer times at ``workers``; their ring fit prices merged messages unless a link for ``workers`` exists.

        The fit minimises absolute residuals: it reproduces the measured total, so merged and
        fused messages are priced on the same footing as the measured layer-wise ones, and
        its bandwidth follows the large messages that dominate a fused all-reduce.
        """
        measured = np.asarray(allreduce_us, float)
        model = replace(self, measured={**self.measured, workers: measured})
        timed = (measured > 0) & (np.asarray(grad_bytes) > 0)
        if workers not in self.links and workers > 1 and timed.sum() >= 2:
            fit = fit_alpha_beta(np.asarray(grad_bytes)[timed], measured[timed], workers=workers, relative=False)
            model = model.with_link(workers, fit, f"fit of {name}")
        return model

    def link(self, workers: int) -> tuple[AlphaBeta, str]:
        if workers in self.links:
            return self.links[workers], self.link_names[workers]
        if self.default is not None:
            return self.default, self.default_name
        if self.links:
            nearest = min(self.links, key=lambda n: (abs(n - workers), -n))
            return self.links[nearest], f"{self.link_names[nearest]} (measured at {nearest} workers, ring-scaled)"
        raise DagprofError(f"no all-reduce cost for {workers} workers: give --net, an OSU table or a measured comm log")

    def allreduce_us(self, nbytes: np.ndarray | float, workers: int) -> np.ndarray:
        """Ring all-reduce time; 0 for one worker and for empty messages (a layer without parameters sends nothing)."""
        m = np.asarray(nbytes, dtype=float)
        if workers == 1:
            return np.zeros_like(m)
        return np.where(m > 0, ring_allreduce_us(m, workers, self.link(workers)[0]), 0.0)

    def layer_us(self, grad_bytes: np.ndarray, workers: int) -> np.ndarray:
        if workers == 1:
            return np.zeros(len(grad_bytes))
        if workers in self.measured:
            if len(self.measured[workers]) != len(grad_bytes):
                raise DagprofError(f"measured comm at {workers} workers has {len(self.measured[workers])} layers, the profile {len(grad_bytes)}")
            return self.measured[workers]
        return self.allreduce_us(grad_bytes, workers)

    def describe(self, workers: int) -> str:
        if workers == 1:
            return "none (1 worker)"
        link = self.link(workers)[1]
        return f"measured per layer; merged messages by {link}" if workers in self.measured else link


def link_from_text(text: str) -> tuple[AlphaBeta, str]:
    """An interconnect preset (``10gbe``, ``ib56``...) or a bare bandwidth (``25Gbit``, no latency), and its name."""
    try:
        return preset(text), text
    except DagprofError as unknown:
        try:
            return AlphaBeta.from_bandwidth(parse_bandwidth(text)), f"{text} (no latency)"
        except DagprofError as bad:
            if text.strip()[:1] in tuple("+-.0123456789"):  # a rate, not a preset's name: what is wrong with it
                raise DagprofError(f"--net {text!r}: {bad.problem}") from None
            raise DagprofError(f"--net {text!r}: {unknown}; or give a bandwidth like 10Gbit, 25GB/s") from None


def comm_model(profile: LayerProfile, net: str | None = None, osu: list[str] = (), comm_logs: list[str] = (),
               notes: list[str] | None = None, link_models: list[str] = ()) -> CommModel:
    """All-reduce costs for ``profile`` from every source given, most specific winning (see the module doc).

    ``net``: a preset or bandwidth for any worker count; ``osu``: OSU latency tables (fitted per
    worker count, over the message sizes the profile sends); ``link_models``: ``dagprof calibrate``
    files (the link of the worker count each was measured with: its ``workers``, or every entry of
    ``by_workers``; a file naming neither stands for any worker count); ``comm_logs``: measured per-layer
    all-reduce times (the profile's own ``allreduce_us`` column counts too). Sources that cannot be
    used are explained in ``notes``.
    """
    notes = notes if notes is not None else []
    comm = CommModel()
    if net:
        link, name = link_from_text(net)
        comm = CommModel(default=link, default_name=name)
    for path in link_models:
        comm = _with_link_model(comm, path)
    for path in osu:
        table = read_osu_allreduce(path)
        # fit over the sizes the model will price: small messages use another MPI protocol
        comm = comm.with_link(table.workers, table.fit(min_bytes=int(profile.grad_bytes[profile.grad_bytes > 0].min(initial=0))), table.describe())
    for src in [profile] + [read_layer_file(p) for p in comm_logs]:
        if src.allreduce_us is None:
            if src is not profile:
                raise DagprofError("no allreduce_us column / communication times", src.source)
            continue
        if src.workers is None and src is profile:
            notes.append("the layer file's all-reduce times are unused: its worker count is unknown (name it tmpNcomm.log or add '# workers=N')")
            continue
        if src.workers is None:
            raise DagprofError("cannot tell the worker count of these all-reduce times (name it tmpNcomm.log or add '# workers=N')", src.source)
        if src.num_layers != profile.num_layers:
            raise DagprofError(f"{src.num_layers} layers, the profile has {profile.num_layers}", src.source)
        comm = comm.with_measured(src.workers, profile.grad_bytes, src.allreduce_us, os.path.basename(src.source))
    return comm


def _with_link_model(comm: CommModel, path: str) -> CommModel:
    """A ``dagprof calibrate`` file's all-reduce links at the worker counts they were measured with, else for any count;
    with its ``overlap`` (``calibrate --overlap``), the contention measured on the same ranks."""
    f = read_link_model(path)
    by_workers = f.links_by_workers()
    name = f"{os.path.basename(path)} (calibrate)"
    if f.overlap is not None:
        o = overlap_from_table(f.overlap, path)
        measured_on = f.workers if f.workers else 0  # the ranks it was measured on: a file naming none stands for any count
        comm = replace(comm, contention={**comm.contention, measured_on: Contention(o.model_slowdown, o.comm_slowdown, os.path.basename(path))})
    if not by_workers:
        return replace(comm, default=f.link, default_name=name)
    for n, ab in by_workers.items():
        comm = comm.with_link(n, ab, f"{name}, measured on {n} workers")
    return comm
