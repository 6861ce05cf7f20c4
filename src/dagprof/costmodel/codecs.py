"""Measured costs of gradient compression on this machine (numbers only; ``collect.measure.codec_costs`` measures them).

fp16/bf16: casting a bucket to the wire type (encode, on the thread that runs backward, inside
the comm hook) and back (decode, in the all-reduce's completion callback), per fp32 byte.
PowerSGD rank r, per parameter: ``encode`` (error feedback and P = M Q, in the hook),
``middle`` (orthogonalise P, Q = M^T P, between the P and Q all-reduces) and ``decode``
(M = P Q^T and the error update, after the Q all-reduce), in microseconds; and the same three stretches
of torch's own ``powerSGD_hook`` run whole on a bucket of this one gradient in a one-process group (its
all-reduces then cost next to nothing), less a bucket that compresses nothing, each the fastest of alternating
runs: everything the hook does for the gradient, its allocations and Python included (the 16,384 x 64 embedding at
rank 2 on the 2-core VM: 1,039 / 506 / 862 us against kernels of 984 in all). ``passes.compression`` prices with these.
"""
from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import astuple, dataclass, field
from typing import Annotated, Literal

import msgspec

from ..errors import DagprofError
from ..fsutil import atomic_open, read_input

FORMAT = "dagprof-codec-costs"
VERSION = 1
MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: compress a matrix only when that saves 2x
CodecName = Literal["none", "fp16", "bf16", "powersgd"]  # as the strategy file stores it (``compression.codec``)
# A cost in microseconds (or per byte) as a file holds it: a finite number >= 0 (a kept file edited by hand or by another
# tool is refused naming the field: a NaN or negative cost reached the replay as an op of no valid length, an infinite one
# hid PowerSGD); the upper bound (317 years in microseconds) refuses infinity
Cost = Annotated[float, msgspec.Meta(ge=0.0, le=1e16)]


@dataclass(frozen=True)
class Codec:
    """A gradient codec: what the optimizer chooses, ``passes.compression`` prices and ``dagprof.apply`` deploys.

    Defined here, below both the passes and the strategy schema (``collect.deploy.strategy.Compression``
    stores ``name`` and ``rank`` as its ``codec`` and ``rank`` fields), so there is one set of names and labels.
    """

    name: CodecName = "none"
    rank: int = 0  # PowerSGD's matrix approximation rank

    @property
    def lossy(self) -> bool:
        return self.name != "none"

    def label(self) -> str:
        return {"none": "no compression", "fp16": "fp16 hook", "bf16": "bf16 hook"}.get(self.name, f"PowerSGD rank {self.rank}")


@dataclass(frozen=True)
class PowerSGDCost:
    encode_us: Cost
    middle_us: Cost
    decode_us: Cost
    # torch's hook whole on a bucket of this gradient, less a bucket that compresses nothing (all 0: not measured):
    hook_issue_us: Cost = 0.0  # to its first all-reduce
    hook_middle_us: Cost = 0.0  # between its first and last all-reduce
    hook_decode_us: Cost = 0.0  # after its last all-reduce

    @property
    def whole(self) -> bool:
        return self.hook_issue_us + self.hook_middle_us + self.hook_decode_us > 0


@dataclass
class CodecCosts:
    encode_us_per_byte: dict[str, Cost]  # "fp16"/"bf16" -> us per fp32 byte
    decode_us_per_byte: dict[str, Cost]
    powersgd: dict[int, dict[str, PowerSGDCost]] = field(default_factory=dict)  # rank -> parameter -> cost
    copy_us_per_byte: Cost = 0.0  # a plain memory copy (PowerSGD's clone, cat and error update)
    machine: str = ""
    reference_op_us: Cost = 0.0  # collect.measure.overlap's reference op timed beside these costs (0: not timed)
    powersgd_bucket_us: Cost = 0.0  # torch's PowerSGD hook whole on a bucket of one scalar: its cost per bucket (0: not measured)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # each measured gradient's shape (empty: older files kept none)

    def scaled(self, factor: float) -> "CodecCosts":
        """Every cost ``factor`` times as large (costs from an idle core, used inside a busier job)."""
        return CodecCosts({k: v * factor for k, v in self.encode_us_per_byte.items()}, {k: v * factor for k, v in self.decode_us_per_byte.items()},
                          {r: {p: PowerSGDCost(*(v * factor for v in astuple(c)))
                               for p, c in per.items()} for r, per in self.powersgd.items()},
                          self.copy_us_per_byte * factor, self.machine, self.reference_op_us * factor, self.powersgd_bucket_us * factor,
                          self.shapes)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **msgspec.to_builtins(self, str_keys=True)}

    @classmethod
    def from_dict(cls, d: dict, path: str | None = None) -> "CodecCosts":
        """The costs a file's document holds, typed by their fields (each a ``Cost``; PowerSGD's ranks, JSON's string keys,
        as numbers), else refused in one line naming the field."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise DagprofError("not a dagprof codec-cost file", path)
        if (version := d.get("version", VERSION)) != VERSION:  # files before the version was written are version 1
            raise DagprofError(f"codec-cost layout version {version!r}, this dagprof reads {VERSION}: written by another dagprof", path)
        try:
            return msgspec.convert(d, cls, str_keys=True)
        except msgspec.ValidationError as err:
            raise DagprofError(f"malformed codec-cost file: {err}", path) from None

    def save(self, path: str) -> None:
        with atomic_open(path) as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "CodecCosts":
        path = os.fspath(path)
        try:
            return cls.from_dict(json.loads(read_input(path)), path)
        except (ValueError, UnicodeDecodeError) as err:
            raise DagprofError(f"cannot read codec costs: {err}", path) from None


def this_machine() -> str:
    """The machine the costs are measured on, as ``CodecCosts.machine`` names it (its host name and processor)."""
    return f"{platform.node()} {platform.processor() or platform.machine()}"


def powersgd_split(shape: tuple[int, ...], rank: int) -> tuple[int, int, int]:
    """(uncompressed, P, Q) elements of one gradient under PowerSGD rank ``rank`` (torch's rule)."""
    numel = math.prod(shape)
    n = shape[0] if shape else 1
    m = numel // max(n, 1)
    r = min(n, m, rank)
    if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
        return 0, n * r, m * r
    return numel, 0, 0
