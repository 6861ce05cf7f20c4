"""Peak memory per rank of an FSDP job, from its profile: under FSDP, as profiled or a what-if (``fsdp_peak``), and
under DDP (``ddp_peak_of_fsdp``, ``search.memory``'s model with every parameter on every rank).

``fsdp_peak`` walks the moments of one step where the most is alive (``_moments``), each a small function saying what is
alive then and why; what every moment is made of (each layer's activations, the units' full parameters and
gradients, the gradients in flight) is read once from the profile (``_Job``), and each rank adds its own shards. On a CPU
job the autograd graph's host memory counts too (``memory.autograd_host``): what its nodes hold with each layer's
activations, their shells through the step, the step before's where the script keeps its loss (``_loss_forward``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import DagprofError
from ..graph.build_fsdp import Passes
from ..graph.dag import Graph
from ..graph.meta import FsdpGraphUnit, FsdpRecord
from ..passes.fsdp import Reshard, resharded
from ..passes.fsdp_mesh import workers_mesh
from ..traces.events import Kind
from ..traces.kineto_schema import dtype_bytes
from ..traces.run_schema import FSDP2_API, LOSS_BACKWARD, LOSS_FORWARD, MODEL_OUTPUT, SAVED_OUTSIDE_LAYERS
from .memory import NO_SIZES, OPTIMIZER_STATE, MemoryBreakdown, MemoryModel, autograd_host, backward_layers

# what a profile that did not name the gathered parameters among a layer's saved tensors (an older dagprof; FSDP1 before
# 2026-12-05) gives: a layer that saved at least its parameters' bytes counts the rest, else all it saved (``fsdp_peak``), so a weight FSDP padded
# to the shard count can count once more or not: a layout's peak moved by up to 2 MiB between profiles of other layouts
GATHERED_UNRECORDED = ("the profile does not say which saved tensors were gathered parameters (an older dagprof's; FSDP1's before "
                       "2026-12-05): a padded weight may count once more or not (up to 2 MiB seen); profile again for the exact figure")


# a profile whose every rank recorded 0 bytes of FSDP shards: a job that ended inside the window, read before 2026-12-05
NO_SHARDS = ("the profile has no sizes of the FSDP shards (every rank's parameter, gradient and optimizer-state shards 0 bytes: "
             "training ended inside the profiled window, where dagprof before 2026-12-05 did not read them); profile again")


def missing_sizes(fs: FsdpRecord) -> str | None:
    """Why ``fs`` gives no peak memory (``NO_SIZES``, ``NO_SHARDS``), or None: it does. bench/tp_fresh/t5_dp_tp.py run for
    fewer steps than the window read a peak without its parameters and optimizer state (1.41 MiB, every what-if alike)."""
    if not fs.layer_saved_bytes:
        return NO_SIZES
    if any(u.numel for u in fs.units) and not any(m.param_shard_bytes for m in fs.memory.values()):
        return NO_SHARDS
    return None


def offload_note(fs: FsdpRecord) -> str | None:
    """What the peak per rank means where units offload to CPU (``CPUOffloadPolicy``), else None: it counts their shards,
    gradient shards and optimizer state with the rest, which a CPU job holds in its one memory, but a GPU job in host memory."""
    off = [u.name for u in fs.units if u.offload]
    if not off:
        return None
    return (f"{len(off)} of {len(fs.units)} FSDP units offload to CPU (CPUOffloadPolicy): the peak per rank counts their parameter, "
            "gradient and optimizer-state shards beside the gathered units and activations (one memory on a CPU job; on a GPU those "
            "shards are host memory and the device's peak is lower: not modelled)")


def roots_note(fs: FsdpRecord, ddp: bool = False) -> str | None:
    """What the peak per rank means on a job of several ``fully_shard`` roots, else None: each root's activations alive
    as the profile ran the roots (``root_phases``), every other root's gradient shards through a root's backward (the
    habit of zeroing them just before it, which the profile does not show). Measured against the scripts' ``--memory``
    (docs/evidence.md, rootmem62): an actor-critic -10 to -2 %, a GAN -10 to -4 %, a DINO +2 to +9 %. ``ddp``: a row
    asks for ``--data-parallel ddp``, whose peak (``ddp_peak_of_fsdp``) counts every model's activations at once."""
    roots = len({u.root for u in fs.units})  # FsdpUnit.root: which timed root a unit is of
    if roots < 2:
        return None
    return (f"{roots} fully_shard roots: the peak per rank counts each root's activations while the profile had them alive and "
            "the other roots' gradients as kept until just before each root's backward (a script that frees them earlier "
            "peaks lower; measured -10 to +9 % on three two-root jobs)"
            + ("; a --data-parallel ddp row's peak counts every model's activations at once (high where a model frees its "
               "own before another's forward; not measured)" if ddp else ""))


@dataclass
class FsdpMemory:
    """Peak bytes of one rank of an FSDP job and what is alive at that moment (``fsdp_peak``)."""

    params: float  # this rank's parameter shards
    optimizer: float  # its optimizer state (on the shards)
    grads: float  # gradient shards already reduce-scattered
    activations: float  # what layers and functional ops between them saved for backward, and a stand-in for the output and loss
    gathered: float  # full parameters of the units unsharded at that moment, and their unsharded gradients
    at: str  # where the peak falls: "backward of <unit>", "all-gather of <unit> (backward prefetch)", "reduce-scatter of <unit>", ...
    # the autograd graph's shells on the host (``memory.AutogradHost``: this step's, the step before's at the loss's
    # forward); what its nodes hold until their backward is in activations
    autograd: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.grads + self.activations + self.gathered + self.autograd

    def to_dict(self) -> dict:
        mb = lambda x: x / 2**20  # noqa: E731
        return {"total_mb": mb(self.total), "params_mb": mb(self.params), "optimizer_mb": mb(self.optimizer), "grads_mb": mb(self.grads),
                "activations_mb": mb(self.activations), "gathered_mb": mb(self.gathered), "autograd_mb": mb(self.autograd), "at": self.at}


class _Moment(NamedTuple):
    """What every rank holds at one moment beyond its parameter and optimizer-state shards (``FsdpMemory``'s other fields)."""

    grads: float
    activations: float
    gathered: float
    at: str
    previous: float = 0.0  # the step before's autograd shells, before the script assigns its new loss (``_Job.previous``)


def fsdp_peak(g: Graph, reshard: Reshard | None = None, workers: int | None = None) -> dict[int, FsdpMemory]:
    """Peak memory per rank of an FSDP graph (``graph.build_fsdp``), as profiled or under a what-if: the fullest of
    ``_moments``, or the optimizer step (every shard, its gradients and its state, and the model's output).

    ``reshard``: reshard_after_forward of every unit (the root too), or of the units a mapping names (None: as profiled); ``workers``: the shard
    degree (None: as profiled; HSDP keeps its shard degree). From the profile: each rank's parameter,
    gradient and optimizer-state shards (measured bytes), each unit's size and dtypes, the activation bytes
    each layer saved. A layer's saved bytes count the gathered weight it saved too (FSDP frees that storage
    after forward and gathers it again for backward): the collector names those storages
    (``layer_saved_gathered_bytes``, padded to the shard count as FSDP allocates them), and the layer counts the rest. In
    profiles without them (``GATHERED_UNRECORDED``) a layer that saved at least its parameters' bytes (``layer_grad_bytes``
    in the parameter dtype) counts only the rest, a threshold that FSDP's padding flips: a `down` layer that saved only its
    weight (its input was saved by ``F.relu``) was counted once more where the weight was not padded (3x2 of the 6-rank
    testbed MLP) and not where it was (2x3, 1x6). With the record (``bench/bench_hsdp_mesh.py --layouts 1x6,2x3,3x2``):
    a layout's peak from the two others' profiles 0.01-0.04 MiB apart (1.8-2.0 MiB with the threshold), each 4.5-8.9 % short
    until the gradients in flight were counted (``_Job.in_flight``), then -0.5 to +1.4 % at blocks.3's or blocks.1's backward;
    with what a unit saved between its layers freed at its backward, FSDP2's held reduce-scatter input and a unit's gradients
    made layer by layer: -1.1 to -0.1 %, at blocks.2's backward in every layout, where the heap-sampled runs peaked
    (``tests/data/fsdp/pad-*``).

    Measured against ``bench/fsdp_train.py --memory`` (``bench/bench_fsdp.py --part 3``, load 23-34): the transformer
    +0.5 % (reshard on) and +1.2 % (off), the MLP with a 4096-entry vocabulary -0.6 % and +3.9 % (its off peak is the
    loss's backward; the rest is the ``down`` layers' saved weights counted as activations: ``_Job.acts``' rule needs a layer
    to have saved its bias too); ``tests/data/fsdp/loss-vocab`` +0.1 / +0.0 %. Before the loss's backward was recorded
    its peak was missed (-9 to -14 %, that recording -36 to -42 %); before the model's output was, a stand-in counted
    what functional ops saved twice (the transformer +8 to +10 %). With the model's output recorded (``bench/bench_fsdp.py
    --part 7``'s models, one profile each, load 4): -0.0 % with a 16384-entry vocabulary (154.3 MiB, the root's reduce-scatter;
    the stand-in had -10.4 %), -1.2 % on the transformer (+9.2 %). With the moments above (part 3 again, load 6-7, the runs
    also saying where they peaked): transformer -1.6 % (on; at blocks.2's backward, measured at blocks.3's as blocks.2's
    prefetch all-gather starts) and -0.3 % (off, loss backward, as measured), the MLP -2.3 % (on; the root's all-gather at
    its backward's start, where it peaked: it had read -0.7 % at the root's reduce-scatter, with every F.relu output alive
    there) and -0.2 % (off, loss backward, as measured). With a unit's backward prefetch on gloo (``_prefetch_gather``: the
    next unit's all-gather output held twice; 2026-12-04, one profile and one measured run each under the lock, load 4.0-4.2):
    the transformer with reshard on -1.1 % (-2.4 before; measured in blocks.2's pre-backward, at ``c10d._allgather_base_``,
    as the model now puts it), off and the MLP unchanged (-0.3, -2.3, -0.2 %); the LoRA fine-tune
    (``tests/data/lora/fsdp-*``, recorded again under the lock) -4.3 / -4.8 % against its fullest step (-6.9 / -7.5 before;
    those few steps peaked at the loss's backward with about one block's all-gather output more alive), -0.2 to -0.3 %
    against the steps that peaked at that prefetch.
    """
    fs = g.meta.fsdp
    if fs is None:
        raise DagprofError("not an FSDP graph")
    if why := missing_sizes(fs):
        raise DagprofError(why)
    passes = Passes(g)
    accumulates, recomputed = passes.most_micro_batches() > 1, frozenset(g.layers[i] for i in passes.recomputed)
    moments: list[_Moment] = []
    for phase in root_phases(g):
        job = _Job(g, reshard, workers, accumulates, recomputed, [u for u in fs.units if u.root in phase])
        # the other roots' gradient shards: made in their own phase, alive until their script zeroes them (not recorded)
        rest = sum(_grad_shard(u, job.scale) for u in fs.units if u.root not in phase)
        moments += [m._replace(grads=m.grads + rest) for m in _moments(job) if m is not None]
    out = {}
    for rank, mem in fs.memory.items():
        params, opt = mem.param_shard_bytes * job.scale, mem.optim_state_bytes * job.scale
        best = FsdpMemory(params, opt, mem.grad_shard_bytes * job.scale, job.output, 0.0, "optimizer step", job.shell)
        for m in moments:
            cand = FsdpMemory(params, opt, m.grads, m.activations, m.gathered, m.at, job.shell + m.previous)
            if cand.total > best.total:
                best = cand
        out[int(rank)] = best
    return out


def root_phases(g: Graph) -> list[frozenset[int]]:
    """The ``fully_shard`` roots (``FsdpGraphUnit.root``) whose activations are alive together, as one step of the
    profile ran them (its lowest rank, the step after the first). A root's activations live from the forward its
    backward follows to that backward's end, taking the step as a cycle (a GAN's generator runs backward last, its
    forward first); roots whose spans meet share a phase, and a root with no backward (a teacher under no_grad) saved
    nothing and joins every phase. The actor-critic's critic runs forward and backward before the actor's forward: two
    phases, where one summed both roots' activations (+35 to +48 % measured, docs/evidence.md, rootmem62)."""
    fs = g.meta.fsdp
    roots = sorted({u.root for u in fs.units}) if fs else [0]
    if len(roots) < 2:
        return [frozenset(roots)]
    root_of = {n: u.root for u in fs.units for n in u.layers}
    of_layer = np.array([root_of.get(n, -1) for n in g.layers] + [-1])
    steps = np.unique(g.step[g.step >= 0])  # -1: nodes of no step
    if not len(steps):
        return [frozenset(roots)]
    step = steps[1] if len(steps) > 1 else steps[0]
    m = (g.rank == g.rank[g.rank >= 0].min()) & (g.step == step) & (g.layer >= 0) & np.isin(g.kind, [Kind.FORWARD, Kind.BACKWARD])
    idx = np.flatnonzero(m)[np.argsort(g.order[m], kind="stable")]
    runs: list[tuple[int, int]] = []  # (root, kind) of each run of layers, in the order they ran
    for r, k in zip(of_layer[g.layer[idx]].tolist(), g.kind[idx].tolist()):
        if r >= 0 and (not runs or runs[-1] != (r, k)):
            runs.append((r, k))
    n, spans = len(runs), {}
    for r in roots:
        back = [i for i, run in enumerate(runs) if run == (r, Kind.BACKWARD)]
        if not back:
            continue
        start = next((back[0] - d for d in range(1, n + 1) if runs[(back[0] - d) % n] == (r, Kind.FORWARD)), back[0])
        spans[r] = {j % n for j in range(start, back[-1] + 1 if back[-1] >= start else back[-1] + n + 1)}
    phases: list[set[int]] = []
    for r in spans:
        joined = [p for p in phases if any(spans[r] & spans[q] for q in p)]
        phases = [p for p in phases if p not in joined] + [set().union({r}, *joined)]
    idle = {r for r in roots if r not in spans}
    return [frozenset(p | idle) for p in phases] or [frozenset(roots)]


def _size(dtype: str | None) -> int:
    """Bytes per element of a unit's dtype (4 where the profile does not say)."""
    return dtype_bytes(dtype or "") or 4


def _full(u: FsdpGraphUnit) -> float:
    """Unit ``u``'s parameters gathered (in the parameter dtype)."""
    return float(u.numel * _size(u.param_dtype))


def _full_grad(u: FsdpGraphUnit) -> float:
    """Unit ``u``'s unsharded gradients (of its parameters that take one), in the dtype they are reduced in."""
    return float(u.grad_numel * _size(u.reduce_dtype or u.orig_dtype))


def _grad_shard(u: FsdpGraphUnit, scale: float) -> float:
    """Unit ``u``'s gradient shard (of its parameters that take one), its shards ``scale`` times as large as profiled."""
    return _reduced(u, float(u.shard_bytes) * scale * (u.grad_numel / u.numel if u.numel else 1.0))


def _reduced(u: FsdpGraphUnit, nbytes: float) -> float:
    """``nbytes`` of unit ``u``'s gradients in its original dtype, as large in the dtype they are reduced in."""
    return nbytes * _size(u.reduce_dtype or u.orig_dtype) / _size(u.orig_dtype)


class _Job:
    """What an FSDP graph's ranks hold at each moment of a step beyond their own shards, from its profile (the same on
    every rank), under the what-if's ``reshard`` and shard degree (``workers``)."""

    def __init__(self, g: Graph, reshard: Reshard | None, workers: int | None, accumulates: bool = False,
                 recomputed: frozenset[str] = frozenset(), units: list[FsdpGraphUnit] | None = None):
        fs = self.fs = g.meta.fsdp
        self.frozen = g.meta.layer_frozen_bytes
        units = self.units = fs.units if units is None else units  # ``units``: those of the roots of one phase (``root_phases``)
        mesh = (units[0].mesh or [fs.world_size]) if units else [fs.world_size]
        self.shard = mesh[-1] if workers is None or len(mesh) > 1 else workers_mesh(g, workers)[1]  # HSDP keeps its shard degree
        self.scale = mesh[-1] / self.shard  # how much larger each rank's shards are than profiled
        self.returned = fs.layer_output_bytes or {}  # what each layer returned: the gradient reaching it in backward is as large
        # a layer that activation checkpointing ran forward again in backward (``recomputed``, ``Passes.recomputed``) and
        # that saved nothing in forward saves then what no saved-tensor hook saw: its input, for a linear, norm or
        # activation layer (bench/fsdp_fresh/gnn_ckpt_eval.py peaked in a block's backward holding its `msg` layer's
        # recomputed input, the gathered features of both ends of every edge)
        self.recomputed = {n: float(b) for n, b in (fs.layer_input_bytes or {}).items() if n in recomputed and not fs.layer_saved_bytes.get(n)}
        self.forward = [g.layers[lay] for lay, _ in reversed(backward_layers(g, {}))]  # the layers as forward first ran them
        self.root = [i for i, u in enumerate(units) if u.is_root]  # each fully_shard root's own unit
        self.others = [i for i in range(len(units)) if i not in self.root]  # forward order of the inner units (as recorded)
        inner = {n for i in self.others for n in units[i].layers}
        last_inner = max((k for k, n in enumerate(g.layers) if n in inner), default=-1)
        self.after_inner = set(g.layers[last_inner + 1:])  # the root's layers after the inner units: their backward runs first
        self.kept = [i for i in self.others if not resharded(units[i], reshard)]  # inner units kept gathered after forward
        # ``reshard_after_forward=N``: from its forward to its backward all-gather a unit holds its post-forward shard (1/N of
        # its parameters, FSDP2's ``_sharded_post_forward_param_data``) beside its own shard; none where N is the what-if's
        # shard degree (``--workers``: FSDP2 makes the int True there, ``graph.build_fsdp.check_post_forward_workers``)
        self.post = [_full(u) / u.reshard_to if u.reshard_to and u.reshard_to < self.shard and resharded(u, reshard) else 0.0
                     for u in units]
        # the root as every unit (``passes.fsdp.resharded``): fully_shard's default keeps it gathered after forward, True reshards it
        self.root_kept = sum(_full(units[i]) for i in self.root if not resharded(units[i], reshard))
        # FSDP2 holds the last unit's reduce-scatter input (its padded gradients in the reduce dtype) until the next unit's
        # post-backward (``reduce_scatter_max_input_buffers``, 1 by default; not recorded), so through that unit's backward
        self.keeps_rs_input = fs.api == FSDP2_API
        # gloo all-gathers into a flat buffer of the output's size on its worker thread, then copies it out (ProcessGroupGloo's
        # AsyncAllgatherWork ``newLikeFlat``): an all-gather in flight holds its output twice there (the backend as
        # ``graph.build_fsdp`` reads it: unnamed is gloo)
        self.gather_copies = 2.0 if (fs.backend or "gloo") == "gloo" else 1.0
        # FSDP2 frees a unit's all-gather output in forward only at the next unit's copy-out (``FSDPParamGroup.wait_for_unshard``
        # keeps it in ``comm_ctx.all_gather_state`` to overlap that copy-out with the next all-gather): the last unit
        # gathered in forward holds its output until the root's post-forward (none where its shard group is 1 rank)
        last = self.others[-1] if self.others else (self.root[0] if self.root else None)
        self.last_gather = _full(units[last]) if fs.api == FSDP2_API and self.shard > 1 and last is not None else 0.0
        host = autograd_host(g)  # on a CPU job the autograd nodes' held bytes go with each layer's saved tensors
        saved = self.saved = host.saved(fs.layer_saved_bytes)
        self.shell, self.previous = host.shell, host.previous
        self.loss_forward = float(saved.get(LOSS_FORWARD, 0))  # what the loss saved, as its forward ends (where recorded)
        outside = float(saved.get(SAVED_OUTSIDE_LAYERS, 0))
        self.between = between_units(fs, units)
        self.outside_rest = max(outside - sum(self.between), 0.0)  # saved between layers by no inner unit's forward: alive to the end
        self.output = float(saved.get(MODEL_OUTPUT, 0))  # the logits the script holds through the step, where recorded
        self.loss = self.output if MODEL_OUTPUT in saved else outside  # else: a stand-in for them and the loss's tensors
        self.loss_backward = float(saved.get(LOSS_BACKWARD, 0))  # what the loss's graph held in its backward, where recorded
        self.shard_of = [_grad_shard(u, self.scale) for u in units]
        self.root_acts = sum(self.acts(units[i].layers, units[i]) for i in self.root)
        # the root's layers after the inner units ran backward before them and freed what they saved (a profile without the
        # layers' outputs keeps them: the stand-in it had for the gradients in flight)
        self.root_tail_acts = sum(self.acts([n for n in units[i].layers if n in self.after_inner], units[i]) for i in self.root) if self.returned else 0.0
        self.root_head_acts = sum(self.acts([n for n in units[i].layers if n not in self.after_inner], units[i]) for i in self.root)
        self.root_full = sum(_full(units[i]) for i in self.root)
        self.root_grad = sum(_full_grad(units[i]) for i in self.root)
        # gradient accumulation (``set_requires_gradient_sync(False)`` on all but the last micro-batch): FSDP2 keeps each
        # unit's unsharded gradients of the micro-batches before (``unsharded_accumulated_grad``, in the reduce dtype) until
        # its reduce-scatter in the last one, so every moment of that micro-batch holds those of the units not yet reduced:
        # bench/fsdp_fresh/unet_dcp.py peaked at 3.05-3.21 MiB with 2 micro-batches, 2.55-2.76 with 1, and read 2.57 without them
        self.accumulated = [_full_grad(u) if accumulates else 0.0 for u in units]
        self.root_accumulated = sum(self.accumulated[i] for i in self.root)
        self.tail_grad = sum(_reduced(units[i], float(fs.layer_grad_bytes.get(n, 0)))  # the root's tail's unsharded gradients
                             for i in self.root for n in units[i].layers if n in self.after_inner)

    def done(self, k: int) -> float:
        """The gradient shards alive at inner unit ``k - 1``'s backward (``_backward``): those of the units after it,
        reduced already, and on a job of several roots every other root's, which a script zeroing its gradients just
        before each root's backward keeps from that root's last backward: the GAN's generator's through the
        discriminator's backward (measured there at its peak, docs/evidence.md, rootmem62)."""
        own = self.units[self.others[k - 1]].root if k else None
        later = set(self.others[k:])
        return sum(s for i, s in enumerate(self.shard_of) if i in later or (own is not None and self.units[i].root != own))

    def pending(self, inner: list[int]) -> float:
        """The accumulated gradients (``accumulated``) the root and the inner units ``inner`` still hold, their reduce-scatters to come."""
        return self.root_accumulated + sum(self.accumulated[i] for i in inner)

    def acts(self, names: list[str], u: FsdpGraphUnit) -> float:
        """What the layers ``names`` (of unit ``u``) saved less the gathered parameters among it, where recorded."""
        saved, gathered = self.saved, self.fs.layer_saved_gathered_bytes
        if gathered is None:
            return self._acts_unrecorded(names, u)
        return sum(max(float(saved.get(n, 0) - gathered.get(n, 0)), 0.0) for n in names)

    def _acts_unrecorded(self, names: list[str], u: FsdpGraphUnit) -> float:
        """``acts`` in a profile that did not name the gathered parameters (``GATHERED_UNRECORDED``): all a layer saved less
        its parameters' bytes (in the parameter dtype) where it saved at least that much."""
        ratio = _size(u.param_dtype) / _size(u.orig_dtype)
        out = 0.0
        for n in names:
            s, w = float(self.saved.get(n, 0)), float(self.fs.layer_grad_bytes.get(n, 0) + self.frozen.get(n, 0)) * ratio
            out += s - w if s >= w > 0 else s
        return out

    def unit_acts(self, alive: list[int]) -> float:
        """What the inner units ``alive``'s layers saved, less gathered parameters, and what was saved between them in their forward."""
        return sum(self.acts(self.units[i].layers, self.units[i]) + self.between[i] for i in alive)

    def every_activation(self, extra: float) -> float:
        """Every activation before any unit's backward (the root's, functional ops', the loss's stand-in) and ``extra``."""
        return self.root_acts + self.outside_rest + self.loss + extra + self.unit_acts(self.others)

    def kept_full(self, alive: list[int]) -> float:
        """The full parameters of the units kept gathered after forward among ``alive``, and the post-forward shards of
        those resharded to fewer ranks (``post``)."""
        return sum(_full(self.units[i]) for i in self.kept if i in alive) + sum(self.post[i] for i in alive)

    def running(self, cur: int | None) -> list[str]:
        """The layers whose backward runs at unit ``cur``'s (None: the root's before the inner units), in forward order."""
        if cur is not None:
            return [n for n in self.forward if n in self.units[cur].layers]
        return [n for i in self.root for n in self.forward if n in self.units[i].layers and n not in self.after_inner]

    def grad_of(self, names: list[str], u: FsdpGraphUnit) -> float:
        """The unsharded gradients of the layers ``names`` (of unit ``u``), as ``_full_grad`` sizes them."""
        return _reduced(u, sum(float(self.fs.layer_grad_bytes.get(n, 0)) for n in names))

    def in_flight(self, names: list[str], u: FsdpGraphUnit, grads: bool) -> tuple[float, float]:
        """(activation, gradient) bytes the fullest moment of the layers ``names`` (one unit's, in forward order) running
        backward holds beyond all they saved: after a layer, the function between it and the next runs backward with the
        gradient of that layer's output arriving and its gradient of its input leaving (an elementwise activation: twice
        the layer's output), the gradient that reached the unit (what its last layer returned: a residual holds it until the
        branch's gradient joins it), and the layers after it freed what they saved and, with ``grads``, made their
        parameters' unsharded gradients (the layers before it have not yet). (0, 0) where the profile did not record the
        outputs (1.25 MiB in the testbed MLP's `F.relu` backward, where a heap-sampled run peaked). A layer run again by activation
        checkpointing (``recomputed``) holds what it saved then from its unit's recomputation to its own backward."""
        if not self.returned or not names:
            return 0.0, 0.0
        outs = [float(self.returned.get(n, 0)) for n in names]
        again = [self.recomputed.get(n, 0.0) for n in names]  # what the recomputation saved: alive until that layer's backward
        moments = [(2.0 * o + outs[-1] - self.acts(names[j + 1:], u) + sum(again[:j + 1]), self.grad_of(names[j + 1:], u) if grads else 0.0)
                   for j, o in enumerate(outs)]
        return max(moments, key=sum)

    def leaving(self, names: list[str]) -> float:
        """The gradient a unit's backward passes on (what the layer before its first returned), alive in its reduce-scatter."""
        k = self.forward.index(names[0]) if names and names[0] in self.forward else 0
        return float(self.returned.get(self.forward[k - 1], 0)) if k else 0.0


def _moments(job: _Job) -> list[_Moment | None]:
    """The moments of a step, in order (None: not one in this job): each inner unit's all-gather copy-out in forward, then
    backward runs the root's first layers (k = every inner unit alive), then the inner units in reverse, each followed by
    its reduce-scatter."""
    out: list[_Moment | None] = [_forward_copy_out(job, k) for k in range(len(job.others))]
    out += [_forward_end(job), _loss_forward(job), _loss_backward(job), _root_regather(job)]
    for k in range(len(job.others), -1, -1):
        out += [_prefetch_gather(job, k), _backward(job, k), _reduce_scatter(job, k)]
    return out


def _forward_copy_out(job: _Job, k: int) -> _Moment:
    """Inner unit ``k``'s pre-forward copying its all-gather's output into its parameters: that output (held twice on gloo,
    whose work keeps its flat buffer until FSDP's wait ends: ``_Job.gather_copies``) beside the parameters it fills, the
    root's parameters (gathered for the whole forward), the units before it that keep theirs gathered (or a post-forward
    shard), and what the root's first layers and those units saved. Where units keep their parameters after forward the
    last one's copy-out is the step's fullest moment: the 4-rank tower (``bench/fsdp_fresh/intra_reshard.py --reshard
    false``, blocks of 2.0 MiB) peaked there in every measured step (17.16 MiB; the moments after forward gave 15.65, -8.8 %)."""
    u = job.units[job.others[k]]
    before = job.others[:k]
    acts = job.root_head_acts + job.unit_acts(before)
    gathered = job.root_full + job.kept_full(before) + (job.gather_copies + 1.0) * _full(u) + job.pending(job.others)
    return _Moment(0.0, acts, gathered, f"all-gather of {u.name} (forward copy-out)", job.previous)


def _forward_end(job: _Job) -> _Moment | None:
    """The root's forward ending, before its post-forward hook (FSDP2; None else): every activation and the model's
    output (a loss computed inside the model's forward among them), the root's parameters (gathered until that hook even
    where it reshards after forward), the kept units, and the all-gather output of the unit gathered last in forward,
    which FSDP2 frees only there (``_Job.last_gather``). bench/fsdp_fresh/mae_pretrain.py with ``fully_shard`` on its root
    only (its loss inside the forward) peaked at the loss's ``aten.mean`` with the whole model's all-gather output alive
    (the heap 3.6 MiB above the gathered parameters already at the first layer's forward): 49.86 MiB measured, 45.29
    predicted without it, 48.81 with it."""
    if not job.last_gather:
        return None
    gathered = job.root_full + job.kept_full(job.others) + job.pending(job.others) + job.last_gather
    return _Moment(0.0, job.every_activation(0.0), gathered, "forward end (the last unit's all-gather output)", job.previous)


def _loss_forward(job: _Job) -> _Moment | None:
    """The loss's forward ending, where the profile recorded what it saved (``LOSS_FORWARD``) or that the script keeps
    its loss into the next step: every activation, the model's output, what the loss saved, the kept units as at the
    loss's backward, and this step's whole autograd graph beside the step before's shells (``_Job.previous``), which the
    script's old loss holds until the new one is assigned. bench/fsdp_fresh/ssm_reshard.py (1457 nodes a step) peaked
    there, not at the loss's backward: this step's graph held 0.8 MiB more than once it began to run."""
    if not job.loss_forward and not job.previous:
        return None
    return _Moment(0.0, job.every_activation(job.loss_forward), job.root_kept + job.kept_full(job.others) + job.pending(job.others),
                   "loss forward", job.previous)


def _loss_backward(job: _Job) -> _Moment | None:
    """The loss's backward, where the profile recorded it (``LOSS_BACKWARD``: what the graph from the model's output to the
    loss held at its fullest, its saved tensors and the gradients in flight): every activation, the model's output, the
    kept units' full parameters (the root's too unless it reshards after forward: FSDP2 reshards the root only when
    ``reshard_after_forward=True`` is passed to it, and gathers it again when the gradient reaches its output, after the
    loss's backward)."""
    if not job.loss_backward:
        return None
    return _Moment(0.0, job.every_activation(job.loss_backward), job.root_kept + job.kept_full(job.others) + job.pending(job.others),
                   "loss backward")


def _root_regather(job: _Job) -> _Moment | None:
    """The start of the root's backward, where it resharded after forward: its all-gather's output beside the parameters
    copied out of it (twice its parameters), every activation, the model's output and its gradient (the MLP with a
    4096-entry vocabulary peaked there with reshard on)."""
    regathered = job.root_full - job.root_kept
    if not regathered:
        return None
    return _Moment(0.0, job.every_activation(job.output), job.root_kept + 2.0 * regathered + job.kept_full(job.others) + job.pending(job.others),
                   "all-gather of <root> (backward)")


def _prefetch_gather(job: _Job, k: int) -> _Moment | None:
    """The start of inner unit ``k - 1``'s backward, its pre-backward hook prefetching the next unit's parameters (None:
    no unit to prefetch, or it was kept gathered; or a profile without the layers' outputs, which do not say what gradient
    reached the unit: ``_backward``'s upper bound stands there): this unit's parameters copied out, the next one's all-gather in flight
    (its output, twice on gloo: ``_Job.gather_copies``), every activation of this unit and those before it with the
    gradient that reached it (none of its layers has run backward yet), and what ``_backward`` holds beside (the root's
    parameters and tail gradients, the reduce-scatter input of the unit before, kept units, the shards done). The LoRA
    fine-tune (``tests/data/lora/fsdp-*``) peaked here in about half its steps, at ``blocks.0``'s prefetch as
    ``blocks.1``'s backward began, 0.29 MiB above its other peak (``blocks.1``'s `F.gelu` backward, which ``_backward``
    gave within 0.2 %): the heap sampled after each op rose by ``blocks.0``'s full parameters (0.79 MiB) at the
    all-gather's copy-in and by as much again, in the steps that peaked there, during ``c10d._allgather_base_``."""
    units, others = job.units, job.others
    if k < 2 or others[k - 2] in job.kept or not job.returned:
        return None
    cur, nxt = others[k - 1], others[k - 2]
    running = job.running(cur)
    reached = float(job.returned.get(running[-1], 0)) if running else 0.0
    acts = job.root_acts - job.root_tail_acts + job.outside_rest + job.loss + job.unit_acts(others[:k]) + reached
    gathered = job.root_full + job.tail_grad + job.kept_full(others[:k]) + job.gather_copies * _full(units[nxt]) + job.pending(others[:k])
    gathered += (0.0 if cur in job.kept else _full(units[cur])) - job.post[cur]  # gathered again: its post-forward shard freed
    if job.keeps_rs_input and k < len(others):
        gathered += job.shard_of[others[k]] * job.shard
    done = job.done(k)
    return _Moment(done, acts, gathered, f"all-gather of {units[nxt].name} (backward prefetch)")


def _backward(job: _Job, k: int) -> _Moment:
    """The backward of inner unit ``k - 1`` (k = 0: the root's layers before the inner units, with the root's full
    gradients and every inner unit's gradient shard). Alive: every activation not yet freed (this unit's and those before
    it in the forward order, the root's but those of its layers after the inner units, whose backward ran, where the
    profile recorded the layers' outputs), the gradients in flight at the unit's fullest moment (``_Job.in_flight``; none
    in profiles without the layers' outputs, whose root activations stood in), what functional ops between layers saved
    (by this unit's forward and those before it, ``unit_saved_outside_bytes``; all of it, to the step's end, where the
    profile did not say whose), the model's output (the logits a script keeps until its step ends, ``MODEL_OUTPUT``; a
    profile without it has what functional ops saved once more as a stand-in), the root's and this unit's full
    parameters, the unsharded gradients of this unit's layers whose backward ran at that moment (all of them in profiles
    without the layers' outputs) and those of the root's layers after the inner units, the next unit's prefetched
    parameters, the reduce-scatter input of the unit before in backward order, units kept gathered after forward, and the
    gradient shards of the units already done."""
    units, others = job.units, job.others
    alive = others[:k]
    cur = others[k - 1] if k else None
    prefetch = others[k - 2] if k >= 2 and others[k - 2] not in job.kept else None
    running = job.running(cur)
    flight, made = job.in_flight(running, units[cur if cur is not None else job.root[0]], cur is not None) if running else (0.0, 0.0)
    gathered = job.root_full + (job.tail_grad if k else job.root_grad) + job.kept_full(alive) + job.pending(alive)
    if cur is not None:  # this unit's gradients where the layers' outputs do not say when they are made, its parameters unless kept
        gathered += (0.0 if job.returned else _full_grad(units[cur])) + (0.0 if cur in job.kept else _full(units[cur])) - job.post[cur]
    if prefetch is not None:  # the next unit's parameters, all-gathered ahead
        gathered += _full(units[prefetch]) - job.post[prefetch]
    if job.keeps_rs_input and k < len(others):  # the unit before in backward order: FSDP2 still holds its reduce-scatter input
        gathered += job.shard_of[others[k]] * job.shard
    gathered += made
    acts = job.root_acts - job.root_tail_acts + job.outside_rest + job.loss + job.unit_acts(alive) + flight
    done = job.done(k)
    return _Moment(done, acts, gathered, f"backward of {units[cur].name if cur is not None else '<root>'}")


def _reduce_scatter(job: _Job, k: int) -> _Moment | None:
    """The reduce-scatter after ``_backward(job, k)`` (its post-backward hook, its activations freed): its unsharded
    gradients in the parameter dtype, the reduce-scatter input in the reduce dtype (and, where the two dtypes differ, the
    gradients cast to the reduce dtype before the copy-in), its new gradient shard, what functional ops saved (once), the
    model's output, and what the moments before hold that is still alive (for an inner unit: the root's parameters and
    tail gradients, the activations before it, the gradient its backward passes on; the root's is the last, everything
    else freed)."""
    others = job.others
    cur = others[k - 1] if k else None
    u = cur if cur is not None else (job.root[0] if job.root else None)
    if u is None:
        return None
    unit = job.units[u]
    cast = unit.param_dtype != (unit.reduce_dtype or unit.orig_dtype)
    # the accumulated gradients (the last micro-batch's added to them) beside the reduce-scatter input, as a cast copy would be
    buffers = _full(unit) + (2.0 if cast or job.accumulated[u] else 1.0) * _full_grad(unit)
    done = job.done(k) + job.shard_of[u]
    if cur is None:
        return _Moment(done, job.outside_rest + job.output, buffers, f"reduce-scatter of {unit.name}")
    before = others[:k - 1]
    acts = job.outside_rest + job.output + job.root_acts - job.root_tail_acts + job.leaving(job.running(cur)) + job.unit_acts(before)
    return _Moment(done, acts, job.root_full + job.tail_grad + job.kept_full(before) + buffers + job.pending(before),
                   f"reduce-scatter of {unit.name}")


def between_units(fs: FsdpRecord, units: list[FsdpGraphUnit]) -> list[float]:
    """Per unit of ``units`` (``fs``'s; 0 for a root): the bytes saved between leaf modules while its forward ran
    (``unit_saved_outside_bytes``; a merged unit's, its members' together). All 0 where the profile did not record them, or
    for a unit the profile did not run as one (``whatif --units split``): those stay in what is kept to the step's end."""
    rec = fs.unit_saved_outside_bytes or {}
    return [0.0 if u.is_root else float(sum(rec.get(m, 0) for m in u.name.split(", "))) for u in units]


def ddp_peak_of_fsdp(g: Graph, workers: int | None = None) -> dict[int, MemoryBreakdown]:
    """Peak memory per rank of the FSDP job ``g`` run under DDP (``whatif --data-parallel ddp``): ``MemoryModel``'s
    peak with every parameter on every rank (the units' full sizes in their original dtype), the optimizer state
    per parameter the FSDP profile measured (state over parameter shards), DDP's bucket buffers, and the
    activations each layer saved less its gathered weight (DDP's weights are parameters, which the collector does
    not count): as recorded, else its parameters' bytes (``GATHERED_UNRECORDED``: a layer that saved no weight, an
    embedding, loses its few saved bytes). With Adam's state (2 per
    parameter), the optimizer step's two temporaries of the largest layer's parameters (``MemoryModel.step_transient``):
    a large embedding's DDP run peaked there, in AdamW's division (228.4 MiB measured; 183.6 predicted at backward's
    start, 212.5 with them, 228.5 with the logits the script held too). A transformer-like stack peaks at backward's
    end (88.6 MiB measured; 97.8 predicted with every gradient beside every activation, 90.3 walking backward).
    ``workers`` changes nothing: a DDP rank holds the whole model at any count. Frozen parameters (``grad_numel``) have no
    gradient, bucket or optimizer state; the measured state is per trained parameter."""
    fs = g.meta.fsdp
    if fs is None:
        raise DagprofError("not an FSDP graph")
    if why := missing_sizes(fs):
        raise DagprofError(why)
    trained = float(sum(u.grad_numel * _size(u.orig_dtype) for u in fs.units))
    frozen = float(sum(u.frozen_numel * _size(u.orig_dtype) for u in fs.units))
    share = trained / (trained + frozen) if trained + frozen else 1.0  # of each rank's parameter shard, what the optimizer steps
    ids = {name: i for i, name in enumerate(g.layers)}
    unit_of = {n: u for u in fs.units for n in u.layers}
    gathered = fs.layer_saved_gathered_bytes
    host = autograd_host(g)
    recorded = host.saved(fs.layer_saved_bytes)
    saved = {}
    for name, s in recorded.items():
        if name in ids:
            u = unit_of.get(name)
            w = (float(gathered.get(name, 0)) if gathered is not None
                 else float(fs.layer_grad_bytes.get(name, 0) + g.meta.layer_frozen_bytes.get(name, 0))
                 * (_size(u.param_dtype) / _size(u.orig_dtype) if u else 1.0))
            saved[ids[name]] = max(float(s) - w, 0.0)
    largest = max((float(v) for v in fs.layer_grad_bytes.values()), default=0.0)
    backward = backward_layers(g, {ids[n]: float(v) for n, v in fs.layer_grad_bytes.items() if n in ids})
    out = {}
    for rank, mem in fs.memory.items():
        state = mem.optim_state_bytes / (mem.param_shard_bytes * share) if mem.param_shard_bytes and share else 0.0
        adam = abs(state - OPTIMIZER_STATE["adam"]) < 0.05
        model = MemoryModel(trained, saved, recorded.get(SAVED_OUTSIDE_LAYERS, 0.0), state, 2.0 * largest if adam else 0.0,
                            recorded.get(MODEL_OUTPUT, 0.0), backward, recorded.get(LOSS_BACKWARD, 0.0), frozen, host.shell,
                            previous=host.previous, loss_forward=float(recorded.get(LOSS_FORWARD, 0.0)))
        out[int(rank)] = model.peak()
    return out
