"""gloo's ring at the scheduler's pace: a JAX job whose ranks outnumber the cores they share (``--workers N --cores C``,
``passes.compute.share_cores``; one rule for the price and its note, ``ring_pace``).

XLA's CPU client runs each array of a collective as one gloo call (``analysis.operand_stall``), a ring of 2(N-1) steps
for an all-reduce. In each step a rank keeps two threads runnable, gloo's device loop thread polling its socket and the
thread that posts the next receive; where the message came first the poller spins until the poster gets a core, which
on crowded cores comes at a scheduler tick. Beyond the cores every step so waits for the scheduler, whatever its bytes:
4 JAX workers on the testbed's 2 cores took 0.92-1.07 ms per call and ring step in 9 of 9 rounds of three scripts
(issue 21, ``bench/jax_workers_categories.py --per-call``), where their messages took ~0.01 ms at 1 Gbit/s. A 2-worker
profile's steps ran at its own pace (0.24-1.03 ms), which its link fit reads as a slow wire, so a 4-worker what-if
priced them at ~0.35 (mixer -33 %).

The pace is the host's, not the job's: ``bench/ring_probe.py`` measures it with no job beside it (N torch gloo ranks
pinned on C cores, small all-reduces back to back), and ``pace_us`` is its law in the host's tick (the profiled hosts'
own, ``GraphMeta.host_tick_us``, their kernels' ``CONFIG_HZ``; else ``TICK_US``). A collective's transfer is priced
at least its ring steps at the pace, the most of that and its link's price (which holds the profile's own pace) with
its waits for a core (``passes.comm_cpu.off_lane_budget``); gloo's CPU is priced through that transfer
(``passes.comm_cpu.spin_share``). Held out (jaxring67, 2026-12-07, 3 cells, 2 of them beside other processes' CPU):
mixer -37.1 -> -30.6 %, VAE +53.2 -> +48.5 %, GAT -7.3 -> -7.3 %; the VAE's excess was its 2-worker profile's gloo CPU
carried x3 as the ring steps (its polling thread held a core 0.86 of its runnable time at 2 ranks on 2 cores, 0.46 at 4),
now priced so (jaxspin69 in evidence).

On a loaded host the rings ran slower than the pace (jax68: mixer 1.22, GAT 2.19 ms a ring step beside 0.6 and 0.9 of a
core of other processes' CPU). The profile records that load (``GraphMeta.host_other_cores``, ``traces.window_cpu``) and
the note says it, unpriced: the pace on the cores it leaves, tick / 2(C - F), was tried (jax69, 2026-12-07): on five kept
loaded and quiet cells (F from the bench's whole-job figure) median |error| 13.8 -> 25.5 %, 4 of 5 further (the others'
share falls as 4 ranks crowd the cores: GAT 1.14 -> 0.89, MDN 1.25 -> 1.10 cores), and quiet held-out 4-worker jobs rang
at 0.95-1.04 ms a step against the 1.00 priced, the step still over by 57-87 % from elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.dag import Graph
from ..traces.comm_kind import CommKind
from ..traces.events import Kind

# The scheduler tick assumed where the profiled host did not say its own (CONFIG_HZ=250: the testbed's kernel, and the
# common distribution default)
TICK_US = 4000.0
THREADS_PER_RANK = 2  # runnable in a collective: gloo's polling device thread and the thread posting the operand's receive


@dataclass(frozen=True)
class RingPace:
    """What a ring step costs where ``ranks`` ranks (``THREADS_PER_RANK`` runnable communication threads each) share
    ``cores``: at least ``step_us``."""

    ranks: int
    cores: int
    tick_us: float
    tick_recorded: bool  # the profiled hosts' kernels said it (else ``TICK_US``)

    @property
    def step_us(self) -> float:
        return pace_us(self.tick_us, self.cores)


def pace_us(tick_us: float, cores: int) -> float:
    """A ring step's time where more runnable threads than ``cores`` share them: each step's poster waits for the next
    tick on one of the cores to preempt a poller, half the time between the cores' ticks on average, tick / (2 C).
    ``bench/ring_probe.py`` (2026-12-07 15:21, load 4.0): 0.77-1.04 ms with 2-4 ranks on 2 cores (tick / 4 = 0.99),
    1.70-1.85 ms with 3-4 ranks on 1 core (tick / 2 = 1.98); 2 ranks on 1 core 0.68 ms (their hand-offs wake each other
    before a tick: priced high there), quantum 3.96 ms."""
    return tick_us / (2.0 * cores)


def ring_pace(g: Graph, ranks_per_host: int, cores: int) -> RingPace | None:
    """``g``'s ``RingPace`` with ``ranks_per_host`` ranks on ``cores``; None where it is no JAX job on gloo whose arrays a
    step were read, or the ranks fit the cores. That is the one rule for the price (``share_cores``, which prices no JAX
    rank's sharing within the cores) and its note (``compute.ring_pace_note``): within them a profile on those cores holds
    the pace in its own collectives (2 ranks on 2 cores ran at it in the probe, 1.01 ms a step), which its link fit reads."""
    if g.meta.framework != "jax" or g.meta.backend != "gloo" or not g.meta.collective_operands_per_step:
        return None
    if ranks_per_host <= cores:
        return None
    ticks = g.meta.host_tick_us
    return RingPace(ranks_per_host, cores, max(ticks.values(), default=TICK_US), bool(ticks))


def paced_us(g: Graph, comm: np.ndarray, pace: RingPace) -> np.ndarray:
    """Per collective of ``comm`` (global COMM nodes of ``g``), the least its transfer takes at ``pace``: its arrays (the
    step's, ``GraphMeta.collective_operands_per_step``, shared evenly over the step's collectives; none outside a step) x
    its ring steps (N-1 an all-gather, 2(N-1) otherwise) x the pace's step."""
    n = int(g.world_size)
    steps = np.where(g.comm_kind[comm] == int(CommKind.ALL_GATHER), n - 1, 2 * (n - 1)).astype(np.float64)
    every = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    per_step = np.bincount(g.step[every][g.step[every] >= 0], minlength=int(g.step.max()) + 1)
    arrays = np.array([float(g.meta.collective_operands_per_step or 0.0) / per_step[s] if s >= 0 else 0.0
                       for s in g.step[comm].tolist()])  # outside every step: no array of the step's is its
    return arrays * steps * pace.step_us
