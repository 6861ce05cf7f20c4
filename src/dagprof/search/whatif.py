"""What-if scenarios: the run's graph under other conditions, replayed.

Each axis of a scenario (workers, bandwidth, ...) is declared once, in ``AXES``: its ``Scenario`` field, which is
also its column, its ``dagprof whatif`` flag and parser, and its pass; ``PASSES`` is the order the passes run in
(workers, DDP <-> FSDP, FSDP unit granularity, scheme, link, FSDP reduce dtype, buckets, partition, compute, cores, Horovod fusion/cycle,
fine-grained collectives, FSDP reshard). Two different ratios answer two questions, and ``COLUMNS`` defines every other column of a row:
- is it faster than what I have? ``speedup_vs_profiled``: the scenario's throughput over the
  profiled run's (both as replayed, so the model's own error cancels out of the ratio);
- does it scale? ``scaling_efficiency``: the throughput of N workers over N times that of ONE
  worker under the same conditions (weak scaling: t(1) / t(N), 1.0 = linear). A faster device or
  link raises the first and can lower the second: less compute leaves less to hide comm behind.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..analysis import job_iteration_us
from ..analysis.interval import link_residuals, predict_interval, run_level
from ..analysis.operand_stall import held_us, stall_bound_us, stall_note
from ..costmodel.alphabeta import parse_bandwidth
from ..costmodel.topology import CollectiveSpec, LinkModelFile, Topology, parse_topology, read_link_model
from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..passes import expand_collectives, partition_tensors, scale_compute, scale_workers, set_buckets, set_link, set_scheme, set_topology
from ..passes.comm import LinkFit, current_topology, graph_world_size, hybrid, link_fit, priced_world_size, profiled_collectives, ps_bandwidth, set_link_ratio
from ..passes.compute import own_cores_note, share_cores
from ..passes.data_parallel import conversion_note, parse_target, to_data_parallel, with_optimizer_state
from ..passes.fsdp import UNMODELLED, refuse_unmodelled, scale_fsdp_workers, set_reduce_dtype, set_reshard
from ..passes.fsdp_units import merge_units, parse_units, with_units
from ..passes.horovod import crowded_hosts, set_horovod
from ..passes.overlap import comm_demand, disturbed, slowed_nodes, undisturbed
from ..passes.profiler_cost import measure_profiler_cost, remove_profiler_cost, scale_host_work
from ..passes.workers import replica_ranks
from ..progress import progress
from ..replay import ReplayResult, replay
from ..units import MAX_CONTENDED_WORKERS, MAX_WORKERS, MB, finite_non_negative, finite_positive, positive_int, positive_number, worker_count
from .memory import OPTIMIZER_STATE, ddp_peak_of_fsdp, fsdp_peak

COLUMNS = {
    "workers": "ranks (data-parallel workers) in the scenario",
    "predicted_iter_ms": "predicted iteration time of the slowest rank, ms",
    "iters_per_s": "iterations per second (1 / predicted_iter_ms); every rank runs one per iteration",
    "speedup_vs_profiled": "throughput (workers / iteration time) over the profiled run's, both replayed; > 1 = more samples/s than now",
    "speedup_vs_one_worker": "throughput over ONE worker's under the same conditions = workers x scaling_efficiency",
    "scaling_efficiency": "weak scaling: one worker's iteration time / this one, same conditions; 1.0 = linear, lower = overhead of scale",
    "vs_measured_pct": "predicted iteration time against the measured one of the profiled run (less the profiler's cost unless --raw), % (+ = slower)",
    "lo_ms": "low end of the interval one step's time should fall in (``level``), from the replayed steps' spread and the link fit's residuals",
    "hi_ms": "high end of that interval, ms",
    "level": "the share of single steps the interval should hold (0.9 = 90 %)",
    "interval": "predicted iteration time (lo_ms-hi_ms, level)",
    "peak_memory_mb": "FSDP jobs and --data-parallel: predicted peak memory of the fullest rank, MiB (memory_per_rank: each rank's "
                      "breakdown at its peak)",
}


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
    reshard_after_forward: bool | None = None  # FSDP's, on every unit
    reduce_dtype: str | None = None  # FSDP's MixedPrecisionPolicy(reduce_dtype=...), a torch dtype name: bfloat16
    data_parallel: str | None = None  # the wrapper: ddp, fsdp or fsdp:keep (passes.data_parallel)
    units: str | None = None  # FSDP unit granularity: merge:N, merge:all or A+B/C+D (passes.fsdp_units)

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
    profiled_bandwidth: str | None = None  # the wire rate the run was profiled at, as written (``passes.comm.split_at_wire``)
    first_bucket_mb: float | None = None
    overlap: bool = True  # False: all-reduces start after the whole backward
    cores: int | None = None  # cores per host shared by its ranks
    ranks_per_host: int | None = None
    fine: bool = False  # per-message collectives on per-link queues
    optimizer_state: str = "momentum"  # --data-parallel fsdp from DDP: optimizer state per parameter (search.memory.OPTIMIZER_STATE)
    slowdown: float = 0.0  # compute beside in-flight collectives takes (1 + slowdown x overlap) as long (search.measured.slowdown_of)
    comm_rate: float | None = None  # bytes/s of the all-reduce the slowdown was measured beside (None: each collective counts whole)
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
    if c.fine and s.workers > 64:
        raise DagprofError(f"fine-grained collectives need <= 64 ranks, got {s.workers} workers")
    if is_fsdp_graph(g):
        g = scale_fsdp_workers(g, s.workers, c.link_file.fsdp if c.link_file else None)
    else:
        g = scale_workers(g, s.workers, replicate=True if (c.fine or c.cores) else None)
    n = priced_world_size(g)
    if c.topology:
        return set_topology(g, replace(parse_topology(c.topology, n), overhead_us=base_topo.overhead_us))
    if c.link_file:  # a file fitted per worker count (nccl-tests) has a better link for n
        return set_topology(g, c.link_file.on(current_topology(g), n))
    return g


def _data_parallel(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.data_parallel is None:
        return g
    out = to_data_parallel(g, s.data_parallel, s.bucket_mb, c.link_file.fsdp if c.link_file else None)
    return with_optimizer_state(out, OPTIMIZER_STATE[c.optimizer_state]) if is_fsdp_graph(out) and not is_fsdp_graph(g) else out


def _units(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.units is None:
        return g
    if s.data_parallel is not None:
        raise DagprofError("--units with --data-parallel is not modelled (merge the units of an FSDP profile)")
    return merge_units(g, s.units)


def _scheme(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    return g if s.scheme is None else set_scheme(g, s.scheme)


def _link(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.link_to is not None:
        if s.bandwidth is not None or s.latency_us is not None:
            raise DagprofError("--link-to gives the link: with --bandwidth or --latency in the same row it is not modelled")
        if c.link_from is None:
            raise DagprofError("--link-to needs --link-from: a dagprof calibrate file of the link the run was profiled on, measured alike")
        if is_ps_graph(g):
            raise DagprofError("--link-to on a parameter-server job is not modelled (its messages are priced on the link's fit)")
        source, target = read_link_model(c.link_from), read_link_model(s.link_to)
        return set_link_ratio(g, source.ratio_to(target), source.delta_to(target), source.workers or 0)
    if s.bandwidth is None and s.latency_us is None:
        return g
    return set_link(g, None if s.bandwidth is None else wire_bandwidth(g, parse_bandwidth(s.bandwidth), base_topo), s.latency_us, c.link)


def wire_bandwidth(g: Graph, asked: float, base_topo: Topology) -> float:
    """The link's bandwidth (B/s) for a row's ``asked``: as asked, or, where the profiled wire rate is known
    (``profiled_at``), the fitted link's wire part scaled by asked over that rate. That is the rate asked where the fit was
    slower than the wire (``passes.comm.split_at_wire`` left the wire's rate as its bandwidth), and the fit scaled by the
    rate ratio where it was faster (bytes that crossed outside the timed transfers: TF's fits ran at 109-200 % of the wire,
    and pricing them at the wire's rate put 125 Mbit/s +105 % off instead of +33 %). A parameter-server job's fit reads
    the other way where slower than the wire (``passes.comm.ps_bandwidth``)."""
    wire = g.meta.wire_bytes_per_s
    if wire is None:
        return asked
    if is_ps_graph(g):
        return ps_bandwidth(base_topo.inter.bandwidth_bytes_per_s, wire, asked)
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
    cap = None if s.bucket_mb is None else (1e18 if s.bucket_mb == float("inf") else s.bucket_mb * MB)
    first = None if c.first_bucket_mb is None else c.first_bucket_mb * MB
    return set_buckets(g, cap, overlap=c.overlap, first_bucket_bytes=first)


def _partition(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    return g if s.partition is None else partition_tensors(g, s.partition)


def _compute(g: Graph, s: Scenario, c: Cluster, base_topo: Topology | None) -> Graph:
    if s.compute_speed is None:
        return g
    if g.meta.parallel is not None and g.meta.parallel.unpaired_p2p:  # a stage's recv would keep waiting as long as measured
        raise DagprofError(f"--compute-speed on this pipeline job is not modelled: {g.meta.parallel.unpaired_p2p}, so a stage's "
                           "waits for its peers would stay as measured")
    return scale_compute(g, s.compute_speed)


def _cores(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    return share_cores(g, c.cores, c.ranks_per_host) if c.cores else g


def _horovod(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.fusion_mb is None and s.cycle_ms is None:
        return g
    return set_horovod(g, replay, None if s.fusion_mb is None else s.fusion_mb * MB, s.cycle_ms)


def _fine(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    return expand_collectives(g) if c.fine else g


def _reshard(g: Graph, s: Scenario, c: Cluster, base_topo: Topology) -> Graph:
    if s.reshard_after_forward is None:
        return g
    if not is_fsdp_graph(g):
        raise DagprofError("--reshard-after-forward is an FSDP what-if; this profile is not an FSDP job")
    return set_reshard(g, s.reshard_after_forward)  # last: the passes above reprice the all-gathers it zeroes


# The order ``apply`` runs the passes in, each a no-op unless its axis is set (or, for cores and fine, its ``Cluster`` setting).
# Cores last: it places the finished graph on the host's cores and gives each collective's exit lags a wait of their own,
# which the passes that rewire collectives (fine, reshard, Horovod's fusion) do not expect.
PASSES: tuple[Pass, ...] = (_workers, _data_parallel, _units, _scheme, _link, _reduce_dtype, _buckets, _partition, _compute, _horovod, _fine, _reshard, _cores)


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
         "FSDP jobs: reshard_after_forward of every unit, on or off (or both: on,off)", _reshard, lambda on: "on" if on else "off"),
    Axis("reduce_dtype", "--reduce-dtype", _dtype, "FSDP jobs: the dtype gradients are reduced in, e.g. float32,bfloat16", _reduce_dtype),
    Axis("data_parallel", "--data-parallel", parse_target, "DDP or FSDP2 jobs: the data-parallel wrapper, ddp, fsdp (fully_shard per "
         "unit) or fsdp:keep (reshard_after_forward=False), e.g. ddp,fsdp", _data_parallel),
    Axis("units", "--units", parse_units, "FSDP jobs: unit granularity, coarser than profiled: merge:N (every N adjacent inner units one "
         "unit), merge:all (fully_shard on the root only) or groups A+B/C+D (e.g. blocks.0+blocks.1/blocks.2+blocks.3; "
         "units not named stay), e.g. merge:2,merge:all", _units),
)


def sweep(values: dict[str, list | None]) -> list[Scenario]:
    """Every combination of the axes' values (``values[name]``; None or missing: as profiled), one scenario each."""
    lists = [values.get(a.name) or [None] for a in AXES]
    return [Scenario(**{a.name: v for a, v in zip(AXES, combo)}) for combo in itertools.product(*lists)]


def base_topology(g: Graph, c: Cluster) -> Topology:
    """The cluster the run ran on: ``c.topology``, else ``c.link_model``, else fitted to its collectives (split at the wire
    rate it was profiled at where ``profiled_at`` gave it)."""
    n0 = priced_world_size(g)  # a hybrid job's link model prices its data-parallel group
    t = current_topology(g)
    if c.topology:  # the profile's per-collective software overhead stays
        return replace(parse_topology(c.topology, n0), overhead_us=t.overhead_us)
    if c.link_file:
        return c.link_file.on(t, n0)
    return t


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
        return None


def on_link(g: Graph, topo: Topology | None) -> Graph:
    """``g`` with its collectives priced on ``topo``; as measured where it is None (``measured_comm``)."""
    return g if topo is None else set_topology(g, topo)


def profiled_at(g: Graph, c: Cluster) -> Graph:
    """``g`` with the wire rate it was profiled at (``c.profiled_bandwidth``) in its meta, where given: its fitted link is then
    split at it (``passes.comm.split_at_wire``); a parameter-server job's fit is read against it per row instead
    (``passes.comm.ps_bandwidth``)."""
    if c.profiled_wire is None:
        return g
    return g.replace(meta=g.meta.replace(wire_bytes_per_s=c.profiled_wire))


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


def disturb(g: Graph, c: Cluster) -> tuple[Graph, ReplayResult]:
    """``g`` (undisturbed compute) slowed by the overlap its own replay has, and its replay: two replays instead of one."""
    res = replay(g)
    if not c.slowdown:
        return g, res
    g = g.replace(dur=disturbed(g, g.dur, res, c.slowdown, _demand(g, res, c)))
    return g, replay(g)


def apply(g: Graph, s: Scenario, c: Cluster, base_topo: Topology | None) -> Graph:
    """The run's graph under scenario ``s``: on the cluster ``base_topo`` (None: collectives as measured), then ``PASSES`` in order."""
    asked = ([a.unmodelled_on_fsdp for a in AXES if a.unmodelled_on_fsdp and getattr(s, a.name) is not None]
             + [k for k, asked in (("no_overlap", not c.overlap), ("fine", c.fine)) if asked])
    if asked and s.data_parallel in ("fsdp", "fsdp:keep") and not is_fsdp_graph(g):
        raise DagprofError(f"--data-parallel {s.data_parallel} makes this DDP job FSDP; {UNMODELLED[asked[0]]} is not modelled for FSDP yet")
    if is_fsdp_graph(g) and s.data_parallel != "ddp":
        refuse_unmodelled(g, asked)
    if s.data_parallel == "ddp" and is_fsdp_graph(g) and (s.reshard_after_forward is not None or s.reduce_dtype is not None):
        raise DagprofError("--reshard-after-forward and --reduce-dtype are FSDP what-ifs; --data-parallel ddp makes this FSDP job DDP")
    g = on_link(g, base_topo)
    for p in PASSES:
        g = p(g, s, c, base_topo)
    return g


MODEL_TOLERANCE_PCT = 2.0  # a model further than this from the profiled run predicts nothing


def check_model(model_us: float, measured_us: float | None, tolerance_pct: float | None, built: Graph,
                corrected: Graph | None = None, share: float = 0.0, link: str = "the link fitted to its collectives") -> float:
    """The model's error on the profiled run itself, %; refused beyond ``tolerance_pct`` (None: never).

    Every prediction inherits that error, and a link fitted to small or noisy collectives can
    be off by far more than the effect asked about, so such a model must not predict. Compare like
    with like: a model of the raw op times (``--raw``) against the profiled steps as measured; a model
    whose op times had the profiler's cost removed (``corrected``: ``built`` with its host work shortened)
    against the job without the profiler, that is the measured iteration less the measured ``share``
    (``measured_us`` is then that reference). Since the correction makes the model drop by that same share,
    the gate passes or refuses the same model either way: the correction moves the predictions, not the check.
    A refusal splits the miss along the chain that made the model, each part with its own figure: the
    replay of the graph as built (collectives as measured) against the measured run, the correction against
    the replay less the share (it is fitted on the model, so the measured-link replay need not drop by
    exactly that), and ``link`` against the replay it reprices.
    """
    base_us = job_iteration_us(built if corrected is None else corrected)  # the replay the model reprices
    ref = measured_us or base_us
    err = 100.0 * (model_us - ref) / ref
    if tolerance_pct is None or abs(err) <= tolerance_pct:
        return err
    what, parts = "replayed", []
    if measured_us:
        what = "measured less the profiler's cost" if corrected is not None else "measured"
        built_us, as_measured = job_iteration_us(built), ref / (1.0 - share)
        parts.append(f"the replay of the graph as built {_pct(built_us, as_measured)} off the measured run"
                     + (f" ({as_measured / 1e3:.2f} ms)" if corrected is not None else ""))
        if corrected is not None:
            parts.append(f"the profiler-cost correction ({-100 * share:+.1f} %) {_pct(base_us, built_us * (1.0 - share))} off that replay less the cost")
    parts.append(f"{link} {_pct(model_us, base_us)} off the replay it reprices")
    raise DagprofError(f"not predicting: the model the what-ifs start from gives the profiled run {model_us / 1e3:.2f} ms/iter (mean step both), {what} "
                       f"{ref / 1e3:.2f} ms ({err:+.1f} %, more than {tolerance_pct:g} %): {', '.join(parts)}; --allow-model-error predicts anyway")


def _pct(x: float, ref: float) -> str:
    return f"{100.0 * (x - ref) / ref:+.1f} %"


def evaluate(g0: Graph, scenarios: list[Scenario], cluster: Cluster | None = None, measured_us: float | None = None,
             timeline: Callable[[int, Graph, ReplayResult], str | None] | None = None, steps_graph: Graph | None = None,
             tolerance_pct: float | None = MODEL_TOLERANCE_PCT, raw: bool = False) -> dict:
    """Replay every scenario; one row per scenario with the ``COLUMNS``.

    Refused when the model of the profiled run misses it by more than ``tolerance_pct`` (None: never).
    Scaling efficiency needs one worker under the same conditions: that scenario is replayed
    too (once per distinct set of conditions). ``timeline(i, graph, result)`` may save scenario
    ``i``'s predicted timeline and return its path. Each row's interval comes from the scenario
    replayed step by step: on ``g0``, or on ``steps_graph`` (each step with its own times) when
    ``g0`` is the averaged iteration, and widened by the level it stands on (``analysis.interval.run_level``).
    Rows that change the link, the workers or the scheme carry a ``caveat`` when the link fitted to the
    profile cannot tell latency from bandwidth.
    Unless ``raw``, the profiler's own cost measured on the run is removed from the op times first
    (``passes.profiler_cost``), and ``measured_us`` and ``vs_measured_pct`` then mean the job without
    the profiler (``check_model``); ``profiler_cost`` in the result says what was done, or why not.
    """
    t0 = time.perf_counter()
    cluster = cluster or Cluster()
    g0 = profiled_at(g0, cluster)
    steps_graph = None if steps_graph is None else profiled_at(steps_graph, cluster)
    n0 = graph_world_size(g0)
    unit = replica_ranks(g0)  # ranks of one data-parallel replica: "one worker" of a hybrid job is one replica
    base_topo = measured_comm(g0, scenarios, cluster)
    cost = measure_profiler_cost(g0 if steps_graph is None else steps_graph)
    built, corrected = g0, None
    if not raw and cost.usable:
        g0, factor = remove_profiler_cost(g0, cost, job_iteration_us, model=on_link(g0, base_topo))
        corrected = g0
        steps_graph = None if steps_graph is None else scale_host_work(steps_graph, factor)
        measured_us = None if not measured_us else measured_us * (1.0 - cost.share)
    g0 = undisturb(g0, on_link(g0, base_topo), cluster)
    if steps_graph is not None:
        steps_graph = undisturb(steps_graph, on_link(steps_graph, base_topo), cluster)
    model = job_iteration_us(*disturb(on_link(g0, base_topo), cluster))
    given = base_topo is None or cluster.topology or cluster.link_model or g0.meta.topology  # else the link is fitted to the profile's collectives
    model_error = check_model(model, measured_us, tolerance_pct, built, corrected, cost.share if corrected is not None else 0.0,
                              "the collectives as measured" if base_topo is None else "the link model" if given else "the link fitted to its collectives")
    fit = None if given else link_fit(g0)
    caveat = None if fit is None or fit.weak is None else f"extrapolates a link fit too weak to split latency from bandwidth: {fit.weak}"
    wire, wire_notes = _profiled_wire(g0, fit, cluster)
    stepwise = g0 if steps_graph is None else steps_graph
    residuals = link_residuals(stepwise, on_link(stepwise, base_topo))
    level = run_level(stepwise, cost, corrected is not None, model, measured_us)
    one_worker: dict[str, float] = {}
    rows, relinked, held = [], False, held_us(g0)
    for i, s in enumerate(progress(scenarios, "what-if scenarios", unit="scenario")):
        t1 = time.perf_counter()
        g, res = disturb(apply(g0, s, cluster, base_topo), cluster)
        it = job_iteration_us(g, res)
        n = graph_world_size(g)
        single = replace(s, workers=unit)
        key = repr(single)
        if key not in one_worker:
            one_worker[key] = it if n == unit else _one_replica_us(g0, single, cluster, base_topo)
        eff = None if one_worker[key] is None else one_worker[key] / it
        gs, rs = (g, res) if steps_graph is None else disturb(apply(steps_graph, s, cluster, base_topo), cluster)
        relinks = (s.bandwidth is not None or s.latency_us is not None or s.link_to is not None or s.workers not in (None, n0) or s.scheme is not None
                   or s.reduce_dtype is not None or s.data_parallel is not None or s.units is not None)
        interval = predict_interval(gs, rs, it, residuals, run=level, stall_bound_us=stall_bound_us(g0) if relinks else 0.0, stall_held_us=held)
        row = {**s.label(), "workers": n, **interval.to_dict(), "iters_per_s": 1e6 / it,
               "speedup_vs_profiled": (n / n0) * model / it, "speedup_vs_one_worker": None if eff is None else n / unit * eff, "scaling_efficiency": eff,
               "vs_measured_pct": None if not measured_us else 100.0 * (it - measured_us) / measured_us, "seconds": time.perf_counter() - t1}
        if caveat and relinks:
            row["caveat"] = caveat
        relinked = relinked or relinks
        if s.data_parallel is not None and is_fsdp_graph(g0) != is_fsdp_graph(g):  # DDP <-> FSDP: the scenario's own record
            peaks = fsdp_peak(g, reshard=s.reshard_after_forward) if is_fsdp_graph(g) else ddp_peak_of_fsdp(g0, s.workers)
            row["peak_memory_mb"] = max(m.total for m in peaks.values()) / MB
            row["memory_per_rank"] = {r: m.to_dict() for r, m in peaks.items()}
        elif is_fsdp_graph(g0):
            grouped = g0 if s.units is None else with_units(g0, s.units)  # the memory model reads the units and dtypes from meta
            dtyped = grouped if s.reduce_dtype is None else set_reduce_dtype(grouped, s.reduce_dtype)
            peaks = fsdp_peak(dtyped, reshard=s.reshard_after_forward, workers=s.workers)
            row["peak_memory_mb"] = max(m.total for m in peaks.values()) / MB
            row["memory_per_rank"] = {r: m.to_dict() for r, m in peaks.items()}
        path = timeline(i, g, res) if timeline else None
        if path:
            row["trace"] = path
        rows.append(row)
    link = None if fit is None else {
        "latency_us": fit.link.alpha_us, "bandwidth_bytes_per_s": fit.link.bandwidth_bytes_per_s if fit.link.beta_us_per_byte else None,
        "collectives": fit.collectives, "sizes": fit.sizes, "r2": fit.r2, "weak": fit.weak, "profiled_wire": wire}
    profiler = cost.to_dict() | ({"corrected": False, "verdict": "--raw", "text": "op times as profiled (--raw)"} if raw else {})
    return {"workers": n0, "model_iter_ms": model / 1e3, "model_error_pct": model_error, "profiler_cost": profiler,
            "reference_iter_ms": None if not measured_us else measured_us / 1e3, "link": link_text(base_topo), "link_fit": link,
            "columns": COLUMNS, "scenarios": rows, "overlap_slowdown": cluster.slowdown, "overlap_rate_bytes_per_s": cluster.comm_rate,
            "notes": _hybrid_notes(g0) + _conversion_notes(g0, scenarios, cluster) + _crowded_notes(g0)
                     + _shared_cores_notes(g0, cluster) + _overlap_notes(cluster) + _own_cores_notes(g0, scenarios, cluster)
            + _link_to_notes(scenarios, cluster) + wire_notes + ([note] if relinked and (note := stall_note(g0)) else []),
            "seconds": time.perf_counter() - t0}


FAR_BELOW_WIRE = 0.8  # a fit slower than this share of the profiled wire: most of its collectives' time is not the link's


def _profiled_wire(g: Graph, fit: LinkFit | None, c: Cluster) -> tuple[dict | None, list[str]]:
    """The fitted link against the wire rate the run was profiled at (``Cluster.profiled_bandwidth``): for --json, and a note
    saying how much of the collectives' per-byte time ``split_at_wire`` keeps fixed (the fit far below the wire: busy cores)."""
    if c.profiled_wire is not None and is_ps_graph(g):
        return None, _ps_wire_notes(g, c)
    if c.profiled_wire is None or fit is None:
        return None, []
    wire = c.profiled_wire
    share = 1e6 / wire / fit.link.beta_us_per_byte if fit.link.beta_us_per_byte > 0 else None
    nbytes = float(profiled_collectives(g, overlapping=g.meta.comm_lanes > 1)[0].sum())
    out = {"bandwidth_bytes_per_s": wire, "fit_share": share, "collectives": fit.collectives, "bytes": nbytes,
           "far_below": share is not None and share < FAR_BELOW_WIRE}
    if fit.link.beta_us_per_byte == 0:
        return out, [f"--profiled-bandwidth {c.profiled_bandwidth}: the {fit.collectives} collectives' ({nbytes / 1e6:.3g} MB) durations "
                     "show no time per byte, so nothing of them is wire time to keep apart"]
    head = f"--profiled-bandwidth {c.profiled_bandwidth}: the link fitted to {fit.collectives} collectives ({nbytes / 1e6:.3g} MB) runs at {share:.0%} of it"
    if share >= 1.0:
        return out, [f"{head}, no slower than the wire (bytes crossed outside the timed transfers, or the rate is not the wire's): "
                     "its whole per-byte time scales by the rate ratio, --bandwidth over it"]
    far = "far below the wire: " if share < FAR_BELOW_WIRE else ""
    if g.meta.horovod is not None:
        return out, [f"{far}{head}; Horovod's copies and reductions on the cores run beside the wire's transfer, so each collective "
                     "takes the longer of its profiled price and the wire's time at --bandwidth"]
    return out, [f"{far}{head}; the other {1 - share:.0%} of its per-byte time is taken as work on the cores (busy cores, copies) "
                 "and kept at every bandwidth, only the wire's part scales"]


def _ps_wire_notes(g: Graph, c: Cluster) -> list[str]:
    """A parameter-server job's fitted link (``passes.comm.fit_ps_link``) against the wire it was profiled at: how each
    --bandwidth row reads it (``passes.comm.ps_bandwidth``)."""
    fit = g.meta.ps_link_fit
    share = fit.bandwidth_bytes_per_s / c.profiled_wire
    head = (f"--profiled-bandwidth {c.profiled_bandwidth}: the parameter-server exchanges ({fit.target_exchange_us / 1e3:.1f} ms on "
            f"average) fitted at {share:.0%} of it")
    how = ("no slower than the wire (a port's burst allowance): the fit scales by the rate ratio, --bandwidth over it" if share >= 1.0 else
           "; what held them back was not the wire (busy cores, lost segments) and is kept as a limit of its own: a row's messages move at "
           "the slower of --bandwidth and the fit")
    return [head + ("" if share < 1.0 else ", ") + how]


def _link_to_notes(scenarios: list[Scenario], c: Cluster) -> list[str]:
    """What a ``--link-to`` row rests on: the two calibrations' ratio, not a fit."""
    if not any(s.link_to is not None for s in scenarios):
        return []
    return [f"--link-to: each collective as profiled plus what its kind and size took more on the row's link than on "
            f"--link-from's ({c.link_from}, the first rank out's time), each exit lag times their ratio, the nearest swept sizes "
            "interpolated (beyond the sweep, its end's); the two files must "
            "be measured alike (on a loaded machine each size's time grows by about the same amount on both links, and the ratio shrinks)"]


def _overlap_notes(c: Cluster) -> list[str]:
    if not c.slowdown:
        return []
    per = "" if c.comm_rate is None else (f", each collective weighted by its bytes per second against the measured all-reduce's "
                                          f"{c.comm_rate / 1e9:.3g} GB/s (at most 1)")
    return [f"compute beside in-flight collectives runs (1 + {c.slowdown:.2f} x overlap) slower (measured){per}: taken out of the "
            "profiled op times and charged again under each scenario; measured on one link, the weighting is not validated at another "
            "rate (on the testbed 200 Mbit/s slowed compute as much as an unshaped link)"]


def _conversion_notes(g0: Graph, scenarios: list[Scenario], c: Cluster) -> list[str]:
    """The known limits of a DDP <-> FSDP answer, once per target wrapper asked for."""
    measured = c.link_file is not None and c.link_file.fsdp is not None
    fsdp = is_fsdp_graph(g0)
    targets = {"ddp" if s.data_parallel == "ddp" else "fsdp" for s in scenarios if s.data_parallel is not None}
    return [f"--data-parallel {t} from a{'n FSDP' if fsdp else ' DDP'} profile: {conversion_note(t, measured)}"
            for t in sorted(targets) if (t == "fsdp") != fsdp]


def _shared_cores_notes(g: Graph, c: Cluster) -> list[str]:
    """Ranks that outnumbered their host's cores when profiled: each op's time holds the sharing as it fell then."""
    over = {h: rc for h, rc in g.meta.host_cpus.items() if rc[0] > rc[1]}
    if not over or c.cores:
        return []
    h, (ranks, cores) = next(iter(sorted(over.items())))
    more = f" (and {len(over) - 1} more host(s) alike)" if len(over) > 1 else ""
    return [f"{ranks} ranks shared {cores} cores on host {h}{more} when profiled: their ops ran slower where more than {cores} computed "
            f"at once, and a what-if that changes when they compute (units, reshard, DDP <-> FSDP, the link) keeps the profiled "
            f"op times unless --cores {cores} models the sharing (a 4-rank HSDP job on 2 cores: --units merge:all -27 and -42 % "
            "off the measured job in two rounds without it, -4 and -26 % with it)"]


def _own_cores_notes(g: Graph, scenarios: list[Scenario], c: Cluster) -> list[str]:
    """More parameter-server workers than the profiled host's cores, without --cores: the assumption said, with its numbers."""
    note = None if c.cores or not is_ps_graph(g) else own_cores_note(g, max(s.workers or 0 for s in scenarios))
    return [note] if note else []


def _crowded_notes(g: Graph) -> list[str]:
    """Horovod ranks sharing too few cores: what their spinning waits take from compute is kept as measured."""
    crowded = crowded_hosts(g)
    return [f"{len(crowded)} host(s) ({', '.join(f'{h}: {g.meta.host_cpus[h][0]} ranks on {g.meta.host_cpus[h][1]} cores' for h in crowded)}) "
            "have fewer cores than their ranks' main and Horovod threads, and Horovod's synchronize() spins a core while it waits: "
            "compute there slows as the waits grow (a slower link, more workers), which is not modelled; the predictions "
            "keep compute as profiled (one such job measured 25 % slower at 200 Mbit/s than predicted from 500)"] if crowded else []


def _hybrid_notes(g: Graph) -> list[str]:
    """What a hybrid job's answers leave as measured."""
    par = g.meta.parallel
    if par is None or not par.hybrid or par.dp_mesh:  # HSDP: every collective is data-parallel and modelled
        return []
    unit = replica_ranks(g)
    return [f"parallelism {par.describe()}: only the data-parallel collectives are modelled; the others keep their measured "
            "times and group sizes" + (f" ({unit} ranks per data-parallel replica)" if unit > 1 else "")]


def _one_replica_us(g0: Graph, single: Scenario, cluster: Cluster, base_topo: Topology | None) -> float | None:
    """One data-parallel replica's iteration under the same conditions; None where fewer workers are not modelled
    (a hybrid job whose other groups span its data-parallel ranks: the scaling columns are then n/a)."""
    try:
        return job_iteration_us(*disturb(apply(g0, single, cluster, base_topo), cluster))
    except DagprofError:
        if not hybrid(g0):
            raise
        return None


def link_text(t: Topology | None) -> str:
    if t is None:
        return "collectives as measured (no data-parallel collective to fit a link to)"
    ab = t.inter
    return (f"{t.hosts} host(s) x {t.devices_per_host}, link {ab.bandwidth_bytes_per_s * 8 / 1e9:.3g} Gbit/s, latency {ab.alpha_us:.3g} us, "
            f"{t.overhead_us:.3g} us per collective")
