"""What a graph knows about itself beyond its nodes: the typed contract between builders and passes.

The builders (``graph.build``, ``graph.build_ps``) fill it from the measured run; passes read it
(world size, topology, scheme) and record what they changed. ``slots=True`` makes a misspelt
field an ``AttributeError`` instead of a silent new key. Passes are graph -> graph functions and
must not touch their input: ``Graph.replace`` and ``GraphBuilder.from_graph`` give the new graph
``copy()`` of the meta, whose lists and dicts are new (their contents are shared, and read-only:
the framework sub-records are frozen, a pass replaces one, it does not edit it in place).
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DagprofError
from ..traces.run_schema import FSDP2_API, FSDP_ROOT, DdpApi, ZeroInfo, ddp_label
from ..units import count

if TYPE_CHECKING:
    from ..costmodel.fsdp_costs import StepFit
    from ..costmodel.topology import CollectiveSpec, Topology
    from ..traces.buckets import BucketLayout
    from ..traces.host_segments import HostSegments
    from ..traces.meta import GradClip, HookWire, HorovodRecord, PaddedGather, PsRecord, RowPull, StepSched
    from ..traces.parallelism import Parallelism
    from .measured import Provenance


WARMUP_STEPS = 2  # a job's first two steps (DDP: step 0 builds the buckets, step 1 uses them first): not its steady state


@dataclass(frozen=True)
class LoopSteps:
    """Step durations (us) timed by dagprof's collector in the training loop, rank -> step -> us: the steps the
    profiler recorded and the others of the same job (warm-up included), which measure the profiler's own cost."""

    profiled: dict[int, dict[int, float]]
    unprofiled: dict[int, dict[int, float]]
    # rank -> step -> the training thread's CPU, its waits for a core and its process's CPU in that step, profiled or not
    # (``traces.meta.StepSched``; empty where not recorded): what the profiler added in the window, and what a load did
    sched: dict[int, dict[int, StepSched]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CoreGroup:
    """Ranks of one host that may contend for cores, and how many cores they may use together (``GraphMeta.host_cpus``,
    ``GraphMeta.pinned_groups``): named, so that no reader takes one count for the other."""

    ranks: int  # how many ranks
    cores: int  # the cores they may run on together


@dataclass(frozen=True, slots=True)
class FsdpGraphUnit:
    """One FSDP2 unit as the graph knows it (``graph.build_fsdp``): the recorded unit (``run_schema.FsdpUnit``)
    with its layers by name and what it did after forward."""

    name: str
    numel: int  # unsharded parameter elements
    shard_bytes: int
    orig_dtype: str
    param_dtype: str  # what the all-gather moves
    reduce_dtype: str  # what the reduce-scatter moves
    reshard_after_forward: bool  # as configured after lazy init (FSDP2's default: False for the root, True for the others)
    resharded_after_forward: bool  # as it ran (FSDP1's root never reshards after forward, whatever its strategy)
    mesh: list[int]  # (shard,) or HSDP's (replicate, shard)
    mesh_dims: list[str]
    layers: list[str]  # the leaf layers it runs (not those of nested units)
    tensors: int = 0  # parameter tensors it manages (0: not recorded, as in a DDP profile turned FSDP)
    frozen_numel: int = 0  # of numel, the elements that take no gradient (FsdpUnit.frozen_numel)
    frozen_tensors: int = 0  # of tensors, those that take no gradient
    reshard_to: int = 0  # FsdpUnit.reshard_to: the N of reshard_after_forward=N (the post-forward shard group), 0: none
    offload: bool = False  # FsdpUnit.offload: CPUOffloadPolicy
    untimed_root: str = ""  # FsdpUnit.untimed_root (``traces.fsdp_run.untimed_roots``): another root's unit, its compute in no layer
    root: int = 0  # FsdpUnit.root: k > 0, a unit of another fully_shard root timed beside the first

    @property
    def is_root(self) -> bool:
        """Whether this is a ``fully_shard`` root's own unit: the first root's ``FSDP_ROOT``, another root's named by its
        layers' prefix alone (``FSDPViT1``; its inner units ``FSDPViT1.blocks.0``)."""
        return self.name == FSDP_ROOT or (self.root > 0 and "." not in self.name)

    @property
    def grad_numel(self) -> int:
        """The elements FSDP reduce-scatters and the optimizer steps: the frozen ones are gathered only."""
        return self.numel - self.frozen_numel

    @property
    def grad_tensors(self) -> int:
        """The tensors the optimizer steps."""
        return self.tensors - self.frozen_tensors


@dataclass(frozen=True, slots=True)
class FsdpShards:
    """One rank's sharded parameters, gradients and optimizer state at the window's end, bytes."""

    param_shard_bytes: int
    grad_shard_bytes: int
    optim_state_bytes: int


@dataclass(frozen=True, slots=True)
class FsdpRecord:
    """An FSDP job's units, shards per rank and activation sizes, for the what-ifs and the memory model."""

    units: list[FsdpGraphUnit]
    memory: dict[int, FsdpShards]  # rank -> its shards
    backend: str
    world_size: int
    layer_saved_bytes: dict[str, int]  # rank 0's activations per layer
    layer_grad_bytes: dict[str, int]
    api: str = FSDP2_API  # FsdpInfo.api: dagprof.apply configures FSDP2 units only
    # rank 0's gathered parameters among layer_saved_bytes, per layer (FsdpInfo.layer_saved_gathered_bytes); None: not recorded
    layer_saved_gathered_bytes: dict[str, int] | None = None
    layer_output_bytes: dict[str, int] | None = None  # rank 0's bytes each layer returned (FsdpInfo.layer_output_bytes); None: not recorded
    layer_input_bytes: dict[str, int] | None = None  # rank 0's bytes each layer received (FsdpInfo.layer_input_bytes); None: not recorded
    # rank 0's bytes saved between leaf modules per unit whose forward ran (FsdpInfo.unit_saved_outside_bytes); None: not recorded
    unit_saved_outside_bytes: dict[str, int] | None = None
    # the optimizer step per tensor and per byte of its shards, read from the profile's Kineto ops (graph.build_fsdp.profiled_step);
    # None: not in the profile (no Kineto, no DTensor dispatch seen)
    step_fit: StepFit | None = None


@dataclass(frozen=True, slots=True)
class SgdRecord:
    """The S-SGD DAG model's parameters (``sgd.dag``)."""

    policy: str
    workers: int
    iterations: int


@dataclass(frozen=True, slots=True)
class PsLinkFit:
    """The link fitted to measured parameter-server exchanges (``passes.comm.fit_ps_link``)."""

    bandwidth_bytes_per_s: float
    alpha_us: float
    server_us_per_byte: float
    target_exchange_us: float
    workers_per_server: float = 0.0  # the profile's workers over its servers: the pushes one server's port carries (0: not recorded)
    # each row_sparse pull's time beyond the wire's at the fitted link, as measured (ps-lite copies the rows out and in on
    # threads mx.profiler does not trace, which wait for busy cores); () where no key is row_sparse
    row_pull_extra_us: tuple[RowPull, ...] = ()
    # a row_sparse pull's time per byte on the wire against the fitted link's: the fastest pull's (the exchanges the link is
    # fitted to wait for the slowest worker and the servers' updates, so their rate can be slower than the wire's); 1: none
    row_pull_beta_ratio: float = 1.0
    # (step, factor): each profiled step's exchanges at its own time per byte, the fitted one's times ``factor``
    # (``passes.comm.fit_ps_link``); () where the fit kept one for all steps (an averaged graph's)
    step_factors: tuple[tuple[int, float], ...] = ()


class WakeFrom(enum.Enum):
    """What a DDP profile's wake-up price was read from (``wake_up``)."""

    BLOCKED_WAITS = "blocked waits"  # the lag of its own waits that blocked: a wake-up after a voluntary sleep, measured
    RUN_QUEUE = "run queue"  # the kernel's schedstat: its thread's run-queue wait per time it got a core


@dataclasses.dataclass(frozen=True)
class WakeUp:
    """One wake-up's price per rank (us) and what it rests on: ``count`` blocked waits, or times the threads got a core;
    ``stderr_us`` the price's standard error from its samples (their spread over the root of their number, ``dof``
    degrees of freedom): what the prediction's interval carries (``wake_up_spread``)."""

    us: dict[int, float]
    source: WakeFrom
    count: int
    stderr_us: float = 0.0
    dof: int = 0

    def said(self) -> str:
        """For the note: the price, its standard error and where it came from."""
        r = min(self.us)
        err = f" +- {self.stderr_us / 1e3:.2f}" if self.dof else ""
        if self.source == WakeFrom.BLOCKED_WAITS:
            return (f"{self.us[r] / 1e3:.2f}{err} ms (the median lag, both ranks, of this profile's {self.count} waits that blocked: how long a "
                    "rank took to resume after the collective it waited for ended; +- the lags' standard error, which the interval carries)")
        return (f"{self.us[r] / 1e3:.2f}{err} ms (rank {r}: its wait for a core per time its thread got one, as profiled, over the "
                f"{self.count} times the ranks' threads got one; no blocked wait measured in this graph)")

    def on_ranks(self, ranks: list[int]) -> WakeUp:
        """This price on the ranks ``ranks`` of a graph whose rank r copies the profiled rank r mod the profiled count
        (``passes.workers``): a pooled price is every rank's, a rank's own its copies'."""
        own = sorted(self.us)
        return dataclasses.replace(self, us={r: self.us[own[r % len(own)]] for r in ranks})


@dataclasses.dataclass(frozen=True, slots=True)
class GlooWake:
    """A profiled rank's other threads' (gloo's) wake-ups (``passes.comm_cpu.comm_cpu``, from ``traces.meta.OtherThreads``):
    the times they got a core per ring step of the rank's collectives, what each waited for a core, and the ring steps
    the rank's collectives made a step in the profile."""

    runs_per_ring_step: float
    wait_us_per_run: float
    ring_steps: float  # a step's, as profiled


@dataclasses.dataclass(frozen=True)
class CommCpu:
    """The CPU a profile's collectives took off the training thread (its process's other threads: gloo's), per profiled
    rank, in us per byte the rank sent (``passes.comm_cpu``): what ``--cores`` queues on the shared cores per collective;
    and their wake-ups per ring step, priced on more ranks than cores ({}: not recorded, files before 2026-12-06)."""

    us_per_byte: dict[int, float]
    wake: dict[int, GlooWake] = dataclasses.field(default_factory=dict)


@dataclass(slots=True)
class GraphMeta:
    # --- the measurement (graph.build / graph.build_ps; analysis.diff.match re-cuts steps and measured_iter_us)
    world_size: int | None = None  # ranks of the profiled job (or of the what-if: passes.workers); prices collectives
    ranks: list[int] = field(default_factory=list)  # the ranks whose traces built the graph
    steps: list[int] = field(default_factory=list)  # the profiled steps the graph holds, common to all ranks
    backend: str | None = None  # the collective backend as the trace names it (gloo, nccl, ps-lite, ...)
    framework: str | None = None  # tensorflow, jax, mxnet, horovod as the reader names it; None: PyTorch
    source: str | None = None  # the trace file or run folder the graph was built from
    measured_iter_us: dict[int, float] = field(default_factory=dict)  # rank -> measured iteration time, us
    loop_steps: LoopSteps | None = None  # the training loop's own step times, profiled or not (dagprof runs; passes.profiler_cost)
    buckets: BucketLayout = ()  # rank 0's DDP buckets (RankTrace.buckets)
    ddp_models: int = 0  # dagprof runs: DDP models rank 0 wrapped (a GAN's two; 0: not recorded)
    ddp_api: DdpApi = ""  # dagprof runs: "replicate" where the DDP is the composable replicate()'s (``ddp_label``)
    comm_hook: str = ""  # dagprof runs: the job's own DDP comm hook by name ("": DDP's all-reduce); passes.buckets.HALF_HOOKS
    hook_wire: HookWire | None = None  # what that hook put on the wire, rank 0's (varying where ranks differ); None: not recorded
    find_unused: bool = False  # dagprof runs: DDP under find_unused_parameters=True, no static graph: it never rebuilds its buckets
    warnings: list[str] = field(default_factory=list)  # the run's load/alignment warnings, shown to the user
    main_device: dict[int, int] = field(default_factory=dict)  # rank -> index of its main compute device (the builders)
    comm_lanes: int = 1  # most collectives one rank ran at once (graph.build); > 1: durations are completion spacings
    provenance: Provenance | None = None  # each node's measured interval and each edge's rule (graph.build)
    parallel: Parallelism | None = None  # process groups and mesh dimensions (graph.build; passes.workers scales its DP size);
    # None: a builder of data-parallel jobs only (parameter server, S-SGD model, synthetic graphs)
    layer_grad_bytes: dict[str, int] = field(default_factory=dict)  # dagprof runs: rank 0's gradient bytes per layer (module path)
    layer_frozen_bytes: dict[str, int] = field(default_factory=dict)  # dagprof runs: rank 0's bytes of parameters without one, per layer
    layer_saved_bytes: dict[str, int] = field(default_factory=dict)  # dagprof runs: rank 0's activation bytes saved per layer
    layer_output_bytes: dict[str, int] = field(default_factory=dict)  # dagprof DDP runs: rank 0's bytes each layer returned ({}: not recorded)
    # dagprof CPU runs: rank 0's autograd nodes per layer (RankFile.layer_autograd_nodes) and its torch version, which
    # prices them (search.memory.autograd_host) and FSDP2's DTensor step (costmodel.fsdp_costs.DTENSOR_STEP); {}: not recorded
    layer_autograd_nodes: dict[str, int] = field(default_factory=dict)
    layer_types: dict[str, str] = field(default_factory=dict)  # dagprof runs: rank 0's classes of its numbered layers (RankFile.layer_types)
    torch: str = ""
    grad_clips: dict[int, GradClip] = field(default_factory=dict)  # dagprof runs: rank 0's clip_grad_norm_ calls per step ({}: none or not recorded)
    # dagprof, MXNet, TF/JAX runs: host -> its ranks and the cores they may use together (their affinity sets' union, where
    # they recorded them, else the fewest cores one could run on; unpinned ranks: the host's). Which ranks contend: core_groups
    host_cpus: dict[str, CoreGroup] = field(default_factory=dict)
    # hosts whose ranks were pinned apart (graph.build.pinned_groups) -> each group of ranks whose affinity sets overlap, with
    # their cores; a rank alone on its own cores is a group of its own. Absent: every rank may run on every core
    pinned_groups: dict[str, tuple[CoreGroup, ...]] = field(default_factory=dict)
    host_tick_us: dict[str, float] = field(default_factory=dict)  # TF/JAX runs: host -> its kernel's scheduler tick, where it said (analysis.operand_stall)
    # TF/JAX runs: host -> cores' worth of other processes' CPU on its ranks' cores in the profiled window, where every rank
    # recorded it (traces.window_cpu; passes.ring_pace prices the pace on the cores left)
    host_other_cores: dict[str, float] = field(default_factory=dict)
    collective_operands_per_step: float | None = None  # XLA (JAX): arrays rank 0's collectives carried a step (analysis.operand_stall)
    # TF: a padded all-gather of a sparse gradient (traces.xplane_run.padded_key) -> each profiled worker's rows per step
    # (passes.padded_gathers prices N workers' padding from them; {}: none, or not recorded)
    padded_gathers: dict[str, PaddedGather] = field(default_factory=dict)
    host_segments: dict[int, HostSegments] = field(default_factory=dict)  # TF/JAX: rank -> its main thread's labelled time (analysis.overhead)
    # TF/JAX: rank -> when XLA compiled, (start, end) on its clock, us (RankMeta.xla_compiles; passes.average_steps); absent: none
    xla_compiles: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    # --- the communication model (passes.comm, graph.build_ps)
    topology: Topology | None = None  # the link model pricing the collectives; None: fitted from the profile
    scheme: CollectiveSpec | None = None  # the collective scheme (ring, tree, hier, ps:K); None: ring
    kinds_apart: bool = False  # once priced: each collective costs on its kind's link (passes.comm.kinds_apart)
    wire_bytes_per_s: float | None = None  # the link rate the run was profiled at, where known (passes.link_fit.split_at_wire)
    # every rank's traffic crossed one medium, both ways, where known (``whatif --half-duplex``): the profile's collectives are
    # fitted, as they are priced, at their bytes' share of it (passes.link_fit.medium_equivalent_bytes)
    half_duplex: bool = False
    # a bandwidth what-if's wire rate on a parameter-server job profiled at a known one: its row_sparse pulls' wire (graph.build_ps.rebuild_ps)
    ps_asked_bytes_per_s: float | None = None
    fine: bool = False  # collectives expanded into per-link messages (passes.comm.expand_collectives)
    # --- what passes changed
    folded_ranks: dict[str, list[int]] | None = None  # representative rank -> ranks it stands for (graph.symmetry)
    micro_batches: int = 1  # micro-batches per step (passes.accumulate)
    bucket_cap_mb: float | None = None  # bucket size set by passes.buckets; None: as profiled
    overlap: bool | None = None  # backward/communication overlap set by passes.buckets; None: as profiled
    ps_link_fit: PsLinkFit | None = None  # the link fitted to measured PS exchanges (passes.comm.fit_ps_link)
    wake_up: WakeUp | None = None  # a DDP profile's wake-up price, kept before --workers rebuilds its ranks (passes.data_parallel)
    comm_cpu: CommCpu | None = None  # its collectives' CPU off the training thread, kept before a pass rebuilds its ranks (passes.comm_cpu)
    # JAX on gloo: per profiled rank, the share of its collectives' in-flight time its threads off the lanes were runnable,
    # kept as ``comm_cpu`` (``passes.comm_cpu.spin_share``)
    spin_share: dict[int, float] | None = None
    # --- framework sub-records (frozen: a pass sets a new one)
    horovod: HorovodRecord | None = None  # Horovod's tensors, fusion threshold, cycle time (traces.horovod; passes.horovod)
    zero: ZeroInfo | None = None  # DDP with ZeroRedundancyOptimizer: rank 0's shards and parameter broadcasts (passes.workers)
    fsdp: FsdpRecord | None = None  # FSDP2: units, their dtypes and reshard policy, sharded memory per rank (graph.build_fsdp)
    ps: PsRecord | None = None  # MXNet parameter server: keys, placement, measured exchanges (graph.build_ps)
    sgd: SgdRecord | None = None  # the S-SGD DAG model's policy, workers, iterations (sgd.dag)

    def job_of(self, per_rank: list[float]) -> float:
        """The job's step (or iteration) from its ranks' own: the slowest rank's where every step joins all ranks (a
        collective each step). A parameter server's workers meet only at the servers: a pull answered late lengthens its
        own worker's step, and its peer's next one (waiting for the late push), so the slowest worker per step counts
        that stall twice, and a window's slowest worker holds it whole where it fell in the window's last step; the
        workers' mean counts it once (``mx_attn_accum.py`` on the testbed, ``tests/data/mxnet/testbed_attn``: pulls 8-10 ms
        late in 2 of 4 steps; the slowest worker per step read a profiler cost of 25 %, the mean 12 %)."""
        if not per_rank:  # e.g. a what-if's one-worker replica of a lone rank-1 trace: no rank left with its step marks
            raise DagprofError("no rank of the replayed graph spans a step, so its iteration cannot be timed (a what-if on one "
                               "rank's trace other than rank 0 needs every rank's traces)", self.source)
        return max(per_rank) if self.ps is None else sum(per_rank) / len(per_rank)

    @property
    def job_name(self) -> str:
        """What ``job_of`` takes, as the outputs name it."""
        return "slowest rank" if self.ps is None else "workers' mean"

    @property
    def ddp_label(self) -> str:
        """How the outputs name the job's DDP (``traces.run_schema.ddp_label``)."""
        return ddp_label(self.ddp_api)

    @property
    def torch_minor(self) -> str:
        """The profile's torch version as major.minor (``2.13.0+cpu``: ``2.13``), what its measured constants are keyed by."""
        return ".".join(self.torch.split("+")[0].split(".")[:2])

    def core_groups(self, host: str) -> tuple[CoreGroup, ...]:
        """The ranks of ``host`` that contend for cores, per group: one group, ``host_cpus``'s, unless they were pinned
        apart (``pinned_groups``)."""
        return self.pinned_groups.get(host, (self.host_cpus[host],))

    def crowded_groups(self, host: str, threads_per_rank: int, among_ranks: bool = False) -> list[CoreGroup]:
        """The groups of ``host`` (``core_groups``) where ``threads_per_rank`` runnable threads per rank outnumber their
        cores; ``among_ranks``: only where ranks share cores (a rank pinned alone contends with its own threads only)."""
        return [k for k in self.core_groups(host)
                if threads_per_rank * k.ranks > k.cores and (k.ranks > 1 or not among_ranks or host not in self.pinned_groups)]

    def crowded_hosts(self, threads_per_rank: int, among_ranks: bool = False) -> list[str]:
        """Hosts with a group of ranks whose ``threads_per_rank`` runnable threads per rank outnumber their cores
        (``crowded_groups``)."""
        return sorted(h for h in self.host_cpus if self.crowded_groups(h, threads_per_rank, among_ranks))

    def pinned_said(self, host: str) -> str:
        """How ``host``'s ranks were pinned, to follow its cores in a note: " (pinned apart: 1 rank on 1 core, 1 rank on
        1 core)"; "" where they were not."""
        groups = self.pinned_groups.get(host)
        return "" if groups is None else " (pinned apart: " + ", ".join(f"{count(k.ranks, 'rank')} on {count(k.cores, 'core')}" for k in groups) + ")"

    def copy(self) -> GraphMeta:
        """A copy whose top-level lists and dicts are new, so setting or appending on it leaves ``self`` alone."""
        return GraphMeta(**{f.name: _fresh(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def replace(self, **changes: Any) -> GraphMeta:
        """``copy()`` with some fields changed; an unknown field is a ``TypeError``."""
        return dataclasses.replace(self.copy(), **changes)


def _fresh(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    return dict(value) if isinstance(value, dict) else value
