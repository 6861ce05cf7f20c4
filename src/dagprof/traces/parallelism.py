"""Which mesh dimension each collective serves: data (DP), tensor (TP), pipeline (PP), expert/context (EP/CP) parallel.

Why: adding data-parallel workers changes the gradient collectives only; a tensor-parallel all-reduce
moves activations inside one model replica and keeps its size and traffic. A what-if that cannot tell
them apart must refuse, not answer as if the job were plain DDP.

Evidence per collective, strongest first (the first that tells wins):

1. the process group's description: torch's DeviceMesh names its groups ``mesh_<dim name>``, Megatron
   ``TENSOR_MODEL_PARALLEL_GROUP`` and the like (``record_param_comms`` args, ``distributedInfo.pg_config``);
2. a DDP gradient bucket (dagprof's hooks know each bucket's parameters): DP; a trace from one of
   dagprof's data-parallel collectors (TensorFlow, JAX, Horovod, MXNet PS): DP, but the send/recv and all-to-all
   that Kineto adds to a dagprof run (in DDP's group, whose ranks are not theirs) are PP and EP/CP, and those it
   shows only inside other ops (``RankMeta.unseen_collectives``) make a group of unknown ranks;
3. a collective issued after its step's optimizer step (a Kineto trace's ``Optimizer.step#`` range, after the backward
   pass) or before the step's forward pass (a wrapper's forward range) exchanges no gradients, even in a group described
   as DP: the job's own (``Dim.JOB``: a DCP save's object collectives, a logged metric), which link what-ifs re-price at
   its profiled size and ``--workers`` keeps as profiled, said;
4. the collective itself: send/recv is PP; all-to-all is EP/CP (in the forward pass an embedding or
   expert exchange, in the backward pass its gradient);
5. where it sits and its size: an all-reduce or reduce-scatter inside the forward pass of at least
   ``ACTIVATION_MIN_BYTES`` moves activations (TP); one in or after the backward pass with the size of
   one of its group's forward ones is their gradient (TP); any other in or after the backward pass
   reduces gradients (DP); an all-gather in the forward pass of a group that reduce-scatters gradients is
   FSDP/ZeRO's (DP);
   any collective a DTensor op issued (inside ``Redistribute``, a tensor subclass's dispatch or ``from_local``'s
   backward) in a group that reduces activations in the forward pass is tensor parallel too: sequence parallelism's
   all-gathers, and the all-reduces of the partial gradients of parameters a TP plan replicates (the optimizer's
   DTensor ops issue them after backward; DDP's gradient buckets are issued by its reducer, never by a DTensor op);
6. what is left (broadcast, barrier, an all-gather) takes its group's label when its group's other
   collectives agree on one;
7. else "unknown".

Traces that record no group per collective (gloo writes no ``record_param_comms``) put every collective
in group "0". When the rank's ``pg_config`` names exactly one group of the label position gave, the
collective is moved to it (``resolve_groups``), so ranks are matched within their real groups.
"""
from __future__ import annotations

import enum
import re
from collections import Counter
from dataclasses import dataclass, field, replace

import msgspec
import numpy as np

from .comm_kind import P2P, P2P_PEERED
from .events import CommKind, EventTable, Kind, LaneKind, RankTrace, Run
from .meta import InOpGroup

ACTIVATION_MIN_BYTES = 1024  # a forward all-reduce below this is a loss or metric reduction, not evidence of TP
OPTIMIZER_STEP = "Optimizer.step#"  # torch.optim's record_function around each step
# the ranges torch's data-parallel wrappers record as their forward begins (DDP's, FSDP1's, FSDP2's ``FSDP::pre_forward
# (fqn)``): the step's forward pass has begun (an op named so, ``aten::nll_loss_forward``, may come after a TP forward's collectives)
FORWARD_RANGE = re.compile(r"^(Distributed|FullySharded)DataParallel\.(forward|_root_pre_forward|_pre_forward)$|^FSDP::(root_)?pre_forward")


class Dim(enum.IntEnum):
    """A collective's mesh dimension (the graph's ``dim`` node column)."""

    UNKNOWN = 0
    DP = 1
    TP = 2
    PP = 3
    EP_CP = 4
    JOB = 5  # no mesh dimension: the job's own, issued between an optimizer step and the next forward (a checkpoint's, a logger's)

    @property
    def text(self) -> str:
        return {Dim.UNKNOWN: "unknown", Dim.EP_CP: "EP/CP", Dim.JOB: "job-own"}.get(self, self.name)

    @classmethod
    def of_text(cls, text: str) -> Dim:
        """The dimension ``text`` names (``Dim.text``, as ``GroupLabel.dims`` keys it)."""
        return next(d for d in cls if d.text == text)


class Phase(enum.IntEnum):
    """Where in its step a collective was issued."""

    NONE = 0  # outside the profiled steps, or no backward pass recorded
    FORWARD = 1
    BACKWARD = 2
    AFTER_BACKWARD = 3


_DESC_DIMS = (  # process-group descriptions and mesh dimension names, as torch, Megatron and torchtitan write them
    (re.compile(r"(^|[^a-z])(d?dp|dp_shard|dp_replicate|dp_cp|fsdp|hsdp|replicate|shard|data)([^a-z]|$)|data_parallel", re.I), Dim.DP),
    (re.compile(r"(^|[^a-z])(tp|sp|tensor|tensor_model)([^a-z]|$)|tensor_model_parallel|tensor_parallel", re.I), Dim.TP),
    # Megatron ties the first and last pipeline stages' embeddings in its EMBEDDING_GROUP
    (re.compile(r"(^|[^a-z])(pp|pipe|pipeline)([^a-z]|$)|pipeline_model_parallel|pipeline_parallel|embedding", re.I), Dim.PP),
    (re.compile(r"(^|[^a-z])(ep|cp|expert|context)([^a-z]|$)|expert_model_parallel|context_parallel", re.I), Dim.EP_CP),
)
_TEXT = {int(d): d.text for d in Dim}
_REDUCING = frozenset({CommKind.ALL_REDUCE, CommKind.REDUCE_SCATTER})
_SCATTERING = frozenset({CommKind.SCATTER, CommKind.GATHER})  # rooted exchanges (gloo runs an all_gather's backward so, DCP its plan)
# DTensor's redistribution, its dispatch, and from_local/to_local's backward (DDP over a TP-split model reduces the
# partial gradients of a TP plan's replicated parameters there)
_DTENSOR_OP = re.compile(r"^(Nested)?Redistribute(Backward)?$|^PythonSubclass$|^_(From|To)TorchTensorBackward$")


class Aside(enum.Enum):
    """Why a collective of a data-parallel group carries none of its gradients, as the trace shows it (its evidence reads
    the value): gathered or scattered within the passes (``_fill_from_group``: a loss's in-batch negatives, their backward),
    or issued between an optimizer step, which has already applied them, and the next forward pass (``_update_to_forward``: a
    DCP save's object collectives, a logged metric)."""

    ACTIVATIONS = "in a data-parallel group, no gradient exchange"
    JOB_OWN = "issued between an optimizer step and the next forward pass: the job's own (a checkpoint's, a logger's), no gradients"


@dataclass(frozen=True)
class NoGradients:
    """Collectives of one group that exchange no gradients: why, what the trace shows around them (``_issuer``), how many
    (instances, summed over ranks)."""

    why: Aside
    around: str
    count: int


def in_op_name(kind: CommKind, ranks: int) -> str:
    """The name of a graph piece that is a collective the model ran inside one of its ops, sized (``run_partition.cut_in_op``),
    for people: what it is, later stages read from its ``comm_kind`` and ``group_size``."""
    return f"{kind.label} inside the op (group of {ranks})"


def p2p_peer(trace: RankTrace, group: str, local: int) -> int | None:
    """The rank a send or recv of ``group`` on ``trace`` exchanges with, where the trace tells: its peer argument
    (``local``, as the group numbers it: ``EventTable.peer``) in a group the trace recorded for it, else the other member
    of a 2-rank group. None otherwise, and for a dagprof run's (Kineto puts its send/recv in DDP's group, not theirs)."""
    members = trace.group_ranks.get(group, [])
    if trace.meta.format != "kineto" or trace.rank not in members:
        return None
    if 0 <= local < len(members) and members[local] != trace.rank and _own_group(trace, group):
        return members[local]
    if len(members) == 2:
        return members[0] if members[1] == trace.rank else members[1]
    return None


def _own_group(trace: RankTrace, group: str) -> bool:
    """Was the collective issued in ``group``, so that a peer argument counts in it? A group a record named or
    ``resolve_groups`` moved it to is; gloo records none, so its "0" is the group issued only where ``pg_config`` puts
    the rank in no other group."""
    if group != "0" or (len(trace.groups) > 1 and not trace.meta.resolved_groups):
        return True
    return "0" in trace.meta.group_desc and not any(trace.rank in r for name, r in trace.group_ranks.items() if name != "0")


def desc_dim(desc: str) -> Dim:
    """The dimension a group's description names ("mesh_tp" -> TP), UNKNOWN when it names none ("default_pg")."""
    if not desc or desc in ("default_pg", "undefined") or "_and_" in desc.lower():  # Megatron's TENSOR_AND_DATA_...: two at once
        return Dim.UNKNOWN
    for pattern, dim in _DESC_DIMS:
        if pattern.search(desc.replace("mesh_", " ")):
            return dim
    return Dim.UNKNOWN


def described_dp_group(trace: RankTrace) -> tuple[int, ...]:
    """The ranks of the rank's one process group that pg_config describes as data parallel (DeviceMesh's ``mesh_dp``);
    () where it describes none, or several of different ranks."""
    desc = trace.meta.group_desc
    found = {tuple(r) for n, r in trace.group_ranks.items() if trace.rank in r and desc_dim(desc.get(n, "")) is Dim.DP}
    return found.pop() if len(found) == 1 else ()


def in_op_groups(trace: RankTrace, hooked: dict[str, tuple[int, ...]], unhooked: list[tuple[str, float, int]]) -> list[InOpGroup]:
    """A dagprof run's collectives that Kineto shows but no hook saw (``unhooked``: each one's lane, transfer us and the
    bytes the collector recorded for its call, 0 where none (``run_comm.own_call_bytes``); the
    model's own, inside its ops, or the job's host time), by process group and mesh dimension, labelled as a stock trace's
    are (``desc_dim`` of the group's description, DeviceMesh's ``mesh_tp``): a ProcessGroupGloo (an NCCL communicator)
    runs its collectives on lanes of its own (``_by_worker_lane``), so one on a lane where the hooks' collectives ran
    (``hooked``: lane -> their group's ranks, data parallel) is in that group; one on another lane is in the rank's one
    described group that no hook's collective ran in, else not told (unknown). A DP x TP job's tensor-parallel all-reduces
    so count under TP in the breakdown by dimension, as time inside the ops that issued them."""
    own = {name: tuple(r) for name, r in trace.group_ranks.items() if trace.rank in r}
    desc = trace.meta.group_desc
    dp = set(hooked.values())
    told = [n for n, r in own.items() if desc_dim(desc.get(n, "")) is not Dim.UNKNOWN and r not in dp]
    found: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for lane, us, nbytes in unhooked:
        ranks = hooked.get(lane)
        if ranks is not None:
            name = next((n for n, r in own.items() if r == ranks and desc_dim(desc.get(n, "")) is not Dim.UNKNOWN), "")
            dim = desc_dim(desc[name]) if name else Dim.DP
        elif len(told) == 1:
            ranks, dim = own[told[0]], desc_dim(desc[told[0]])
        elif len(own) == 1:  # the rank's one group (a plain DDP job's): the hooks' one
            ranks = next(iter(own.values()))
            dim = Dim.DP if ranks in dp else Dim.UNKNOWN
        else:
            ranks, dim = (), Dim.UNKNOWN
        found.setdefault((",".join(map(str, ranks)), dim.text), []).append((us, nbytes))
    return [InOpGroup(g, d, len(u), float(sum(x for x, _ in u)), sum(b for _, b in u), sum(b > 0 for _, b in u))
            for (g, d), u in sorted(found.items())]


@dataclass(frozen=True)
class GroupLabel:
    """One process group of the job as labelled: what its collectives are and why."""

    name: str
    desc: str
    ranks: tuple[int, ...]  # () when the trace does not say (``label_run``: a default group that lumps DP, TP or PP ones)
    dims: dict[str, int]  # Dim.text -> collectives (instances, summed over ranks) with that label
    nbytes: dict[str, int]  # Dim.text -> payload bytes
    evidence: list[str]  # why, most frequent first
    no_gradients: tuple[NoGradients, ...] = ()  # of its collectives, those that exchange no gradients, typed


@dataclass(frozen=True)
class Parallelism:
    """The job's process groups and mesh dimensions as the trace tells them."""

    groups: list[GroupLabel]
    world_size: int
    dp_groups: list[tuple[int, ...]]  # rank sets of the profiled data-parallel groups (the mesh's, when described)
    dp_size: int  # ranks in one data-parallel group (0: no data-parallel collective); passes.workers changes it
    notes: list[str] = field(default_factory=list)
    unpaired_p2p: str = ""  # why pipeline send/recv were not paired across ranks (``p2p_peer``: their waits stay as measured); "": none
    # data-parallel collectives an XLA program ran inside another of its ops (a while loop: ``lax.scan``, ``fori_loop``),
    # summed over ranks: (instances, bytes). The graph times them as that op; ``search.whatif`` cannot re-price them
    looped_dp: tuple[int, int] = (0, 0)
    # data-parallel collectives a ``while`` of their XLA program ran (its HLO says so; or nested as above), summed over ranks:
    # (instances, bytes); ``looped_dp`` are those of them the trace times only as their loop op
    in_loop_dp: tuple[int, int] = (0, 0)
    # a dagprof run's collectives that only its Kineto trace shows inside the model's ops (not all-to-all or send/recv,
    # which ``_unseen`` labels), per step and rank: (instances, transfer us) and instances by kind
    in_ops: tuple[float, float] = (0.0, 0.0)
    in_ops_kinds: tuple[tuple[CommKind, float], ...] = ()
    in_ops_sized: float = 0.0  # those of them the collector sized, per step and rank: pieces of their ops (``in_op_name``)
    # a DDP model with find_unused_parameters=True: one of ``in_ops``' all-reduces a synchronised backward is its reducer's
    # (which parameters got a gradient, 4 bytes a parameter tensor), not the model's
    ddp_used_map: bool = False
    # why the trace does not say which process group each collective ran in ("": it does): gloo records none, and the ranks
    # also belong to groups without a description (``_untold_groups``), or the default group, of no listed ranks, holds the
    # collectives of two dimensions. They are then matched across all ranks in issue order, so a shared node may join ranks
    # that never met (``graph.build`` keeps the host waits on them as measured), and re-pricing them is refused
    # (``passes.link_fit.profiled_comm``)
    ungrouped: str = ""
    # a dagprof run's collectives Kineto shows but no hook saw (``in_op_groups``), summed over ranks and the window: the
    # breakdown by dimension counts them as time inside the ops that issued them
    in_op_groups: tuple[InOpGroup, ...] = ()

    def in_ops_text(self) -> str:
        """The collectives a dagprof run's Kineto trace shows inside the model's own ops (``in_ops``), per step and rank,
        and which answers re-price them: link what-ifs those the collector sized (``in_ops_sized``), no other. SyncBatchNorm's
        statistics took 104 of a 262 ms step so, timed as forward and backward compute (the wait for the other rank with
        them), and a link what-if left them all as measured unsaid; a DP x TP job's tensor-parallel all-reduces (52 ms a
        step) went unsaid the same way."""
        n, us = self.in_ops
        if not n:
            return ""
        kinds = ", ".join(f"{k.label} x{c:g}" for k, c in self.in_ops_kinds)
        used = min(1.0, dict(self.in_ops_kinds).get(CommKind.ALL_REDUCE, 0.0)) if self.ddp_used_map else 0.0
        own = "the model's collectives (SyncBatchNorm, a differentiable all_gather, a tensor-parallel all-reduce)"
        whose = (f"{used:g} of them DDP's all-reduce of which parameters got a gradient (find_unused_parameters=True)"
                 + (f", the rest {own}" if n > used else "")) if used else own
        head = (f"{n:g} collectives a step per rank ({kinds}; {us / 1e3:.1f} ms a step on the comm threads, waits for the "
                f"other ranks included) ran inside the model's own ops, beside the gradients' data-parallel collectives: {whose}. The graph "
                "times them inside the ops that issued them" + (": counted so in the breakdown by dimension" if self.in_op_groups
                                                                 else ": not in the breakdown by dimension"))
        sized, rest = self.in_ops_sized, n - self.in_ops_sized
        # a re-priced one: the op's time less its price on the profiled link (waits kept), plus its price on the new one
        priced = f"; link what-ifs re-price the {sized:g} whose bytes were recorded" if sized else ""
        # no bytes: made outside the torch.distributed / functional-collective functions the collector patches, or an
        # asynchronous one whose transfer ended before its wait began (or whose wait went unrecorded)
        kept = (f"; {'the other ' if sized else ''}{rest:g} keep their measured time (no bytes recorded: made outside the "
                "functions the collector patches, or an asynchronous one whose transfer ended before its wait began)") if rest > 0 else ""
        # an all-gather's output grows with the workers: a worker what-if keeps it too
        return head + priced + kept + "; bucket and worker what-ifs keep them all as measured"

    def in_loop_text(self, rank_steps: int) -> str:
        """The data-parallel collectives XLA ran inside loops, per step and rank (``rank_steps``: steps x ranks), and what
        the script can change. A ``lax.scan`` LM under plain ``jit`` all-reduced its LSTM weights' gradient in each of
        its 32 iterations (252 of a 356 ms step) where only the few its loop op timed were counted and shard_map blamed."""
        n = max(rank_steps, 1)
        # counts over the window, not per step: 3 of 64 read "0.1875 of them" (``bench/frameworks/jax_diffusion_accum.py``)
        timed = (f", {self.looped_dp[0]} of the {self.in_loop_dp[0]} in the profiled steps (all ranks) timed only as their loop op"
                 if self.looped_dp[0] else "")
        return (f"{self.in_loop_dp[0] / n:g} data-parallel collectives a step per rank ({self.in_loop_dp[1] / n / 2**20:.2f} MiB) "
                f"ran inside XLA loops (lax.scan, fori_loop, while_loop){timed}: a replicated parameter's gradient is all-reduced "
                "in every iteration that uses it (jit's partitioner and shard_map with check_vma on both do so); a shard_map step "
                "with check_vma=False and one psum after the loop sends it once")

    @property
    def unknown_are_activations(self) -> bool:
        """Every collective labelled unknown moved activations in a data-parallel group of the profile (``_fill_from_group``:
        a loss's all-gather and its backward's scatters, a DCP save's gathers, in a user's own Kineto trace): their group, and so their link, is
        the data-parallel one, which ``passes.comm.in_op_prices`` prices them on."""
        unknown = [g for g in self.groups if Dim.UNKNOWN.text in g.dims]
        return bool(unknown) and all(g.ranks and tuple(g.ranks) in self.dp_groups and g.dims[Dim.UNKNOWN.text] == sum(
            x.count for x in g.no_gradients if x.why is Aside.ACTIVATIONS) for g in unknown)

    def aside(self, why: Aside) -> list[str]:
        """What the trace shows around the collectives that exchange no gradients for ``why`` (``_issuer``), each once."""
        return sorted({x.around for g in self.groups for x in g.no_gradients if x.why is why})

    @property
    def dims(self) -> set[Dim]:
        return {Dim.of_text(k) for g in self.groups for k in g.dims}

    @property
    def mesh_dims(self) -> set[Dim]:
        """The mesh dimensions of the collectives: ``dims`` but the job's own (``Dim.JOB``), which no mesh holds."""
        return self.dims - {Dim.JOB}

    @property
    def hybrid(self) -> bool:
        """Other dimensions beside data parallelism: their collectives, or DP groups smaller than the job
        (a dagprof run sees DDP's collectives only; the others are inside the ops that issued them)."""
        return bool(self.mesh_dims - {Dim.DP}) or 0 < self.dp_size < self.world_size

    @property
    def dp_mesh(self) -> bool:
        """Data parallelism alone over a 2-D mesh (HSDP: replicate x shard): a rank meets others in two data-parallel
        groups. Every collective is then modelled; ``hybrid`` stays true so each is priced on its group's size."""
        return self.mesh_dims <= {Dim.DP} and len(self.dp_groups) > 1 and any(
            len({g for g in self.dp_groups if r in g}) > 1 for r in range(self.world_size))

    def describe(self) -> str:
        """One line: the dimensions seen and their degrees."""
        if self.dp_mesh:
            sizes = sorted({len(g) for g in self.dp_groups if 0 in g})
            return f"DP x{self.world_size} on a 2-D mesh (groups of {' and '.join(map(str, sizes))} ranks: HSDP's replicate x shard)"
        parts = []
        for d in sorted(self.mesh_dims):
            if d is Dim.DP and self.dp_size and any(g.ranks for g in self.groups if Dim.DP.text in g.dims):
                parts.append(f"DP x{self.dp_size}")
            else:
                sizes = sorted({len(g.ranks) for g in self.groups if d.text in g.dims and g.ranks})
                parts.append(d.text + (f" x{'/'.join(map(str, sizes))}" if sizes and d is not Dim.UNKNOWN else ""))
        if self.dp_size and self.world_size > self.dp_size and self.mesh_dims <= {Dim.DP}:
            inside = sorted({g.dim for g in self.in_op_groups} - {Dim.DP.text})
            parts.append(f"{self.world_size // self.dp_size} ranks per replica (the collectives among them, such as tensor-parallel "
                         "all-reduces, are timed inside the ops that issued them: " + (", ".join(inside) or "not in this breakdown") + ")")
        return ", ".join(parts) or "no collectives"


# ---------------------------------------------------------------- one rank's collective instances
@dataclass(frozen=True, eq=False)
class _Instances:
    """One row per (group, seq) collective instance on a rank."""

    rows: list[np.ndarray]  # event rows of each instance (enqueue and transfer)
    group: np.ndarray
    seq: np.ndarray
    coll: list[CommKind]  # ``Collectives.kind``, else the events' ``comm_kind``
    nbytes: np.ndarray
    phase: np.ndarray
    bucket: np.ndarray
    dtensor: np.ndarray  # bool: issued by a DTensor op
    update_to_forward: np.ndarray  # bool: issued between an optimizer step and the next forward pass (``_update_to_forward``)


def _instances(trace: RankTrace) -> _Instances:
    ev = trace.events
    rows = np.flatnonzero((ev.group >= 0) & ((ev.kind == Kind.COMM) | (ev.kind == Kind.COMM_ENQUEUE)))
    key = ev.group[rows].astype(np.int64) * (1 << 40) + np.maximum(ev.seq[rows], 0)
    uniq, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    members = np.split(rows[np.argsort(inv.reshape(-1), kind="stable")], np.cumsum(counts)[:-1]) if len(rows) else []
    coll_of = trace.meta.collectives.by_event() if trace.meta.collectives is not None else {}
    colls = [next((coll_of[int(i)] for i in m if int(i) in coll_of), None) or CommKind(int(ev.comm_kind[m].max())) for m in members]
    first = np.array([m[np.argmin(ev.start[m])] for m in members], dtype=np.int64)
    inside = np.zeros(len(ev), dtype=bool)
    inside[rows] = _inside_dtensor_op(ev, rows)
    return _Instances(
        rows=members, group=ev.group[first].astype(np.int64), seq=ev.seq[first].astype(np.int64), coll=colls,
        nbytes=np.array([int(ev.nbytes[m].max()) for m in members], dtype=np.int64), phase=_phases(trace, first),
        bucket=np.array([int(ev.bucket[m].max()) for m in members], dtype=np.int64),
        dtensor=np.array([bool(inside[m].any()) for m in members], dtype=bool) if members else np.zeros(0, bool),
        update_to_forward=_update_to_forward(trace, first, *_named_bounds(trace)),
    )


def _inside_dtensor_op(ev: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per row: does a DTensor op (``_DTENSOR_OP``) on its lane enclose it? Ops on a lane nest, so one that starts
    at or before the row and ends at or after it encloses it: the latest end among those started before."""
    named = np.array([bool(_DTENSOR_OP.match(n)) for n in ev.names], dtype=bool)
    marks = np.flatnonzero(named[ev.name]) if len(named) else np.zeros(0, np.int64)
    out = np.zeros(len(rows), dtype=bool)
    for lane in np.unique(ev.lane[marks]).tolist():
        m = marks[ev.lane[marks] == lane]
        m = m[np.argsort(ev.start[m], kind="stable")]
        reach = np.maximum.accumulate(ev.start[m] + ev.dur[m])
        mine = np.flatnonzero(ev.lane[rows] == lane)
        at = np.searchsorted(ev.start[m], ev.start[rows[mine]], side="right") - 1
        ok = at >= 0
        out[mine[ok]] = reach[at[ok]] >= ev.start[rows[mine[ok]]] + ev.dur[rows[mine[ok]]]
    return out


def _phases(trace: RankTrace, rows: np.ndarray) -> np.ndarray:
    """Phase of each row by its start against its step's backward pass (host ops of kind BACKWARD)."""
    ev = trace.events
    cpu = np.array([lane.kind != LaneKind.GPU_STREAM for lane in trace.lanes], dtype=bool)
    bwd = np.flatnonzero((ev.kind == Kind.BACKWARD) & cpu[ev.lane] if len(trace.lanes) else np.zeros(len(ev), bool))
    phase = np.full(len(rows), int(Phase.NONE), dtype=np.int8)
    for s in np.unique(ev.step[rows]).tolist():
        mine = np.flatnonzero(ev.step[rows] == s)
        b = bwd[ev.step[bwd] == s]
        if not len(b):
            continue
        first, last = float(ev.start[b].min()), float(ev.end[b].max())
        t = ev.start[rows[mine]]
        phase[mine] = np.where(t < first, Phase.FORWARD, np.where(t <= last, Phase.BACKWARD, Phase.AFTER_BACKWARD))
    return phase


def _loop_own(trace: RankTrace, inst: _Instances) -> np.ndarray:
    """Per instance of a dagprof run's rank whose gradients DDP's buckets carry (not FSDP2's, whose root gathers before its
    first layer's forward, nor a script's own data parallelism, whose calls after its optimizer step may be its training's):
    is it the loop's own, a sized call in no bucket issued before its step's first layer forward or after its optimizer
    step (``_update_to_forward`` on the hooks' ``Kind.FORWARD`` and ``Kind.UPDATE`` spans), not a broadcast (DDP's buffer
    broadcasts run inside its forward, before its first layer's)? Those of no size stay as they were (DDP ``join()``'s, at
    each forward). ``bench/ddp_fresh/gat_edges.py``'s logged accuracy (16 B, every 5th step, between ``opt.step()`` and
    the next forward) read "DP": at 1 Gbit/s one took 4.5 ms while the ranks' other threads waited 5-13 ms for a core,
    and the link fitted to it and the 170 kB buckets put 2.3 ms of latency on every bucket (the model of the profiled run
    +11.8 %, refused)."""
    if trace.meta.format != "dagprof-rank" or trace.meta.fsdp is not None or not (inst.bucket >= 0).any():
        return np.zeros(len(inst.coll), dtype=bool)
    ev = trace.events
    main = np.array([lane.main for lane in trace.lanes], dtype=bool)
    on_main = main[ev.lane] if len(main) else np.zeros(len(ev), dtype=bool)
    first = np.array([m[np.argmin(ev.start[m])] for m in inst.rows], dtype=np.int64)
    mine = _update_to_forward(trace, first, (ev.kind == Kind.UPDATE) & on_main, _trained_forwards(ev, on_main))
    plain = np.array([c not in P2P and c not in (CommKind.ALL_TO_ALL, CommKind.BROADCAST) for c in inst.coll], dtype=bool)
    return mine & plain & (inst.bucket < 0) & (inst.nbytes > 0)


def _trained_forwards(ev: EventTable, on_main: np.ndarray) -> np.ndarray:
    """Per event: a layer forward on the main lanes that the step's backward answers. Per step, only layers a backward
    ran in count (an embedding of token ids has none), and of each, the forwards before the backward beyond its backwards
    are dropped from the front: an evaluation pass under ``torch.no_grad`` at the top of the step, which no backward
    follows. A step without a layer's backward keeps its forwards. ``bench/ddp_fresh/layerdrop_dna.py`` validates after
    ``opt.step()`` (the next step's top, in dagprof's steps), then all-reduces its 4-byte validation loss: the
    evaluation's forwards came first, so the call read "DP" and was fitted to the link as a bucket."""
    fwd = (ev.kind == Kind.FORWARD) & on_main & (ev.layer >= 0)
    bwd = np.flatnonzero((ev.kind == Kind.BACKWARD) & on_main & (ev.layer >= 0))
    out = fwd & ~np.isin(ev.step, ev.step[bwd])
    for s in np.unique(ev.step[bwd]).tolist():
        b = bwd[ev.step[bwd] == s]
        before = fwd & (ev.step == s) & (ev.start < ev.start[b].min())
        for lay in np.unique(ev.layer[b]).tolist():
            f = np.flatnonzero(before & (ev.layer == lay))
            f = f[np.argsort(ev.start[f], kind="stable")]
            out[f[max(0, len(f) - int(np.count_nonzero(ev.layer[b] == lay))):]] = True
    return out


def _named_bounds(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """Per event: is it an optimizer step (``OPTIMIZER_STEP`` ranges on the host), a forward range (``FORWARD_RANGE``: the
    wrapper's, as DDP and FSDP record it)? Any trace's bounds for ``_update_to_forward``; a dagprof run's hooks give their
    own spans (``_loop_own``)."""
    ev = trace.events
    named = np.array([n.startswith(OPTIMIZER_STEP) for n in ev.names], dtype=bool)
    ranges = np.array([bool(FORWARD_RANGE.search(n)) for n in ev.names], dtype=bool)
    return (named[ev.name] if len(named) else np.zeros(len(ev), bool)), (ranges[ev.name] if len(ranges) else np.zeros(len(ev), bool))


def _update_to_forward(trace: RankTrace, rows: np.ndarray, update: np.ndarray, forward: np.ndarray) -> np.ndarray:
    """Per row: does it start after its step's optimizer step (``update``, per event) ended, or before the step's first
    forward (``forward``), where the step's optimizer step followed its backward pass? The optimizer has applied the
    gradients by then, and has not yet the next ones, so what the job exchanges there is its own: a DCP save's object
    gathers and broadcasts, after ``opt.step()`` or at the top of the next iteration, read "DP" from the gradients'
    all-reduce in their group, and ``--workers`` scaled them as gradient traffic. ZeroRedundancyOptimizer's broadcasts run
    inside its step, DDP's buffer broadcasts and FSDP's gathers inside the forward ranges and the passes: none is between
    them."""
    ev = trace.events
    out = np.zeros(len(rows), dtype=bool)
    cpu = np.array([lane.kind != LaneKind.GPU_STREAM for lane in trace.lanes], dtype=bool)
    if not len(rows) or not len(cpu):
        return out
    if not update.any():
        return out
    steps = np.flatnonzero(update & cpu[ev.lane])
    bwd = np.flatnonzero((ev.kind == Kind.BACKWARD) & cpu[ev.lane])
    fwd = np.flatnonzero(forward & cpu[ev.lane])
    for s in np.unique(ev.step[rows]).tolist():
        u, b, f = steps[ev.step[steps] == s], bwd[ev.step[bwd] == s], fwd[ev.step[fwd] == s]
        if len(u) and len(b) and (done := float(ev.end[u].max())) > float(ev.end[b].max()):
            mine = np.flatnonzero(ev.step[rows] == s)
            t = ev.start[rows[mine]]
            begun = float(ev.start[f].min()) if len(f) and float(ev.start[f].min()) < float(ev.start[b].min()) else -np.inf
            out[mine] = (t >= done) | (t < begun)
    return out


# ---------------------------------------------------------------- labelling
def _by_position(inst: _Instances, k: int, forward_sizes: dict[int, set[int]]) -> tuple[Dim, str]:
    c, ph, nb, g = inst.coll[k], Phase(int(inst.phase[k])), int(inst.nbytes[k]), int(inst.group[k])
    if inst.bucket[k] >= 0:
        return Dim.DP, "DDP gradient bucket"
    if c in P2P:
        return Dim.PP, "send/recv"
    if c == CommKind.ALL_TO_ALL:
        where = {Phase.FORWARD: " in the forward pass (embedding/expert exchange)", Phase.BACKWARD: " in the backward pass (its gradient)"}
        return Dim.EP_CP, "all-to-all" + where.get(ph, "")
    if c in _REDUCING:
        if ph is Phase.FORWARD and nb >= ACTIVATION_MIN_BYTES:
            return Dim.TP, f"{c.label} of activations inside the forward pass"
        if ph in (Phase.BACKWARD, Phase.AFTER_BACKWARD):
            if nb in forward_sizes.get(g, set()):
                return Dim.TP, f"{c.label} in backward of a forward activation's size"
            return Dim.DP, f"{c.label} of gradients in/after the backward pass"
    return Dim.UNKNOWN, ""


@dataclass(frozen=True, eq=False)
class _Labels:
    """One rank's collective instances as labelled: each one's ``Dim``, why (evidence text), and, for those that exchange
    no gradients, why so and what the trace shows around them (``GroupLabel.no_gradients``)."""

    trace: RankTrace
    inst: _Instances
    dims: np.ndarray
    why: list[str]
    aside: list[tuple[Aside, str] | None]

    def set_aside(self, k: int, aside: Aside, dim: Dim) -> None:
        """Instance ``k`` exchanges no gradients for ``aside``, said with what surrounds it; the kind is said of activations
        (gathered, or scattered back), of the job's own calls not (a DCP save runs five kinds: eight reasons read as noise)."""
        around = _issuer(self.trace.events, self.inst.rows[k])
        kind = f"{self.inst.coll[k].label} " if aside is Aside.ACTIVATIONS else ""
        self.dims[k], self.why[k], self.aside[k] = dim, f"{kind}{aside.value} ({around})", (aside, around)


def _label_rank(trace: RankTrace) -> _Labels:
    inst = _instances(trace)
    n = len(inst.coll)
    dims = np.zeros(n, dtype=np.int8)
    why = [""] * n
    out = _Labels(trace, inst, dims, why, [None] * n)
    if trace.meta.format != "kineto":  # dagprof's collectors record data-parallel collectives, and what Kineto adds on the main thread
        why[:] = [("send/recv" if c in P2P else "all-to-all") if c in P2P or c == CommKind.ALL_TO_ALL else "recorded by a data-parallel collector"
               for c in inst.coll]
        dims[:] = [Dim.PP if c in P2P else Dim.EP_CP if c == CommKind.ALL_TO_ALL else Dim.DP for c in inst.coll]
        _resharding(trace, inst, dims, why)
        for k in np.flatnonzero(_loop_own(trace, inst)).tolist():
            out.set_aside(k, Aside.JOB_OWN, Dim.JOB)
        return out
    desc = trace.meta.group_desc
    forward_sizes: dict[int, set[int]] = {}
    for k in range(n):
        if inst.coll[k] in _REDUCING and inst.phase[k] == Phase.FORWARD and inst.nbytes[k] >= ACTIVATION_MIN_BYTES:
            forward_sizes.setdefault(int(inst.group[k]), set()).add(int(inst.nbytes[k]))
    for k in range(n):
        name = trace.groups[int(inst.group[k])]
        d = desc_dim(desc.get(name, ""))
        job_own = bool(inst.update_to_forward[k]) and inst.coll[k] not in P2P and inst.coll[k] != CommKind.ALL_TO_ALL
        if d is not Dim.UNKNOWN and not (d is Dim.DP and job_own):  # a DP group exchanges no gradients there: the job's own
            moved = name in trace.meta.resolved_groups
            dims[k], why[k] = d, f"position, in the rank's one {desc[name]!r} group" if moved else f"group description {desc[name]!r}"
            continue
        if job_own:
            out.set_aside(k, Aside.JOB_OWN, Dim.JOB)
            continue
        if inst.dtensor[k] and int(inst.group[k]) in forward_sizes and inst.bucket[k] < 0:
            dims[k], why[k] = Dim.TP, f"{inst.coll[k].label} issued by a DTensor op in a group that reduces activations"
            continue
        dims[k], why[k] = _by_position(inst, k, forward_sizes)
    # an all-gather in the forward pass of a group that reduce-scatters gradients: FSDP/ZeRO
    for k in range(n):
        g = inst.group[k]
        if dims[k] == Dim.UNKNOWN and inst.coll[k] == CommKind.ALL_GATHER:
            same = (inst.group == g) & (dims == Dim.DP) & _reduce_scatters(trace, inst)
            if same.any():
                dims[k], why[k] = Dim.DP, "all-gather of a group that reduce-scatters gradients (FSDP/ZeRO)"
    return out


def _resharding(trace: RankTrace, inst: _Instances, dims: np.ndarray, why: list[str]) -> None:
    """XLA's all-to-alls that no ``lax.all_to_all`` asked for (``traces.xla_hlo``: the instruction's metadata names
    the op the SPMD partitioner split, as a sharded program's ``broadcast_in_dim`` transposed in backward) reshard an
    array between two shardings of the program's own mesh: no expert or context exchange. Over the device groups of
    the data-parallel collectives they are the data-parallel mesh's (DP: more workers, the same all-to-all over more
    ranks); over other groups nothing says which dimension they serve (unknown, said why). A JAX FSDP program's
    gradient all-to-all was labelled EP/CP, and ``whatif --workers`` refused the run."""
    info = trace.meta.collectives
    if info is None or not info.origin:
        return
    at = {e: (o, d) for e, o, d in zip(info.event, info.origin, info.devices)}
    told = [next((at[int(i)] for i in rows if int(i) in at), ("", "")) for rows in inst.rows]
    dp_devices = {d for (o, d), c in zip(told, inst.coll) if d and c != CommKind.ALL_TO_ALL and c not in P2P}
    for k, (origin, devices) in enumerate(told):
        if inst.coll[k] != CommKind.ALL_TO_ALL or not origin or origin == "all_to_all":
            continue
        if devices and devices in dp_devices:
            dims[k], why[k] = Dim.DP, "XLA's resharding all-to-all over the data-parallel collectives' devices"
        else:
            dims[k], why[k] = Dim.UNKNOWN, (f"XLA's resharding all-to-all (partitioning {origin}) over other devices than the "
                                            "data-parallel collectives': not told which dimension it serves")


def _reduce_scatters(trace: RankTrace, inst: _Instances) -> np.ndarray:
    """Per instance: a reduce-scatter, also where gloo runs one as the all-reduce of its whole input (its call names it:
    FSDP2's ``c10d::_reduce_scatter_base_`` on CPU; ``traces.kineto`` prices it as the all-reduce it is)."""
    return np.array([c == CommKind.REDUCE_SCATTER or any("reduce_scatter" in trace.events.name_of(int(i)) for i in rows)
                     for c, rows in zip(inst.coll, inst.rows)], dtype=bool)


def _fill_from_group(labels: list[_Labels]) -> None:
    """Collectives nothing told take their group's label when the group's labelled ones (all ranks; the job's own aside)
    agree; but data parallelism gathers nothing in the forward pass of a group that does not reduce-scatter
    (``_label_rank`` labels FSDP's) and scatters nothing: such a collective in a data-parallel group moves the model's
    activations (a contrastive loss's all-gathered embeddings and their backward), so it stays unknown, said with what
    the trace shows around it (``_issuer``)."""
    per_group: dict[str, set[int]] = {}
    for x in labels:
        for k in np.flatnonzero((x.dims != Dim.UNKNOWN) & (x.dims != Dim.JOB)).tolist():
            if x.inst.coll[k] not in P2P and x.inst.coll[k] != CommKind.ALL_TO_ALL:
                per_group.setdefault(x.trace.groups[int(x.inst.group[k])], set()).add(int(x.dims[k]))
    for x in labels:
        inst = x.inst
        for k in np.flatnonzero(x.dims == Dim.UNKNOWN).tolist():
            if inst.coll[k] == CommKind.ALL_TO_ALL:  # XLA's resharding over other devices (``_resharding``): not its lumped group's
                continue
            seen = per_group.get(x.trace.groups[int(inst.group[k])], set())
            if seen == {int(Dim.DP)} and (inst.coll[k] in _SCATTERING or (inst.coll[k] == CommKind.ALL_GATHER and inst.phase[k] == Phase.FORWARD)):
                x.set_aside(k, Aside.ACTIVATIONS, Dim.UNKNOWN)
            elif len(seen) == 1:
                x.dims[k], x.why[k] = next(iter(seen)), "its group's other collectives"


def _issuer(ev: EventTable, rows: np.ndarray) -> str:
    """What the trace shows around a collective: the outermost backward op on its lane that encloses its first row (a
    differentiable all_gather's backward, ``_AllGatherBackward``, scatters under gloo), else the innermost range the script
    named (``record_function``: a user's "checkpoint" around a DCP save), else that the trace cannot tell. A user's CRF trace
    had a DCP save's gathers and scatters called a loss's all-gather's backward, a guess its trace did not support."""
    r = int(rows[np.argmin(ev.start[rows])])
    lane, t0, t1 = ev.lane[r], ev.start[r], ev.start[r] + ev.dur[r]
    around = np.flatnonzero((ev.lane == lane) & (ev.start <= t0) & (ev.start + ev.dur >= t1) & (ev.kind != Kind.STEP))
    around = around[around != r]
    # autograd's node (outermost: ``_AllGatherBackward`` runs ``_AlltoAll``), the script's innermost named range
    for pick, at, text in ((ev.kind[around] == Kind.BACKWARD, np.argmin, "in the backward op {!r}"),
                           (ev.depth[around] < 0, np.argmax, "in the range {!r}")):
        if pick.any():
            return text.format(ev.names[int(ev.name[around[pick][at(ev.start[around[pick]])]])])
    return "no backward op nor named range around it: what issued it the trace cannot tell"


def label_run(run: Run) -> tuple[Parallelism, list[np.ndarray]]:
    """The job's groups and dimensions, and per rank (in ``run.ranks`` order) the ``Dim`` of every event
    (``Dim.UNKNOWN`` for events that are no collective)."""
    labels = [_label_rank(t) for t in run.ranks]
    _fill_from_group(labels)
    per_event = []
    stats: dict[str, dict] = {}
    inline: Counter = Counter()  # (dim, collective) -> instances whose transfer ran inside the op that issued it
    looped, in_loop = [0, 0], [0, 0]  # ``Parallelism.looped_dp``, ``in_loop_dp``
    paired: Counter = Counter()  # (dim, collective) -> send/recv whose peer the trace tells (align.matching pairs them)
    lone = 0  # send/recv whose peer it does not tell
    for trace, inst, dims, why, aside in ((x.trace, x.inst, x.dims, x.why, x.aside) for x in labels):
        out = np.zeros(len(trace.events), dtype=np.int8)
        ev = trace.events
        info = trace.meta.collectives
        looping = {e for e, f in zip(info.event, info.in_loop) if f} if info is not None else set()
        for k, rows in enumerate(inst.rows):
            out[rows] = dims[k]
            name = trace.groups[int(inst.group[k])]
            transfer = rows[ev.kind[rows] == Kind.COMM]
            if inst.coll[k] in P2P_PEERED and p2p_peer(trace, name, int(ev.peer[rows].max())) is not None:
                paired[(_TEXT[int(dims[k])], inst.coll[k])] += 1
            else:
                lone += inst.coll[k] in P2P
                nested = bool(len(transfer)) and bool((ev.depth[transfer] > 0).all())
                if nested:
                    inline[(_TEXT[int(dims[k])], inst.coll[k])] += 1
                    if trace.meta.format == "xplane" and dims[k] == Dim.DP:
                        looped[0] += 1
                        looped[1] += int(inst.nbytes[k])
                if dims[k] == Dim.DP and trace.meta.format == "xplane" and (nested or looping.intersection(transfer.tolist())):
                    in_loop[0] += 1
                    in_loop[1] += int(inst.nbytes[k])
            if trace.meta.format != "kineto" and dims[k] != Dim.DP:  # a dagprof run puts them in DDP's group: not their ranks
                name = f"{name} ({_TEXT[int(dims[k])]})"
            st = stats.get(name)
            if st is None:
                st = stats[name] = {"desc": "", "ranks": (), "dims": Counter(), "nbytes": Counter(), "why": Counter(), "aside": Counter()}
            st["desc"] = st["desc"] or trace.meta.group_desc.get(name, "")
            st["ranks"] = st["ranks"] or tuple(trace.group_ranks.get(name, ()))
            text = _TEXT[int(dims[k])]
            st["dims"][text] += 1
            st["nbytes"][text] += int(inst.nbytes[k])
            st["why"][why[k] or "nothing tells"] += 1
            if aside[k] is not None:
                st["aside"][aside[k]] += 1
        per_event.append(out)
    groups = [GroupLabel(name, st["desc"], st["ranks"], dict(st["dims"]), dict(st["nbytes"]), [w for w, _ in st["why"].most_common()],
                         tuple(NoGradients(a, around, n) for (a, around), n in sorted(st["aside"].items(), key=lambda x: (x[0][0].name, x[0][1]))))
              for name, st in stats.items()]
    # the default group's ranks only assumed (no pg_config entry, as gloo or an old trace writes: every collective in "0")
    # while it carries two of DP, TP and PP: those groups are really smaller and the trace does not say how
    lumped = {name for name, st in stats.items() if name == "0" and len(set(st["dims"]) & {"DP", "TP", "PP"}) > 1
              and not any("0" in t.meta.group_desc for t in run.ranks)}
    untold = _untold_groups(run)
    ungrouped = ("gloo records none, and the trace names no group of the ranks that its dimensions' collectives share"
                 if "0" in lumped else "")
    if untold and "0" in stats:
        lumped.add("0")
        ungrouped = f"gloo records none, and the ranks also belong to {untold} groups without a description"
        notes = [f"{sum(stats['0']['dims'].values())} collectives (summed over ranks) recorded without their process group (gloo) "
                 f"while the ranks also belong to {untold} process groups without a description (new_group / new_subgroups "
                 "without group_desc): which group each ran in, and so its size, is not known; they are matched across all ranks "
                 "in issue order, and what-ifs that re-price them are refused"]
    else:
        notes = []
    groups = [x if x.name not in lumped else replace(x, ranks=()) for x in groups] + _unseen(run, inline)
    dp = _dp_groups(run, groups)
    notes = list(run.meta.parallelism_notes) + notes
    if paired:
        what = ", ".join(f"{n} {d} {c.label}" for (d, c), n in sorted(paired.items(), key=_by_label))
        notes.append(f"{what} (summed over ranks) paired across ranks by group, peer and order: each recv waits in the replay for "
                     "its peer stage's send, so pipeline bubbles emerge from it; their transfer times stay as measured (not re-priced by what-ifs)")
    if inline:  # gloo's send/recv run in the calling thread: graph.build keeps the calling op, timed as measured
        what = ", ".join(f"{n} {d} {c.label}" for (d, c), n in sorted(inline.items(), key=_by_label))
        sized = _sized_in_ops(run)
        priced = ", ".join(f"{sized[c]} {c.label}" for c in sorted({c for _, c in inline}, key=lambda c: c.label) if sized.get(c))
        notes.append(f"{what} (summed over ranks) ran inside the ops that issued them: the graph times them as those ops, "
                     "as measured (not in the breakdown by dimension, not re-priced by what-ifs"
                     + (f", but for link what-ifs, which re-price the {priced} whose bytes the collector recorded)" if priced else ")"))
    lone += sum(u.count for t in run.ranks for c, u in t.meta.unseen_collectives.items() if c in P2P)
    why = (f"{lone} send/recv (summed over ranks) without a known peer: a Kineto trace names one by the op's peer argument "
           "(record_param_comms' Src/Dst Rank, or c10d::send/recv_'s inputs under record_shapes) or by a 2-rank group; "
           "a dagprof run records them in DDP's group") if lone else ""
    in_ops, kinds, sized = _in_ops(run)
    summed: dict[tuple[str, str], list] = {}
    for x in (x for t in run.ranks for x in t.meta.in_op_groups):
        row = summed.setdefault((x.group, x.dim), [0, 0.0, 0, 0])
        row[0] += x.count
        row[1] += x.us
        row[2] += x.nbytes
        row[3] += x.sized
    par = Parallelism(groups, run.world_size, dp, max((len(r) for r in dp), default=0), notes, why, (looped[0], looped[1]),
                      (in_loop[0], in_loop[1]), in_ops, kinds, sized, ddp_used_map=any(t.meta.find_unused for t in run.ranks),
                      ungrouped=ungrouped, in_op_groups=tuple(InOpGroup(g, d, *row) for (g, d), row in sorted(summed.items())))
    if in_ops[0]:
        notes.append(par.in_ops_text())
    return par, per_event


def _by_label(item: tuple[tuple[str, CommKind], int]) -> tuple[str, str]:
    """A (dimension, kind) count's place in a note: by the kind's name, as it reads."""
    (d, c), _ = item
    return d, c.label


def _in_ops(run: Run) -> tuple[tuple[float, float], tuple[tuple[CommKind, float], ...], float]:
    """``Parallelism.in_ops``, ``in_ops_kinds`` and ``in_ops_sized``: the unseen collectives ``_unseen`` leaves, per profiled
    step and rank."""
    rank_steps = max(sum(len(t.meta.steps_profiled) for t in run.ranks), 1)
    count: Counter = Counter()
    us = 0.0
    for t in run.ranks:
        for coll, u in t.meta.unseen_collectives.items():
            if coll != CommKind.ALL_TO_ALL and coll not in P2P:
                count[coll] += u.count
                us += u.us
    kinds = tuple((k, n / rank_steps) for k, n in sorted(count.items(), key=lambda kn: kn[0].label))
    sized = sum(n for k, n in _sized_in_ops(run).items() if k != CommKind.ALL_TO_ALL and k not in P2P)
    return (sum(count.values()) / rank_steps, us / rank_steps), kinds, sized / rank_steps


def _sized_in_ops(run: Run) -> Counter:
    """Kind -> the pieces over all ranks that are a collective the model ran inside an op, sized (``EventTable.group_size``)."""
    return Counter(CommKind(int(k)) for t in run.ranks for k in t.events.comm_kind[t.events.group_size > 0].tolist())


def _untold_groups(run: Run) -> int:
    """Process groups a rank belongs to beside the default one that no description names, on ranks whose collectives the
    trace records without a group (gloo: all in "0", none moved by ``resolve_groups``); 0 when none. Such a rank's
    collectives may have run in any of them: a job with ``new_subgroups()`` expert groups beside a world all-reduce read
    "EP/CP x4" where its all-to-alls ran in pairs."""
    out = 0
    for t in run.ranks:
        if t.meta.format != "kineto" or t.groups != ["0"] or t.meta.explicit_seq:
            continue
        out = max(out, sum(1 for name, members in t.group_ranks.items()
                           if name != "0" and t.rank in members and desc_dim(t.meta.group_desc.get(name, "")) is Dim.UNKNOWN))
    return out


def _unseen(run: Run, inline: Counter) -> list[GroupLabel]:
    """A dagprof run's collectives that only its Kineto trace shows, issued inside other ops: all-to-alls (EP/CP) and
    send/recv (PP) tell their dimension by kind; one group of unknown ranks per dimension, counted into ``inline``."""
    found: dict[str, Counter] = {}
    for t in run.ranks:
        for coll, u in t.meta.unseen_collectives.items():
            d = Dim.EP_CP if coll == CommKind.ALL_TO_ALL else Dim.PP if coll in P2P else None
            if d is not None:
                found.setdefault(d.text, Counter())[coll] += u.count
                inline[(d.text, coll)] += u.count
    return [GroupLabel(f"unseen {d}", "", (), {d: sum(c.values())}, {}, [f"{', '.join(k.label for k in c)} in the Kineto trace, no hook saw"])
            for d, c in found.items()]


def _dp_groups(run: Run, groups: list[GroupLabel]) -> list[tuple[int, ...]]:
    """Rank sets of the data-parallel groups: the mesh's described DP groups if any, else those of the DP collectives but
    FSDP2's post-forward groups (``reshard_after_forward=N``: a unit's backward all-gathers in N of its shard group's ranks),
    which are no mesh dimension: 4 ranks whose units reshard to 2 read as a 2x2 HSDP mesh, and ``--workers`` shrank them."""
    described = {tuple(r) for t in run.ranks for name, r in t.group_ranks.items()
                 if r and desc_dim(t.meta.group_desc.get(name, "")) is Dim.DP}
    if described:
        return sorted(described)
    world = tuple(range(run.world_size))
    post = {tuple(map(int, c.group.split(","))) for t in run.ranks if t.meta.fsdp for c in t.meta.fsdp.collectives
            if c.kind == "all_gather" and c.unit >= 0 and (u := t.meta.fsdp.units[c.unit]).reshard_to and u.mesh and len(c.group.split(",")) < u.mesh[-1]}
    return sorted({g.ranks or world for g in groups if Dim.DP.text in g.dims} - post)


# ---------------------------------------------------------------- gloo: collectives without their group
def resolve_groups(run: Run) -> Run:
    """Move collectives recorded without a group (all in "0") to the one group of their rank that the mesh
    describes with the dimension their position gives; renumber ``seq`` per group. Unchanged when nothing moves."""
    if not any(_needs_groups(t) for t in run.ranks):
        return run
    parallelism, per_event = label_run(run)
    ranks, moved = [], 0
    for trace, dims in zip(run.ranks, per_event):
        if not _needs_groups(trace):
            ranks.append(trace)
            continue
        target = {}
        for name, members in trace.group_ranks.items():
            d = desc_dim(trace.meta.group_desc.get(name, ""))
            if d is not Dim.UNKNOWN and trace.rank in members:
                target.setdefault(d, []).append(name)
        ev = trace.events
        groups = list(trace.groups)
        group, seq, nbytes = ev.group.copy(), ev.seq.copy(), ev.nbytes.copy()
        zero = groups.index("0")
        dims = _by_worker_lane(trace, dims, zero)
        for d, names in target.items():
            if len(names) != 1:
                continue
            rows = np.flatnonzero((ev.group == zero) & (dims == d))
            if not len(rows):
                continue
            if names[0] not in groups:
                groups.append(names[0])
            group[rows] = groups.index(names[0])
            # an all-gather's gathered bytes (``CommKind.event_bytes``) were its chunk times the default group's ranks
            gathered = rows[ev.comm_kind[rows] == CommKind.ALL_GATHER]
            if default := len(trace.group_ranks.get("0", ())):  # none: the reader left those bytes unknown (0)
                nbytes[gathered] = nbytes[gathered] // default * len(trace.group_ranks[names[0]])
            old = np.unique(ev.seq[rows])
            seq[rows] = np.searchsorted(old, ev.seq[rows])  # issue order kept, counted within the new group
            moved += len(np.unique(ev.seq[rows]))
        rest = np.flatnonzero(group == zero)
        old = np.unique(ev.seq[rest])
        seq[rest] = np.searchsorted(old, ev.seq[rest])
        table = EventTable(names=ev.names, **{c: getattr(ev, c) for c in EventTable.COLUMNS if c not in ("group", "seq", "nbytes")},
                           group=group, seq=seq, nbytes=nbytes)
        meta = msgspec.structs.replace(trace.meta, resolved_groups=groups[1:])
        ranks.append(RankTrace(**{**trace.__dict__, "events": table, "groups": groups, "meta": meta}))
    note = (f"{moved} collectives recorded without their process group (gloo) assigned to their mesh group by position"
            if moved else "")
    meta = msgspec.structs.replace(run.meta, parallelism_notes=[*run.meta.parallelism_notes, note]) if note else run.meta
    return Run(ranks, run.source, meta)


def _by_worker_lane(trace: RankTrace, dims: np.ndarray, zero: int) -> np.ndarray:
    """Per event, the dimension of the group it ran in where its gloo worker thread tells: a ProcessGroupGloo runs its
    collectives on its own threads, so every collective on one such lane is in one group, and the lane takes the label of
    most of its bytes. Position alone swapped two in a 2-D FSDP x TP job: the clip-norm all-reduce a DTensor op
    issued over DP read as TP, the script's own scalar loss all-reduce over TP read as a gradient's (DP), and FSDP's
    all-gathers stayed unknown (gloo reduce-scatters by all-reduce, so no reduce-scatter vouched for them)."""
    ev = trace.events
    out = dims.copy()
    # any host thread but the training loop's that runs transfers: its runloop (the trace may name one "python3")
    worker = np.array([not lane.main and lane.kind != LaneKind.GPU_STREAM for lane in trace.lanes], dtype=bool)
    transfers = np.flatnonzero((ev.kind == Kind.COMM) & (ev.group == zero) & worker[ev.lane]) if len(worker) else np.zeros(0, np.int64)
    for lane in np.unique(ev.lane[transfers]).tolist():
        mine = transfers[ev.lane[transfers] == lane]
        votes: Counter = Counter()  # by bytes: position misreads scalars (a norm, a loss), activations and gradients carry the bytes
        for d, nb in zip(dims[mine].tolist(), ev.nbytes[mine].tolist()):
            if d not in (Dim.UNKNOWN, Dim.JOB):  # the job's own after the optimizer step: of whichever group it ran in
                votes[d] += nb + 1
        top = votes.most_common(2)
        if not top or (len(top) > 1 and top[0][1] == top[1][1]):
            continue
        out[np.isin(ev.seq, ev.seq[mine]) & (ev.group == zero)] = top[0][0]
    return out


def _needs_groups(trace: RankTrace) -> bool:
    """A Kineto trace whose collectives all sit in the fallback group "0" while its pg_config describes mesh groups."""
    desc = trace.meta.group_desc
    return (trace.meta.format == "kineto" and trace.groups == ["0"] and not trace.meta.explicit_seq
            and any(desc_dim(d) is not Dim.UNKNOWN for d in desc.values()))
