"""The profiler's own cost, measured on the job and removed from its op times before predicting.

Recording every op (Kineto, dagprof's hooks) makes the profiled steps slower than the job's other
steps: 0-11 % on the namespace testbed. Every prediction started from those op times inherits it.
dagprof's collectors (PyTorch hooks, and the TF/JAX step window) time every step of the training loop,
profiled or not, so the cost is
measured per run: the profiled steps against the unprofiled ones (past the job's first ``WARMUP_STEPS``)
of the same job, each step timed as the job's (``job_steps``), compared by their medians: the recording costs
every profiled step, while another job's load stalls a few steps of either kind at random (on the
loaded testbed single steps took twice the others), so the median step shows the cost, the mean
mostly the stalls. The recording lands on the host: it
lengthens the compute ops and the framework gaps between them, not the wire time of a collective;
so those are what the correction shortens, by one factor found by replay, so that the model's
iteration drops by the measured share, but where the profiler's CPU explains the cost, by no more host work than the
cost can be made of (``bound_factor``: that CPU, or each rank's host ops lengthened by the step's whole excess): on a
wire-bound step the rest lies in waits, and the model then drops by less (``removed_share``), which its checks hold it to.
Nothing is corrected when the measurement is missing (a
stock torch.profiler trace has no unprofiled steps), too noisy to tell the cost from zero (unless, on a PyTorch run, the
ranks' training threads' CPU a step rose beyond its own noise: then that CPU is the cost, ``thread_cpu_cost``), or
says the profiled steps were faster, or when the unprofiled steps before and after the window differ (beyond their
noise) by more than the profiled steps exceed the slower side: the job's own speed changed, a neighbour's load came
or went, and the pooled median would book that change as the profiler's cost. ``ProfilerCost.verdict`` then says why.
A load that came and went inside the window alone is told by the ranks' CPU, recorded for every step: the profiler's
cost is work in the ranks' processes, a load is not (``split_by_cpu``). Where the waits for a core are not recorded (MXNet), an excess that
the workers' added CPU cannot make at any pace a shared machine gave is refused (``beyond_process_cpu``). The op times are still brought to the
unprofiled steps' level, the job's own pace that a later run is measured at, but the line says how much of that the
profiler's CPU explains and that the rest was a load on the machine.

The comparison relies on the steps outside the window running as in an unprofiled job: PyTorch's collector patches
and hooks for the window only and undoes it at its end (tests/test_collect_hooks.py guards it for FSDP2); what stays is
the optimizer hooks that count steps and, on DDP, a pass-through comm hook. Measured on ``bench/review6/convnext_accum.py``
(FSDP2) and ``bench/ddp_heldout_conv.py`` (DDP), the profiled jobs' steps after the window ran as a plain ``torchrun``
job's (per step, 0.95-1.03 of its process CPU time and 0.88-1.05 of its wall time in the quietest rounds): a profiled
job that runs slower than another throughout shows the machine's load at the time, which no comparison inside the job
can tell from the job's own speed.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

import numpy as np

from ..graph.build_ps import scale_server_work
from ..graph.dag import DeviceKind, Graph
from ..graph.meta import WARMUP_STEPS, LoopSteps
from ..graph.provenance import provenance
from ..traces.events import Kind
from ..traces.meta import PsRecord, runnable_stretch
from .compute import COMPUTE_KINDS, XPLANE_FRAMEWORKS

MIN_STEPS = 3  # unprofiled steps needed to measure the cost
NOISE_SIGMAS = 2.0  # the cost must exceed this many standard errors of the difference of the two means
LEAST_FACTOR = 0.05  # the least host-work factor the correction uses: some host work always stays
# the most a step's CPU work was stretched by the machine's other work where its waits for a core were recorded: a quiet
# demo run at load 6.0 (``outside_stretch``) x3.9; a job that records no waits (MXNet) gets this pace, no more
MAX_PACE = 4.0
# host work the recording slows; the collectives keep their measured times, but the host call that issues one (a DDP
# bucket's) is the training thread's work, its CPU and its waits for a core, as an op is: left out, a loaded DLRM profile's
# calls (57 ms a rank-step against 13-14 ms of the thread's CPU outside the window) stayed whole and the ops went to x0.12;
# counted, 2 -> 4 ranks DLRM -23.5 -> -2.6 % change error (the profile it was found on), held out DLRM +7.3 -> +1.2 %,
# TwoTower +23.8 -> +24.2 %, the DDP testbed's kept round 10 of 17 cells closer, 6 further by at most 0.3 points
# (docs/evidence.md, branches crfcorr67 and crfheld68). PyTorch's only: Horovod's requests are COMM_ENQUEUE too, but
# nothing measured judges counting them (crf69): where they move an answer it is a 4-ranks-on-2-cores profile's
# ``--workers 1``, its compute at the factor that brings a wait-bound step to its level (the autoencoder fixture 625 ms
# raw, 104.8 as here, 31.7 counted; one worker measured 67.2 on a later day), and a fresh profile's cost was too noisy
# to correct, so both ways answered alike (+576 %: the shared cores' compute kept, not the requests)
_CORRECTED = COMPUTE_KINDS + (Kind.DATA,)
_CORRECTED_TORCH = _CORRECTED + (Kind.COMM_ENQUEUE,)


@dataclass(frozen=True)
class ProfilerCost:
    """The profiler's cost on one run: median step (the job's, ``job_steps``) profiled against unprofiled, in us."""

    profiled_us: float | None
    unprofiled_us: float | None
    profiled_steps: int
    unprofiled_steps: int
    stderr_us: float | None  # standard error of profiled_us - unprofiled_us (robust: ``pooled_median_stderr``)
    verdict: str | None  # None: usable; else why nothing is corrected
    cpu_us: float | None = None  # the ranks' processes' CPU per profiled step beyond an unprofiled one's, together (None: not recorded)
    loaded: str | None = None  # the window ran slower than that CPU explains: the load's evidence (``split_by_cpu``)
    between_us: float | None = None  # the script's time between its timed steps, a window step's mean (``between_steps_us``)
    tf: bool = False  # a TensorFlow run: its line names TF's profiler and the ms a step removed (``_describe``)
    noisy_wall: str | None = None  # the wall steps' reading where too noisy to say: the cost is the training threads' CPU (``thread_cpu_cost``)

    @property
    def usable(self) -> bool:
        return self.verdict is None

    @property
    def share(self) -> float:
        """The share of a profiled step removed to reach the unprofiled level: 0.06 = 6 % (0 when not usable)."""
        return (self.profiled_us - self.unprofiled_us) / self.profiled_us if self.usable else 0.0

    def describe(self) -> str:
        return self._describe() + between_note(self)

    def _describe(self) -> str:
        if not self.usable:
            head = "TF profiler cost not removed" if self.tf else "op times not corrected for the profiler's cost"
            return f"{head}: {self.verdict}"
        if self.loaded is not None:
            return (f"op times brought to the unprofiled steps' level: {-100 * self.share:+.1f} % (profiled {self.profiled_us / 1e3:.1f} "
                    f"ms/step vs {self.unprofiled_us / 1e3:.1f} ms unprofiled), of which the profiler's CPU explains only "
                    f"{-100 * self.cpu_us / self.profiled_us:+.1f} %: {self.loaded}")
        if self.noisy_wall is not None:
            return (f"op times corrected for the profiler's CPU: {-100 * self.share:+.1f} % (the ranks' training threads' CPU "
                    f"{self.cpu_us / 1e3:.1f} ms a step more in the window, together, at the machine's pace outside it; the steps' "
                    f"wall times too noisy to say: {self.noisy_wall})")
        seen = (f"profiled {self.profiled_us / 1e3:.1f} ms/step vs {self.unprofiled_us / 1e3:.1f} ms unprofiled, {self.profiled_steps} "
                f"and {self.unprofiled_steps} steps")
        if self.tf:
            return (f"TF profiler cost removed: {(self.profiled_us - self.unprofiled_us) / 1e3:.1f} ms a step, op times "
                    f"{-100 * self.share:+.1f} % ({seen})")
        return f"op times corrected for the profiler's cost: {-100 * self.share:+.1f} % ({seen})"

    def to_dict(self) -> dict:
        return {"profiled_step_ms": None if self.profiled_us is None else self.profiled_us / 1e3,
                "unprofiled_step_ms": None if self.unprofiled_us is None else self.unprofiled_us / 1e3,
                "profiled_steps": self.profiled_steps, "unprofiled_steps": self.unprofiled_steps,
                "stderr_ms": None if self.stderr_us is None else self.stderr_us / 1e3,
                "share_pct": 100 * self.share, "corrected": self.usable, "verdict": self.verdict,
                "cpu_ms": None if self.cpu_us is None else self.cpu_us / 1e3, "loaded": self.loaded is not None,
                "between_steps_ms": None if self.between_us is None else self.between_us / 1e3, "from_thread_cpu": self.noisy_wall is not None,
                "text": self.describe()}


BETWEEN_SHARE = 0.03  # between-step time said where it is at least this share of a profiled step


def between_note(cost: ProfilerCost) -> str:
    """What ``describe`` adds where the script's time between its timed steps (``between_steps_us``) is at least
    ``BETWEEN_SHARE`` of a profiled step: the model's mean step holds it, the steps timed outside the window do not."""
    if cost.between_us is None or not cost.profiled_us or cost.between_us < BETWEEN_SHARE * cost.profiled_us:
        return ""
    return (f"; the window's steps also hold {cost.between_us / 1e3:.1f} ms a step of the script's own work between the "
            "steps dagprof times (fetching the next batch, a print, a loss read): in the model's steps, not in the steps timed outside the "
            "window")


def between_steps_us(g: Graph) -> float | None:
    """The script's time between the steps dagprof's collector times, a profiled step's mean (the job's: ``GraphMeta.job_of``
    of the ranks' means): each step's mark to the next in the trace (what the model replays) less the collector's timing of
    it (begin to end, what the cost is measured on, outside the window too). Not the profiler's cost: a custom loop's
    ``loss.numpy()`` and ``auc.result().numpy()`` every 4 steps (``bench/frameworks/tf_siamese_loop.py``) took 22-35 ms
    at 2 workers (51-66 at 4), 6.2-8.2 ms a window step (9.7-11.2 % of the unprofiled step), which the model's mean step
    held and the unprofiled steps did not: the 4.5-15.7 % its model stood over their median (docs/evidence.md, branch
    tfcost); ``tf/recsys-ragged`` fetches its next batch and prints outside the step (5.0 ms a step).
    TensorFlow runs only, where it was compared (a JAX step returns before its dispatched work ends, so its marks' gap
    may be the step's own: 30 ms on ``tf-jax/lstm-lm-loaded``); None elsewhere, where the graph holds no measured marks or
    the collector timed no profiled step."""
    loop, p = g.meta.loop_steps, provenance(g)
    if loop is None or p is None or g.meta.framework != "tensorflow":
        return None
    per_rank = []
    for r, timed in loop.profiled.items():
        marks = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == r))
        marks = marks[np.argsort(p.mstart[marks])]
        gaps = [float(p.mstart[b] - p.mstart[a]) - timed[int(g.step[a])] for a, b in zip(marks[:-1], marks[1:])
                if int(g.step[a]) in timed and np.isfinite(p.mstart[a]) and np.isfinite(p.mstart[b])]
        if gaps:
            per_rank.append(max(statistics.mean(gaps), 0.0))
    return float(g.meta.job_of(per_rank)) if per_rank else None


def measure_profiler_cost(g: Graph) -> ProfilerCost:
    """The profiled steps the graph holds against the job's unprofiled steps (``GraphMeta.loop_steps``), and the script's
    time between the steps timed (``between_steps_us``), which the model holds and they do not."""
    cost = replace(_measure(g), tf=g.meta.framework == "tensorflow")
    return cost if cost.profiled_us is None else replace(cost, between_us=between_steps_us(g))


def _measure(g: Graph) -> ProfilerCost:
    loop = g.meta.loop_steps
    if loop is None:
        return ProfilerCost(None, None, 0, 0, None, "not measured (no unprofiled steps: dagprof's collectors time them in PyTorch, "
                            "Horovod, TensorFlow, JAX and MXNet runs; stock traces and TF/JAX runs recorded by an older dagprof do not)")
    prof = job_steps(loop.profiled, set(g.meta.steps), g.meta.job_of)
    base = job_steps(loop.unprofiled, None, g.meta.job_of, steady_from(loop), resumed_step(loop))
    if len(prof) < 2 or len(base) < MIN_STEPS:
        return ProfilerCost(_median(prof), _median(base), len(prof), len(base), None,
                            f"not measured ({len(prof)} profiled and {len(base)} unprofiled steps from step {steady_from(loop)} on; "
                            f"needs 2 and {MIN_STEPS})")
    p, u = statistics.median(prof), statistics.median(base)
    se = pooled_median_stderr(prof, base)
    seen = f"profiled {p / 1e3:.1f} ms/step vs {u / 1e3:.1f} ms unprofiled, {100 * (u - p) / p:+.1f} % +- {100 * se / p:.1f} %"
    verdict = None
    before, after = window_sides(loop, g.meta.steps, g.meta.job_of)
    if u - p > NOISE_SIGMAS * se:
        verdict = f"the profiled steps ran faster than the others ({seen}): the machine's load changed, not a cost to remove"
    elif p - u < NOISE_SIGMAS * se:
        verdict = f"too noisy to say ({seen})"
        if g.meta.framework is None and not warmed_up_in_window(g) and (by_cpu := thread_cpu_cost(loop, set(g.meta.steps), p, seen)) is not None:
            return replace(by_cpu, profiled_steps=len(prof), unprofiled_steps=len(base))
    elif before and after:  # as the intervals' drift term (analysis.interval.run_level), but one step a side is enough
        # to refuse: a job whose speed changed (user_mlp: 272 ms before, 173 profiled, 99 after) was read as a 43 % profiler cost
        b, a = statistics.median(before), statistics.median(after)
        if abs(a - b) - NOISE_SIGMAS * math.hypot(median_stderr(before), median_stderr(after)) > p - max(a, b):
            verdict = (f"the job's own speed changed across the window by more than the cost seen against its slower side ({seen}; "
                       f"unprofiled {b / 1e3:.1f} ms/step before it, {a / 1e3:.1f} ms after): the machine's load changed, "
                       "not a cost to remove")
    if verdict is not None:
        return ProfilerCost(p, u, len(prof), len(base), se, verdict)
    cost = ProfilerCost(p, u, len(prof), len(base), se, None)
    if not any(loop.sched.values()) and g.meta.ps is not None:
        timed = set.intersection(*(set(d) for d in loop.unprofiled.values()))
        return beyond_process_cpu(cost, g.meta.ps, set(g.meta.steps), {s for s in timed if s >= steady_from(loop)}, seen)
    if g.meta.framework == "tensorflow":  # the load told, the correction's bound not taken (``tf_load_only``)
        return tf_load_only(cost, split_by_cpu(cost, loop, set(g.meta.steps), steady_from(loop)))
    if g.meta.framework in XPLANE_FRAMEWORKS:  # JAX: the thread marking the steps dispatches and waits: its pace is not the work's
        return cost
    return split_by_cpu(cost, loop, set(g.meta.steps), steady_from(loop))


def thread_cpu_cost(loop: LoopSteps, window: set[int], profiled_us: float, seen: str) -> ProfilerCost | None:
    """The profiler's cost read from the ranks' training threads' CPU where the wall steps are too noisy to say (``seen``):
    their CPU per profiled step beyond an unprofiled one's (``job_sched``, past the warm-up), a rank's mean, at the pace
    the machine gave them outside the window (``outside_stretch``), where it rose beyond ``NOISE_SIGMAS`` standard errors.
    The recording is CPU on those threads (Kineto's per-call records, dagprof's hooks), and their CPU a step moves far less
    than the wall step, which waits on the peers, the wire and the machine: a PPO rollout learner's 9-15 ms steps (a
    rollout of 80-160 ms every 8) read "too noisy" in 5 of 11 kept profiles while its ranks' threads spent +1.5 to +3.5 ms
    a step more in every one of them (docs/evidence.md, branch level66). PyTorch runs only (the threads that do the work:
    TF's and JAX's marking thread waits on its pools, MXNet records none); None where the CPU did not rise beyond its noise
    (a job whose steps differ in work: the GAT's random graphs, each rank's its own)."""
    first = steady_from(loop)
    w, u = job_sched(loop, window, 0, "cpu_us"), job_sched(loop, None, first, "cpu_us")
    if len(w) < 2 or len(u) < MIN_STEPS:
        return None
    ranks = len(loop.profiled)
    added, se = (statistics.median(w) - statistics.median(u)) / ranks, pooled_median_stderr(w, u) / ranks
    if added <= NOISE_SIGMAS * se:
        return None
    pace = outside_stretch(loop, window, first)
    excess = min(pace * added, (1.0 - LEAST_FACTOR) * profiled_us)
    return ProfilerCost(profiled_us, profiled_us - excess, len(w), len(u), pace * se, None, cpu_us=ranks * excess, noisy_wall=seen)


def warmed_up_in_window(g: Graph) -> bool:
    """Whether a warm-up ended in the window: the training threads' CPU fell after it below every window step
    (``measure_steady_compute`` usable, on DDP jobs: ``steady_applies``) and the steps before it computed slower than those
    after it beyond the noise (``NOISE_SIGMAS``), or none were timed. That CPU is not the profiler's, and the steady-compute
    rule prices it (``correct_profiler_cost``; ``tests/data/powersgd-warmup``), so ``thread_cpu_cost`` leaves it alone.
    Where the steps before the window ran as those after it, every window step above them is the profiler's (the held-out
    DANN: 4 of 6 such rounds; docs/evidence.md, branch level66)."""
    loop = g.meta.loop_steps
    if loop is None or not g.meta.steps or not steady_applies(g) or measure_steady_compute(g).verdict is not None:
        return False
    first = steady_from(loop)
    before = job_sched(loop, None, first, "cpu_us", until=min(g.meta.steps))
    after = job_sched(loop, None, max(first, max(g.meta.steps) + 1), "cpu_us")
    if len(before) < 2 or len(after) < 2:
        return True
    return statistics.median(before) - statistics.median(after) > NOISE_SIGMAS * pooled_median_stderr(before, after)


def beyond_process_cpu(cost: ProfilerCost, ps: PsRecord, window: set[int], base: set[int], seen: str) -> ProfilerCost:
    """``cost`` refused where the profiled steps' excess is more than the CPU the profiler added to the workers' processes
    (``PsRecord.cpu_us`` in the window against ``unprofiled_cpu_us`` in the unprofiled steps ``base``, the workers together) can have
    made of it at any pace a shared machine gave (``MAX_PACE``), beyond the noise (``NOISE_SIGMAS``): MXNet's collector
    records each step's process CPU but not its waits for a core, so ``split_by_cpu`` cannot tell a load from the
    profiler's cost, and a PS step's excess under a load lies in its exchanges (each step's fitted rate,
    ``PsLinkFit.step_factors``), which the correction does not shorten: two fresh ``mx_gru_forecast.py`` runs whose
    window ran 282 / 203 ms a step against 103 / 70 after it, their workers' CPU +5.3 / +6.9 ms a step, were corrected by
    63 / 66 % and their models missed by +62 / +100 % (as profiled +0.01 / +0.02 %). Unchanged where not recorded or
    where that CPU can make the excess."""
    def per_step(rows: list[tuple[int, int, float]], keep: Callable[[int], bool]) -> list[float]:
        by: dict[int, list[float]] = {}
        for step, _, us in rows:
            if keep(step):
                by.setdefault(step, []).append(us)
        return [sum(v) for v in by.values() if len(v) == ps.num_workers]
    inside = per_step(ps.cpu_us, lambda s: s in window)
    outside = per_step(ps.unprofiled_cpu_us, lambda s: s in base)
    if len(inside) < 2 or len(outside) < MIN_STEPS:
        return cost
    added = statistics.median(inside) - statistics.median(outside)
    cpu_se = MAX_PACE * pooled_median_stderr(inside, outside)
    excess = cost.profiled_us - cost.unprofiled_us
    if excess - MAX_PACE * max(added, 0.0) <= NOISE_SIGMAS * math.hypot(cost.stderr_us, cpu_se):
        return cost  # not ``cpu_us``: that would bound the correction (``bound_factor``), and the servers' CPU is not counted
    return replace(cost, cpu_us=max(added, 0.0), verdict=(
        f"the profiled steps' excess ({seen}) is more than the CPU the profiler added to the workers' processes, "
        f"{added / 1e3:+.1f} ms/step together, can make at x{MAX_PACE:.0f} its pace (the most a shared machine stretched "
        "it): the machine's load changed, not a cost to remove"))


def split_by_cpu(cost: ProfilerCost, loop: LoopSteps, window: set[int], first: int) -> ProfilerCost:
    """``cost`` held against the CPU the ranks' processes spent per step in the window beyond outside it (``LoopSteps.sched``;
    unchanged where it was not recorded). The recording is work on the job's cores: its callbacks on the training thread,
    Kineto's own thread, dagprof's step files, all in the ranks' processes, so it cannot lengthen a step by more than the
    CPU it added to them together (on any number of cores, with nothing else running). A load on the machine lengthens
    the steps without adding to their CPU: on the 2-core dev machine, a busy loop pinned to each core during the demo
    job's window (``bench/bench_profiler_spike.py``) took its steps from 195 ms outside it to 453 ms in it while the
    ranks' CPU per step rose 12 ms and their training threads' waits for a core 3x (-57 %; -50 to -78 % in 4 such runs).
    Where the steps' excess over that CPU stands out of the noise (``NOISE_SIGMAS``, as the cost itself), ``loaded`` says
    so. The correction stays whole: the unprofiled steps are the job's pace, which a later run is measured at; keeping the
    load in the op times (only the CPU removed) predicted 7 hog runs +77 to +254 % against their unprofiled steps, the
    whole correction -12 to +21 %. Not on JAX runs, and on TF runs for the load's line only (``tf_load_only``, which says why)."""
    cpu = {when: job_sched(loop, steps, first, "process_cpu_us") for when, steps in (("in", window), ("out", None))}
    if len(cpu["in"]) < 2 or len(cpu["out"]) < MIN_STEPS:
        return cost
    pace = outside_stretch(loop, window, first)
    added = pace * (statistics.median(cpu["in"]) - statistics.median(cpu["out"]))
    cpu_se = pace * pooled_median_stderr(cpu["in"], cpu["out"])
    p, u = cost.profiled_us, cost.unprofiled_us
    if (p - u) - added <= NOISE_SIGMAS * math.hypot(cost.stderr_us, cpu_se):
        return replace(cost, cpu_us=max(added, 0.0))
    waits = [statistics.median(w) if w else 0.0 for w in (job_sched(loop, s, first, "wait_us") for s in (window, None))]
    why = (f"the ranks' extra CPU is {added / 1e3:+.1f} +- {cpu_se / 1e3:.1f} ms/step at the pace the machine gave them outside "
           f"the window (x{pace:.2f}), and their training threads waited {waits[0] / 1e3:.1f} ms/step for a core in the window, "
           f"{waits[1] / 1e3:.1f} ms outside: the rest was a load on the machine, not the profiler's")
    return replace(cost, cpu_us=max(added, 0.0), loaded=why)


def tf_load_only(cost: ProfilerCost, held: ProfilerCost) -> ProfilerCost:
    """A TensorFlow run's cost as ``split_by_cpu`` holds it (``held``) where that finds a load, else ``cost`` as measured. The
    load's line only: the correction stays whole either way (``removable_us``), but a window whose excess the ranks' CPU
    cannot make was a load, not the profiler's: a fresh ``tf_tft_forecast_fit.py`` run (Keras ``fit``, 2 workers) read
    43.0 ms profiled against 22.3 unprofiled as a 48 % profiler cost while its ranks' CPU rose 6.5 ms a step (12.6 at the
    pace outside the window) and their training threads waited 15.9 ms a step for a core in the window against 2.1 outside;
    on the namespace testbed at load 3 the same script's 9 jobs' windows ran -35 to +21 % against their unprofiled steps
    (median +5 %; docs/evidence.md, branch tftcost). Where the CPU explains the cost, its bound (``bound_factor``) is not
    taken: TF's ops run on the thread pools while the thread marking the steps waits, so the pace the CPU is held at
    (``outside_stretch``) is not the work's, and held to it 2 of 3 fresh TF Siamese profiles' models moved from +8.5 / +9.6 %
    over the job's unprofiled step to +13.0 / +11.4 % (branch tfcost)."""
    return held if held.loaded is not None else cost


def outside_stretch(loop: LoopSteps, window: set[int], first: int) -> float:
    """How much longer the training threads' CPU work took in wall time than on cores of their own, outside the window:
    their CPU plus their waits for a core, over their CPU (``traces.meta.runnable_stretch``), all ranks' unprofiled steps
    from ``first`` on; 1 where not recorded. On a shared machine the profiler's added CPU queues behind the others' as the
    job's own work does (a quiet demo run at load 6.0, ``bench/bench_profiler_spike.py``: 34 ms of added CPU, 70 ms of added
    step, at a pace of x3.9 outside the window; held against the CPU alone it read as a load), so that
    CPU costs the step this many times itself, the pace the machine gave the job before and after the window."""
    steps = [x for per in loop.sched.values() for x in per.values() if x.step >= first and x.step not in window]
    return max(runnable_stretch(steps), 1.0)


def job_sched(loop: LoopSteps, only: set[int] | None, first: int, field: str, until: int | None = None) -> list[float]:
    """Per step that every rank recorded (profiled ``only``, or every unprofiled one from ``first`` on, before ``until``
    where given): ``field`` of ``traces.meta.StepSched`` summed over the ranks (their CPU, or their waits, together)."""
    per_rank = loop.profiled if only is not None else loop.unprofiled
    ids = [{s for s in per_rank[r] if (only is None or s in only) and first <= s and (until is None or s < until)
            and getattr(loop.sched.get(r, {}).get(s), field, None) is not None} for r in per_rank]
    common = sorted(set.intersection(*ids)) if ids else []
    return [sum(getattr(loop.sched[r][s], field) for r in per_rank) for s in common]


def steady_from(loop: LoopSteps) -> int:
    """The job's first step past its warm-up: ``WARMUP_STEPS`` counted from the first step its collector timed. dagprof's
    collectors number steps from 0, MXNet's from 1, and a job's second step may still be warming up: MXNet's step 2
    (before the profiler starts) ran slower than the steps after the window in 67 of 88 kept mx_attn_accum.py testbed
    jobs (median +7.4 %; its process's CPU time +7.3 %, higher in 70: its own work, where a neighbour's load would slow
    steps after the window as often), and taken for the job's speed before the window it refused the cost as a change."""
    return min((s for per in (loop.profiled, loop.unprofiled) for d in per.values() for s in d), default=0) + WARMUP_STEPS


def window_sides(loop: LoopSteps, steps: list[int], join: Callable[[list[float]], float]) -> tuple[list[float], list[float]]:
    """The job's unprofiled steps before the profiled ``steps`` (past its warm-up, ``steady_from``) and after them (``job_steps``)."""
    if not steps:
        return [], []
    first, last = min(steps), max(steps)
    ids = set().union(*loop.unprofiled.values())
    return (job_steps(loop.unprofiled, {s for s in ids if s < first}, join, steady_from(loop)),
            job_steps(loop.unprofiled, {s for s in ids if s > last}, join, resumed=resumed_step(loop)))


def resumed_step(loop: LoopSteps) -> int | None:
    """The first step after the profiled window as collected (every rank's), which each rank begins once it has written its
    trace (``job_steps`` joins it apart); None where nothing was profiled."""
    ends = [max(d) for d in loop.profiled.values() if d]
    return max(ends) + 1 if ends else None


def job_steps(per_rank: dict[int, dict[int, float]], only: set[int] | None, join: Callable[[list[float]], float],
              first: int = 0, resumed: int | None = None) -> list[float]:
    """Each step that every rank timed, as the job's: its ranks' durations joined by ``join`` (``GraphMeta.job_of``:
    the slowest rank's, a parameter server's workers' mean); the ``resumed`` step (``resumed_step``) as the rank that began
    it last timed it, the least of the ranks' durations: the ranks end the window writing their traces, which end apart,
    and the first collective after it holds the others for the last (a fresh CRF tagger's ranks paused 1088 and 831 ms
    there; the second's step then took 330 ms, the first's 76, its CPU 67; in 16 fresh Kineto profiles the ranks paused
    0.3-1.3 s, and the job's step after the window was the slowest of those after it in 11; docs/evidence.md, branch
    proflevel65)."""
    common = set.intersection(*(set(d) for d in per_rank.values())) if per_rank else set()
    keep = sorted(s for s in common if s >= first and (only is None or s in only))
    return [(min if s == resumed else join)([d[s] for d in per_rank.values()]) for s in keep]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def pooled_median_stderr(a: list[float], b: list[float]) -> float:
    """Standard error of median(a) - median(b), one step's spread estimated from both lists' deviations from their own
    medians together: it is the machine's, the same for the profiled and the unprofiled steps, and a few steps alone do not
    tell it (the median absolute deviation of 3 steps is the smaller of two deviations: on the testbed unprofiled steps of
    127.0, 130.0 and 153.5 ms gave 3 ms where the 11 profiled steps beside them spread 6.3 ms, and the profiler's cost
    came out -8.7 %, which the unprofiled job of the same round, 146.7 ms a step, did not show)."""
    ma, mb = statistics.median(a), statistics.median(b)
    mad = statistics.median([abs(x - ma) for x in a] + [abs(x - mb) for x in b])
    return 1.2533 * 1.4826 * mad * math.sqrt(1 / len(a) + 1 / len(b))


def median_stderr(xs: list[float]) -> float:
    """Standard error of the median of ``xs``: 1.2533 sd / sqrt(n), the sd estimated as 1.4826 x the median absolute deviation."""
    med = statistics.median(xs)
    return 1.2533 * 1.4826 * statistics.median(abs(x - med) for x in xs) / math.sqrt(len(xs))


def scale_host_work(g: Graph, factor: float) -> Graph:
    """Host compute ops (data loading and a PyTorch collective's host call too: ``_host_work``) and every rank's framework gaps
    times ``factor``; the collectives as measured,
    and a GPU's kernels and the gaps between them too (the profiler's cost is the host's: CUPTI's per-launch
    callbacks; one NCCL rank's profiled steps ran 66-73 ms against 50 unprofiled while its kernels were the GPU's).
    A parameter server's work is host work too (``graph.build_ps.scale_server_work``): ``mx_sparse_mf.py``'s server
    (dense AdaGrad in Python, 10-20 ms a step) and its row_sparse pulls (10 ms each, waiting for it) were most of its
    profiled steps on the namespace testbed (37 ms against 21 unprofiled): kept as measured, the model of the profiled
    configuration was +44 % with every worker's host work cut to the floor (now 0.0 %)."""
    host, mask = _host_work(g)
    dur, gap = g.dur.copy(), g.gap.copy()
    dur[mask] *= factor
    gap[host] *= factor
    return scale_server_work(g.replace(dur=dur, gap=gap), factor)


def host_work_us(g: Graph) -> float:
    """The host work ``scale_host_work`` scales in the median step that ``g`` holds (an averaged graph's one or its profiled
    window's), all ranks together (us): what the correction's factor shortens, to hold against the CPU the profiler added
    (``ProfilerCost.cpu_us``) or the step's excess, both read on median steps (``measure_profiler_cost``). The recording
    costs CPU per op it records (a rank's training thread 4.5-12.7 us more per Kineto op in the window's median step than
    outside it, on PPO, DNA, ALBERT, Glow, TwoTower and DLRM profiles: docs/evidence.md, branch level69), so a window step
    unlike the others sets no bound for them: PPO's rollout (52,098 ops in 293 ms, one step in 8, against 839 in 24) made
    the window's mean host work 5.6x its median step's, and held every step's cut to 7.8 % where its median step ran 27 %
    over the steps outside the window. Host time outside those steps (no step's, an end mark's gap) counts in every step."""
    host, mask = _host_work(g)
    work = np.where(mask, g.dur, 0.0) + np.where(host, g.gap, 0.0)
    steps = np.unique(g.step[mask & (g.step >= 0)])
    if not len(steps):
        return float(work.sum())
    per_step = [float(work[g.step == s].sum()) for s in steps]
    return float(np.median(per_step) + work[~np.isin(g.step, steps)].sum() / len(steps))


def _host_work(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Per node: on a host (its gaps are host time), and host work the recording slows (``_CORRECTED``; a PyTorch
    collective's host call too)."""
    host = (g.rank >= 0) & ~on_accelerator(g)
    return host, host & np.isin(g.kind, [int(k) for k in (_CORRECTED_TORCH if g.meta.framework is None else _CORRECTED)])


def on_accelerator(g: Graph) -> np.ndarray:
    """Per node: on an accelerator's stream, a COMPUTE device of a rank whose host threads only launch work (HOST
    devices). Ranks without HOST devices (CPU jobs' compute lanes, MXNet's engine threads) have none."""
    launching = {d.rank for d in g.devices if d.kind == DeviceKind.HOST}
    streams = np.array([d.kind == DeviceKind.COMPUTE and d.rank in launching for d in g.devices] or [False], dtype=bool)
    return streams[np.maximum(g.device, 0)] & (g.device >= 0)


@dataclass
class ModelReplays:
    """``model``'s iteration (``iteration_us``: passes do not import the replay) as it is and with its host work scaled by
    each factor asked (``scale_host_work``), each replayed once: the factor's search (``remove_profiler_cost``) and the
    share it removed (``removed_share``) read the same replays."""

    model: Graph
    iteration_us: Callable[[Graph], float]
    scaled: dict[float, float] = field(default_factory=dict)  # factor -> the iteration replayed at it (us)

    @cached_property
    def raw(self) -> float:
        return self.iteration_us(self.model)

    def at(self, factor: float) -> float:
        if factor not in self.scaled:
            self.scaled[factor] = self.iteration_us(scale_host_work(self.model, factor))
        return self.scaled[factor]


def remove_profiler_cost(g: Graph, cost: ProfilerCost, iteration_us: Callable[[Graph], float], model: Graph | None = None,
                         rounds: int = 4, tolerance: float = 0.002, bounded: bool = True) -> tuple[Graph, float]:
    """``g`` with its host work shortened so that ``model`` (default ``g``; e.g. ``g`` under the fitted link) replays
    ``1 - cost.share`` of its iteration, removing no more host work than the measured cost can have added where the
    ranks' CPU explains it (``least_factor``; not when ``bounded`` is False); returns the graph and the factor
    (``find_factor``)."""
    factor = find_factor(g, cost, ModelReplays(g if model is None else model, iteration_us), rounds, tolerance, bounded)
    return (g, 1.0) if factor is None else (scale_host_work(g, factor), factor)


def find_factor(g: Graph, cost: ProfilerCost, model: ModelReplays, rounds: int = 4, tolerance: float = 0.002,
                bounded: bool = True) -> float | None:
    """The host-work factor of ``remove_profiler_cost``, found on ``model``'s replays; None where nothing is removed (the
    cost not usable, or ``least_factor`` 1). A few secant steps: the iteration is monotone in the factor but not
    proportional to it, since communication that the host work hid may surface."""
    if not cost.usable:
        return None
    floor = least_factor(g, cost) if bounded else LEAST_FACTOR
    if floor >= 1.0:
        return None
    raw = model.raw
    target = raw * (1.0 - cost.share)
    f0, t0 = 1.0, raw
    f1 = max(1.0 - cost.share, floor)
    for _ in range(rounds):
        t1 = model.at(f1)
        if abs(t1 - target) <= tolerance * target or t1 == t0:
            break
        f0, t0, f1 = f1, t1, min(1.0, max(floor, f1 + (target - t1) * (f1 - f0) / (t1 - t0)))
        if f1 == floor and t0 >= target:  # the bound holds the factor: the replay at it says how far the model drops
            break
    return f1


@dataclass(frozen=True)
class SteadyCompute:
    """The ranks' training threads' CPU per step in the profiled window against the job's unprofiled steps after it (us,
    the ranks together): the pace a later run computes at once its warm-up is over. A wire-bound step hides a warm-up that
    lasts into the window (its compute is a few ms of a 280 ms step, so ``measure_profiler_cost`` reads the wall steps as
    too noisy), while a strategy that takes the wire away (PowerSGD: a 30 ms step, mostly compute) runs at the later pace
    (the held-out embedding job's Adam and allocator warm-up: docs/evidence.md, branch psgd)."""

    window_us: float | None
    after_us: float | None
    window_steps: int
    after_steps: int
    stderr_us: float | None
    verdict: str | None  # None: usable; else why the op times keep their level

    @property
    def factor(self) -> float:
        """What the host work is multiplied by: the later pace over the window's (1 where not usable)."""
        return self.after_us / self.window_us if self.verdict is None else 1.0

    def describe(self, applied: bool = True) -> str:
        """What was done with the pace; ``applied`` False: measured, but the op times kept the window's (``whatif``'s choice)."""
        if self.verdict is not None:
            return f"compute kept at the window's pace: {self.verdict}"
        if not applied:
            return (f"compute kept at the window's pace, though the training threads' CPU fell {100 * (self.factor - 1):+.1f} % after it "
                    f"({self.window_us / 1e3:.1f} ms/step in the window, {self.after_us / 1e3:.1f} after it): dagprof optimize prices its "
                    "strategies at that later pace; a what-if keeps the profiled one (the later pace was judged no closer to measured "
                    "what-ifs)")
        return (f"compute brought to the pace after the window: {100 * (self.factor - 1):+.1f} % (the training threads' CPU "
                f"{self.window_us / 1e3:.1f} ms/step in the window, {self.after_us / 1e3:.1f} after it, {self.window_steps} and "
                f"{self.after_steps} steps: a warm-up that ran into the window, or the profiler's CPU the wall steps did not show)")


def measure_steady_compute(g: Graph) -> SteadyCompute:
    """The window's training-thread CPU against the steps after it (``SteadyCompute``); usable where it fell by more than
    ``NOISE_SIGMAS`` standard errors and every step after the window computed faster than the window's fastest step. Only
    the steps after the window count: the steps before it are the warm-up's. The standard error treats steps as
    independent, but the machine's own pace moves in stretches of seconds, several steps (docs/evidence.md, branch psgdq):
    a warm-up that ended in the window leaves every later step below all of it (the held-out embedding, 26.3-27.8 against
    a window falling 38.7 -> 28.3), a fast stretch that the 4 steps after it caught does not (the held-out conv: 107.0-115.4
    and 128.8 against 125.7, its PowerSGD runs then at x0.91-1.22 the window's compute, not x0.89; branch psgdconv; a
    fresh embedding: 24.1-27.3 against a flat window of 25.4-29.3, median 27.4, its PowerSGD runs at x0.94-1.24, not
    x0.92; branch psgdemb)."""
    loop = g.meta.loop_steps
    if loop is None or not loop.sched or not g.meta.steps:
        return SteadyCompute(None, None, 0, 0, None, "not measured (no per-step CPU recorded)")
    w = job_sched(loop, set(g.meta.steps), 0, "cpu_us")
    a = job_sched(loop, None, max(g.meta.steps) + 1, "cpu_us")  # the unprofiled steps after the window
    if len(w) < 2 or len(a) < MIN_STEPS:
        return SteadyCompute(_median(w), _median(a), len(w), len(a), None,
                             f"not measured ({len(w)} profiled steps and {len(a)} after them; needs 2 and {MIN_STEPS})")
    mw, ma = statistics.median(w), statistics.median(a)
    se = pooled_median_stderr(w, a)
    head = f"the training threads' CPU {mw / 1e3:.1f} ms/step in the window, {ma / 1e3:.1f} after it"
    if mw - ma <= NOISE_SIGMAS * se:
        verdict = f"{head} (+- {se / 1e3:.1f}): no fall beyond the noise"
    elif max(a) >= min(w):  # the fall did not clear the window's own steps: a stretch of the machine's pace
        verdict = (f"{head}, but {max(a) / 1e3:.1f} in one of the {len(a)} steps after it, within the window's own steps "
                   f"({min(w) / 1e3:.1f}-{max(w) / 1e3:.1f}): a fast stretch of the machine (they last seconds), not a warm-up over")
    else:
        verdict = None
    return SteadyCompute(mw, ma, len(w), len(a), se, verdict)


def steady_applies(g: Graph) -> bool:
    """Where the steady-compute rule is measured: PyTorch DDP jobs, the only ones it was judged on (docs/evidence.md, branches
    psgd and onecost); FSDP's optimizer is judged elsewhere, and the other frameworks' collectors were not checked for it."""
    return g.meta.framework is None and g.meta.fsdp is None


@dataclass(frozen=True)
class Correction:
    """A profile corrected for the profiler's cost (``correct_profiler_cost``): what ``whatif``, ``optimize`` (and its
    ``--verify``) and the testbed bench each predict from and hold the measured step against."""

    graph: Graph  # the profile with its host work scaled by ``factor``
    factor: float  # the host-work factor applied (1: none)
    share: float  # the share of the model's iteration it removed (``removed_share``): the measured step is held against less this
    steady: SteadyCompute | None = None  # a usable fall of the compute's pace after the window (``measure_steady_compute``)
    steady_applied: bool = False  # ``factor`` is ``steady``'s: the compute brought to that pace

    def describe(self, g: Graph, cost: ProfilerCost) -> str:
        """The one line every command says (``describe_removal``, and the steady pace where measured)."""
        line = describe_removal(g, cost, self.share)
        return line if self.steady is None else f"{line}; {self.steady.describe(self.steady_applied)}"


def correct_profiler_cost(g: Graph, cost: ProfilerCost, iteration_us: Callable[[Graph], float], model: Graph | None = None,
                          measured: Graph | None = None, pace_after_window: bool = False) -> Correction:
    """The one correction every prediction starts from (unless ``--raw``): ``remove_profiler_cost`` on ``g`` and the
    share of ``model``'s (default ``g``'s) iteration that removed. Where the wall steps gave no usable ``cost`` on a DDP
    job (``steady_applies``), the compute's pace after the window is measured too (``measure_steady_compute`` on
    ``measured``, default ``g``: the stepwise graph the cost was measured on), and with ``pace_after_window`` the host
    work is brought to it where it fell, the share then the model's own drop at that factor.

    ``dagprof optimize`` asks for it: a strategy that takes the wire away (PowerSGD) runs at the later pace (the held-out
    embedding job: docs/evidence.md, branch psgd). ``whatif`` and the testbed bench do not, by choice, and say so: applied
    to them (branch onecost) it fired on 16 kept DDP -> FSDP pairs' DDP profiles (their FSDP step predicted 4-16 % lower)
    and one held-out testbed round (its 18 cells 0.2-6.5 % lower), and took them no closer to what was measured: the
    pairs' median miss 8.4 -> 9.5 % (within 8 % 8 -> 7, three pairs from within to outside), the round's 2.8 -> 3.0 %."""
    replays = ModelReplays(g if model is None else model, iteration_us)
    if cost.usable or not steady_applies(g):
        factor = find_factor(g, cost, replays)
        if factor is None:
            return Correction(g, 1.0, 0.0)
        return Correction(scale_host_work(g, factor), factor, removed_share(replays, factor, cost))
    steady = measure_steady_compute(g if measured is None else measured)
    if steady.verdict is not None:
        return Correction(g, 1.0, 0.0)
    if not pace_after_window:
        return Correction(g, 1.0, 0.0, steady)
    share = 1.0 - replays.at(steady.factor) / replays.raw
    return Correction(scale_host_work(g, steady.factor), steady.factor, share, steady, True)


def least_factor(g: Graph, cost: ProfilerCost) -> float:
    """The least host-work factor the correction may use on ``g``: where the ranks' CPU explains the cost (``split_by_cpu``:
    ``cpu_us`` recorded, not ``loaded``), the host work it removes is at most what the measured cost can have added to
    the ranks' host ops (``bound_factor``); the rest of what a factor found on the step alone would take lies in waits
    (for peers, the wire), not host work. ``LEAST_FACTOR`` where nothing bounds it: the CPU not
    recorded, or a load (the whole correction then, as ``split_by_cpu`` says)."""
    bound = bound_factor(g, cost)
    return LEAST_FACTOR if bound is None else bound


def bound_factor(g: Graph, cost: ProfilerCost) -> float | None:
    """The host-work factor that removes the most host work the measured cost can be made of, all ranks together (of
    ``host_work_us``): the profiler's CPU (``cpu_us``: work on the ranks' cores, which adds no more than itself to their
    host ops), or each rank's host ops lengthened by the whole excess of the job's step (the cost on a host-bound step),
    whichever is more. Beyond both, the factor is made up on a step whose host work hides under the wire: a 1 Gbit/s
    testbed profile (tests/data/ddp-testbed-corrected, 18.1 ms of step over 15.3 ms of the ranks' added CPU) took 0.51
    found on the step alone, 64 of the 2 ranks' 131 ms of host work, and its unshaped cells, mostly host work, came out
    28-49 % fast (raw -14 to +24 %). A host-bound step's own factor stays within it (a live demo run's 19 ms of excess
    a step, each rank's host work shortened by as much). None where the CPU does not explain the cost (not recorded,
    ``loaded``)."""
    per_step, removable = host_work_us(g), removable_us(g, cost)
    if removable is None or per_step <= 0:
        return None
    return min(max(1.0 - removable / per_step, LEAST_FACTOR), 1.0)


def removable_us(g: Graph, cost: ProfilerCost) -> float | None:
    """The most host work a step of ``g`` can have gained from the measured cost, all ranks together (``bound_factor``);
    None where the CPU does not explain the cost."""
    if not cost.usable or cost.loaded is not None or cost.cpu_us is None:
        return None
    ranks = len(np.unique(g.rank[_host_work(g)[1]]))
    return max(cost.cpu_us, ranks * (cost.profiled_us - cost.unprofiled_us))


def removed_share(model: ModelReplays, factor: float, cost: ProfilerCost) -> float:
    """The share of ``model``'s iteration that the correction's ``factor`` removed: ``cost.share`` where the correction
    found its factor on the step (it drops by that share, within its tolerance, or it took the least factor a load
    allows), else the model's own drop at the factor ``least_factor`` held it to. The reference a corrected model is
    checked against is the measured step less this share: the job less what the model was corrected for."""
    if not cost.usable or factor >= 1.0:
        return 0.0
    bound = bound_factor(model.model, cost)
    if bound is None or factor > bound + 1e-9:
        return cost.share
    return 1.0 - model.at(factor) / model.raw


def describe_removal(g: Graph, cost: ProfilerCost, removed: float) -> str:
    """``cost.describe()``, and where ``least_factor`` held the correction on ``g`` how much of the cost the model dropped
    by (``removed_share``) and why the rest stays."""
    most = removable_us(g, cost)
    if most is None or removed >= cost.share - 1e-9:
        return cost.describe()
    return (f"{cost.describe()}; the host work cut by no more than the cost can have added to it ({most / 1e3:.1f} ms a step, "
            f"all ranks together: the profiler's CPU, {cost.cpu_us / 1e3:.1f} ms, or the step's excess on every rank) moves "
            f"the model {-100 * removed:+.1f} %: the rest of the cost lies in waits, not host work")
