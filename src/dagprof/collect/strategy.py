"""The strategy file: what the optimizer found, in a form ``dagprof.apply`` deploys on PyTorch DDP.

A versioned JSON document written by ``dagprof optimize`` (the search layer builds it) and read
by ``apply`` (this layer, which configures torch). Like the run-file format it is a contract
between two layers, so it lives with the code that consumes it and imports nothing.

Buckets are named by parameter, in gradient-ready order (DDP's order after its first-iteration
rebuild), so a strategy for another model (other names or sizes) is recognised and refused.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from ..errors import DagprofError
from ..fsutil import atomic_open

FORMAT = "dagprof-strategy"
VERSION = 1
CODECS = ("none", "fp16", "bf16", "powersgd")
LOSSY_CAVEAT = ("lossy gradient compression changes what the optimizer sees (fp16/bf16 round gradients, PowerSGD "
                "approximates them at low rank with error feedback): check accuracy and convergence on your job before adopting it")
ACCUMULATION_CAVEAT = "gradient accumulation multiplies the effective batch: retune the learning rate, and compare time per sample"


@dataclass(frozen=True)
class Bucket:
    """One all-reduce: parameters in gradient-ready order, their gradient bytes, the layers they belong to."""

    params: tuple[str, ...]
    nbytes: int
    layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Compression:
    codec: str = "none"  # one of CODECS
    rank: int = 0  # PowerSGD's matrix approximation rank
    start_iter: int = 2  # PowerSGD: plain all-reduce before this iteration (DDP rebuilds buckets after iteration 0)

    @property
    def lossy(self) -> bool:
        return self.codec != "none"

    def label(self) -> str:
        return {"none": "no compression", "fp16": "fp16 hook", "bf16": "bf16 hook"}.get(self.codec, f"PowerSGD rank {self.rank}")


@dataclass(frozen=True)
class Prediction:
    baseline_ms: float  # the profiled configuration, replayed with the same model
    strategy_ms: float  # per optimizer step divided by the micro-batches (time per profiled batch)
    candidates_replayed: int = 0

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.strategy_ms


@dataclass(frozen=True)
class Strategy:
    model: tuple[tuple[str, int], ...]  # (parameter name, elements) of every parameter with a gradient
    world_size: int
    buckets: tuple[Bucket, ...] | None = None  # None: keep DDP's layout
    compression: Compression = field(default_factory=Compression)
    partition: int = 1  # each bucket all-reduced in this many pieces
    accumulate: int = 1  # micro-batches per optimizer step (no_sync for all but the last)
    recompute: tuple[str, ...] = ()  # module paths run under torch.utils.checkpoint
    grad_as_bucket_view: bool = False  # DDP gradient_as_bucket_view: no second copy of the gradients
    prediction: Prediction | None = None
    notes: tuple[str, ...] = ()

    @property
    def lossy(self) -> bool:
        return self.compression.lossy

    def is_default(self) -> bool:
        return (self.buckets is None and not self.compression.lossy and self.partition == 1 and self.accumulate == 1
                and not self.recompute and not self.grad_as_bucket_view)

    def summary(self) -> str:
        """One plain line: "buckets at layers a|b|c, fp16 hook: predicted 630 -> 470 ms (-25 %)"."""
        parts = []
        if self.buckets is not None:
            ends = [b.layers[-1] if b.layers else b.params[-1].rpartition(".")[0] for b in self.buckets]
            parts.append(f"{len(self.buckets)} buckets ending at layers {'|'.join(ends)}")
        if self.compression.lossy:
            parts.append(self.compression.label())
        if self.partition > 1:
            parts.append(f"each bucket in {self.partition} pieces")
        if self.accumulate > 1:
            parts.append(f"{self.accumulate} micro-batches per step (no_sync)")
        if self.recompute:
            parts.append(f"recompute {', '.join(self.recompute)}")
        if self.grad_as_bucket_view:
            parts.append("gradients as bucket views")
        text = ", ".join(parts) or "keep DDP's defaults"
        if self.prediction is not None:
            p = self.prediction
            per = " per micro-batch" if self.accumulate > 1 else ""
            text += (f": predicted {p.baseline_ms:.0f} -> {p.strategy_ms:.0f} ms{per} "
                     f"({100 * (p.strategy_ms - p.baseline_ms) / p.baseline_ms:+.0f} %, {p.speedup:.2f}x)")
        return text

    def caveats(self) -> list[str]:
        out = [LOSSY_CAVEAT] if self.lossy else []
        return out + ([ACCUMULATION_CAVEAT] if self.accumulate > 1 else [])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = [list(m) for m in self.model]
        return {"format": FORMAT, "version": VERSION, "summary": self.summary(), "caveats": self.caveats(), **d}

    @classmethod
    def from_dict(cls, d: dict, path: str | None = None) -> "Strategy":
        if d.get("format") != FORMAT:
            raise DagprofError("not a dagprof strategy file (no \"format\": \"dagprof-strategy\")", path)
        if d.get("version") != VERSION:
            raise DagprofError(f"strategy file version {d.get('version')} is not supported (this dagprof reads version {VERSION})", path)
        try:
            comp = Compression(**d.get("compression") or {})
            if comp.codec not in CODECS:
                raise ValueError(f"unknown codec {comp.codec!r}")
            buckets = None if d.get("buckets") is None else tuple(
                Bucket(tuple(b["params"]), int(b["nbytes"]), tuple(b.get("layers", ()))) for b in d["buckets"])
            pred = d.get("prediction")
            return cls(
                model=tuple((str(n), int(k)) for n, k in d["model"]), world_size=int(d["world_size"]), buckets=buckets,
                compression=comp, partition=int(d.get("partition", 1)), accumulate=int(d.get("accumulate", 1)),
                recompute=tuple(d.get("recompute", ())), grad_as_bucket_view=bool(d.get("grad_as_bucket_view", False)),
                prediction=None if pred is None else Prediction(**pred),
                notes=tuple(d.get("notes", ())))
        except (KeyError, TypeError, ValueError) as err:
            raise DagprofError(f"malformed strategy file: {type(err).__name__}: {err}", path) from None


def save_strategy(s: Strategy, path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    with atomic_open(path) as f:
        json.dump(s.to_dict(), f, indent=1)
    return path


def load_strategy(path: str | os.PathLike[str]) -> Strategy:
    path = os.fspath(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as err:
        raise DagprofError(f"cannot read strategy file: {err.strerror}", path) from None
    except json.JSONDecodeError as err:
        raise DagprofError(f"strategy file is not JSON: {err.msg} at line {err.lineno}", path) from None
    if not isinstance(d, dict):
        raise DagprofError("strategy file must hold a JSON object", path)
    return Strategy.from_dict(d, path)
