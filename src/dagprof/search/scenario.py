"""What-if scenarios: the axes a scenario changes, and the passes that change the run's graph for each.

Each axis of a scenario (workers, bandwidth, ...) is declared once, in ``AXES``: its ``Scenario`` field, which is
also its column, its ``dagprof whatif`` flag and parser, and its pass; ``PASSES`` is the order the passes run in
(workers, FSDP's HSDP mesh, DDP <-> FSDP, FSDP unit granularity, scheme, link, FSDP reduce dtype, buckets, partition, compute, cores, Horovod fusion/cycle,
fine-grained collectives, FSDP reshard). ``Cluster`` holds what every scenario of a table shares; ``apply`` runs the passes.
``search.whatif`` replays the scenarios.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..costmodel.alphabeta import parse_bandwidth, ring_allreduce_us
from ..costmodel.topology import CollectiveSpec, LinkModelFile, Topology, parse_topology, read_link_model
from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph, refuse_replicated_by_fsdp, refuse_several_roots
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..passes import expand_collectives, partition_tensors, scale_compute, scale_workers, set_buckets, set_link, set_scheme, set_topology
from ..passes.buckets import refuse_own_ddp_setup
from ..passes.comm import current_topology, ps_bandwidth, ps_port_share, set_link_ratio
from ..passes.comm_cpu import keep_comm_cpu
from ..passes.compute import share_cores
from ..passes.crowded_cores import refuse_uncrowding
from ..passes.data_parallel import keep_wake_up, parse_target, to_data_parallel, with_optimizer_state
from ..passes.fsdp import UNMODELLED, refuse_unmodelled, set_reduce_dtype, set_reshard
from ..passes.fsdp_mesh import parse_mesh, scale_fsdp_workers, set_mesh
from ..passes.fsdp_units import merge_units, parse_units
from ..passes.horovod import set_horovod
from ..passes.link_fit import graph_world_size, priced_comm, priced_world_size
from ..passes.overlap import comm_demand, disturbed, slowed_nodes, undisturbed
from ..replay import ReplayResult, replay
from ..units import MAX_CONTENDED_WORKERS, MAX_WORKERS, MB, finite_non_negative, finite_positive, positive_int, positive_number, worker_count
from .measured import slowdown_of
from .memory import OPTIMIZER_STATE


@dataclass
class Scenario:
    """One row of a what-if table; None leaves that aspect as profiled. Each field is an axis of ``AXES``."""

    workers: int | None = None
    bandwidth: str | None = None  # as the user wrote it, e.g. 10Gbit (``costmodel.alphabeta.parse_bandwidth`` reads it)
    latency_us: float | None = None
    link_to: str | None = None  # a `dagprof calibrate` file of the target link, against ``Cluster.link_from`` (costmodel.topology.LinkModelFile.ratio_to)
    bucket_mb: float | None = None  # inf: one bucket per step
    scheme: CollectiveSpec | None = None
    partition: int | None = None
    compute_speed: float | None = None  # 2 = twice as fast
    fusion_mb: float | None = None  # HOROVOD_FUSION_THRESHOLD in MiB (Horovod runs)
    cycle_ms: float | None = None  # HOROVOD_CYCLE_TIME (Horovod runs)
    reshard_after_forward: bool | None = None  # FSDP's, passed explicitly to every unit (the root too)
    reduce_dtype: str | None = None  # FSDP's MixedPrecisionPolicy(reduce_dtype=...), a torch dtype name: bfloat16
    data_parallel: str | None = None  # the wrapper: ddp, fsdp or fsdp:keep (passes.data_parallel)
    units: str | None = None  # FSDP unit granularity: merge:N, merge:all or A+B/C+D (passes.fsdp_units)
    mesh: tuple[int, int] | None = None  # FSDP2's (replicate, shard) layout, HSDP (passes.fsdp_mesh)

    def label(self) -> dict:
        """The row's axis columns, by ``AXES``."""
        return {a.name: None if (v := getattr(self, a.name)) is None else a.cell(v) for a in AXES}


@dataclass
class Cluster:
    """Settings that hold for every scenario of a table."""

    link: str = "inter"  # which links bandwidth/latency change: inter, intra, all
    topology: str | None = None  # a file or presets like "nvlink/100gbe:8"
    link_model: str | None = None  # a `dagprof calibrate` file
    link_from: str | None = None  # a `dagprof calibrate` file of the profiled link: ``Scenario.link_to`` scales prices by the two's ratio
    profiled_bandwidth: str | None = None  # the wire rate the run was profiled at, as written (``passes.link_fit.split_at_wire``)
    first_bucket_mb: float | None = None
    overlap: bool = True  # False: all-reduces start after the whole backward
    cores: int | None = None  # cores per host shared by its ranks
    ranks_per_host: int | None = None
    fine: bool = False  # per-message collectives on per-link queues
    optimizer_state: str = "momentum"  # --data-parallel fsdp from DDP: optimizer state per parameter (search.memory.OPTIMIZER_STATE)
    slowdown: float = 0.0  # compute beside in-flight collectives takes (1 + slowdown x overlap) as long (search.measured.slowdown_of)
    comm_rate: float | None = None  # bytes/s of the all-reduce the slowdown was measured beside (None: each collective counts whole)
    half_duplex: bool = False  # every rank's traffic crosses one shaper, both ways (``Topology.half_duplex``)
    link_file: LinkModelFile | None = field(init=False, repr=False)  # ``link_model`` read once, for every pass and scenario
    profiled_wire: float | None = field(init=False, repr=False)  # ``profiled_bandwidth`` read once, bytes/s

    def __post_init__(self) -> None:
        self.link_file = None if self.link_model is None else read_link_model(self.link_model)
        self.profiled_wire = None if self.profiled_bandwidth is None else parse_bandwidth(self.profiled_bandwidth)
        if self.profiled_bandwidth is not None and (self.topology or self.link_model):
            raise DagprofError("splits the link fitted to the run's collectives; --topology and --link-model give the link instead",
                               "--profiled-bandwidth")


Pass = Callable[[Graph, Scenario, Cluster, Topology], Graph]


def _workers(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.workers is None:
        return g
    refuse_own_ddp_setup(g, "--workers", wire=True)
    if s.workers != graph_world_size(g):
        refuse_replicated_by_fsdp(g, "--workers")
    if c.fine and s.workers > 64:
        raise DagprofError(f"fine-grained collectives need <= 64 ranks, got {s.workers} workers")
    profiled = g
    if is_fsdp_graph(g):
        g = scale_fsdp_workers(g, s.workers, c.link_file.fsdp if c.link_file else None)
    else:
        if s.data_parallel in ("fsdp", "fsdp:keep"):
            g = keep_wake_up(g)  # measured on the profiled ranks, before their copies lose what it reads
        g = scale_workers(g, s.workers, replicate=True if (c.fine or c.cores) else None)
    refuse_uncrowding(profiled, s.workers, c.cores, c.ranks_per_host)  # after the job's own refusals, which say more
    n = priced_world_size(g)
    if c.topology:
        return set_topology(g, replace(parse_topology(c.topology, n), overhead_us=base_topo.overhead_us))
    if c.link_file:  # a file fitted per worker count (nccl-tests) has a better link for n
        return set_topology(g, c.link_file.on(current_topology(g), n))
    return g


def _mesh(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.mesh is None:
        return g
    if s.workers is not None or s.data_parallel is not None:
        raise DagprofError("--mesh with --workers or --data-parallel is not modelled: the mesh gives the ranks (RxS)")
    return set_mesh(g, *s.mesh, c.link_file.fsdp if c.link_file else None)


def _data_parallel(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.data_parallel is None:
        return g
    if not is_fsdp_graph(g):
        refuse_own_ddp_setup(g, "--data-parallel")
    elif s.data_parallel == "ddp" and (s.bucket_mb is not None or not c.overlap):  # ``_buckets`` re-lays one reducer's buckets
        refuse_several_roots(g, "--data-parallel ddp with --bucket-mb or --no-overlap", "re-laying DDP's buckets is modelled for "
                             "one model's reducer; each model's own default buckets are (--data-parallel ddp alone)")
    out = to_data_parallel(g, s.data_parallel, s.bucket_mb, c.link_file.fsdp if c.link_file else None, s.reshard_after_forward)
    return with_optimizer_state(out, OPTIMIZER_STATE[c.optimizer_state]) if is_fsdp_graph(out) and not is_fsdp_graph(g) else out


def _units(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.units is None:
        return g
    if s.data_parallel is not None:
        raise DagprofError("--units with --data-parallel is not modelled (merge the units of an FSDP profile)")
    return merge_units(g, s.units)


def _scheme(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.scheme is None:
        return g
    refuse_own_ddp_setup(g, "--scheme", wire=True)
    return set_scheme(g, s.scheme)


def _link(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.link_to is not None or s.bandwidth is not None or s.latency_us is not None:
        refuse_own_ddp_setup(g, "a link what-if", wire=True)
    if s.link_to is not None:
        if s.bandwidth is not None or s.latency_us is not None:
            raise DagprofError("--link-to gives the link: with --bandwidth or --latency in the same row it is not modelled")
        if c.link_from is None:
            raise DagprofError("--link-to needs --link-from: a dagprof calibrate file of the link the run was profiled on, measured alike")
        if is_ps_graph(g):
            raise DagprofError("--link-to on a parameter-server job is not modelled (its messages are priced on the link's fit)")
        given, target = read_link_model(c.link_from), read_link_model(s.link_to)
        quiet = given.repetitions and target.repetitions
        source, target = given.wire(quiet), target.wire(quiet)
        _check_profiled_on(g, source, base_topo, given.scheduled())
        return set_link_ratio(g, source.ratio_to(target), source.delta_to(target), source.workers or 0)
    if s.bandwidth is None and s.latency_us is None:
        return g
    if s.bandwidth is not None and is_ps_graph(g) and g.meta.wire_bytes_per_s is not None:  # the row_sparse pulls' wire (rebuild_ps)
        g = g.replace(meta=g.meta.replace(ps_asked_bytes_per_s=parse_bandwidth(s.bandwidth)))
    return set_link(g, None if s.bandwidth is None else wire_bandwidth(g, parse_bandwidth(s.bandwidth), base_topo), s.latency_us, c.link)


def refuse_link_from_elsewhere(g: Graph, link_from: str) -> None:
    """Refuse a ``--link-from`` calibration of other ranks or another backend than the profiled run's (``g`` as profiled): the
    two files' ratio is the profiled link's only when measured alike. A 4-rank sweep (4 ranks over 2 CPUs, every size a wait
    for a core) given for a 2-rank run was refused only where its fit happened to sit 4x from the run's own, and then as
    "not the link this run was profiled on"."""
    f, world, backend = read_link_model(link_from), g.meta.world_size, g.meta.backend
    if f.workers is not None and world is not None and f.workers != world:
        raise DagprofError(f"calibrated on {f.workers} ranks, this run has {world}: --link-from and --link-to are read as the profiled "
                           f"link measured alike (dagprof calibrate --world {world} on each link)", f.path)
    if backend in ("gloo", "nccl") and f.backend != backend:
        raise DagprofError(f"calibrated on {f.backend}, this run's collectives ran on {backend}: --link-from and --link-to are read as the "
                           "profiled link measured alike (calibrate with the run's backend)", f.path)


LINK_FROM_APART = 4.0  # --link-from's link and the profile's own fit this many times apart: measured on another link


def _check_profiled_on(g: Graph, source: LinkModelFile, base_topo: Topology, scheduled: str = "") -> None:
    """Refuse a ``--link-from`` file that is not of the link the run was profiled on: at the run's median collective size
    its fit and the fit of the run's own collectives are over ``LINK_FROM_APART`` times apart. A calibration of an
    unshaped link given for a run profiled at 1 Gbit/s put ``--link-to`` its 1 Gbit/s file at 427.7 ms for a run that
    measured 205.7 ms there, with no word (the ratio of two files is trusted to be the profiled link's). Where the file's
    small sizes did not grow with bytes (``scheduled``: ``LinkModelFile.scheduled``), the line says what they read: a
    sweep of ranks waiting for cores (the testbed's loopback on 4 ranks over 2 CPUs) is the profiled link, measured unlike
    the run."""
    sizes = g.nbytes[priced_comm(g)]
    sizes = sizes[sizes > 0]
    if not len(sizes):
        return
    m, n = float(np.median(sizes)), priced_world_size(g)
    own, theirs = float(ring_allreduce_us(m, n, base_topo.inter)), float(ring_allreduce_us(m, n, source.link_for(n)))
    if own > 0 and theirs > 0 and max(own / theirs, theirs / own) > LINK_FROM_APART:
        why = (f"): {scheduled}: ranks waiting for a core, not the wire. Calibrate the profiled link where each rank has a core "
               "(or the machine is otherwise idle), or predict by --bandwidth; another host or network: give --link-from a calibration "
               "of the profiled link") if scheduled and theirs > own else ("; another host or network?): give --link-from a calibration of "
                                                                           "the profiled link")
        raise DagprofError(f"not the link this run was profiled on: its fit prices the run's median collective ({m / MB:.2f} MB, {n} ranks) "
                           f"at {theirs / 1e3:.3g} ms, the run's own collectives fit {own / 1e3:.3g} ms ({max(own / theirs, theirs / own):.0f}x "
                           f"apart{why}", source.path)


def wire_bandwidth(g: Graph, asked: float, base_topo: Topology) -> float:
    """The link's bandwidth (B/s) for a row's ``asked``: as asked, or, where the profiled wire rate is known
    (``profiled_at``), the fitted link's wire part scaled by asked over that rate. That is the rate asked where the fit was
    slower than the wire (``passes.link_fit.split_at_wire`` left the wire's rate as its bandwidth), and the fit scaled by the
    rate ratio where it was faster (bytes that crossed outside the timed transfers: TF's fits ran at 109-200 % of the wire,
    and pricing them at the wire's rate put 125 Mbit/s +105 % off instead of +33 %). A parameter-server job's fit reads
    the other way where slower than the wire (``passes.comm.ps_bandwidth``)."""
    wire = g.meta.wire_bytes_per_s
    if wire is None:
        return asked
    if is_ps_graph(g):
        return ps_bandwidth(base_topo.inter.bandwidth_bytes_per_s, wire, asked, ps_port_share(g))
    return asked * base_topo.inter.bandwidth_bytes_per_s / wire


def _reduce_dtype(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.reduce_dtype is None:
        return g
    if not is_fsdp_graph(g):
        raise DagprofError("--reduce-dtype is an FSDP what-if; this profile is not an FSDP job")
    return set_reduce_dtype(g, s.reduce_dtype)


def _buckets(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.bucket_mb is not None and g.meta.horovod is not None:
        raise DagprofError("a Horovod run fuses tensors by its fusion threshold and cycle time: use --fusion-mb and --cycle-ms")
    if s.bucket_mb is None and c.overlap:
        return g
    flag, asked = ("--no-overlap", "") if s.bucket_mb is None else ("--bucket-mb", f" {s.bucket_mb:g}")
    refuse_own_ddp_setup(g, flag)
    cap = None if s.bucket_mb is None else (1e18 if s.bucket_mb == float("inf") else s.bucket_mb * MB)
    first = None if c.first_bucket_mb is None else c.first_bucket_mb * MB
    try:
        return set_buckets(g, cap, overlap=c.overlap, first_bucket_bytes=first)
    except DagprofError as err:  # the pass's refusal (a step under find_unused_parameters, no backward) names the what-if asked
        raise DagprofError(err.problem, err.path or flag + asked) from None


def _partition(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.partition is None:
        return g
    refuse_own_ddp_setup(g, "--partition")
    return partition_tensors(g, s.partition)


def _compute(g: Graph, s: Scenario, c: Cluster, base_topo: Topology | None) -> Graph:
    if s.compute_speed is None:
        return g
    if g.meta.parallel is not None and g.meta.parallel.unpaired_p2p:  # a stage's recv would keep waiting as long as measured
        raise DagprofError(f"--compute-speed on this pipeline job is not modelled: {g.meta.parallel.unpaired_p2p}, so a stage's "
                           "waits for its peers would stay as measured")
    return scale_compute(g, s.compute_speed)


def _cores(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if c.cores and s.workers is None:  # with --workers, ``_workers`` asked it
        refuse_uncrowding(g, None, c.cores, c.ranks_per_host)
    return share_cores(g, c.cores, c.ranks_per_host, replay) if c.cores else g


def _horovod(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.fusion_mb is None and s.cycle_ms is None:
        return g
    return set_horovod(g, replay, None if s.fusion_mb is None else s.fusion_mb * MB, s.cycle_ms)


def _fine(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    return expand_collectives(g) if c.fine else g


def _reshard(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.reshard_after_forward is None or s.data_parallel in ("fsdp", "fsdp:keep"):  # --data-parallel applied it (to_data_parallel)
        return g
    if not is_fsdp_graph(g):
        raise DagprofError("--reshard-after-forward is an FSDP what-if; this profile is not an FSDP job")
    return set_reshard(g, s.reshard_after_forward)  # last: the passes above reprice the all-gathers it zeroes


# The order ``apply`` runs the passes in, each a no-op unless its axis is set (or, for cores and fine, its ``Cluster`` setting).
# Cores last: it places the finished graph on the host's cores and gives each collective's exit lags a wait of their own,
# which the passes that rewire collectives (fine, reshard, Horovod's fusion) do not expect.
PASSES: tuple[Pass, ...] = (_workers, _mesh, _data_parallel, _units, _scheme, _link, _reduce_dtype, _buckets, _partition, _compute, _horovod, _fine,
                            _reshard, _cores)


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"expected on or off, got {text!r}")
    return text == "on"


_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


def _dtype(text: str) -> str:
    if text.lower() not in _DTYPES:
        raise ValueError(f"expected float32, bfloat16 or float16 (or fp32, bf16, fp16), got {text!r}")
    return _DTYPES[text.lower()]


def _calibration(text: str) -> str:
    if not os.path.isfile(text):
        raise ValueError(f"no such file: {text!r}")
    return text


def _bandwidth(text: str) -> str:
    parse_bandwidth(text)  # checked here, read by the pass: the table shows it as written
    return text


@dataclass(frozen=True)
class Axis:
    """One what-if axis, declared once: a ``Scenario`` field (its name is the row's column, in the table and in --json),
    the ``dagprof whatif`` flag that sweeps it (a comma-separated list of ``parse``-d values), and the pass answering it."""

    name: str
    flag: str
    parse: Callable[[str], Any]
    help: str
    apply: Pass  # runs at its place in ``PASSES``
    cell: Callable[[Any], Any] = lambda v: v  # the value as its column shows it
    unmodelled_on_fsdp: str = ""  # refused on FSDP jobs under this ``passes.fsdp.UNMODELLED`` key; "": answered


# The axes in the order of the table's columns and of the sweep (the first varies slowest).
AXES: tuple[Axis, ...] = (
    Axis("workers", "--workers", worker_count, f"number of ranks, e.g. 4,16,4096 (weak scaling: same per-rank batch); at most "
         f"{MAX_WORKERS:,}, {MAX_CONTENDED_WORKERS:,} with --cores", _workers),
    Axis("bandwidth", "--bandwidth", _bandwidth, "link bandwidth(s), e.g. 10Gbit,200Mbit,25GB/s", _link),
    Axis("latency_us", "--latency", finite_non_negative, "link latency in us (per message), e.g. 5,50", _link),
    Axis("link_to", "--link-to", _calibration, "links measured by `dagprof calibrate` (files; with --link-from, the profiled link "
         "measured alike): each collective priced as profiled plus what its kind and size took more on FILE's link than on "
         "--link-from's, each exit lag times their ratio, e.g. 200mbit.json", _link),
    Axis("bucket_mb", "--bucket-mb", positive_number, "DDP bucket cap(s) in MB (MiB, as DDP's bucket_cap_mb); 'inf' = one bucket per step",
         _buckets, unmodelled_on_fsdp="bucket_mb"),
    Axis("scheme", "--scheme", CollectiveSpec.parse, "collective algorithm(s): ring, tree, hier, ps:K (K servers)", _scheme, str,
         unmodelled_on_fsdp="scheme"),
    Axis("partition", "--partition", positive_int, "cut each tensor into K pieces (BytePS partition)", _partition,
         unmodelled_on_fsdp="partition"),
    Axis("compute_speed", "--compute-speed", finite_positive, "compute speed factor(s), 2 = twice as fast", _compute),
    Axis("fusion_mb", "--fusion-mb", finite_non_negative, "Horovod runs: HOROVOD_FUSION_THRESHOLD(s) in MiB, e.g. 0,4,64 (0 = no fusion)",
         _horovod, unmodelled_on_fsdp="horovod"),
    Axis("cycle_ms", "--cycle-ms", finite_non_negative, "Horovod runs: HOROVOD_CYCLE_TIME(s) in ms, e.g. 1,5,20", _horovod,
         unmodelled_on_fsdp="horovod"),
    Axis("reshard_after_forward", "--reshard-after-forward", _on_off,
         "FSDP jobs: reshard_after_forward passed to every unit, the root too, on or off (or both: on,off)", _reshard, lambda on: "on" if on else "off"),
    Axis("reduce_dtype", "--reduce-dtype", _dtype, "FSDP jobs: the dtype gradients are reduced in, e.g. float32,bfloat16", _reduce_dtype),
    Axis("data_parallel", "--data-parallel", parse_target, "DDP or FSDP2 jobs: the data-parallel wrapper, ddp, fsdp (fully_shard per "
         "unit at its default: the root kept gathered after forward, the others resharded) or fsdp:keep (reshard_after_forward=False), "
         "e.g. ddp,fsdp", _data_parallel),
    Axis("units", "--units", parse_units, "FSDP jobs: unit granularity, coarser than profiled: merge:N (every N adjacent inner units one "
         "unit), merge:all (fully_shard on the root only) or groups A+B/C+D (e.g. blocks.0+blocks.1/blocks.2+blocks.3; "
         "units not named stay), e.g. merge:2,merge:all", _units),
    Axis("mesh", "--mesh", parse_mesh, "FSDP2 jobs: the layout replicate x shard ranks (HSDP; 1xN: plain FSDP), e.g. 2x2,1x4", _mesh,
         lambda m: f"{m[0]}x{m[1]}"),
)


def sweep(values: dict[str, list | None]) -> list[Scenario]:
    """Every combination of the axes' values (``values[name]``; None or missing: as profiled), one scenario each."""
    lists = [values.get(a.name) or [None] for a in AXES]
    return [Scenario(**{a.name: v for a, v in zip(AXES, combo)}) for combo in itertools.product(*lists)]


def base_topology(g: Graph, c: Cluster) -> Topology:
    """The cluster the run ran on: ``c.topology``, else ``c.link_model``, else fitted to its collectives (split at the wire
    rate it was profiled at where ``profiled_at`` gave it); half-duplex where ``c.half_duplex`` says so."""
    n0 = priced_world_size(g)  # a hybrid job's link model prices its data-parallel group
    t = current_topology(g)
    if c.topology:  # the profile's per-collective software overhead stays
        t = replace(parse_topology(c.topology, n0), overhead_us=t.overhead_us)
    elif c.link_file:
        t = c.link_file.on(t, n0)
    return replace(t, half_duplex=c.half_duplex) if c.half_duplex else t


def measured_comm(g: Graph, scenarios: list[Scenario], c: Cluster) -> Topology | None:
    """``base_topology``, or None where no link can be fitted (a tensor-parallel-only trace: no data-parallel
    collective) and nothing asked needs one: rows that change compute alone (``--compute-speed``) keep every
    collective, its dependencies and its measured time, whatever its dimension, so the replay answers them as measured."""
    try:
        return base_topology(g, c)
    except DagprofError:
        asked = {a.name for s in scenarios for a in AXES if getattr(s, a.name) is not None}
        if asked - {"compute_speed"} or c.slowdown or not c.overlap or c.fine or c.profiled_bandwidth is not None:
            raise
        if c.topology:  # read all the same: a strategy given as --topology of a 1-rank trace answered with no word
            parse_topology(c.topology, priced_world_size(g))
        return None


def on_link(g: Graph, topo: Topology | None) -> Graph:
    """``g`` with its collectives priced on ``topo``; as measured where it is None (``measured_comm``)."""
    return g if topo is None else set_topology(g, topo)


def profiled_at(g: Graph, c: Cluster) -> Graph:
    """``g`` with what is known of the link it was profiled on in its meta: the wire rate (``c.profiled_bandwidth``), where
    given, at which its fitted link is then split (``passes.link_fit.split_at_wire``; a parameter-server job's fit is read
    against it per row instead, ``passes.comm.ps_bandwidth``); one medium for every rank (``c.half_duplex``), at whose share
    its collectives are fitted as they are priced (``passes.link_fit.medium_equivalent_bytes``)."""
    changes = ({} if c.profiled_wire is None else {"wire_bytes_per_s": c.profiled_wire}) | ({"half_duplex": True} if c.half_duplex else {})
    return g.replace(meta=g.meta.replace(**changes)) if changes else g


def _demand(g: Graph, res: ReplayResult, c: Cluster):
    return None if c.comm_rate is None else comm_demand(g, res, g.nbytes.astype(float), c.comm_rate)


def undisturb(g: Graph, model: Graph, c: Cluster) -> Graph:
    """``g`` with its compute undisturbed (``passes.overlap``): each op's slowdown beside the collectives in flight
    in ``model`` (``g`` on the cluster it ran on, the same nodes) taken out, as the optimizer does; the scenario then
    charges its own overlap again (``disturb``): a faster link moves more bytes per second of copies beside the same
    backward and slows it more, a slower one less."""
    if not c.slowdown:
        return g
    res = replay(model)
    nodes, dur = slowed_nodes(model), g.dur.copy()
    dur[nodes] = undisturbed(model, res, c.slowdown, _demand(model, res, c))[nodes]
    return g.replace(dur=dur)


def beside(c: Cluster, s: Scenario) -> Cluster:
    """The cluster whose compute slowdown beside collectives a row's timeline takes (``disturb``): on a ``--link-to`` row
    whose profiled link's calibration measured one (``--link-from``'s ``calibrate --overlap``, which ``undisturb`` took out),
    the row's link's own where its file measured one too; else ``c``'s. One link's measurement weighted by
    bytes per second prices another link the wrong way where the slower link costs the cores more per byte: on the testbed
    tbf paces 200 Mbit/s in single packets, 22-24 ms of the receiver's CPU a MiB against 1.2-2.0 at 1 Gbit/s."""
    if s.link_to is None or c.link_from is None or c.link_model is not None or not c.slowdown:
        return c
    slowdown, rate = slowdown_of(None, s.link_to)
    return replace(c, slowdown=slowdown, comm_rate=rate) if slowdown else c


def disturb(g: Graph, c: Cluster) -> tuple[Graph, ReplayResult]:
    """``g`` (undisturbed compute) slowed by the overlap its own replay has, and its replay: two replays instead of one."""
    res = replay(g)
    if not c.slowdown:
        return g, res
    g = g.replace(dur=disturbed(g, g.dur, res, c.slowdown, _demand(g, res, c)))
    return g, replay(g)


def fixed_workers(g: Graph, workers: int, base_topo: Topology | None) -> bool:
    """Whether the job's worker count cannot become ``workers`` whatever else a scenario changes: its workers pass refuses
    that alone, on no cluster settings of the user's (a hybrid job whose other groups span its data-parallel ranks, ZeRO
    stepped by DDP's comm hook, a DDP hook of the job's own, an FSDP2 unit given ``reshard_after_forward=N``, ranks that
    shared fewer cores and would get more of one: ``refuse_uncrowding``); a ``--topology`` it cannot read is the user's to
    fix, not the job's."""
    try:
        _workers(on_link(g, base_topo), Scenario(workers=workers), Cluster(), base_topo)
    except DagprofError:
        return True
    return False


def apply(g: Graph, s: Scenario, c: Cluster, base_topo: Topology | None) -> Graph:
    """The run's graph under scenario ``s``: on the cluster ``base_topo`` (None: collectives as measured), then ``PASSES`` in order."""
    asked = ([a.unmodelled_on_fsdp for a in AXES if a.unmodelled_on_fsdp and getattr(s, a.name) is not None]
             + [k for k, asked in (("no_overlap", not c.overlap), ("fine", c.fine)) if asked])
    if asked and s.data_parallel in ("fsdp", "fsdp:keep") and not is_fsdp_graph(g):
        raise DagprofError(f"--data-parallel {s.data_parallel} makes this DDP job FSDP; {UNMODELLED[asked[0]]} is not modelled for FSDP yet")
    if is_fsdp_graph(g) and s.data_parallel != "ddp":
        refuse_unmodelled(g, asked)
    # a replicate_with_fsdp job answers the link's axes and --workers alone (``refuse_replicated_by_fsdp``)
    changed = [a.flag for a in AXES if getattr(s, a.name) is not None and a.name != "workers" and a.apply is not _link]
    if changed:
        refuse_replicated_by_fsdp(g, changed[0])
    if s.data_parallel == "ddp" and is_fsdp_graph(g) and (s.reshard_after_forward is not None or s.reduce_dtype is not None):
        raise DagprofError("--reshard-after-forward and --reduce-dtype are FSDP what-ifs; --data-parallel ddp makes this FSDP job DDP")
    g = on_link(g, base_topo)
    if c.cores:
        g = keep_comm_cpu(g)  # read on the profiled ranks, before --workers or --mesh copies them
    for p in PASSES:
        g = p(g, s, c, base_topo)
    return g
