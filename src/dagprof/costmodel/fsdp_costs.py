"""FSDP2's own costs that a DDP profile cannot show, measured once on the user's machine (``dagprof calibrate``).

A DDP profile times DDP's optimizer on whole plain tensors and DDP's bucket copies; FSDP2 steps the optimizer on
DTensor shards (a DTensor op dispatches through its sharding layer: a fixed cost per tensor that a plain tensor has
not), copies every all-gather's output into the unsharded parameters (``split_with_sizes_copy`` into freshly
allocated storage), and runs Python hooks around each unit's forward and backward (pre/post forward and backward,
copy-in, reshard frees), each blocking collective returning to a rank that must be woken. None of that scales from
DDP's numbers, so ``collect.measure.calibrate.measure_fsdp`` runs them on the user's own process group: the same
optimizer on the same small ``fully_shard`` model and on its plain copy at a few shapes, FSDP2's copy-out at a few
sizes, and one forward and backward of a stack of small units against the same plain stack, less the all-gathers
and reduce-scatters it ran as the sweep times them; then the same for a stack of units of MBs, whose cost per unit
beyond its collectives grows with the unit's bytes (first touch of the freshly allocated gathered parameters and
gradients, FSDP's copy-in and copy-out passes over them, the wake-up after longer collectives): the slope between the
two sizes, less the copy-out's own, is that growth. The DDP -> FSDP conversion (``passes.data_parallel``) scales the
profile's measured optimizer step by the ratio of the two fits, prices each copy-out by the measured time per byte,
and gives each unit the measured time per unit beyond its collectives at its bytes. Stored under ``fsdp`` in the
link-model file (version 3; ``costmodel.topology``; a file written before the large units were measured has no
growth: 0). DDP's own passes over its buckets (each gradient scaled into its bucket, the all-reduced bucket copied
back) write storage allocated long before, which FSDP's copy-out into new storage does not: the FSDP -> DDP conversion
prices them by their own measured rates (a file without them: at the copy-out's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import DagprofError


@dataclass(frozen=True)
class StepFit:
    """An optimizer step's time: ``us_per_tensor`` per parameter tensor it updates plus ``us_per_byte`` per byte of them."""

    us_per_tensor: float
    us_per_byte: float

    def us(self, tensors: int, nbytes: float) -> float:
        return self.us_per_tensor * tensors + self.us_per_byte * nbytes

    @classmethod
    def fit(cls, points: list[tuple[int, int, float]]) -> "StepFit":
        """Least squares over (tensors, bytes, us), both terms >= 0 (when the joint fit makes one negative, the
        better of the two one-term fits: timing noise must not give a term a negative cost)."""
        a = np.array([[t, b] for t, b, _ in points], dtype=float)
        y = np.array([u for _, _, u in points], dtype=float)
        if len(points) < 2 or not (y > 0).all():
            raise DagprofError(f"need >= 2 positive optimizer timings to fit a step, got {points}")
        coef = np.linalg.lstsq(a, y, rcond=None)[0]
        if (coef >= 0).all():
            return cls(float(coef[0]), float(coef[1]))
        one = [np.array([y @ a[:, k] / (a[:, k] @ a[:, k]) if k == j else 0.0 for k in range(2)]) for j in range(2)]
        best = min(one, key=lambda c: float(np.sum((a @ c - y) ** 2)))
        return cls(float(best[0]), float(best[1]))


def step_ratio(plain: StepFit, dtensor: StepFit, tensors: int, nbytes: float, world: int) -> float:
    """The ``dtensor`` step on ``world`` ranks' shards over the ``plain`` one on the whole ``tensors`` of ``nbytes``."""
    whole = plain.us(tensors, nbytes)
    return dtensor.us(tensors, nbytes / max(world, 1)) / whole if whole > 0 else 1.0 / max(world, 1)


class StepFits(NamedTuple):
    """AdamW's step on plain tensors and on DTensor shards, one torch version (``DTENSOR_STEP``)."""

    plain: StepFit
    dtensor: StepFit


# torch version (major.minor) -> (plain, DTensor) fits of AdamW's step in CPU time, 2 gloo ranks: bench/dtensor_optimizer.py
# under the lock, not fitted to any job. Without a calibrate --fsdp file, a DDP profile prices FSDP2's step as its own step
# times their ratio at the job's tensors and bytes (the profile's step holds its machine's speed and load's waits, the ratio
# what DTensor adds per op); a version not here is not priced and says so. torch 2.13: three runs of 3 rounds pooled
# (2026-12-06 08:01-08:06 at load 4.5-6.7 and 09:23 alone under the lock at load 2.9; each run's own DTensor fit 161 / 170 /
# 210 us a tensor, 0.00078 / 0.00082 / 0.00074 per shard byte): DTensor 180 us a tensor + 0.00078 per shard byte, plain 24 +
# 0.00103 (the convnet's and ResNet's FSDP2 jobs stepped 166-362 and 183-187 us a tensor). The 2026-12-05 runs (07:46-07:47,
# load 2.6-3.7) had given DTensor 527 us a tensor, plain 37: 2.1x the convnet's own step, a price that had covered the LM/GRU
# pairs' unpriced bytes (``passes.data_parallel.no_bandwidth``; docs/evidence.md, branches ddpfsdpconv and ddpfsdp57).
DTENSOR_STEP = {"2.13": StepFits(StepFit(23.70, 0.0010269), StepFit(180.23, 0.00078163))}


def dtensor_step_ratio(torch_minor: str, tensors: int, nbytes: float, world: int) -> float | None:
    """``DTENSOR_STEP``'s ratio for a profile of torch ``torch_minor`` (``GraphMeta.torch_minor``); None where not measured."""
    fits = DTENSOR_STEP.get(torch_minor)
    return step_ratio(*fits, tensors, nbytes, world) if fits and tensors else None


@dataclass(frozen=True)
class UnitHostFit:
    """A unit's host work in one pass (forward or backward) beyond its collectives and its copy-out, CPU us:
    ``us`` per unit, ``us_per_tensor`` per parameter tensor, ``us_per_byte`` per byte of its parameters. A DDP profile
    knows a unit's trained tensors only (its buckets'), so the conversion counts those: a unit's frozen tensors' hooks
    are unpriced (a LoRA block's)."""

    us: float
    us_per_tensor: float
    us_per_byte: float

    def at(self, tensors: int, nbytes: float) -> float:
        return self.us + self.us_per_tensor * tensors + self.us_per_byte * nbytes


@dataclass(frozen=True)
class FsdpHost:
    """FSDP2's host work a DDP profile never ran, measured once per torch version (``bench/fsdp_host_costs.py``): each
    unit's hooks, copy-ins, gradient views and reshard frees per pass (CPU time: a profile's own waits for a core
    stretch it, ``passes.data_parallel``), and gloo's fixed cost per blocking call (wall time: the hand-offs between the
    ranks' threads and gloo's, which DDP's few all-reduces of one bucket size cannot split from their bytes):
    ``call_us`` an all-gather's (every FSDP collective's), ``scatter_us`` what a reduce-scatter costs beyond it. A job's
    blocking calls run one after another, so each is its mean over repetitions, tail included: gloo's reduce-scatter
    returns about 4 ms late in about a third of its calls at any size from 4 KiB to 1 MiB (``bench/fsdp_call_sizes.py``),
    its all-gather far less often, so a small reduce-scatter's mean is 1.1-2.0 ms where its median is 0.3-1.9.
    ``release_us`` + ``release_us_per_byte`` per gathered byte: how much later than the first rank gloo's all-gather
    releases the other where the ranks compute between their calls, as a job does, beyond the release ``call_us`` holds
    (timed from a barrier); which rank alternates (``bench/fsdp_release.py``). A DDP profile's link, fitted where its
    first rank saw each all-reduce done, holds none of it. ``call_us_per_byte``: what gloo's calls cost per all-reduce-equivalent
    byte beyond ``call_us`` (the slope of the all-gathers' means over 4 KiB-1 MiB), the price of FSDP's bytes where the DDP
    profile's collectives showed no bandwidth (``passes.data_parallel.no_bandwidth``)."""

    forward: UnitHostFit
    backward: UnitHostFit
    call_us: float
    scatter_us: float = 0.0
    release_us: float = 0.0
    release_us_per_byte: float = 0.0
    call_us_per_byte: float = 0.0


# torch version (major.minor) -> FSDP2's host work (``FsdpHost``): measured under the lock held alone, 2 gloo ranks, not fitted to
# any job; a version not here is not priced and says so. torch 2.13, 2026-12-05: the hooks by bench/fsdp_host_costs.py (20:09,
# 3 rounds pooled, load 4.8-5.0): a unit's 0.36 ms forward, 0.51 backward, 0.022 / 0.020 more per tensor, 0.16 / 0.31 ms per
# MiB beyond the copy-out (CPU 0.09 us per KB, priced apart). The same bench at load 9.8-10.3 (09:01) had timed 0.45 / 0.84
# ms and 0.12 per tensor: their CPU time did not hold under that load, so the quiet figure, the profile's stretch on
# top. The fixed cost per call by bench/fsdp_call_sizes.py (45 repetitions per size), the intercept of
# each size's mean over 4-256 KiB, the mean of two runs: all-gather 0.49 and 0.60 ms, reduce-scatter 1.57 and 1.39 (20:27,
# load 2.6-2.7; 20:45, load 1.9; the medians' intercepts 0.10 and 0.95 in the first; the hooks' bench at load 5 gave the
# means' 0.85 and 2.35 over 4-64 KiB).
# The all-gather's later release by bench/fsdp_release.py (2026-12-06, alone under the lock, 2 x 40 calls a size, 16 KiB-4 MiB):
# the mean of each call's later return less the first, a line in the bytes. 01:29 (load 3.8): back to back 0.09 ms + 0.12 per
# MiB, from a barrier 0.11 + 0.12; 01:54 (load 5): back to back 0.15 per MiB. 02:17 (load falling from 12 after others' work,
# the sweep's threads 1.14x their CPU): from a barrier 0.11 ms + 0.17 per MiB, with 3 ms of compute between the calls 0.31 ms +
# 0.16 per MiB (median 0.03-0.22 ms, p90 0.9-3.4: a tail, as the kept FSDP2 jobs' 0.15-0.99 ms means over medians of
# 0.02-0.13). Priced: the compute's release beyond the barrier's (in ``call_us``), 0.20 ms, and its 0.16 ms per MiB.
# Beside a 2-rank DDP job (load 5-9) the release was 2.5-12x as long (medians; with compute between the calls 3.2 ms: the other's compute).
# Against the compute between the calls (2026-12-06 03:58, alone, load 2.5-3.1, the sweep's threads 1.25x their CPU; 3 x 60 calls a
# size): two-valued, not a line in the compute. Back to back the all-gather's mean 0.03-0.82 ms (0.07 pooled up to 1 MiB); with 2,
# 5, 10, 20 ms of compute 0.95 / 2.30 / 1.62 / 2.08 pooled, 0.25-0.62 of the calls a scheduler slice late (those a median 2.2-3.9 ms:
# with 2 ms of compute the other rank's whole 2 ms) and the rest together (the sizes' medians 0.03-2.7). How often follows the load,
# not the compute beyond 2 ms nor the bytes: across 63 kept DDP/FSDP pairs the FSDP2 jobs' mean release was 0.20 ms + 3.5 ms x
# (their own stretch - 1) (Pearson +0.84; bench/fsdp_fresh/release_load.py), and no load the DDP profile records tracks it (its
# stretch: Spearman -0.08). So the quiet price stays: the 47 jobs at a stretch below 1.1 released a median 0.34 ms a call.
# The cost per byte beyond the call's: the all-gathers' means of the same bench, 4 KiB-1 MiB, one line through the three
# runs kept (2026-12-05 20:27 and 20:45 as above, and 21:14 at load 1.7 in q52's hold): 1.863 ns per all-reduce-equivalent
# byte (each run's own 1.91 / 1.79 / 1.88; their medians' 1.23 / 1.50 / 1.93); the reduce-scatters' lines lose it in their
# tail (-0.04 to +1.16), so the all-gathers' for both kinds, as the link model prices both by their all-reduce equivalent.
FSDP_HOST: dict[str, FsdpHost] = {"2.13": FsdpHost(UnitHostFit(359.3, 21.58, 1.483e-4), UnitHostFit(514.8, 20.20, 2.983e-4),
                                                   call_us=(491.0 + 602.0) / 2, scatter_us=(1574.0 + 1392.0) / 2 - (491.0 + 602.0) / 2,
                                                   release_us=0.314e3 - 0.110e3, release_us_per_byte=0.159e3 / 2**20,
                                                   call_us_per_byte=1.863e-3)}


@dataclass(frozen=True)
class FsdpCosts:
    """What ``dagprof calibrate`` measured of FSDP2 on the user's group (module docstring)."""

    world: int  # ranks of the group that measured (the DTensor step was timed on 1/world shards)
    plain_step: StepFit  # the optimizer on whole plain tensors (DDP's)
    dtensor_step: StepFit  # the same optimizer on fully_shard's DTensor shards (bytes: the shard's)
    copy_out_us_per_byte: float  # FSDP2's copy-out of an all-gather into freshly allocated parameters
    unit_forward_us: float  # per unit, its forward's cost beyond its all-gather (hooks, copy-in/out, the wake-up after it)
    unit_backward_us: float  # per unit, its backward's beyond its all-gather and reduce-scatter
    optimizer: str = "AdamW"  # what was timed: the ratio is this optimizer's
    unit_forward_us_per_byte: float = 0.0  # growth of unit_forward_us per byte of the unit's parameters, beyond its copy-out's
    unit_backward_us_per_byte: float = 0.0  # the same for unit_backward_us (beyond its backward all-gather's copy-out)
    bucket_in_us_per_byte: float = 0.0  # DDP's scaled copy of each gradient into its bucket (0: not measured)
    bucket_out_us_per_byte: float = 0.0  # DDP's copy of an all-reduced bucket back into the gradients (0: not measured)

    def unit_us(self, phase: str, nbytes: float) -> float:
        """A unit of ``nbytes`` parameters: its ``phase`` pass's cost beyond its collectives and its copy-outs."""
        if phase == "forward":
            return self.unit_forward_us + self.unit_forward_us_per_byte * nbytes
        return self.unit_backward_us + self.unit_backward_us_per_byte * nbytes

    def step_ratio(self, tensors: int, nbytes: float, world: int) -> float:
        """FSDP's step on ``world`` ranks' shards over DDP's on the whole ``tensors`` of ``nbytes``."""
        return step_ratio(self.plain_step, self.dtensor_step, tensors, nbytes, world)

    def to_dict(self) -> dict[str, Any]:
        return {"world": self.world, "optimizer": self.optimizer, "copy_out_us_per_byte": self.copy_out_us_per_byte,
                "unit_forward_us": self.unit_forward_us, "unit_backward_us": self.unit_backward_us,
                "unit_forward_us_per_byte": self.unit_forward_us_per_byte, "unit_backward_us_per_byte": self.unit_backward_us_per_byte,
                "bucket_in_us_per_byte": self.bucket_in_us_per_byte, "bucket_out_us_per_byte": self.bucket_out_us_per_byte,
                "plain_step": _fit_dict(self.plain_step), "dtensor_step": _fit_dict(self.dtensor_step)}

    @classmethod
    def from_dict(cls, d: Any, source: str = "link model") -> "FsdpCosts":
        try:
            costs = cls(int(d["world"]), StepFit(**d["plain_step"]), StepFit(**d["dtensor_step"]), float(d["copy_out_us_per_byte"]),
                       float(d["unit_forward_us"]), float(d["unit_backward_us"]), str(d.get("optimizer", "AdamW")),
                       float(d.get("unit_forward_us_per_byte", 0.0)), float(d.get("unit_backward_us_per_byte", 0.0)),
                       float(d.get("bucket_in_us_per_byte", 0.0)), float(d.get("bucket_out_us_per_byte", 0.0)))
        except (KeyError, TypeError, ValueError) as err:
            raise DagprofError(f"bad fsdp entry ({err!r}); need world, plain_step, dtensor_step (us_per_tensor, us_per_byte), "
                               "copy_out_us_per_byte, unit_forward_us, unit_backward_us", source) from None
        # a NaN or negative cost (a damaged file) would price every FSDP unit or optimizer step NaN or below nothing
        flat = [(f"{k}.{kk}" if isinstance(v, dict) else k, vv) for k, v in costs.to_dict().items() if k != "optimizer"
                for kk, vv in (v.items() if isinstance(v, dict) else [("", v)])]
        bad = next(((k, v) for k, v in flat if not 0 <= v < float("inf") or (k == "world" and v < 1)), None)
        if bad is not None:
            raise DagprofError(f"bad fsdp entry: {bad[0]} must be a finite number >= {1 if bad[0] == 'world' else 0}, got {bad[1]!r}", source)
        return costs


def _fit_dict(f: StepFit) -> dict[str, float]:
    return {"us_per_tensor": f.us_per_tensor, "us_per_byte": f.us_per_byte}


def optimizer_ratio(costs: FsdpCosts | None, torch_minor: str, tensors: int, nbytes: float, world: int) -> float | None:
    """FSDP2's optimizer step on ``world`` ranks' DTensor shards over a profile's on the plain whole ``tensors`` of
    ``nbytes``: as ``calibrate --fsdp`` measured it on the user's machine (``costs``), else ``DTENSOR_STEP``'s for the
    profile's torch version ``torch_minor`` (DTensor's dispatch per op, about 14x a plain op's on 4 KiB tensors at torch
    2.13); None: neither, or no tensors."""
    if not tensors:
        return None
    return costs.step_ratio(tensors, nbytes, world) if costs is not None else dtensor_step_ratio(torch_minor, tensors, nbytes, world)
