"""The strategy file: what the optimizer found, in a form ``dagprof.apply`` deploys on PyTorch DDP.

A versioned JSON document written by ``dagprof optimize`` (the search layer builds it) and read
by ``apply`` (this layer, which configures torch). Like the run-file format (``traces/run_schema.py``)
it is a contract between two layers, typed as msgspec Structs, so a field exists in one place; it
lives with the code that consumes it and imports no framework (the core imports it).

Versioning, as for run files: every file carries ``format`` and ``version``; a reader accepts
``MIN_VERSION`` .. ``VERSION`` and refuses anything else in one line. A field added WITH a default
keeps the version (older readers skip it); removing, renaming or re-meaning one bumps ``VERSION``.
Version 2 added ``fsdp`` (an FSDP2 job's plan): a version-1 reader would skip it and take the file
for DDP's defaults, so a file is written as version 2 when it has one, and as version 1 (byte for
byte as before) when it does not.

Buckets are named by parameter, in gradient-ready order (DDP's order after its first-iteration
rebuild), so a strategy for another model (other names or sizes) is recognised and refused.
"""
from __future__ import annotations

import os

import msgspec

from ...costmodel.codecs import Codec, CodecName
from ...fsutil import atomic_open, read_versioned
from ...units import count

FORMAT = "dagprof-strategy"
VERSION = 2
DDP_VERSION = 1  # what a strategy without an FSDP plan is written as
MIN_VERSION = 1
LOSSY_CAVEAT = ("lossy gradient compression changes what the optimizer sees (fp16/bf16 round gradients, PowerSGD "
                "approximates them at low rank with error feedback): check accuracy and convergence on your job before adopting it")
REDUCE_DTYPE_CAVEAT = ("gradients reduced in a lower precision (FSDP's reduce dtype) round what the optimizer sees: check accuracy and "
                       "convergence on your job before adopting it")
ACCUMULATION_CAVEAT = "gradient accumulation multiplies the effective batch: retune the learning rate, and compare time per sample"


class Bucket(msgspec.Struct, frozen=True):
    """One all-reduce: parameters in gradient-ready order, their gradient bytes, the layers they belong to.

    The strategy file's own record, not the profiled ``traces.buckets.Bucket``: a planned bucket's
    index is its place in ``Strategy.buckets`` and its parameters' sizes are in ``Strategy.model``,
    while ``layers`` is for the person reading the file. One record for both would change one of two
    versioned formats: run files need ``index`` and ``shapes``; strategy files have neither (and
    version 1 files are read and written back byte for byte)."""

    params: tuple[str, ...]
    nbytes: int
    layers: tuple[str, ...] = ()


class Compression(msgspec.Struct, frozen=True):
    """The codec (``costmodel.codecs.Codec``: its ``name`` and ``rank``) and when PowerSGD starts."""

    codec: CodecName = "none"
    rank: int = 0  # PowerSGD's matrix approximation rank
    start_iter: int = 2  # PowerSGD: plain all-reduce before this iteration (DDP rebuilds buckets after iteration 0)

    @property
    def as_codec(self) -> Codec:
        return Codec(self.codec, self.rank)

    @property
    def lossy(self) -> bool:
        return self.as_codec.lossy

    def label(self) -> str:
        return self.as_codec.label()


class FsdpUnitPlan(msgspec.Struct, frozen=True, omit_defaults=True):
    """One FSDP2 unit (a ``fully_shard``-ed module) as the strategy configures it."""

    name: str  # module path, "<root>" for the root module (another root's: its prefix first, ``FsdpGraphUnit.is_root``)
    numel: int  # its own parameters' elements, unsharded (not those of units inside it): refused when the model's differ
    reshard_after_forward: bool
    root: int = 0  # which fully_shard root it is in, as the profile attached them (the first run forward first)


class FsdpPlan(msgspec.Struct, frozen=True):
    """What the optimizer chose for an FSDP2 job: each unit's ``reshard_after_forward`` and the reduce dtype.

    Prefetch depth is not part of it (measured to change nothing on gloo/CPU, not searched), nor unit grouping (a wrap-time choice:
    ``optimize`` advises it beside the strategy)."""

    units: tuple[FsdpUnitPlan, ...]
    reduce_dtype: str | None = None  # a torch dtype name ("bfloat16"); None: as the job configured it

    def label(self) -> str:
        off = [u.name for u in self.units if not u.reshard_after_forward]
        on = [u.name for u in self.units if u.reshard_after_forward]
        parts = [("reshard after forward: every unit" if not off else "keep gathered after forward: every unit" if not on
                  else f"keep gathered after forward: {', '.join(off)}")]
        if self.reduce_dtype:
            parts.append(f"reduce in {self.reduce_dtype}")
        return ", ".join(parts)

    @property
    def lossy(self) -> bool:
        return self.reduce_dtype in ("bfloat16", "float16")

    @property
    def roots(self) -> int:
        """How many ``fully_shard`` roots the plan configures (``dagprof.apply`` takes that many modules)."""
        return 1 + max((u.root for u in self.units), default=0)

    def of_root(self, k: int) -> FsdpPlan:
        """The plan of root ``k``'s units alone (``apply`` configures one root at a time)."""
        return FsdpPlan(tuple(u for u in self.units if u.root == k), self.reduce_dtype)

    def mismatch(self, units: dict[str, int], absent: str, here: str) -> str | None:
        """Why the plan does not fit ``units`` (name -> parameter elements: a model's, or a run's), or None;
        ``absent`` ends "FSDP unit X is not ...", ``here`` names where the units are."""
        names = [u.name for u in self.units]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            return f"FSDP unit {twice!r} is listed twice"
        missing = [n for n in names if n not in units]
        extra = [n for n in units if n not in names]
        if missing or extra:
            what = f"FSDP unit {missing[0]!r} is not {absent}" if missing else f"FSDP unit {extra[0]!r} {here} is not in the strategy"
            return f"{what} ({len(missing)} missing, {len(extra)} unknown of {len(names)})"
        wrong = next((u for u in self.units if u.numel != units[u.name]), None)
        if wrong is not None:
            return f"FSDP unit {wrong.name!r} has {wrong.numel} parameter elements in the strategy, {units[wrong.name]} {here}"
        return None


class Prediction(msgspec.Struct, frozen=True):
    baseline_ms: float  # the profiled configuration, replayed with the same model
    strategy_ms: float  # per optimizer step divided by the micro-batches (time per profiled batch)
    candidates_replayed: int = 0

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.strategy_ms


class Strategy(msgspec.Struct, frozen=True):
    model: tuple[tuple[str, int], ...]  # (parameter name, elements) of every parameter with a gradient
    world_size: int
    buckets: tuple[Bucket, ...] | None = None  # None: keep DDP's layout
    compression: Compression = msgspec.field(default_factory=Compression)
    partition: int = 1  # each bucket all-reduced in this many pieces
    accumulate: int = 1  # micro-batches per optimizer step (no_sync for all but the last)
    recompute: tuple[str, ...] = ()  # module paths run under torch.utils.checkpoint
    grad_as_bucket_view: bool = False  # DDP gradient_as_bucket_view: no second copy of the gradients
    prediction: Prediction | None = None
    notes: tuple[str, ...] = ()
    fsdp: FsdpPlan | None = None  # an FSDP2 job's plan (version 2); None: a DDP strategy

    @property
    def lossy(self) -> bool:
        return self.compression.lossy or (self.fsdp is not None and self.fsdp.lossy)

    def summary(self) -> str:
        """One plain line: "3 buckets ending at a, b and c, fp16 hook: predicted 630 -> 470 ms (-25 %)" (layer names in words,
        not a ``|``-joined list a reader takes for one name)."""
        parts = []
        if self.buckets is not None:
            ends = [b.layers[-1] if b.layers else b.params[-1].rpartition(".")[0] for b in self.buckets]
            parts.append(f"{count(len(self.buckets), 'bucket')} ending at {_listed(ends)}")
        if self.compression.lossy:
            parts.append(self.compression.label())
        if self.partition > 1:
            parts.append(f"each bucket in {count(self.partition, 'piece')}")
        if self.accumulate > 1:
            parts.append(f"{count(self.accumulate, 'micro-batch', 'micro-batches')} per step (no_sync)")
        if self.recompute:
            parts.append(f"recompute {', '.join(self.recompute)}")
        if self.grad_as_bucket_view:
            parts.append("gradients as bucket views")
        if self.fsdp is not None:
            parts.append(self.fsdp.label())
        text = ", ".join(parts) or "keep DDP's defaults"
        if self.prediction is not None:
            p = self.prediction
            per = " per micro-batch" if self.accumulate > 1 else ""
            text += (f": predicted {p.baseline_ms:.0f} -> {p.strategy_ms:.0f} ms{per} "
                     f"({100 * (p.strategy_ms - p.baseline_ms) / p.baseline_ms:+.0f} %, {p.speedup:.2f}x)")
        return text

    def caveats(self) -> list[str]:
        out = [LOSSY_CAVEAT] if self.compression.lossy else []
        out += [REDUCE_DTYPE_CAVEAT] if self.fsdp is not None and self.fsdp.lossy else []
        return out + ([ACCUMULATION_CAVEAT] if self.accumulate > 1 else [])


class _Document(msgspec.Struct, kw_only=True):
    """What the file holds: the header, two lines for people, then the strategy's fields (read back as a ``Strategy``)."""

    format: str = FORMAT
    version: int = VERSION
    summary: str
    caveats: list[str]


def save_strategy(s: Strategy, path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    head = msgspec.to_builtins(_Document(version=DDP_VERSION if s.fsdp is None else VERSION, summary=s.summary(), caveats=s.caveats()))
    body = msgspec.to_builtins(s)
    if s.fsdp is None:
        body.pop("fsdp", None)
    with atomic_open(path, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(head | body), indent=1))
    return path


def load_strategy(path: str | os.PathLike[str]) -> Strategy:
    """The strategy in ``path``; a missing, foreign, damaged or newer file is a one-line ``DagprofError`` naming it."""
    return read_versioned(path, Strategy, FORMAT, range(MIN_VERSION, VERSION + 1), "dagprof strategy file",
                          "run dagprof optimize again")


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: names as a sentence lists them."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
