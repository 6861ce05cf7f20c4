"""Peak memory per rank, estimated from the profile, and what recomputation frees.

From the profile: gradient bytes per parameter (the DDP buckets), and the activation bytes each
layer saved for backward (the collector's saved-tensor hook, each storage once per step,
parameters excluded; what the loss and functional ops between layers saved counts too).
Assumed: parameters as large as their gradients (fp32 training), plus those that take none (frozen, as a LoRA
fine-tune's base weights: the collector's ``layer_frozen_bytes``), optimizer state ``optimizer_state`` times the
trained parameters (SGD 0, SGD with momentum 1, Adam 2: torch makes state only for a parameter with a gradient), of the
largest shard a rank owns under ZeRO-1 (``passes.zero.zero_state_share``).

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

On a CPU job the autograd graph is host memory beside the tensors (``autograd_host``): each node a layer's forward
recorded holds its saved-variable records until its backward runs, then a shell until the script drops the loss that
holds the graph. The first goes with the layer's saved activations, the second is alive through the step. A script that
keeps its loss into the next step (a loop variable) holds the step before's shells too until it assigns the new loss:
then, as the loss's forward ends, every activation, what the loss saved and this step's whole graph are alive beside
them (``LOSS_FORWARD``, ``PREVIOUS_GRAPH``), which can be fuller than the loss's backward.

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
from ..passes.gradients import GradientOrder
from ..passes.recompute import Segment
from ..passes.zero import zero_state_share
from ..traces.events import Kind
from ..traces.run_schema import LOSS_BACKWARD, LOSS_FORWARD, MODEL_OUTPUT, PREVIOUS_GRAPH, SAVED_OUTSIDE_LAYERS
from ..units import MB

# what a profile without activation sizes lacks, and why it may
NO_SIZES = ("the profile has no activation sizes (layer_saved_bytes: a model under torch.compile, whose modules dagprof "
            "leaves unhooked, or a profile from an older dagprof)")
OPTIMIZER_STATE = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}
# host bytes per autograd node, by torch version (major.minor): (held from its forward until its backward ran: the node,
# its saved-variable records, the saved tensors' metadata; its shell after it ran, until the script drops the loss that
# holds the graph), per node as the collector counts them (by sequence number). Measured by bench/autograd_host_memory.py
# on the SSM's model alone, not fitted to any job's peak: torch 2.13, 924 / 582 B at sequence 24 (911-934 / 570-591 B at 12-48)
AUTOGRAD_NODE_BYTES = {"2.13": (924.0, 582.0)}


@dataclass(frozen=True)
class AutogradHost:
    """The host memory of a CPU job's autograd graph (``autograd_host``); none where the profile counted no nodes."""

    freed: dict[str, float]  # layer path (or SAVED_OUTSIDE_LAYERS) -> bytes its nodes free as they run backward
    shell: float = 0.0  # what every node keeps after it ran, alive through the step (the loss holds the graph)
    previous: float = 0.0  # the step before's shells, held until the script assigns its new loss (``PREVIOUS_GRAPH``)
    note: str | None = None  # why the nodes counted are not priced (a torch version not measured)

    def saved(self, layer_saved_bytes: dict[str, int]) -> dict[str, float]:
        """``layer_saved_bytes`` with each layer's nodes' held bytes added: they are freed when its saved tensors are."""
        out = {k: float(v) for k, v in layer_saved_bytes.items()}
        for k, nb in self.freed.items():
            out[k] = out.get(k, 0.0) + nb
        return out


def autograd_host(g: Graph) -> AutogradHost:
    """The autograd graph's host memory from the nodes the profile counted per layer (``layer_autograd_nodes``, rank 0's;
    recorded on CPU jobs only) at its torch version's bytes per node (``AUTOGRAD_NODE_BYTES``). bench/bench_host_memory.py:
    the SSM of bench/fsdp_fresh/ssm_reshard.py (1457 nodes a step), the 2-layer T5 and a ViT read -14.1 / -11.7 / -1.0 %
    without them, -0.2 / -0.1 / -0.2 % with them."""
    nodes = {k: n for k, n in g.meta.layer_autograd_nodes.items() if k != PREVIOUS_GRAPH}
    if not nodes:
        return AutogradHost({})
    version = g.meta.torch_minor
    if version not in AUTOGRAD_NODE_BYTES:
        return AutogradHost({}, note=f"peak memory leaves out the host memory of the autograd graph ({sum(nodes.values())} nodes a step): "
                                     f"its bytes per node are not measured for torch {g.meta.torch or '(not recorded)'} "
                                     "(bench/autograd_host_memory.py measures them)")
    held, shell = AUTOGRAD_NODE_BYTES[version]
    return AutogradHost({k: n * (held - shell) for k, n in nodes.items()}, shell * sum(nodes.values()),
                        shell * g.meta.layer_autograd_nodes.get(PREVIOUS_GRAPH, 0))


@dataclass
class MemoryBreakdown:
    params: float
    optimizer: float
    grads: float
    buckets: float
    activations: float
    codec: float
    step: float = 0.0  # the optimizer step's temporaries, where the peak is that step (``MemoryModel.step_transient``)
    # the autograd graph's shells on the host (``AutogradHost``: this step's, the step before's at the loss's forward);
    # what its nodes hold until their backward is in activations
    autograd: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.grads + self.buckets + self.activations + self.codec + self.step + self.autograd

    def to_dict(self) -> dict:
        mb = lambda x: x / MB  # noqa: E731
        return {"total_mb": mb(self.total), "params_mb": mb(self.params), "optimizer_mb": mb(self.optimizer), "grads_mb": mb(self.grads),
                "ddp_buckets_mb": mb(self.buckets), "activations_mb": mb(self.activations), "codec_mb": mb(self.codec),
                "optimizer_step_mb": mb(self.step), "autograd_mb": mb(self.autograd)}


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
    frozen: float = 0.0  # parameter bytes that take no gradient: no gradient, bucket or optimizer state either
    shell: float = 0.0  # the autograd graph's shells on the host, alive through the step (``AutogradHost.shell``)
    previous: float = 0.0  # the step before's shells, held until the loss's forward ends (``AutogradHost.previous``)
    loss_forward: float = 0.0  # what the loss saved, alive as its forward ends (``LOSS_FORWARD``)

    @classmethod
    def from_profile(cls, g: Graph, order: GradientOrder, layer_saved_bytes: dict[str, int], optimizer: str = "momentum") -> "MemoryModel":
        if optimizer not in OPTIMIZER_STATE:
            raise DagprofError(f"--optimizer-state takes {', '.join(OPTIMIZER_STATE)}, got {optimizer!r}")
        if not layer_saved_bytes:
            raise DagprofError(NO_SIZES)
        host = autograd_host(g)
        layer_saved_bytes = host.saved(layer_saved_bytes)
        ids = {name: i for i, name in enumerate(g.layers)}
        saved = {ids[k]: float(v) for k, v in layer_saved_bytes.items() if k in ids}
        grads: dict[int, float] = {}
        for lay, nb in zip(order.layer.tolist(), order.nbytes.tolist()):
            grads[int(lay)] = grads.get(int(lay), 0.0) + float(nb)
        adam = optimizer == "adam"  # its step's two temporaries of the largest parameter
        state = OPTIMIZER_STATE[optimizer] * zero_state_share(g)
        return cls(float(order.total_bytes), saved, float(layer_saved_bytes.get(SAVED_OUTSIDE_LAYERS, 0)), state,
                   2.0 * float(order.nbytes.max(initial=0)) if adam else 0.0, float(layer_saved_bytes.get(MODEL_OUTPUT, 0)), backward_layers(g, grads),
                   float(layer_saved_bytes.get(LOSS_BACKWARD, 0)), float(sum(g.meta.layer_frozen_bytes.values())), host.shell,
                   host.previous, float(layer_saved_bytes.get(LOSS_FORWARD, 0)))

    def freed(self, seg: Segment) -> float:
        """Activation bytes recomputing ``seg`` frees (all it saves but its input)."""
        inner = sum(self.saved.get(lay, 0.0) for lay in seg.layers)
        return max(inner - self.saved.get(seg.layers[0], 0.0), 0.0)

    def peak(self, recompute: list[Segment] = (), codec: Codec = Codec(), bucket_view: bool = False,
             largest_bucket: float = 0.0) -> MemoryBreakdown:
        grads, acts = self._fullest_backward(recompute)
        extra = {"powersgd": self.grad_bytes, "fp16": largest_bucket / 2, "bf16": largest_bucket / 2}.get(codec.name, 0.0)
        backward = MemoryBreakdown(self.grad_bytes + self.frozen, self.optimizer_state * self.grad_bytes, grads,
                                   0.0 if bucket_view else self.grad_bytes, acts + self.outside + self.output, extra, autograd=self.shell)
        step = dataclasses.replace(backward, grads=self.grad_bytes, activations=self.output, step=self.step_transient)  # activations freed by then
        # the loss's forward ending, no gradient yet (``zero_grad`` set them to None), the step before's shells still held
        forward = dataclasses.replace(backward, grads=self.grad_bytes - sum(nb for _, nb in self.backward) if self.backward else 0.0,
                                      activations=self._every_saved(recompute) + self.outside + self.output + self.loss_forward,
                                      autograd=self.shell + self.previous)
        return max((backward, step, forward), key=lambda m: m.total)  # the first of equals: without those two, backward holds more

    def _every_saved(self, recompute: list[Segment]) -> float:
        """Every layer's saved activations before backward: a recomputed module's beyond its input freed."""
        return sum(self.saved.values()) - sum(self.freed(s) for s in recompute)

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
