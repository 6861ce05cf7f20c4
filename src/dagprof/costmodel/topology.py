"""Cluster shape and per-link alpha-beta models, and the collective scheme a what-if names.

A ``Topology`` is ``hosts x devices_per_host`` ranks (rank r on host r // devices_per_host),
one link model between devices of a host and one for a host's network port. The collective
algorithms that run on it, each with its closed form and its messages, are ``costmodel.collectives``.

Files: a topology is JSON or TOML ``{hosts, devices_per_host, intra: LINK, inter: LINK}``
with ``LINK = {alpha_us, beta_us_per_byte[, gamma_us_per_byte]}`` or
``{bandwidth: "10Gbit", latency_us: 20}`` or ``{preset: "nvlink"}``. A link-model file
(``dagprof calibrate``) is one LINK plus how it was measured; version 2 adds ``kinds``: per collective kind
(``all_gather``, ``reduce_scatter``) the LINK on which an all-reduce of that kind's all-reduce-equivalent
bytes (``allreduce_equivalent_factor``) costs what the kind measured, so FSDP's collectives are priced
from their own measurement (``Topology.for_kind``). A file without ``kinds`` (version 1) prices every
kind on the one LINK. Version 3 adds ``fsdp``: FSDP2's optimizer step, copy-out and per-unit costs as measured on
the group (``costmodel.fsdp_costs``), which DDP -> FSDP reads, and prices each kind at its swept sizes as measured
(``Topology.kind_scale``: the kind's link fits its sweep with every size weighted alike, which leaves its largest sizes,
tens of MBs as a large embedding's unit gathers, 20-40 % under what they measured on gloo); an older file prices as before.
Version 4 adds ``overlap``: how much an in-flight all-reduce slowed compute on the group (``calibrate --overlap``,
``collect.measure.overlap``), which ``optimize --link-model`` prices a held-out job's overlap with.
"""
from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tomllib

from ..errors import DagprofError
from ..fsutil import atomic_open, read_input
from ..traces import formats
from ..traces.events import CommKind
from ..units import MB
from .alphabeta import AlphaBeta, fit_alpha_beta, parse_bandwidth, ring_allreduce_us
from .fsdp_costs import FsdpCosts
from .presets import preset


class Scheme(enum.Enum):
    RING = "ring"
    TREE = "tree"  # binary tree: reduce to rank 0, broadcast back
    HIERARCHICAL = "hier"  # reduce inside each host, ring across hosts, broadcast back
    PS = "ps"  # BytePS-style parameter servers on their own hosts


@dataclass(frozen=True)
class CollectiveSpec:
    scheme: Scheme = Scheme.RING
    servers: int = 0  # PS only: number of servers the tensor is partitioned over

    @classmethod
    def parse(cls, text: str) -> "CollectiveSpec":
        """'ring', 'tree', 'hier', 'ps:4' (4 servers)."""
        name, _, arg = text.strip().lower().partition(":")
        try:
            scheme = Scheme(name)
        except ValueError:
            raise DagprofError(f"unknown collective scheme {text!r}; use ring, tree, hier or ps:K") from None
        if scheme is Scheme.PS:
            if not arg.isdigit() or int(arg) < 1:
                raise DagprofError(f"parameter-server scheme needs a server count >= 1, e.g. ps:4, got {text!r}")
            return cls(scheme, int(arg))
        if arg:
            raise DagprofError(f"scheme {name!r} takes no argument, got {text!r}")
        return cls(scheme)

    def __str__(self) -> str:
        return f"ps:{self.servers}" if self.scheme is Scheme.PS else self.scheme.value


@dataclass(frozen=True)
class Topology:
    """``kinds``: (collective kind, its link) pairs measured per kind (``dagprof calibrate``); a kind
    not listed, and every kind when empty, is priced on ``intra``/``inter`` by its all-reduce equivalent.
    ``kind_scale``: per kind, (all-reduce-equivalent bytes, measured time over its link's price) at each swept size:
    a kind's transfer time is its link's times that ratio, interpolated in log size (``kind_factor``).
    ``link_ratio``: per kind, (all-reduce-equivalent bytes, its time on another link over its time on this one) at each
    size two calibrations swept (``LinkModelFile.ratio_to``): a collective's transfer and exit lag scale by it (``ratio_at``)."""

    hosts: int
    devices_per_host: int
    intra: AlphaBeta  # device <-> device inside a host
    inter: AlphaBeta  # a host's network port (each direction)
    # Fixed software cost per collective (launch, thread hand-off), independent of the number
    # of ranks: what a profile's latency mostly is, unlike the per-message wire latency alpha.
    overhead_us: float = 0.0
    kinds: tuple[tuple[str, AlphaBeta], ...] = ()
    kind_scale: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    link_ratio: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    # per kind, (all-reduce-equivalent bytes, the first rank out's time on the other link less on this one, us) at each size
    # two calibrations swept on ``link_delta_workers`` ranks (``LinkModelFile.delta_to``): where given, a collective's
    # transfer grows by it (scaled to the ranks' wire share), not by ``link_ratio``, and its exit lag still by the ratio
    link_delta: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    link_delta_workers: int = 0
    # the profiled fit of a Horovod job, whose work on the cores runs beside the wire's transfer rather than after it, and
    # the wire alone at the profiled rate: a collective takes at least the fit's price less the profiled wire's time plus
    # the shorter of the two wires' (``passes.link_fit.split_at_wire``); not written by to_dict
    floor: "Topology | None" = None
    floor_wire: "Topology | None" = None
    # every rank's traffic crosses one shaper, both ways (``whatif --half-duplex``): the namespace testbed's one shaped loopback,
    # on 2 ranks a half-duplex link. ``inter`` is then what each port gets while every port carries, as a fit to all-reduces
    # measures it, and a collective in which fewer ranks send at once costs its bytes over the medium (``one_way_share``)
    half_duplex: bool = False

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.devices_per_host < 1:
            raise DagprofError(f"topology needs >= 1 host and >= 1 device per host, got {self.hosts}x{self.devices_per_host}")
        if not self.overhead_us >= 0:
            raise DagprofError(f"collective overhead must be >= 0 us, got {self.overhead_us}")

    @property
    def world_size(self) -> int:
        return self.hosts * self.devices_per_host

    def host_of(self, rank: int) -> int:
        return rank // self.devices_per_host

    def link(self, a: int, b: int) -> AlphaBeta:
        """The model of the path a -> b (ranks; PS servers are hosts of their own)."""
        return self.intra if self.host_of(a) == self.host_of(b) else self.inter

    def one_way_share(self, kind: CommKind, backend: str = "gloo") -> float:
        """``one_way_share`` of a ``kind`` collective on this topology's ranks where every rank's traffic crosses one medium
        (``half_duplex``), 1 elsewhere."""
        return one_way_share(kind, self.world_size, backend) if self.half_duplex else 1.0

    def with_workers(self, workers: int) -> "Topology":
        """Same host shape, more (or fewer) hosts: ``workers`` must fill whole hosts."""
        if workers < 1:
            raise DagprofError(f"workers must be >= 1, got {workers}")
        per = min(self.devices_per_host, workers)
        if workers % per:
            raise DagprofError(f"{workers} workers do not fill hosts of {self.devices_per_host} devices")
        return replace(self, hosts=workers // per, devices_per_host=per, floor=None if self.floor is None else self.floor.with_workers(workers),
                       floor_wire=None if self.floor_wire is None else self.floor_wire.with_workers(workers))

    def kind_factor(self, kind: str, equiv_bytes: float) -> float:
        """What a ``kind`` collective of ``equiv_bytes`` (all-reduce-equivalent) measured over its link's price: the
        nearest swept sizes' ratios interpolated in log size, the end's beyond the sweep; 1 where none was measured."""
        return _interp_log(dict(self.kind_scale).get(kind), equiv_bytes)

    def ratio_at(self, kind: str, equiv_bytes: float) -> float:
        """``link_ratio`` of a ``kind`` collective (an unnamed kind: the all-reduce's) of ``equiv_bytes``, interpolated
        as ``kind_factor``; 1 where no other link was measured."""
        table = dict(self.link_ratio)
        return _interp_log(table.get(kind or "all_reduce", table.get("all_reduce")), equiv_bytes)

    def delta_at(self, kind: str, equiv_bytes: float, workers: int) -> float:
        """``link_delta`` of a ``kind`` collective (an unnamed kind: the all-reduce's) of ``equiv_bytes`` on ``workers``
        ranks, us: interpolated as ``kind_factor``, times the ring's wire share on ``workers`` over the calibrations' ranks."""
        table = dict(self.link_delta)
        points = table.get(kind or "all_reduce", table.get("all_reduce"))
        if not points or equiv_bytes <= 0:
            return 0.0
        m, d = np.array(points, dtype=float).T
        n, w = max(workers, 2), max(self.link_delta_workers, 2)
        return float(np.interp(np.log(equiv_bytes), np.log(m), d)) * ((n - 1) / n) / ((w - 1) / w)

    def for_kind(self, kind: str) -> "Topology":
        """The topology that prices a ``kind`` collective: its own measured link where there is one."""
        ab = dict(self.kinds).get(kind)
        return self if ab is None else replace(self, intra=ab, inter=ab, kinds=())

    def with_link(self, which: str = "inter", bandwidth: float | None = None, latency_us: float | None = None) -> "Topology":
        """Change bandwidth (bytes/s) and/or latency of the 'inter', 'intra' or 'all' links."""
        if which not in ("inter", "intra", "all"):
            raise DagprofError(f"link must be inter, intra or all, got {which!r}")
        if bandwidth is not None and not bandwidth > 0:
            raise DagprofError(f"bandwidth must be positive, got {bandwidth} B/s")
        if latency_us is not None and not latency_us >= 0:
            raise DagprofError(f"latency must be >= 0 us, got {latency_us}")

        def change(ab: AlphaBeta) -> AlphaBeta:
            return AlphaBeta(
                ab.alpha_us if latency_us is None else latency_us,
                ab.beta_us_per_byte if bandwidth is None else 1e6 / bandwidth,
                ab.gamma_us_per_byte,
            )

        def scaled(ab: AlphaBeta) -> AlphaBeta:
            """A kind's measured link under the change: the same latency shift and bandwidth ratio as the all-reduce link's."""
            new = change(self.inter)
            ratio = new.beta_us_per_byte / self.inter.beta_us_per_byte if self.inter.beta_us_per_byte > 0 else 1.0
            return AlphaBeta(max(ab.alpha_us + new.alpha_us - self.inter.alpha_us, 0.0), ab.beta_us_per_byte * ratio, ab.gamma_us_per_byte)

        t = self
        if which in ("inter", "all"):
            t = replace(t, inter=change(t.inter), kinds=tuple((k, scaled(ab)) for k, ab in t.kinds))
        if which in ("intra", "all"):
            t = replace(t, intra=change(t.intra))
        return t

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "devices_per_host": self.devices_per_host, "intra": _link_dict(self.intra), "inter": _link_dict(self.inter),
                "overhead_us": self.overhead_us}

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "topology") -> "Topology":
        try:
            hosts, per = int(d["hosts"]), int(d.get("devices_per_host", 1))
            inter = link_from_dict(d["inter"], source)
            intra = link_from_dict(d["intra"], source) if "intra" in d else inter
            overhead = float(d.get("overhead_us", 0.0))
        except (KeyError, TypeError, ValueError) as err:
            raise DagprofError(f"bad topology ({err}); need hosts, devices_per_host, inter[, intra, overhead_us]", source) from None
        try:
            return cls(hosts, per, intra, inter, overhead)
        except DagprofError as err:  # a value out of range: the line names the file it came from
            raise DagprofError(err.problem, err.path or source) from None

    @classmethod
    def flat(cls, workers: int, link: AlphaBeta) -> "Topology":
        """Every rank on its own host behind ``link`` (a plain Ethernet cluster)."""
        return cls(workers, 1, link, link)


def _interp_log(points: tuple[tuple[float, float], ...] | None, equiv_bytes: float) -> float:
    """(bytes, value) points interpolated in log bytes at ``equiv_bytes``, the end's beyond them; 1 without points."""
    if not points or equiv_bytes <= 0:
        return 1.0
    m, r = np.array(points, dtype=float).T
    return float(np.interp(np.log(equiv_bytes), np.log(m), r))


def _link_dict(ab: AlphaBeta) -> dict[str, float]:
    return {"alpha_us": ab.alpha_us, "beta_us_per_byte": ab.beta_us_per_byte, "gamma_us_per_byte": ab.gamma_us_per_byte}


def link_from_dict(d: Any, source: str = "link") -> AlphaBeta:
    """A LINK entry of a topology or link-model file (see module docstring)."""
    if not isinstance(d, dict):
        raise DagprofError(f"a link must be a table, got {d!r}", source)
    if "preset" in d:
        return preset(str(d["preset"]))
    gamma = _link_number(d, "gamma_us_per_byte", 0.0, source)
    if "bandwidth" in d:
        bw = d["bandwidth"]
        bps = parse_bandwidth(bw) if isinstance(bw, str) else _link_number(d, "bandwidth", None, source)
        if not 0 < bps < float("inf"):
            raise DagprofError(f"link bandwidth must be positive, got {bw!r}", source)
        return AlphaBeta.from_bandwidth(bps, _link_number(d, "latency_us", 0.0, source), gamma)
    missing = [k for k in ("alpha_us", "beta_us_per_byte") if k not in d]
    if missing:
        raise DagprofError(f"link needs alpha_us and beta_us_per_byte (or bandwidth, or preset); missing {missing[0]!r}", source)
    return AlphaBeta(_link_number(d, "alpha_us", None, source), _link_number(d, "beta_us_per_byte", None, source), gamma)


def _link_number(d: dict, key: str, default: float | None, source: str) -> float:
    """A LINK field as a finite non-negative number: NaN or a string would price every collective as NaN or fail later."""
    v = d.get(key, default)
    try:
        f = float("nan") if isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        f = float("nan")
    if not 0 <= f < float("inf"):
        raise DagprofError(f"link {key} must be a finite number >= 0, got {v!r}", source)
    return f


def load_topology(path: str | os.PathLike[str]) -> Topology:
    return Topology.from_dict(_read_table(path), os.fspath(path))


# 5: every rank's time of every repetition per swept size (``times_us``, beside each sweep's ``points``); 4: the compute slowdown
# beside collectives (``overlap``); 3: FSDP2's measured costs (``fsdp``); 2: per-kind links (``kinds``); 1 (no ``version``): one link
LINK_MODEL_VERSION = 5


def save_link_model(path: str | os.PathLike[str], link: AlphaBeta, by_workers: dict[int, AlphaBeta] | None = None,
                    kinds: dict[str, tuple[AlphaBeta, dict[str, Any]]] | None = None, fsdp: FsdpCosts | None = None,
                    fsdp_record: dict[str, Any] | None = None, overlap: dict[str, Any] | None = None, **how: Any) -> str:
    """Write a link-model JSON: one LINK, optionally one per worker count (nccl-tests tables
    fit each GPU count), one per collective kind (with what was measured for it) and FSDP2's measured costs
    (with ``fsdp_record``, the timings they were fitted to), the compute slowdown beside collectives (``overlap``,
    ``collect.measure.overlap.Overlap`` as a table), plus ``how`` it was measured (backend, points, ...)
    for the record. The version is the oldest that reads what the file holds."""
    doc = {**_link_dict(link), **how}
    if by_workers:
        doc["by_workers"] = {str(n): _link_dict(ab) for n, ab in sorted(by_workers.items())}
    if kinds:
        doc["version"] = 2
        doc["kinds"] = {k: {**_link_dict(ab), **rec} for k, (ab, rec) in sorted(kinds.items())}
    if fsdp is not None:
        doc["version"] = 3
        doc["fsdp"] = {**fsdp.to_dict(), **(fsdp_record or {})}
    if overlap is not None:
        doc["version"] = 4
        doc["overlap"] = overlap
    if "times_us" in how:
        doc["version"] = 5
    with atomic_open(path) as f:
        json.dump(doc, f, indent=1)
    return os.fspath(path)


@dataclass(frozen=True)
class LinkModelFile:
    """A ``dagprof calibrate`` link-model file (versions 1 to ``LINK_MODEL_VERSION``), read and checked once
    (``read_link_model``): what each reader of it asks for is a field or a method here."""

    path: str
    link: AlphaBeta
    by_workers: tuple[tuple[int, AlphaBeta], ...]  # the ``by_workers`` table (nccl-tests fits per GPU count), by count
    workers: int | None  # the ranks a live sweep ran on
    backend: str
    kinds: tuple[tuple[str, AlphaBeta], ...]  # ``Topology.kinds``; none in a version-1 file
    kind_scale: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]  # ``Topology.kind_scale``; none before version 3
    fsdp: FsdpCosts | None  # FSDP2's measured costs; None before version 3 (or where calibrate did not measure them)
    overlap: dict[str, Any] | None  # the compute slowdown beside collectives as written (``search.measured`` types it); None before version 4
    sweeps: dict[str, Any]  # the ``points``, ``times_us`` and ``kinds`` as written (``ratio_to`` reads their sweeps: only a live calibrate
    # has them), and the ``cpus`` and ``load`` it ran on (version 5)

    def link_for(self, workers: int | None = None) -> AlphaBeta:
        """The file's link; with ``by_workers`` entries, the one fitted nearest to ``workers``."""
        if workers is None or not self.by_workers:
            return self.link
        return min(self.by_workers, key=lambda e: (abs(e[0] - workers), -e[0]))[1]

    def links_by_workers(self) -> dict[int, AlphaBeta]:
        """The file's links by the worker count each was measured with: every ``by_workers`` entry, else the ``workers``
        a live ``dagprof calibrate`` sweep ran on (empty when the file names neither)."""
        if self.by_workers:
            return dict(self.by_workers)
        return {} if self.workers is None else {self.workers: self.link}

    def on(self, t: Topology, workers: int) -> Topology:
        """``t``'s hosts under this file: its link fitted nearest ``workers`` between every pair of ranks, and its
        per-kind links."""
        link = self.link_for(workers)
        return Topology(t.hosts, t.devices_per_host, link, link, t.overhead_us, self.kinds, self.kind_scale)

    def delta_to(self, target: LinkModelFile) -> tuple[tuple[str, tuple[tuple[float, float], ...]], ...]:
        """``Topology.link_delta`` from the same two files as ``ratio_to``: per kind and size, the first rank out's time
        (each sweep's time less its skew, what the graph's collective node times) on ``target`` less on this link. What a
        job's collective took beyond its calibrated time on the profiled link (a core busy beside it, its hooks) is no wire
        time: a slower link adds the calibrated difference to it, where the ratio multiplied it (the testbed's FSDP2
        reduce-scatters took 9.15 ms in a job against 8.54 ms calibrated at 1 Gbit/s, times 5.36)."""
        out = []
        for kind, (a, b) in self._paired(target).items():
            points = tuple((m * allreduce_equivalent_factor(CommKind.from_label(kind), self.backend), (b[m][0] - b[m][1]) - (a[m][0] - a[m][1]))
                           for m in sorted(set(a) & set(b)) if m > 0)
            if points:
                out.append((kind, points))
        return tuple(out)

    def _paired(self, target: LinkModelFile) -> dict[str, tuple[dict[int, tuple[float, float]], dict[int, tuple[float, float]]]]:
        """Per kind both files swept, each file's {bytes: (time, skew)}; refused in one line where they do not compare."""
        if self.workers != target.workers:
            raise DagprofError(f"the two calibrations ran on {self.workers} and {target.workers} ranks; measure both links with the same "
                               f"ranks (the ratio is the link's alone)", target.path)
        sweeps = []
        for f in (self, target):
            try:
                kinds = f.sweeps["kinds"]
                table = {"all_reduce": (f.sweeps["points"], f.sweeps.get("skew_us")), **{k: (kinds[k]["points"], kinds[k].get("skew_us")) for k in kinds}}
                sweeps.append({k: {int(m): (float(t), float(sk[i]) if sk and i < len(sk) else 0.0) for i, (m, t) in enumerate(pts)}
                               for k, (pts, sk) in table.items()})
            except (KeyError, TypeError, ValueError) as err:
                raise DagprofError(f"not a live dagprof calibrate file: points must be [bytes, us] pairs ({err})", f.path) from None
        return {k: (sweeps[0][k], sweeps[1][k]) for k in sorted(set(sweeps[0]) & set(sweeps[1]))}

    def wire(self, quiet: bool = False) -> LinkModelFile:
        """This live sweep as its wire: in each sweep, the sizes below those from which time grows with bytes priced by a ring
        fit of the sizes that grow (``wire_sweep``), and the file's link that fit of its all-reduce sweep. What a
        ``--link-from``/``--link-to`` pair is read as: on the testbed's 4 ranks over 2 cores every link's sweep read 2.2-8.7 ms
        at 4-64 KiB, loopback's too, rising and falling with bytes (ranks waiting for a core), and the whole sweep's fit
        priced the Mixer's 0.17 MB collectives at 1 Gbit/s at 3.05-3.17 ms against its profile's own 0.70-0.81 (the growing
        sizes' fit: 1.97-2.10). ``quiet`` (both files keep every repetition, version 5): each size read at its quietest
        repetition first (``quiet_sweep``). The file as read where a sweep is not [bytes, us] pairs (``_paired`` refuses it)."""
        try:
            main = quiet_sweep(self.sweeps) if quiet else self.sweeps
            points, link = wire_sweep(main["points"], self.workers or 2)
            kinds = {k: v | {"points": wire_sweep(v["points"], self.workers or 2)[0]}
                     for k, v0 in self.sweeps["kinds"].items() for v in [quiet_sweep(v0) if quiet else v0]}
        except (KeyError, TypeError, ValueError):
            return self
        return replace(self, link=link or self.link, sweeps=self.sweeps | main | {"points": points, "kinds": kinds})

    def scheduled(self) -> str:
        """What this live sweep's all-reduces read below the sizes from which time grows with bytes (``growing_from``), in
        numbers a user can act on: their medians, their quietest repetitions and how far apart the ranks got out (version 5),
        and the ranks over the CPUs at the load it ran at (version 5); '' where the sizes grew from the first or are not
        [bytes, us] pairs. A spread of ms at KiB sizes, every rank alike, is ranks waiting for a core, not the wire."""
        try:
            points = self.sweeps["points"]
            i = growing_from(points)
            t = np.array(points, dtype=float)[: i + 1]
        except (KeyError, TypeError, ValueError):
            return ""
        if i == 0:
            return ""
        text = f"its all-reduces of {_kib(t[0, 0])}-{_kib(t[-1, 0])} took {t[:, 1].min() / 1e3:.2f}-{t[:, 1].max() / 1e3:.2f} ms (medians) whatever their bytes"
        if "times_us" in self.sweeps:
            reps = [np.asarray(x, dtype=float) for x in self.sweeps["times_us"][: i + 1]]
            quiet = [x.max(axis=0).min() for x in reps]
            apart = [np.median(x.max(axis=0) - x.min(axis=0)) for x in reps]
            text += (f", {min(quiet) / 1e3:.2f}-{max(quiet) / 1e3:.2f} in their quietest repetition, the ranks getting out "
                     f"{min(apart) / 1e3:.2f}-{max(apart) / 1e3:.2f} ms apart")
        if "cpus" in self.sweeps:
            text += f"; {self.workers} ranks on {self.sweeps['cpus']} CPUs at load {max(self.sweeps.get('load') or [0.0]):.1f}"
        return text

    @property
    def repetitions(self) -> bool:
        """Whether every sweep keeps each repetition's times (version 5), which ``wire(quiet=True)`` reads."""
        return "times_us" in self.sweeps and all("times_us" in v for v in self.sweeps.get("kinds", {}).values())

    def ratio_to(self, target: LinkModelFile) -> tuple[tuple[str, tuple[tuple[float, float], ...]], ...]:
        """``Topology.link_ratio`` from two live ``dagprof calibrate`` files, this one measured on the link a run was profiled
        on and ``target`` on the target link, with the same ranks: per kind (the all-reduce from the main sweep, FSDP's from
        their own sweeps, version 2 on), the target's time over the profiled link's at each size both swept, keyed by
        all-reduce-equivalent bytes. A ratio measured at the size, not a link fit: on the namespace testbed the token bucket
        passes 1 ms of traffic at once after an idle moment whatever the rate, so a 1 MiB all-gather took 5.4x as long at a
        fifth of the rate, where the profile's fitted bandwidth scaled by the rate ratio prices 5x less a fixed overhead."""
        out, backend = [], self.backend
        for kind, (a, b) in self._paired(target).items():
            points = tuple((m * allreduce_equivalent_factor(CommKind.from_label(kind), backend), b[m][0] / a[m][0])
                           for m in sorted(set(a) & set(b)) if m > 0 and a[m][0] > 0 and b[m][0] > 0)
            if points:
                out.append((kind, points))
        if "all_reduce" not in dict(out):
            raise DagprofError("the two calibrations swept no size in common", target.path)
        return tuple(out)


def quiet_sweep(sweep: dict[str, Any]) -> dict[str, Any]:
    """A sweep (``points``, ``skew_us``, ``times_us``) read at each size's quietest repetition: the one whose last rank out
    took least, its time and its ranks' spread. A wait for a core only adds, so the least is the nearest the wire: on the
    testbed's 4 ranks over 2 cores the loopback's medians priced the Mixer's 0.17 MiB collectives at 1.2-2.0 ms, the quietest
    repetitions at 0.55-0.8, its profiles' own fits 0.3-0.4."""
    points, skew = [], []
    for (m, _), t in zip(sweep["points"], sweep["times_us"]):
        t = np.asarray(t, dtype=float)
        r = int(np.argmin(t.max(axis=0)))
        points.append([m, float(t[:, r].max())])
        skew.append(float(t[:, r].max() - t[:, r].min()))
    return sweep | {"points": points} | ({"skew_us": skew} if "skew_us" in sweep else {})


def _kib(nbytes: float) -> str:
    return f"{nbytes / MB:.3g} MiB" if nbytes >= MB else f"{nbytes / 1024:.0f} KiB"


def growing_from(points: list[list[float]]) -> int:
    """The index of the last size in ``points`` ([bytes, us], by bytes) whose time does not grow with bytes: from there on
    each size took longer than the one before."""
    t = np.array(points, dtype=float).reshape(-1, 2)[:, 1]
    i = len(t) - 1
    while i > 0 and t[i - 1] < t[i]:
        i -= 1
    return i


def wire_sweep(points: list[list[float]], workers: int) -> tuple[list[list[float]], AlphaBeta | None]:
    """``points`` ([bytes, us], by bytes) with each size below the last one whose time does not grow with bytes priced by a ring
    fit of the sizes from there on, and that fit; as given (and None) where fewer than two sizes grow."""
    b, t = np.array(points, dtype=float).reshape(-1, 2).T
    i = growing_from(points)
    if len(b) - i < 2 or i == 0:
        return points, None
    fit = fit_alpha_beta(b[i:], t[i:], workers)
    return [[m, float(ring_allreduce_us(m, workers, fit)) if k < i else y] for k, (m, y) in enumerate(points)], fit


def read_link_model(path: str | os.PathLike[str]) -> LinkModelFile:
    """A link-model file (``save_link_model``), every section checked: one line naming the file for what is wrong."""
    formats.expect(path, "link-model")  # a strategy given here read "link needs alpha_us and beta_us_per_byte"
    d, p = _read_table(path), os.fspath(path)
    version = d.get("version", 1)
    if not isinstance(version, int) or version > LINK_MODEL_VERSION:
        raise DagprofError(f"link-model version {version!r} is newer than this dagprof reads ({LINK_MODEL_VERSION})", p)
    table = d.get("by_workers")
    by_workers = {_worker_count(n, p): link_from_dict(link, p) for n, link in (table.items() if isinstance(table, dict) else ())}
    workers = None if d.get("workers") is None else _worker_count(d["workers"], p)
    kind_table = d.get("kinds") or {}
    if not isinstance(kind_table, dict) or not set(kind_table) <= set(KIND_LABELS):
        raise DagprofError(f"kinds must be a table of {', '.join(KIND_LABELS)}", p)
    kinds = tuple((k, link_from_dict(kind_table[k], p)) for k in sorted(kind_table))
    backend = str(d.get("backend", "gloo"))
    kind_scale, world = [], 2 if workers is None else workers
    for kind, link in kinds if version >= 3 else ():
        try:
            factor = allreduce_equivalent_factor(CommKind.from_label(kind), backend)
            points = sorted((float(m) * factor, float(t)) for m, t in kind_table[kind].get("points", ()))
        except (TypeError, ValueError) as err:
            raise DagprofError(f"kinds.{kind}.points must be [bytes, us] pairs and workers a count ({err})", p) from None
        scale = tuple((m, t / r) for m, t in points if m > 0 for r in [float(ring_allreduce_us(m, world, link))] if r > 0 and t > 0)
        if scale:
            kind_scale.append((kind, scale))
    fsdp = None if d.get("fsdp") is None else FsdpCosts.from_dict(d["fsdp"], p)
    for where, points in [("points", d.get("points")), *((f"kinds.{k}.points", kind_table[k].get("points")) for k in kind_table)]:
        _check_points(points, where, p)
    for where, points, times in [("", d.get("points"), d.get("times_us")),
                                 *((f"kinds.{k}.", kind_table[k].get("points"), kind_table[k].get("times_us")) for k in kind_table)]:
        _check_times(points, times, f"{where}times_us", workers, p)
    _check_machine(d.get("cpus"), d.get("load"), p)
    sweeps = {"kinds": kind_table, **{k: d[k] for k in ("points", "times_us", "cpus", "load") if k in d}}
    return LinkModelFile(p, link_from_dict(d, p), tuple(sorted(by_workers.items())), workers, backend, kinds, tuple(kind_scale), fsdp,
                         d.get("overlap"), sweeps)


def _check_points(points: Any, where: str, path: str) -> None:
    """A sweep's [bytes, us] pairs: a negative or non-finite one (a damaged file) would be dropped from the fits unseen."""
    if points is not None and not isinstance(points, list):
        raise DagprofError(f"{where} must be a list of [bytes, us] pairs, got {points!r}", path)
    for pair in points or ():
        try:
            ok = len(pair) == 2 and all(0 <= float(x) < float("inf") for x in pair)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise DagprofError(f"{where} must be [bytes, us] pairs of finite numbers >= 0, got {pair!r}", path)


def _check_times(points: Any, times: Any, where: str, workers: int | None, path: str) -> None:
    """A sweep's ``times_us`` (version 5): per size of ``points``, every rank's time of every repetition, finite and >= 0, one
    row per rank the sweep ran on (a size missing a rank's row was read at its quietest repetition of the ranks left)."""
    if times is None:
        return
    try:
        a = [np.array(t, dtype=float) for t in times]
        ok = len(a) == len(points or ()) and all(x.ndim == 2 and x.size and np.all((x >= 0) & np.isfinite(x)) for x in a)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DagprofError(f"{where} must hold, per swept size, every rank's times (ranks x repetitions) as finite numbers >= 0", path)
    ranks = [len(x) for x in a]
    bad = next((i for i, n in enumerate(ranks) if n != (workers or ranks[0])), None)
    if bad is not None:
        raise DagprofError(f"{where}[{bad}] holds {ranks[bad]} rank(s)' times, the sweep ran on {workers or ranks[0]} "
                           "(a rank's row lost: a damaged file)", path)


def _check_machine(cpus: Any, load: Any, path: str) -> None:
    """Version 5's ``cpus`` and ``load`` (what the sweep ran on, said where a sweep reads ranks waiting for a core)."""
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1):
        raise DagprofError(f"cpus must be the count of CPUs the sweep's ranks ran on (an integer >= 1), got {cpus!r}", path)
    try:
        ok = load is None or isinstance(load, list) and all(0 <= float(x) < float("inf") and not isinstance(x, (bool, str)) for x in load)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DagprofError(f"load must be the load averages before and after the sweep (finite numbers >= 0), got {load!r}", path)


def _worker_count(n: Any, path: str) -> int:
    if not str(n).isdigit() or int(n) < 1:
        raise DagprofError(f"worker count {n!r} is not a positive integer", path)
    return int(n)


# bytes of the ring all-reduce that costs what a collective of S bytes costs, per kind: a ring all-gather or
# reduce-scatter of S bytes sends (n-1)/n S per rank, half an all-reduce of S; gloo has no reduce-scatter of its
# own and all-reduces the whole tensor (``graph.build_fsdp.allreduce_equivalent_bytes``). An all-to-all of an S-byte
# buffer sends each other rank its S/n chunk and receives as much, (n-1)/n S per port each way, half an all-reduce of S:
# gloo (gloo/alltoall.cc) posts every send and receive at once, NCCL runs it as grouped send/recv to every peer
# (nccl-tests' bus bandwidth: (n-1)/n of the algorithm's, against 2 (n-1)/n for an all-reduce); gloo's takes longer
# than its bytes (``all_to_all_factor``)
KIND_FACTORS = {CommKind.ALL_GATHER: 0.5, CommKind.REDUCE_SCATTER: 0.5, CommKind.ALL_REDUCE: 1.0, CommKind.ALL_TO_ALL: 0.5}
KIND_LABELS = tuple(k.label for k in KIND_FACTORS)  # the kinds a link-model file may measure on their own


def allreduce_equivalent_factor(kind: CommKind, backend: str = "gloo", world: int | None = None) -> float:
    """Bytes of the ring all-reduce on ``world`` ranks that costs what a ``kind`` collective of one byte costs
    (``KIND_FACTORS``; a broadcast: ``broadcast_factor``; an all-to-all: ``all_to_all_factor``; a gather or scatter of one
    byte per rank: ``rooted_factor``; an all-gather of one gathered byte ``all_gather_factor`` where ``world`` is given,
    else half; any other kind an all-reduce of its bytes). Without ``world`` the rank-dependent kinds take 2 ranks'."""
    if kind == CommKind.ALL_GATHER and world is not None:
        return all_gather_factor(world, backend)
    n = 2 if world is None else world
    if kind in ROOTED:
        return rooted_factor(n)
    if kind == CommKind.BROADCAST:
        return broadcast_factor(n, backend)
    if kind == CommKind.ALL_TO_ALL:
        return all_to_all_factor(n, backend)
    return 1.0 if kind == CommKind.REDUCE_SCATTER and backend == "gloo" else KIND_FACTORS.get(kind, 1.0)


def one_way_share(kind: CommKind, world: int, backend: str = "gloo") -> float:
    """What a ``kind`` collective's all-reduce-equivalent bytes on ``world`` ranks cost per byte where every rank's traffic
    crosses one medium (``Topology.half_duplex``): its bytes crossing the medium over the all-reduce's (an all-reduce of S
    bytes on N ranks puts 2 (N-1) S on it, at the fitted rate per port times N). A scatter or gather of B per rank puts
    (N-1) B on it, 1/N of its price on ports; a broadcast of S (N-1) S, 1 / (2 ``broadcast_factor``); gloo's
    all-to-all of S (N-1) S, (N-1)/N of ``all_to_all_factor``'s; an all-gather of S gathered (N-1) S, a
    half over ``all_gather_factor``. On 2 ranks each is 1/2: one direction at a time.
    On the testbed's shaped loopback (``bench/bcast_sweep.py --loopback``, 200 Mbit/s, 0.5-8 MB) a broadcast took
    0.495-0.504 of the all-reduce on 2 and on 4 ranks, and an all-to-all 0.491-0.534, where a 1/2 share for a
    broadcast on any N priced it at 1.0 of the all-reduce on 4. Priced as on full-duplex ports, CLIP's backward
    scatters there grew by 35 ms a step from 1 Gbit/s to 200 Mbit/s where they measured about 7."""
    n = max(int(world), 2)
    if kind in (CommKind.SCATTER, CommKind.GATHER):
        return 1.0 / n
    if kind == CommKind.BROADCAST:
        return 1.0 / (2.0 * broadcast_factor(n, backend))
    if kind == CommKind.ALL_TO_ALL:
        return KIND_FACTORS[CommKind.ALL_TO_ALL] / all_to_all_factor(n, backend)
    if kind == CommKind.ALL_GATHER:
        return KIND_FACTORS[CommKind.ALL_GATHER] / all_gather_factor(n, backend)
    return 1.0


def all_gather_factor(world: int, backend: str = "gloo") -> float:
    """An all-gather's all-reduce-equivalent bytes per gathered byte on ``world`` ranks: half (``KIND_FACTORS``: each port
    moves (N-1) chunks each way, as the ring all-reduce of N/2 chunks does), but 3/4 for gloo's on 2 ranks. gloo's ring
    (gloo/allgather.cc) cuts each rank's chunk in two halves and posts, per half, its send to the right before its
    receive from the left, two halves in flight. Its TCP transport writes a send's bytes only once the peer's receive is
    posted, which the peer announces by a notification on the same pair, queued behind what that pair is still writing
    (``Pair::send``, ``Pair::sendAsyncMode``). On 2 ranks left and right are one peer: the rank that comes last finds
    both of its peer's receives posted and writes its two halves ahead of its own receives' notifications, so the first
    rank's halves leave only after the last's first half has crossed: three halves one after another, 3/2 of the chunk's
    time where the all-reduce of the chunk takes 1 (both directions at once). On 3 or more ranks a rank's notifications
    go to its other neighbour and both directions run at once. On the namespace testbed, 2 ports shaped both ways
    (``bench/bcast_sweep.py --both-ways``, 200 Mbit/s, 0.5-8 MB a chunk) it took 1.36-1.48 of the all-reduce of its
    chunk (load 4.9) and 1.25-1.41 (load 13.8): priced 1.5, 1.0 before; on the one shaped loopback, where one direction
    at a time costs nothing more, 1.00-1.02 (``Topology.one_way_share`` takes it back). Another backend: half."""
    if backend not in ("gloo", "", None) or int(world) != 2:
        return KIND_FACTORS[CommKind.ALL_GATHER]
    return 0.75


def all_to_all_factor(world: int, backend: str = "gloo") -> float:
    """An all-to-all's all-reduce-equivalent bytes per byte of its buffer on ``world`` ranks. It sends (N-1)/N of the
    buffer from each port and receives as much (``KIND_FACTORS``: 1/2), and so it goes on NCCL (unmeasured here). gloo's
    takes as long as the whole buffer through one port, N / (2 (N-1)): 1 on 2 ranks, 2/3 on 4. On the namespace testbed
    (``bench/bcast_sweep.py --kind all_to_all``, each rank's port shaped, 0.5-8 MB, load 3.7-6.0) its ports sent (N-1)/N
    of it (tx counters), yet it took 0.92-0.97 of the all-reduce of its bytes on 2 ranks from 2 MB (0.72-0.97 at
    1 Gbit/s), 2.06-2.09 times its bytes at the port's rate: its two directions ran one after the other; on 4 ranks
    0.54-0.64 (0.34 at 0.5 MB, 1 Gbit/s), 1.40-1.42 times its bytes' time from 2 MB at 200 Mbit/s. That testbed shaped
    each port's egress alone, so a rank received from its N-1 peers at once at their summed rate, which no switch port
    does and an all-reduce's ring (one peer each way) never asks; with each port shaped both ways (``--both-ways``, load
    3.9-4.9) it took 0.62-0.71 of the all-reduce on 4 ranks at 200 Mbit/s and 1 Gbit/s, 0.5-8 MB (priced 0.667), and
    0.86-0.97 on 2 (0.73-0.93 at 1 Gbit/s; priced 1). Why a direction at a time: gloo's TCP pair sends its operations in
    order (``Pair::sendAsyncMode`` queues one behind an unfinished write), and a receive is announced to the peer by a
    notification on the same pair, so a rank that posts its send to a peer before its receive from it (every pair on 2
    ranks) holds the peer's send until its own data has crossed; on 4 ranks that depends on which rank reaches the call
    last. Where one medium carries every rank's traffic, a direction at a time costs nothing more:
    ``Topology.one_way_share`` takes it back to its bytes."""
    n = max(int(world), 2)
    if backend not in ("gloo", "", None):
        return KIND_FACTORS[CommKind.ALL_TO_ALL]
    return n / (2.0 * (n - 1))


# a gather or scatter (its bytes: one rank's chunk, as gloo's Kineto events and the collector record it), priced as the
# all-gather of every rank's chunk (``CommKind.priced_as``)
ROOTED = frozenset(k for k in CommKind if k.priced_as == CommKind.ALL_GATHER and k != CommKind.ALL_GATHER)


def rooted_factor(world: int) -> float:
    """A gather's or scatter's all-reduce-equivalent bytes per byte of one rank's chunk on ``world`` ranks: the all-gather of
    the N chunks (``KIND_FACTORS``: N/2), N/2 times an all-reduce of the chunk. gloo's (``ProcessGroupGloo``: ``gloo::gather``,
    ``gloo::scatter``) is root-based: the root receives (or sends) the N-1 other chunks, one point-to-point transfer each,
    all posted at once, so its port moves (N-1) chunks, as each port of a ring all-gather does, where the all-reduce of one
    chunk moves 2 (N-1)/N. On the namespace testbed with each rank's port shaped both ways (``bench/bcast_sweep.py
    --both-ways``, 0.5-8 MB a chunk, load 3.9-4.9) a gather and a scatter took 1.77-1.96 of the all-reduce of their chunk on
    4 ranks at 200 Mbit/s and 1 Gbit/s (1.03-1.09 times their root's (N-1) chunks at the port's rate), 0.82-0.98 on 2 from
    2 MB: priced N/2, 2 and 1; as an all-reduce of the chunk before (``priced_kind``), 1 on any N, about half what a 4-rank
    one took. On the one shaped loopback (``--loopback``, 200 Mbit/s, 0.25-2 MB, load 7-8.4) they took 0.49-0.51 on 2 ranks
    and on 4: the medium carries (N-1) chunks against the all-reduce's 2 (N-1), which ``Topology.one_way_share`` gives
    (1/N of the price on ports); before, 1 (2x). ``tests/data/gloo-kinds`` holds traces of both."""
    return KIND_FACTORS[CommKind.ALL_GATHER] * max(int(world), 1)


def latency_steps(kind: CommKind, world: int, backend: str = "gloo") -> int:
    """How many per-step latencies (``AlphaBeta.alpha_us``, a fit's intercept per ring step) a collective waits through on
    ``world`` ranks: the ring all-reduce's 2 (N-1), and so every kind priced as it, but under gloo a gather's or scatter's 1
    (``gloo::gather``, ``gloo::scatter``: the root posts its N-1 receives or sends at once, and each peer's one transfer
    starts on the root's notification) and a ring all-gather's N-1 (gloo/allgather.cc: one step per hop, its two halves
    in flight hiding each other's wait; on 2 ranks 2, the halves one after the other, ``all_gather_factor``). Priced at
    the all-reduce's 2 (N-1), the gathers and scatters of 0.5 MB on 4 ports shaped both ways (``tests/data/gloo-kinds``,
    the all-reduces' fit: 2.9 ms a step) came 26-28 % over what they took, and so did the all-gathers by 11 %."""
    n = max(int(world), 1)
    if backend in ("gloo", "", None) and n >= 2:
        if kind in ROOTED:
            return 1
        if kind == CommKind.ALL_GATHER:
            return 2 * (n - 1) if n == 2 else n - 1
    return 2 * (n - 1)


def priced_kind(kind: CommKind) -> CommKind:
    """The kind the link model prices a graph's collective as: the kind whose price it takes (``CommKind.priced_as``: a
    gather or scatter an all-gather's, of every rank's chunk, ``rooted_factor``), an all-gather, reduce-scatter, broadcast or
    all-to-all as itself, any other (a send, one its reader could not tell) as an all-reduce of its bytes."""
    priced = kind.priced_as
    return priced if priced in (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER, CommKind.BROADCAST, CommKind.ALL_TO_ALL) else CommKind.ALL_REDUCE


def per_rank_equivalent_bytes(kind: CommKind, nbytes: float, world: int, backend: str = "gloo") -> float:
    """Bytes of the ring all-reduce on ``world`` ranks that costs what a collective of ``nbytes`` (as the events carry them,
    ``CommKind.event_bytes``: an all-gather's gathered total) costs: an all-gather half of them (``KIND_FACTORS``), a scatter
    or gather of a chunk the all-gather of ``world`` chunks (``rooted_factor``); a broadcast ``broadcast_factor``; an
    all-to-all of an ``nbytes`` buffer ``all_to_all_factor``; anything else an all-reduce of them."""
    if kind in (CommKind.ALL_GATHER, CommKind.ALL_TO_ALL, CommKind.BROADCAST, *ROOTED):
        return allreduce_equivalent_factor(kind, backend, world) * nbytes
    return allreduce_equivalent_factor(CommKind.ALL_REDUCE, backend, world) * nbytes


def broadcast_factor(world: int, backend: str = "gloo") -> float:
    """A broadcast's all-reduce-equivalent bytes per byte on ``world`` ranks: its time in whole-buffer sends
    (``broadcast_sends``) over the ring all-reduce's 2 (N-1)/N sends per port: 1 on 2 ranks, 1.5 on 3, 2 on 4, 24/7 on 8.
    The latency (the tree's hops against the ring's 2 (N-1)) is not matched: the bytes are. On the namespace testbed
    (``bench/bcast_sweep.py``: each rank's port shaped to 200 Mbit/s, 0.5-8 MB, two sweeps, load 1.9-3.0) broadcast over
    all-reduce measured 0.88-0.97 on 2 ranks, 1.40-1.47 on 3, 1.55-1.94 on 4 (1.85-1.94 from 2 MB) and 2.03-2.31 on 5
    (model 2.5), where the tree's ceil(log2 N) rounds alone would give 4/3 on 4 and 1.9 on 5. The 8 MB broadcast itself
    took 1.04, 2.09, 3.1 and 4.2 times one send of it at the port's rate on 2-5 ranks (``broadcast_sends``: 1, 2, 3, 4);
    the ratio's shortfall on 5 is the all-reduce's, 15 % over its ring's time there. Another backend (NCCL's pipelined
    ring) is not measured here: priced as an all-reduce of its bytes, as before."""
    n = max(int(world), 2)
    if backend not in ("gloo", "", None):
        return 1.0
    return broadcast_sends(n) * n / (2 * (n - 1))


def broadcast_sends(world: int) -> int:
    """How long gloo's ``broadcast`` (gloo/broadcast.cc) takes on ``world`` ranks, in times one whole buffer takes to
    cross one port. It is a binomial tree in virtual ranks (the root 0): rank v > 0 receives from v - 2^h (h its highest
    bit), then sends to v + 2^i for every later round i < ceil(log2 N); the root sends in every round. A rank issues all
    its sends at once (gloo waits only on receives), so its k children share its port and each has the buffer k sends
    after the parent had it. The last rank's time: 1 on 2 ranks, 2 on 3, 3 on 4 (rank 1 gets it at 2, alongside rank 2,
    then forwards it to rank 3), 6 on 8."""
    dim = (max(world, 1) - 1).bit_length()
    have, todo = {0: 0}, [0]
    while todo:
        v = todo.pop()
        first = v.bit_length()  # v's own round + 1 (the root: round 0)
        kids = [v + (1 << i) for i in range(first, dim) if v + (1 << i) < world]
        for c in kids:
            have[c] = have[v] + len(kids)
            todo.append(c)
    return max(have.values())


def parse_topology(spec: str, workers: int) -> Topology:
    """A topology file (JSON/TOML), or presets: ``10gbe`` (every rank its own host) or
    ``nvlink/100gbe:8`` (8 devices per host over nvlink, hosts over 100gbe); sized to ``workers``."""
    if os.path.exists(spec):
        return load_topology(spec).with_workers(workers)
    links, _, per = spec.partition(":")
    intra_name, _, inter_name = links.rpartition("/")
    try:
        inter = preset(inter_name)
        intra = preset(intra_name) if intra_name else inter
    except DagprofError as e:  # a mistyped file name reads as a preset: say it is neither
        raise DagprofError(f"no such topology file, and {e.problem} (INTRA/INTER:N, e.g. nvlink/100gbe:8)", spec) from None
    if per and not per.isdigit():
        raise DagprofError("devices per host must be a number (e.g. nvlink/100gbe:8)", spec)
    return Topology(1, int(per) if per else 1, intra, inter).with_workers(workers)


def _read_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = os.fspath(path)
    raw = read_input(p)
    try:
        d = tomllib.loads(raw.decode()) if p.endswith(".toml") else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise DagprofError(f"not valid {'TOML' if p.endswith('.toml') else 'JSON'}: {err}", p) from None
    if not isinstance(d, dict):
        raise DagprofError("expected a table at top level", p)
    return d


def fit_sweep(nbytes: np.ndarray, time_us: np.ndarray, workers: int) -> AlphaBeta:
    """Ring alpha-beta from an all-reduce size sweep, trusting each size where it is informative.

    A least-squares fit over 4 KiB..16 MiB lets TCP's small-message behaviour (bursts pass at
    line rate, then the flow settles) pull the bandwidth up by tens of percent, and DDP buckets
    are MBs. So beta is the slope over the large messages (>= 1 MiB, at least the largest two),
    and alpha the median of what remains of every message once its bytes are paid for (a median:
    one late first message must not set the latency). Every size, not the small ones alone: on a
    loaded machine a small all-reduce waits for the scheduler far more often than an MB one (an
    unshaped veth sweep on 2 shared cores: 16-256 KB took 2.5-4.2 ms where 4 KB took 0.35 ms and the
    1-16 MB messages left 0-0.7 ms), and a latency from the small sizes alone made the link miss its own
    1 MB and 4 MB points by +100 % and +56 % (``tests/test_topology_model.py``).
    """
    m, t = np.asarray(nbytes, dtype=float), np.asarray(time_us, dtype=float)
    if len(m) < 2 or len(m) != len(t) or workers < 2:
        raise DagprofError(f"need >= 2 (size, time) points and >= 2 workers to fit a sweep, got {len(m)} points, {workers} workers")
    order = np.argsort(m)
    m, t = m[order], t[order]
    share = 2 * (workers - 1) / workers  # bytes each link carries per byte reduced
    big = m >= MB
    if big.sum() < 2:
        big = np.arange(len(m)) >= len(m) - 2
    slope = np.polyfit(share * m[big], t[big], 1)[0]
    if not slope > 0:  # noise swamped the growth (fast link, short sweep): the largest message alone
        slope = t[-1] / (share * m[-1])
    if not slope > 0:
        raise DagprofError("all-reduce times in this sweep are not positive; cannot fit a bandwidth")
    rest = np.maximum(t - share * m * slope, 0.0)
    return AlphaBeta(float(np.median(rest)) / (2 * (workers - 1)), float(slope))
