"""Peak memory per rank, estimated from the profile, and what recomputation frees.

From the profile: gradient bytes per parameter (the DDP buckets), and the activation bytes each
layer saved for backward (the collector's saved-tensor hook, each storage once per step,
parameters excluded; what the loss and functional ops between layers saved counts too).
Assumed: parameters as large as their gradients (fp32 training), optimizer state
``optimizer_state`` times the parameters (SGD 0, SGD with momentum 1, Adam 2).

Peak = parameters + optimizer state + DDP's bucket buffers (none with ``gradient_as_bucket_view``)
+ what the codec keeps (PowerSGD's error feedback: a copy of the gradients; fp16/bf16: the largest
bucket at half size) + the fullest moment of backward, or the optimizer step where that step
allocates more than the activations took (``step_transient``). Backward starts with the loss's own
(where the profile recorded it, ``LOSS_BACKWARD``: every activation alive, and what the loss's graph
held at its fullest: a cross-entropy's log-softmax and two gradients as large as the logits). It walks the layers in
reverse forward order: each layer's gradients appear as its backward runs and its saved
activations are freed after it (gradients set to None by ``zero_grad``, torch's default, so none
are alive when backward starts); what was saved between layers and the model's output (the logits
a script keeps until its step ends) stay to the end, an upper bound. Without the layers' gradient
bytes, every gradient is alive beside every activation (the bound of earlier profiles).

Recomputing a module keeps only its input (what its first layer saves) and rematerialises the
rest while its backward runs, so the peak drops by what it saved beyond that, minus the largest
such amount of any one recomputed module (alive again during its own backward).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..costmodel.codecs import Codec
from ..errors import DagprofError
from ..graph.dag import Graph
from ..graph.meta import FsdpGraphUnit, FsdpRecord
from ..passes.fsdp import Reshard, resharded
from ..passes.gradients import GradientOrder
from ..passes.recompute import Segment
from ..traces.events import Kind
from ..traces.kineto_schema import dtype_bytes
from ..traces.run_schema import FSDP2_API, FSDP_ROOT, LOSS_BACKWARD, MODEL_OUTPUT, SAVED_OUTSIDE_LAYERS
from ..units import MB

# what a profile without activation sizes lacks, and why it may
NO_SIZES = ("the profile has no activation sizes (layer_saved_bytes: a model under torch.compile, whose modules dagprof "
            "leaves unhooked, or a profile from an older dagprof)")
# what a profile that did not name the gathered parameters among a layer's saved tensors (FSDP1, an older dagprof) gives
GATHERED_UNRECORDED = ("the profile does not say which saved tensors were gathered parameters (FSDP1, or a profile from an older "
                       "dagprof): a layer that saved at least its parameters' bytes counts the rest, else all it saved, so a layer whose "
                       "weight FSDP padded to the shard count can count it once more or not (a layout's peak moved by up to 2 MiB "
                       "between profiles of other layouts); profile again for the exact figure")
OPTIMIZER_STATE = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}


@dataclass
class MemoryBreakdown:
    params: float
    optimizer: float
    grads: float
    buckets: float
    activations: float
    codec: float
    step: float = 0.0  # the optimizer step's temporaries, where the peak is that step (``MemoryModel.step_transient``)

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.grads + self.buckets + self.activations + self.codec + self.step

    def to_dict(self) -> dict:
        mb = lambda x: x / MB  # noqa: E731
        return {"total_mb": mb(self.total), "params_mb": mb(self.params), "optimizer_mb": mb(self.optimizer), "grads_mb": mb(self.grads),
                "ddp_buckets_mb": mb(self.buckets), "activations_mb": mb(self.activations), "codec_mb": mb(self.codec),
                "optimizer_step_mb": mb(self.step)}


@dataclass
class MemoryModel:
    grad_bytes: float
    saved: dict[int, float]  # graph layer id -> activation bytes it saves for backward
    outside: float  # saved between leaf modules (loss, functional ops)
    optimizer_state: float = 1.0
    # bytes the optimizer step allocates beyond its state while it runs: PyTorch's Adam and AdamW on CPU (one tensor at a
    # time) divide by a new square root of each parameter's second moment, two temporaries of the largest parameter
    step_transient: float = 0.0
    output: float = 0.0  # what the model's forward returned (``MODEL_OUTPUT``: the logits), held by the script through the step
    backward: tuple[tuple[int, float], ...] = ()  # (layer id, gradient bytes its backward makes) in backward order
    loss: float = 0.0  # the most the loss's graph held in its backward, before any layer's (``LOSS_BACKWARD``)

    @classmethod
    def from_profile(cls, g: Graph, order: GradientOrder, layer_saved_bytes: dict[str, int], optimizer: str = "momentum") -> "MemoryModel":
        if optimizer not in OPTIMIZER_STATE:
            raise DagprofError(f"--optimizer-state takes {', '.join(OPTIMIZER_STATE)}, got {optimizer!r}")
        if not layer_saved_bytes:
            raise DagprofError(NO_SIZES)
        ids = {name: i for i, name in enumerate(g.layers)}
        saved = {ids[k]: float(v) for k, v in layer_saved_bytes.items() if k in ids}
        grads: dict[int, float] = {}
        for lay, nb in zip(order.layer.tolist(), order.nbytes.tolist()):
            grads[int(lay)] = grads.get(int(lay), 0.0) + float(nb)
        adam = optimizer == "adam"  # its step's two temporaries of the largest parameter
        return cls(float(order.total_bytes), saved, float(layer_saved_bytes.get(SAVED_OUTSIDE_LAYERS, 0)), OPTIMIZER_STATE[optimizer],
                   2.0 * float(order.nbytes.max(initial=0)) if adam else 0.0, float(layer_saved_bytes.get(MODEL_OUTPUT, 0)), backward_layers(g, grads),
                   float(layer_saved_bytes.get(LOSS_BACKWARD, 0)))

    def freed(self, seg: Segment) -> float:
        """Activation bytes recomputing ``seg`` frees (all it saves but its input)."""
        inner = sum(self.saved.get(lay, 0.0) for lay in seg.layers)
        return max(inner - self.saved.get(seg.layers[0], 0.0), 0.0)

    def peak(self, recompute: list[Segment] = (), codec: Codec = Codec(), bucket_view: bool = False,
             largest_bucket: float = 0.0) -> MemoryBreakdown:
        grads, acts = self._fullest_backward(recompute)
        extra = {"powersgd": self.grad_bytes, "fp16": largest_bucket / 2, "bf16": largest_bucket / 2}.get(codec.name, 0.0)
        backward = MemoryBreakdown(self.grad_bytes, self.optimizer_state * self.grad_bytes, grads,
                                   0.0 if bucket_view else self.grad_bytes, acts + self.outside + self.output, extra)
        step = dataclasses.replace(backward, grads=self.grad_bytes, activations=self.output, step=self.step_transient)  # activations freed by then
        return step if step.total > backward.total else backward

    def _fullest_backward(self, recompute: list[Segment]) -> tuple[float, float]:
        """(gradient, layer activation) bytes alive at backward's fullest moment. A recomputed module keeps its input
        until its backward, which rematerialises the rest (``freed``) while it runs."""
        freed = {s.module: self.freed(s) for s in recompute}
        saved = dict(self.saved)
        seg_of: dict[int, Segment] = {}
        for s in recompute:
            for lay in s.layers[1:]:
                saved[lay] = 0.0
            for lay in s.layers:
                seg_of[lay] = s
        if not self.backward:
            return self.grad_bytes, sum(saved.values()) + max(freed.values(), default=0.0)
        alive = sum(saved.values())
        grads = self.grad_bytes - sum(nb for _, nb in self.backward)  # bytes no layer claims: alive from the start
        best = (grads, alive + self.loss)  # the loss's backward, every activation still alive
        for lay, nb in self.backward:
            grads += nb
            seg = seg_of.get(lay)
            now = (grads, alive + (freed[seg.module] if seg else 0.0))
            if sum(now) > sum(best):
                best = now
            alive -= saved.get(lay, 0.0)
        return best


def backward_layers(g: Graph, grads: dict[int, float]) -> tuple[tuple[int, float], ...]:
    """(layer id, gradient bytes) of every profiled layer in backward order: the reverse of the order forward first ran them."""
    fw = np.flatnonzero((g.kind == Kind.FORWARD) & (g.layer >= 0))
    order = dict.fromkeys(g.layer[fw[np.argsort(g.order[fw], kind="stable")]].tolist())
    return tuple((int(lay), float(grads.get(int(lay), 0.0))) for lay in reversed(list(order)))


@dataclass
class FsdpMemory:
    """Peak bytes of one rank of an FSDP job and what is alive at that moment (``fsdp_peak``)."""

    params: float  # this rank's parameter shards
    optimizer: float  # its optimizer state (on the shards)
    grads: float  # gradient shards already reduce-scattered
    activations: float  # what layers and functional ops between them saved for backward, and a stand-in for the output and loss
    gathered: float  # full parameters of the units unsharded at that moment, and their unsharded gradients
    at: str  # where the peak falls: "backward of <unit>", "reduce-scatter of <unit>" or "optimizer step"

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.grads + self.activations + self.gathered

    def to_dict(self) -> dict:
        mb = lambda x: x / 2**20  # noqa: E731
        return {"total_mb": mb(self.total), "params_mb": mb(self.params), "optimizer_mb": mb(self.optimizer), "grads_mb": mb(self.grads),
                "activations_mb": mb(self.activations), "gathered_mb": mb(self.gathered), "at": self.at}


def _size(dtype: str | None) -> int:
    """Bytes per element of a unit's dtype (4 where the profile does not say)."""
    return dtype_bytes(dtype or "") or 4


def fsdp_peak(g: Graph, reshard: Reshard | None = None, workers: int | None = None) -> dict[int, FsdpMemory]:
    """Peak memory per rank of an FSDP graph (``graph.build_fsdp``), as profiled or under a what-if.

    ``reshard``: reshard_after_forward of every non-root unit, or of the units a mapping names (None: as profiled); ``workers``: the shard
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
    until the gradients in flight were counted (below), then -0.5 to +1.4 % at blocks.3's or blocks.1's backward; with what
    a unit saved between its layers freed at its backward, FSDP2's held reduce-scatter input and a unit's gradients made layer
    by layer: -1.1 to -0.1 %, at blocks.2's backward in every layout, where the heap-sampled runs peaked (``tests/data/fsdp/pad-*``).

    The peak is the largest of these moments (the forward end is never above the first one):
    - the loss's backward, where the profile recorded it (``LOSS_BACKWARD``: what the graph from the model's output
      to the loss held at its fullest, its saved tensors and the gradients in flight): every activation, the
      model's output, the kept units' full parameters (the root's too unless it resharded after forward: FSDP2
      reshards the root only when ``reshard_after_forward=True`` is passed to it, and gathers it again when the
      gradient reaches its output, after the loss's backward);
    - the start of the root's backward, where it resharded after forward: its all-gather's output beside the parameters
      copied out of it (twice its parameters), every activation, the model's output and its gradient (the MLP with a
      4096-entry vocabulary peaked there with reshard on);
    - the backward of each inner unit: every activation not yet freed (this unit's and those before it in the
      forward order, the root's but those of its layers after the inner units, whose backward ran, where the profile
      recorded the layers' outputs), the gradients in flight at the unit's fullest moment (``in_flight``, from the bytes
      each layer returned, ``layer_output_bytes``: 1.25 MiB in the testbed MLP's `F.relu` backward, where a heap-sampled
      run peaked; none in profiles without them, whose root activations stood in), what functional ops between layers saved
      (by this unit's forward and those before it, ``unit_saved_outside_bytes``; all of it, to the step's end, where the
      profile did not say whose), the model's output (the
      logits a script keeps until its step ends; the collector records what the root's forward returned,
      ``MODEL_OUTPUT``; a profile without it has what functional ops saved once more as a stand-in), the root's and this unit's full parameters,
      the unsharded gradients of this unit's layers whose backward ran at that moment (all of them in profiles without the
      layers' outputs) and those of the root's layers after the inner units,
      the next unit's prefetched parameters, the reduce-scatter input of the unit before in backward order (FSDP2 holds it
      until the next post-backward), units kept gathered after forward, and the gradient shards of
      the units already done;
    - the backward of the root's layers before the inner units: the root's activations, full parameters and
      full gradients, every inner unit's gradient shards;
    - each unit's reduce-scatter (its post-backward hook, its activations freed): its unsharded gradients in
      the parameter dtype, the reduce-scatter input in the reduce dtype (and, where the two dtypes differ,
      the gradients cast to the reduce dtype before the copy-in), its new gradient shard, what functional ops saved (once), the
      model's output, and what the moments above hold that is still alive (for an inner unit: the root's parameters and tail
      gradients, the activations before it).
    - the optimizer step: every shard, its gradients and its state, and the model's output.

    Measured against ``bench/fsdp_train.py --memory`` (``bench/bench_fsdp.py --part 3``, load 23-34): the transformer
    +0.5 % (reshard on) and +1.2 % (off), the MLP with a 4096-entry vocabulary -0.6 % and +3.9 % (its off peak is the
    loss's backward; the rest is the ``down`` layers' saved weights counted as activations: ``acts``' rule needs a layer
    to have saved its bias too); ``tests/data/fsdp/loss-vocab`` +0.1 / +0.0 %. Before the loss's backward was recorded
    its peak was missed (-9 to -14 %, that recording -36 to -42 %); before the model's output was, a stand-in counted
    what functional ops saved twice (the transformer +8 to +10 %). With the model's output recorded (``bench/bench_fsdp.py
    --part 7``'s models, one profile each, load 4): -0.0 % with a 16384-entry vocabulary (154.3 MiB, the root's reduce-scatter;
    the stand-in had -10.4 %), -1.2 % on the transformer (+9.2 %). With the moments above (part 3 again, load 6-7, the runs
    also saying where they peaked): transformer -1.6 % (on; at blocks.2's backward, measured at blocks.3's as blocks.2's
    prefetch all-gather starts) and -0.3 % (off, loss backward, as measured), the MLP -2.3 % (on; the root's all-gather at
    its backward's start, where it peaked: it had read -0.7 % at the root's reduce-scatter, with every F.relu output alive
    there) and -0.2 % (off, loss backward, as measured).
    """
    fs = g.meta.fsdp
    if fs is None:
        raise DagprofError("not an FSDP graph")
    saved_bytes = fs.layer_saved_bytes
    if not saved_bytes:
        raise DagprofError(NO_SIZES)
    units = fs.units
    unit_layers = [u.layers for u in units]
    mesh = (units[0].mesh or [fs.world_size]) if units else [fs.world_size]
    shard0 = mesh[-1]
    shard = shard0 if workers is None or len(mesh) > 1 else workers
    scale = shard0 / shard

    def param_size(u: FsdpGraphUnit) -> int:
        return _size(u.param_dtype)

    def full(u: FsdpGraphUnit) -> float:
        return float(u.numel * param_size(u))

    def full_grad(u: FsdpGraphUnit) -> float:
        return float(u.numel * _size(u.reduce_dtype or u.orig_dtype))

    grad_bytes = fs.layer_grad_bytes
    gathered_bytes = fs.layer_saved_gathered_bytes

    def acts(names: list[str], u: FsdpGraphUnit) -> float:
        """What the layers ``names`` saved less the gathered parameters among it: as recorded, else (``GATHERED_UNRECORDED``)
        all a layer saved less its parameters' bytes (in the parameter dtype) where it saved at least that much."""
        if gathered_bytes is not None:
            return sum(max(float(saved_bytes.get(n, 0) - gathered_bytes.get(n, 0)), 0.0) for n in names)
        ratio = param_size(u) / _size(u.orig_dtype)
        out = 0.0
        for n in names:
            s, w = float(saved_bytes.get(n, 0)), float(grad_bytes.get(n, 0)) * ratio
            out += s - w if s >= w > 0 else s
        return out

    returned = fs.layer_output_bytes or {}  # what each layer returned: the gradient reaching it in backward is as large
    forward = [g.layers[lay] for lay, _ in reversed(backward_layers(g, {}))]

    def grad_of(names: list[str], u: FsdpGraphUnit) -> float:
        """The unsharded gradients of the layers ``names`` (of unit ``u``), as ``full_grad`` sizes them."""
        return sum(float(grad_bytes.get(n, 0)) for n in names) * _size(u.reduce_dtype or u.orig_dtype) / _size(u.orig_dtype)

    def in_flight(names: list[str], u: FsdpGraphUnit, grads: bool) -> tuple[float, float]:
        """(activation, gradient) bytes the fullest moment of the layers ``names`` (one unit's, in forward order) running
        backward holds beyond all they saved: after a layer, the function between it and the next runs backward with the
        gradient of that layer's output arriving and its gradient of its input leaving (an elementwise activation: twice
        the layer's output), the gradient that reached the unit (what its last layer returned: a residual holds it until the
        branch's gradient joins it), and the layers after it freed what they saved and, with ``grads``, made their
        parameters' unsharded gradients (the layers before it have not yet). (0, 0) where the profile did not record the
        outputs."""
        if not returned or not names:
            return 0.0, 0.0
        outs = [float(returned.get(n, 0)) for n in names]
        moments = [(2.0 * o + outs[-1] - acts(names[j + 1:], u), grad_of(names[j + 1:], u) if grads else 0.0) for j, o in enumerate(outs)]
        return max(moments, key=sum)

    def leaving(names: list[str]) -> float:
        """The gradient a unit's backward passes on (what the layer before its first returned), alive in its reduce-scatter."""
        k = forward.index(names[0]) if names and names[0] in forward else 0
        return float(returned.get(forward[k - 1], 0)) if k else 0.0

    outside = float(saved_bytes.get(SAVED_OUTSIDE_LAYERS, 0))
    between = between_units(fs)
    outside_rest = max(outside - sum(between), 0.0)  # saved between layers by no inner unit's forward: alive to the end
    output = float(saved_bytes.get(MODEL_OUTPUT, 0))  # the logits the script holds through the step, where recorded
    loss = output if MODEL_OUTPUT in saved_bytes else outside  # else: a stand-in for them and the loss's tensors
    loss_backward = float(saved_bytes.get(LOSS_BACKWARD, 0))  # what the loss's graph held in its backward, where recorded
    root = [i for i, u in enumerate(units) if u.name == FSDP_ROOT]
    others = [i for i in range(len(units)) if i not in root]  # forward order of the inner units (as recorded)
    inner_layers = {n for i in others for n in unit_layers[i]}
    last_inner = max((k for k, n in enumerate(g.layers) if n in inner_layers), default=-1)
    after_inner = set(g.layers[last_inner + 1:])
    kept = [i for i in others if not resharded(units[i], reshard)]
    # FSDP2 holds the last unit's reduce-scatter input (its padded gradients in the reduce dtype) until the next unit's
    # post-backward (``reduce_scatter_max_input_buffers``, 1 by default; not recorded), so through that unit's backward
    keeps_rs_input = fs.api == FSDP2_API
    # FSDP keeps the root gathered after forward unless reshard_after_forward=True was passed to it (``resharded_after_forward``:
    # as it ran); the what-if keeps it where it was kept (``passes.fsdp.set_reshard``)
    root_kept = sum(full(units[i]) for i in root if not (resharded(units[i], reshard) and units[i].resharded_after_forward))
    out = {}
    for rank, mem in fs.memory.items():
        params = mem.param_shard_bytes * scale
        opt = mem.optim_state_bytes * scale
        grads = mem.grad_shard_bytes * scale
        shard_of = [float(u.shard_bytes) * scale * _size(u.reduce_dtype or u.orig_dtype)
                    / _size(u.orig_dtype) for u in units]
        root_acts = sum(acts(unit_layers[i], units[i]) for i in root)

        def unit_acts(i: int) -> float:
            """What inner unit ``i``'s layers saved, less gathered parameters, and what was saved between them in its forward."""
            return acts(unit_layers[i], units[i]) + between[i]

        # the root's layers after the inner units ran backward before them and freed what they saved (a profile without the
        # layers' outputs keeps them: the stand-in it had for the gradients in flight)
        root_tail_acts = sum(acts([n for n in unit_layers[i] if n in after_inner], units[i]) for i in root) if returned else 0.0
        root_full = sum(full(units[i]) for i in root)
        root_grad = sum(full_grad(units[i]) for i in root)
        tail_grad = sum(float(grad_bytes.get(n, 0)) * _size(units[i].reduce_dtype or units[i].orig_dtype)
                        / _size(units[i].orig_dtype) for i in root for n in unit_layers[i] if n in after_inner)
        best = FsdpMemory(params, opt, grads, output, 0.0, "optimizer step")
        if loss_backward:  # before any unit's backward: every activation, the kept units' parameters (the root's, unless it resharded)
            everything = root_acts + outside_rest + loss + loss_backward + sum(unit_acts(i) for i in others)
            m = FsdpMemory(params, opt, 0.0, everything, root_kept + sum(full(units[i]) for i in kept), "loss backward")
            best = m if m.total > best.total else best
        regathered = sum(full(units[i]) for i in root) - root_kept  # the root's parameters, resharded after forward
        if regathered:  # its backward's start: the all-gather's output beside the parameters it is copied into, the output's gradient
            m = FsdpMemory(params, opt, 0.0, root_acts + outside_rest + loss + output + sum(unit_acts(i) for i in others),
                           root_kept + 2.0 * regathered + sum(full(units[i]) for i in kept), "all-gather of <root> (backward)")
            best = m if m.total > best.total else best
        for k in range(len(others), -1, -1):  # backward: the root's first layer (k = all inner units alive), then inner units in reverse
            alive = others[:k]
            cur = others[k - 1] if k else None
            prefetch = others[k - 2] if k >= 2 and others[k - 2] not in kept else None
            gathered = root_full + (tail_grad if k else root_grad) + sum(full(units[i]) for i in kept if i in alive)
            if cur is not None:
                gathered += (0.0 if returned else full_grad(units[cur])) + (0.0 if cur in kept else full(units[cur]))
            if prefetch is not None:
                gathered += full(units[prefetch])
            if keeps_rs_input and k < len(others):  # the unit before in backward order: its reduce-scatter input, still held
                gathered += shard_of[others[k]] * shard
            running = ([n for n in forward if n in unit_layers[cur]] if cur is not None  # the layers whose backward runs now
                       else [n for i in root for n in forward if n in unit_layers[i] and n not in after_inner])
            flight, made = in_flight(running, units[cur if cur is not None else root[0]], cur is not None) if running else (0.0, 0.0)
            gathered += made
            a = root_acts - root_tail_acts + outside_rest + loss + sum(unit_acts(i) for i in alive) + flight
            done = sum(shard_of[i] for i in others[k:])
            m = FsdpMemory(params, opt, done, a, gathered, f"backward of {units[cur].name if cur is not None else '<root>'}")
            # its reduce-scatter, once its activations are freed (the root's: the last, everything else freed)
            u = cur if cur is not None else (root[0] if root else None)
            rs = None
            if u is not None:
                cast = units[u].param_dtype != (units[u].reduce_dtype or units[u].orig_dtype)
                buffers = float(units[u].numel * param_size(units[u])) + (2.0 if cast else 1.0) * full_grad(units[u])
                if cur is not None:
                    rs = FsdpMemory(params, opt, done + shard_of[u], outside_rest + output + root_acts - root_tail_acts + leaving(running)
                                    + sum(unit_acts(i) for i in others[:k - 1]),
                                    root_full + tail_grad + sum(full(units[i]) for i in kept if i in others[:k - 1]) + buffers,
                                    f"reduce-scatter of {units[u].name}")
                else:
                    rs = FsdpMemory(params, opt, done + shard_of[u], outside_rest + output, buffers, f"reduce-scatter of {units[u].name}")
            for cand in (m, rs):
                if cand is not None and cand.total > best.total:
                    best = cand
        out[int(rank)] = best
    return out


def between_units(fs: FsdpRecord) -> list[float]:
    """Per unit of ``fs`` (0 for the root): the bytes saved between leaf modules while its forward ran
    (``unit_saved_outside_bytes``; a merged unit's, its members' together). All 0 where the profile did not record them, or
    for a unit the profile did not run as one (``whatif --units split``): those stay in what is kept to the step's end."""
    rec = fs.unit_saved_outside_bytes or {}
    return [0.0 if u.name == FSDP_ROOT else float(sum(rec.get(m, 0) for m in u.name.split(", "))) for u in fs.units]


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
    ``workers`` changes nothing: a DDP rank holds the whole model at any count."""
    fs = g.meta.fsdp
    if fs is None:
        raise DagprofError("not an FSDP graph")
    if not fs.layer_saved_bytes:
        raise DagprofError(NO_SIZES)
    total = float(sum(u.numel * _size(u.orig_dtype) for u in fs.units))
    ids = {name: i for i, name in enumerate(g.layers)}
    unit_of = {n: u for u in fs.units for n in u.layers}
    gathered = fs.layer_saved_gathered_bytes
    saved = {}
    for name, s in fs.layer_saved_bytes.items():
        if name in ids:
            u = unit_of.get(name)
            w = (float(gathered.get(name, 0)) if gathered is not None
                 else float(fs.layer_grad_bytes.get(name, 0)) * (_size(u.param_dtype) / _size(u.orig_dtype) if u else 1.0))
            saved[ids[name]] = max(float(s) - w, 0.0)
    largest = max((float(v) for v in fs.layer_grad_bytes.values()), default=0.0)
    backward = backward_layers(g, {ids[n]: float(v) for n, v in fs.layer_grad_bytes.items() if n in ids})
    out = {}
    for rank, mem in fs.memory.items():
        state = mem.optim_state_bytes / mem.param_shard_bytes if mem.param_shard_bytes else 0.0
        adam = abs(state - OPTIMIZER_STATE["adam"]) < 0.05
        model = MemoryModel(total, saved, float(fs.layer_saved_bytes.get(SAVED_OUTSIDE_LAYERS, 0)), state, 2.0 * largest if adam else 0.0,
                            float(fs.layer_saved_bytes.get(MODEL_OUTPUT, 0)), backward, float(fs.layer_saved_bytes.get(LOSS_BACKWARD, 0)))
        out[int(rank)] = model.peak()
    return out
