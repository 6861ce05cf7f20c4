"""Scaling predictions over worker counts and policies, anchored on a measured single-worker iteration."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import DagprofError
from ..traces.layerwise import LayerProfile
from ..units import count
from .closed import Prediction, closed_form
from .comm import CommModel
from .dag import replay_jitter, replay_schedule
from .schedule import Policy, make_schedule

PROFILER_SHARE = 0.10  # a profile's compute may exceed the unprofiled single-worker iteration by this share: the profiler's
# own cost (the S-SGD testbed's quiet 1-rank steps ran 0.4 % under their profiled compute; dagprof's hooks cost a few %)
ITER_GAP_PCT = 2.0  # a measured iteration beyond one worker this close to the model's goes unsaid (whatif's model tolerance)


def anchor(profile: LayerProfile, iter_time_1_us: float) -> LayerProfile:
    """Give the profile a single-worker iteration of ``iter_time_1_us`` by adding what it lacks (or, where its compute
    exceeds it by up to ``PROFILER_SHARE``, the profiler's own cost, by scaling every layer down to it).

    rest = measured - (forward + backward + update); I/O is taken as prefetched and hidden.
    Without recorded forward times (B-Caffe logs) ``rest`` BECOMES the forward pass, spread over
    layers in proportion to their backward time; with them, it is added to the update (an
    'other' serial term: optimizer, framework overhead). Either way it runs on the compute device
    and overlaps nothing, so the split does not change any predicted iteration time.
    """
    known = float(profile.forward_or_zero().sum() + profile.backward_us.sum() + profile.update_us)
    rest = iter_time_1_us - known
    if rest < -PROFILER_SHARE * iter_time_1_us:
        raise DagprofError(f"single-worker iteration {iter_time_1_us / 1e6:.4f} s is shorter than the profile's own compute {known / 1e6:.4f} s",
                           profile.source or None)
    if rest < 0:  # the profiled ops carry the profiler's own cost: removed evenly, so they fill the measured iteration
        k = iter_time_1_us / known
        fwd = None if profile.forward_us is None else profile.forward_us * k
        return profile.with_(forward_us=fwd, backward_us=profile.backward_us * k, update_us=profile.update_us * k,
                             meta=replace(profile.meta, anchored=f"the profile's compute {known / 1e6:.4f} s exceeds the single-worker "
                                          f"iteration {iter_time_1_us / 1e6:.4f} s by {-rest / iter_time_1_us:.1%} (the profiler's own cost): "
                                          "every layer scaled to fill it"))
    if profile.forward_us is None:
        share = profile.backward_us / profile.backward_us.sum() if profile.backward_us.sum() > 0 else np.full(profile.num_layers, 1 / profile.num_layers)
        return profile.with_(forward_us=rest * share, meta=replace(profile.meta, anchored="forward = iter_time_1 - backward - update"))
    return profile.with_(update_us=profile.update_us + rest, meta=replace(profile.meta, anchored="update += iter_time_1 - forward - backward - update"))


def anchor_single_worker(profile: LayerProfile, iter_time_1_us: float | None, notes: list[str]) -> tuple[LayerProfile, float | None]:
    """``anchor`` on the single-worker iteration given, else on the profile's own when it was measured on one worker.

    Returns the profile and the single-worker iteration used (None: none known, and forward
    times the profile lacks are taken as 0, as ``notes`` says).
    """
    iter_1 = iter_time_1_us if iter_time_1_us is not None else (profile.iter_us if profile.workers == 1 else None)
    if iter_1 is None:
        if profile.forward_us is None:
            notes.append("no forward times and no single-worker iteration time: forward taken as 0, so communication looks relatively larger")
        return profile, None
    if iter_1 <= 0:
        raise DagprofError(f"the single-worker iteration time must be positive, got {iter_1 / 1e6:g} s")
    profile = anchor(profile, iter_1)
    notes.append(profile.meta.anchored)
    return profile, iter_1


def measured_iteration_note(profile: LayerProfile, rows: list[ScalingRow], iter_1: float | None) -> str | None:
    """What became of the profile's own measured iteration (``iter_us`` at ``workers``) where nothing else says it:
    overridden by another single-worker anchor, or, beyond one worker, compared with the model's row there (the rows
    stay the layer times'; a gap over ``ITER_GAP_PCT`` said, as ``whatif`` says its model's)."""
    if profile.iter_us is None or profile.workers is None:
        return None
    given = f"{os.path.basename(profile.source)}'s iter_us {profile.iter_us / 1e3:.2f} ms measured on {count(profile.workers, 'worker')}"
    if profile.workers == 1:
        return None if iter_1 == profile.iter_us else f"{given} not used: --iter-time-1 {iter_1 / 1e3:.2f} ms anchors the layers"
    row = next((r for r in rows if r.workers == profile.workers), None)
    if row is None:
        return f"{given} not compared: {profile.workers} is not among --workers"
    gap = 100.0 * (row.iter_us - profile.iter_us) / profile.iter_us
    if abs(gap) <= ITER_GAP_PCT:
        return None
    return (f"{given}, the layer times model {row.iter_us / 1e3:.2f} ms there ({gap:+.1f} %): the rows are the layer times', "
            "iter_us only checks them")


@dataclass(frozen=True)
class ScalingRow:
    """One policy at one worker count; speed-up and efficiency are against ONE worker of the same policy (weak scaling)."""

    workers: int
    iter_us: float
    comm_exposed_us: float
    comm_us: float
    speedup: float  # N t(1) / t(N)
    efficiency: float  # t(1) / t(N): 1.0 = linear
    comm_source: str


@dataclass
class Scaling:
    """The policy table: every policy at every requested worker count, built once."""

    policy: Policy  # the one asked for: ``rows``
    workers: list[int]
    table: dict[Policy, list[ScalingRow]]  # every policy, one row per worker count
    groups: dict[int, int] = field(default_factory=dict)  # mg-wfbp group count per worker count
    max_replay_rel_diff: float | None = None  # closed form vs DAG replay, when checked

    @property
    def rows(self) -> list[ScalingRow]:
        return self.table[self.policy]

    def gain_over_sequential(self, p: Policy) -> list[float]:
        """How many times faster than no overlap at all, per worker count."""
        return [s.iter_us / r.iter_us for s, r in zip(self.table[Policy.SEQUENTIAL], self.table[p])]


def predict(profile: LayerProfile, workers: list[int], comm: CommModel, policy: Policy = Policy.WFBP, check_replay: bool = False,
            jitter_samples: int = 0, contention: bool = True) -> Scaling:
    """Every policy at every worker count by the closed forms; ``check_replay`` also replays the DAG and records the largest disagreement.

    ``jitter_samples`` > 0: the iteration on more than one worker is instead ``replay_jitter``'s (workers drawing
    profiled steps at random, the all-reduces waiting for the slowest); the closed-form check stays on the medians.
    ``contention`` (where ``comm`` holds a measurement for the worker count): the iteration is the DAG's replayed with
    compute and all-reduces slowing each other (``contended_replay``), which no closed form gives; mg-wfbp's groups are
    still chosen without it (its merging can come out slower than fused under contention)."""
    if not workers or min(workers) < 1:
        raise DagprofError(f"worker counts must be >= 1, got {workers}")
    counts = sorted(set(workers) | {1})
    by_policy: dict[Policy, list[Prediction]] = {p: [] for p in Policy}
    groups: dict[int, int] = {}
    worst = 0.0
    for n in counts:
        for p in Policy:
            schedule = make_schedule(profile, p, n, comm)
            closed = closed_form(profile, schedule)
            slowed = comm.contention_at(n) if contention else None
            if jitter_samples and n > 1:
                by_policy[p].append(replace(closed, iter_us=replay_jitter(profile, schedule, jitter_samples, contention=slowed)))
            else:
                by_policy[p].append(closed if slowed is None else replay_schedule(profile, schedule, contention=slowed))
            if p == Policy.MG_WFBP:
                groups[n] = schedule.num_groups
            if check_replay:
                dag = replay_schedule(profile, schedule)
                worst = max(worst, abs(dag.iter_us - closed.iter_us) / max(closed.iter_us, 1e-12))
    keep = [k for k, n in enumerate(counts) if n in workers]
    table = {p: [_row(counts[k], preds[k], preds[0].iter_us, comm) for k in keep] for p, preds in by_policy.items()}
    return Scaling(Policy(policy), [counts[k] for k in keep], table, {n: g for n, g in groups.items() if n in workers},
                   worst if check_replay else None)


def _row(n: int, pred: Prediction, single_us: float, comm: CommModel) -> ScalingRow:
    eff = single_us / pred.iter_us if pred.iter_us > 0 else float("nan")
    return ScalingRow(n, pred.iter_us, pred.comm_exposed_us, pred.comm_us, n * eff, eff, comm.describe(n))
