"""Peak memory per rank, estimated from the profile, and what recomputation frees.

From the profile: gradient bytes per parameter (the DDP buckets), and the activation bytes each
layer saved for backward (the collector's saved-tensor hook, each storage once per step,
parameters excluded; what the loss and functional ops between layers saved counts too).
Assumed: parameters as large as their gradients (fp32 training), optimizer state
``optimizer_state`` times the parameters (SGD 0, SGD with momentum 1, Adam 2).

Peak = parameters + optimizer state + gradients + DDP's bucket buffers (none with
``gradient_as_bucket_view``) + activations + what the codec keeps (PowerSGD's error feedback: a
copy of the gradients; fp16/bf16: the largest bucket at half size). It is an upper bound of
the moment backward starts with every activation alive and gradients allocated.

Recomputing a module keeps only its input (what its first layer saves) and rematerialises the
rest while its backward runs, so the peak drops by what it saved beyond that, minus the largest
such amount of any one recomputed module (alive again during its own backward).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..collect.collector import SAVED_OUTSIDE_LAYERS
from ..costmodel.codecs import Codec
from ..errors import DagprofError
from ..graph.dag import Graph
from ..passes.gradients import GradientOrder
from ..passes.recompute import Segment
from ..units import MB

OPTIMIZER_STATE = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}


@dataclass
class MemoryBreakdown:
    params: float
    optimizer: float
    grads: float
    buckets: float
    activations: float
    codec: float

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.grads + self.buckets + self.activations + self.codec

    def to_dict(self) -> dict:
        mb = lambda x: x / MB  # noqa: E731
        return {"total_mb": mb(self.total), "params_mb": mb(self.params), "optimizer_mb": mb(self.optimizer), "grads_mb": mb(self.grads),
                "ddp_buckets_mb": mb(self.buckets), "activations_mb": mb(self.activations), "codec_mb": mb(self.codec)}


@dataclass
class MemoryModel:
    grad_bytes: float
    saved: dict[int, float]  # graph layer id -> activation bytes it saves for backward
    outside: float  # saved between leaf modules (loss, functional ops)
    optimizer_state: float = 1.0

    @classmethod
    def from_profile(cls, g: Graph, order: GradientOrder, layer_saved_bytes: dict[str, int], optimizer: str = "momentum") -> "MemoryModel":
        if optimizer not in OPTIMIZER_STATE:
            raise DagprofError(f"--optimizer-state takes {', '.join(OPTIMIZER_STATE)}, got {optimizer!r}")
        if not layer_saved_bytes:
            raise DagprofError("the profile has no activation sizes (layer_saved_bytes); profile again with this dagprof to estimate memory")
        ids = {name: i for i, name in enumerate(g.layers)}
        saved = {ids[k]: float(v) for k, v in layer_saved_bytes.items() if k in ids}
        return cls(float(order.total_bytes), saved, float(layer_saved_bytes.get(SAVED_OUTSIDE_LAYERS, 0)), OPTIMIZER_STATE[optimizer])

    def freed(self, seg: Segment) -> float:
        """Activation bytes recomputing ``seg`` frees (all it saves but its input)."""
        inner = sum(self.saved.get(lay, 0.0) for lay in seg.layers)
        return max(inner - self.saved.get(seg.layers[0], 0.0), 0.0)

    def peak(self, recompute: list[Segment] = (), codec: Codec = Codec(), bucket_view: bool = False,
             largest_bucket: float = 0.0) -> MemoryBreakdown:
        freed = [self.freed(s) for s in recompute]
        acts = sum(self.saved.values()) + self.outside - sum(freed) + max(freed, default=0.0)
        extra = {"powersgd": self.grad_bytes, "fp16": largest_bucket / 2, "bf16": largest_bucket / 2}.get(codec.name, 0.0)
        return MemoryBreakdown(self.grad_bytes, self.optimizer_state * self.grad_bytes, self.grad_bytes,
                               0.0 if bucket_view else self.grad_bytes, acts, extra)
