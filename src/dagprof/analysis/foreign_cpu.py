"""Other work on a rank's cores during the profiled steps: the training thread's waits for a core beyond what its own
process's other threads ran.

A rank pinned alone to one core (``GraphMeta.pinned_groups``: ``taskset``, a launcher's binding, the testbed's hosts)
shares it with its own threads only: Horovod's background loop and gloo's, which run the collectives. Measured on the
two-host Horovod testbed (2026-12-06, ``hvdhosts2``'s 64 kept jobs, each rank on a core of its own): the training thread
was runnable all step (its CPU plus its run-queue wait within 0.1 ms of the step: ``synchronize()`` polls), its own
other threads took 32-57 ms of CPU a 1 Gbit/s step (hvd_autoencoder; hvd_text 14-29), and 4-13 % of the compute ran
beside a collective, at 0.6-1.3 times its own time alone (median per job): the own threads run while the training thread
waits in ``synchronize()``, and the profiled collectives' times carry them. In every job at its level the waits exceeded
the own threads' CPU by 0.8-3.8 ms a step; in the jobs off it (median steps 32-106 % above the jobs around them) by 7-90
ms, on both ranks, while the own threads' CPU stayed as in the others: another process held the cores (``top`` showed
another session's job at 50 % beside one of them). That is the profile's load, not the job's: the ops carry it and so
does every what-if, so ``whatif`` says how much of the step it was.

Per step and rank the figure is the thread's run-queue wait less its process's other threads' CPU (``StepSched``), at
least 0: the least the cores ran of no thread of the rank's process while the thread waited (on one core, each moment of
waiting has the core running another thread; the own threads' CPU may fall outside the waits). Beside a busy loop pinned
to the rank's core (``bench_frameworks.py --hog``, 2026-12-07, branch hvdlvl62: 18 loaded ranks of 8 scripts, each against
the same rank profiled quiet in the same round) it is the others' CPU, not a bound below it: the training thread was
runnable all step and its median step less its CPU, its own threads' and this figure left 0.0-1.8 ms. What no profile
holds is the rank's own CPU on quiet cores: beside the loop the loaded rank's process ran 0.77-1.41 times its quiet CPU
(its threads poll while they wait), and its step less this figure came out -34.5 to +37.0 % of the quiet step, in the same
order (Spearman 0.89); the same script's quiet step moved up to 29 % between rounds (hvd_simclr 65.6, 84.5 ms).
For ranks that share cores it also counts the other ranks' work: there ``shared_foreign_cpu`` takes all the job's CPU on
the host over its cores out of the wait (a bound below the others' work; said, never taken out of the op times).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from ..graph.dag import Graph
from ..graph.meta import GraphMeta
from ..passes.foreign_load import collectives_scaled, scale_loaded_ranks
from ..traces.meta import StepSched

# A rank that waited this share of its median step beyond its own threads' CPU ran beside others' work (said, and taken out of
# its op times): of the 64 kept testbed jobs (the most of either rank) 46 waited 1.2-6.1 % of it so, the other 18 19.5-50.3 %,
# none between; but quiet jobs of scripts that move more bytes a second wait up to 13.5 % so (2026-12-06, hvd_simclr and
# hvd_lstm_lm, others' CPU 0.6-2.3 % of a core: the launcher's middlemen and the kernel's packet work, ksoftirqd, ran on the
# ranks' cores, as they do in the job measured later), and beside a busy loop 48-50 %. Ranks sharing one host's cores
# (``shared_foreign_cpu``; 2026-12-07, branch loadnote66, 182 distinct profiles of 2-4 ranks on 1-2 cores kept by the rounds of
# stops 60-66 at load 2-6): 179 waited at most 7.5 % of a step beyond the job's own CPU (175 at most 2 %), the other three
# 16-24 % (a PowerSGD conv's rounds 0 and 3, waiting for a core 1.05-1.27 times their CPU against 0.15-0.37 in its other
# rounds, and an HSDP dual encoder's round 3); N-BEATS, SimSiam and a MoE LM profiled at load 19 36-66 %
NOTE_SHARE = 0.15


@dataclass(frozen=True)
class ForeignCpu:
    """Per rank of a profile: the median over its profiled steps of its step and of its waits beyond its own threads' CPU."""

    step_us: dict[int, float]
    foreign_us: dict[int, float]

    @property
    def share(self) -> float:
        """The most any rank waited so, over its median step."""
        return max((self.foreign_us[r] / self.step_us[r] for r in self.step_us if self.step_us[r] > 0), default=0.0)

    def to_dict(self) -> dict:
        return {"share_pct": 100.0 * self.share, "per_rank_ms": {r: self.foreign_us[r] / 1e3 for r in sorted(self.foreign_us)},
                "step_ms": {r: self.step_us[r] / 1e3 for r in sorted(self.step_us)}}


def foreign_us(s: StepSched) -> float | None:
    """The step's run-queue wait of the training thread less its process's other threads' CPU, at least 0; None where the
    process's CPU was not recorded (older files)."""
    return None if (own := s.off_thread_cpu_us) is None else max(0.0, s.wait_us - own)


def foreign_cpu(meta: GraphMeta) -> ForeignCpu | None:
    """Every rank's ``foreign_us`` over its profiled steps (``LoopSteps``), whether pinned or not; None where a rank has no
    step with its process's CPU recorded (not a dagprof collector's run, or an older file)."""
    return _medians(meta, lambda r, s, x: foreign_us(x))


def shared_foreign_cpu(meta: GraphMeta) -> ForeignCpu | None:
    """For ranks sharing one host's cores (one host, not pinned apart): per rank and profiled step its training thread's
    run-queue wait less the job's other CPU on the host that step (every rank's process's CPU but this thread's) over the
    cores, at least 0: while the thread waited every core ran another thread, so at least that much of its wait the cores ran
    no thread of the job (``foreign_us`` for one core and one rank). None on several hosts or pinned ranks (which host's
    ranks contend is not recorded per rank), or where a step's process CPU was not recorded."""
    loop = meta.loop_steps
    if loop is None or len(meta.host_cpus) != 1 or meta.pinned_groups:
        return None
    cores = next(iter(meta.host_cpus.values())).cores

    def beyond_job(r: int, s: int, x: StepSched) -> float | None:
        procs = [y.process_cpu_us for q in loop.sched if (y := loop.sched[q].get(s)) is not None]
        if len(procs) < len(loop.sched) or None in procs:
            return None
        return max(0.0, x.wait_us - (sum(procs) - x.cpu_us) / cores)

    return _medians(meta, beyond_job)


def _medians(meta: GraphMeta, wait_of: Callable[[int, int, StepSched], float | None]) -> ForeignCpu | None:
    """Per rank the median over its profiled steps of its step and of ``wait_of(rank, step, its StepSched)``; None where a
    rank has no step that gave one."""
    loop = meta.loop_steps
    if loop is None or not loop.profiled:
        return None
    step, foreign = {}, {}
    for r, steps in loop.profiled.items():
        got = [(us, f) for s, us in steps.items() if (x := loop.sched.get(r, {}).get(s)) is not None and (f := wait_of(r, s, x)) is not None]
        if not got:
            return None
        step[r], foreign[r] = statistics.median(us for us, _ in got), statistics.median(f for _, f in got)
    return ForeignCpu(step, foreign)


def pinned_alone(meta: GraphMeta) -> bool:
    """Every rank of the profile was pinned alone to one core of its host (each host's ``pinned_groups`` one rank on one core)."""
    return bool(meta.host_cpus) and all(h in meta.pinned_groups and all(g.ranks == 1 and g.cores == 1 for g in meta.pinned_groups[h]) for h in meta.host_cpus)


def foreign_cpu_note(meta: GraphMeta) -> str | None:
    """A line for a profile whose ranks, each pinned alone to one core, waited for it beyond their own threads' CPU by at
    least ``NOTE_SHARE`` of the step: other work held their cores; None elsewhere."""
    f = foreign_cpu(meta) if pinned_alone(meta) else None
    if f is None or f.share < NOTE_SHARE:
        return None
    per = ", ".join(f"rank {r} {f.foreign_us[r] / 1e3:.1f} of {f.step_us[r] / 1e3:.1f} ms" for r in sorted(f.foreign_us))
    return (f"each rank pinned alone to a core waited for it beyond its own threads' CPU in the profiled steps ({per}, median "
            f"per step; up to {100 * f.share:.0f} %): other processes held the cores then, and the op times carry that load, "
            "so every row does too (46 of 64 two-host Horovod testbed jobs waited 1.2-6.1 % of a step so, at their level; "
            "profile again on quiet cores to predict the job at its level)")


def shared_cores_load_note(meta: GraphMeta) -> str | None:
    """A line for a profile whose ranks, sharing one host's cores, waited for them beyond all the job's CPU there by at least
    ``NOTE_SHARE`` of the step (``shared_foreign_cpu``): other processes held the cores, which the op times carry; None
    elsewhere (ranks pinned alone: ``foreign_cpu_note``)."""
    f = shared_foreign_cpu(meta)
    if f is None or f.share < NOTE_SHARE:
        return None
    loop = meta.loop_steps
    waits = {r: statistics.median(x.wait_us for s in loop.profiled[r] if (x := loop.sched.get(r, {}).get(s)) is not None) for r in f.step_us}
    per = ", ".join(f"rank {r} {waits[r] / 1e3:.1f} of its {f.step_us[r] / 1e3:.1f} ms step, {f.foreign_us[r] / 1e3:.1f} ms "
                    f"({100 * f.foreign_us[r] / f.step_us[r]:.0f} %) beyond the job's own CPU" for r in sorted(f.step_us))
    return (f"the training threads waited for a core in the profiled steps ({per}; median per step): other processes held the "
            "host's cores then, so the op times carry that load and every row does too, and --cores queues the ranks again on "
            "top of it (179 of 182 kept profiles of 2-4 ranks on 1-2 cores waited at most 8 % of a step so; six profiles of three "
            "scripts taken at load 19, 36-66 %); profile again on quiet cores")


@dataclass(frozen=True)
class ForeignRemoval:
    """A profile's host work brought to its ranks' own pace (``remove_foreign_load``): per loaded rank the factor its host
    ops and gaps were multiplied by, and the share of the model's iteration that removed."""

    graph: Graph
    steps_graph: Graph | None
    factors: dict[int, float]
    foreign: ForeignCpu
    removed: float

    def describe(self) -> str:
        per = ", ".join(f"rank {r} x{f:.2f} ({self.foreign.foreign_us[r] / 1e3:.1f} of its {self.foreign.step_us[r] / 1e3:.1f} ms "
                        "step)" for r, f in sorted(self.factors.items()))
        comm = (", and the collectives' time beyond the wire (the ranks' threads' work) by the least factor" if self.collectives else
                ", the collectives as profiled (give --profiled-bandwidth to scale their time beyond the wire too)")
        return (f"op times brought to the ranks' own cores' pace: a rank pinned alone to a core waited for it beyond its own "
                f"threads' CPU (other processes held it; median per profiled step), so its host work is scaled by the share of "
                f"the core it kept (a Horovod coordinator's negotiations by the least){comm}: {per}; the model "
                f"{-100 * self.removed:+.1f} %. The rank's own CPU on quiet cores is not in the profile: beside a busy loop a "
                "loaded rank's process ran 0.77-1.41 times its quiet CPU (its threads poll while they wait), and its step less "
                "the wait came out -35 to +37 % of its quiet step, so a prediction may stand either side by that much")

    @property
    def collectives(self) -> bool:
        return collectives_scaled(self.graph)

    def to_dict(self) -> dict:
        return {"factors": {r: self.factors[r] for r in sorted(self.factors)}, "removed_pct": 100.0 * self.removed,
                "text": self.describe()} | self.foreign.to_dict()


def load_factors(f: ForeignCpu) -> dict[int, float]:
    """Per rank that waited ``NOTE_SHARE`` of its median step or more beyond its own threads' CPU, the share of its core it
    kept (1 less that wait over the step). A rank whose recorded wait is its whole step or more (the two medians taken apart
    over odd records) kept no measurable share: left as profiled, where scaling by it would make its ops negative or zero."""
    return {r: 1.0 - f.foreign_us[r] / f.step_us[r] for r in f.step_us
            if f.step_us[r] > 0 and NOTE_SHARE * f.step_us[r] <= f.foreign_us[r] < f.step_us[r]}


def remove_foreign_load(g: Graph, steps_graph: Graph | None, iteration_us: Callable[[Graph], float]) -> ForeignRemoval | None:
    """``g`` (and ``steps_graph``) with the host work of each rank pinned alone to a core that waited for it beyond its own
    threads' CPU by at least ``NOTE_SHARE`` of its median step scaled by the share of the core it kept (1 less that wait
    over the step): the other processes' work stretched the rank's, which a later run on its own core does not carry;
    ``removed`` from ``iteration_us`` of the two. None where no rank was so loaded (or not pinned alone: there the waits
    may be another rank's work)."""
    f = foreign_cpu(g.meta) if pinned_alone(g.meta) else None
    if f is None:
        return None
    factors = load_factors(f)
    if not factors:
        return None
    scaled = scale_loaded_ranks(g, factors)
    return ForeignRemoval(scaled, None if steps_graph is None else scale_loaded_ranks(steps_graph, factors), factors, f,
                          1.0 - iteration_us(scaled) / iteration_us(g))
