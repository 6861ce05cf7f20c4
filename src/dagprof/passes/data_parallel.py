"""DDP <-> FSDP2: the profiled job under the other data-parallel wrapper (``whatif --data-parallel``).

DDP -> FSDP (``ddp_to_fsdp``; FSDP -> DDP: ``passes.fsdp_to_ddp``). The units are what a user wraps: each numbered child of a container
(``blocks.0``, ``layers.3``: the ``for block in model.blocks: fully_shard(block)`` recipe), found in the
layers' module paths, and the root (``fully_shard(model)``) with every other layer; a model without a
numbered container has the root alone. Which units reshard after forward is ``fully_shard``'s default
(``reshard_after_forward=None``, ``passes.fsdp.default_reshard``): every unit but the root, which lazy init keeps
gathered from its forward through its backward (one all-gather a step, not two); ``fsdp:keep`` keeps every unit, and
``--reshard-after-forward on|off`` passes that flag explicitly to every unit, the root included (``on``: the root too is
gathered again at backward's start, as torch 2.13 does for ``fully_shard(model, reshard_after_forward=True)``).
A unit's parameters are its layers' gradient bytes as profiled.
The DDP bucket all-reduces go (and the finalize wait's measured blocking with them); per unit and step,
on every rank's main lane, as FSDP2 runs them under gloo (``graph.build_fsdp`` names and orders them):
- before the unit's first forward layer (the root's: before any layer) its all-gather of the full
  parameters, blocking, then the copy-out of the gathered bytes into the parameters;
- a reshard after its last forward layer (the root's after the forward) where the unit reshards after forward, and
  then the same all-gather and copy-out again before its first backward layer (the root's: at backward's start); a
  unit that runs no backward (frozen whole) is gathered all the same, by the next unit's pre-backward (FSDP2's
  backward prefetch follows the forward order, not what runs backward: ``_prefetcher``);
- after its last backward layer (the root's after the backward) its reduce-scatter, blocking, and its reshard;
- the optimizer updates this rank's shards only, on DTensors: the profiled step times DTensor's ratio to a plain step,
  measured per torch version by ``bench/dtensor_optimizer.py`` (``costmodel.fsdp_costs.DTENSOR_STEP``: AdamW at the job's
  tensors and bytes; DTensor's dispatch per op about 7.6x a plain op's at torch 2.13, so a model of small tensors steps
  several times DDP's step, not 1/N of it: the held-out ResNet's FSDP2 jobs 7-20x, priced 5.1x); a version not measured:
  1/N of the profiled time, said in the note (``dtensor_note``);
- FSDP2's hooks around each unit (pre/post-forward and backward, the all-gather's and the reduce-scatter's copy-ins, the
  gradients' views, the reshard frees), host work no DDP profile ran: an ``fsdp hooks`` node before the unit's forward
  all-gather and one after its reduce-scatter, at the CPU time ``bench/fsdp_host_costs.py`` measured per torch version
  (``costmodel.fsdp_costs.FSDP_HOST``: per unit, per trained tensor and per byte of the unit), stretched by the rank's own
  waits for a core as profiled (``_stretch``: CPU work on the job's loaded cores); a version not measured: none, said in
  the note (``host_note``).
Each of those collectives blocks the rank, where DDP's all-reduces block nothing until the finalize: the rank hands the
call to gloo's worker thread, which must be woken to run it, and is itself woken when it completes. Where ``FSDP_HOST``
prices each call for the profile's torch, both wake-ups are in that price (a call timed from a barrier to its slowest
rank's return, ``bench/fsdp_call_sizes.py``) and none is added (``priced_wake_up``: added on top, the held-out quiet
pairs' all-gathers held the ranks a median 1.4 ms a step longer than their FSDP2 jobs' did, the step +22 % median
miss, 14 % without). Else each wake-up costs
what the DDP profile's own waits that blocked cost (``wake_up``: DDP's finalize behind its last bucket; the median lag of
those waits beyond their collective's end, both ranks): the issue carries one, the wait's gap the other. The held-out
mixer's quiet FSDP2 jobs lagged 0.42-0.97 ms on average after each wait, their DDP jobs' finalize 0.28-0.68 ms, where
the run-queue wait per time the busy thread got a core (the kernel's schedstat, what priced it before, and still where no
wait blocked) said 0.06-0.44. A profile with neither prices none and says so with the count of blocking collectives
(``blocking_note``). The price rests on 7-8 heavy-tailed lags (a mixer profile's 4 steps): its standard error, times
the wake-ups a step, widens the prediction's interval (``search.whatif``), which held 11 of 16 mixer pairs' FSDP
steps (load 0.5-23) where it held 7 without. With ``calibrate --fsdp``'s file none is added: its sweep timed each kind as blocking calls, their
wake-ups (at the calibration's load) in them.
Collectives are priced by the link model as every FSDP collective is (all-gathers half an all-reduce of
the gathered bytes, gloo's reduce-scatter a whole one; with a per-kind link model from ``dagprof calibrate``, each
kind on the link its own sweep fitted: ``Topology.kinds``), each with gloo's fixed cost per blocking call as
``FSDP_HOST`` has it for the torch version (an all-gather's mean, 0.55 ms at 2.13, hand-offs between threads: stretched
as the hooks, at the slowest rank's, where the fit's overhead held the load) in place of the DDP profile's fitted overhead
per collective: fitted on DDP's all-reduces of one bucket size, that is their step-to-step excess (0.55-8.0 ms on the
held-out ResNet's DDP profiles, 0 on the mixer's), not a cost per call. Where that fit saw no bandwidth (its all-reduces'
durations did not grow with their size: all of their time in the overhead, ``no_bandwidth``), FSDP's bytes cost gloo's
measured time per byte beyond a call's (``FsdpHost.call_us_per_byte``, stretched alike), not nothing: 12 of the 28 kept LM/GRU
DDP profiles (two buckets a step) fitted so, and their conversions had priced each 0.8 MiB reduce-scatter 0.58 ms where
their FSDP2 jobs took 1.5-2.7 (a DTensor step priced 2.1x the jobs' own had covered it). So too where the fit's price per byte
is dearer than that blocking call's and holds the backward beside it (``beside_compute``): every rank on one host, whose
loopback transfer is the ranks' own CPU work, no wire named, and DDP's all-reduces on two gloo lanes at once beside the
backward on the same cores (their total time over their bytes): 44 of the 95 kept DDP profiles fitted 0.46-4.44 ns a
byte so, and 21 of the 23 above gloo's 1.86 priced their FSDP2 jobs' all-gathers +8 to +35 % of the step over (the q52
set's median point +11.9 % over its jobs' steps), where FSDP2's blocking calls run with the rank's compute stopped (a
lone lane's fit, 8.2 ns a byte on the 1 Gbit/s testbed, is the wire's and stays). Gloo's reduce-scatter costs more per call (1.48 ms
at 2.13, its mean: about a third of its calls return 4 ms late, at any size from 4 KiB to 1 MiB), which each
reduce-scatter's wait carries as its lag beyond the wake-up, on every rank (``FsdpHost.scatter_us``), stretched alike.
Gloo's all-gather also releases one rank after the other, where the ranks compute between their calls 0.20 ms more than
from a barrier (which the fixed cost holds) and 0.16 ms per MiB gathered, on a quiet machine (its mean; a tail:
``FsdpHost.release_us``, ``release_us_per_byte``): the later rank's wait carries it, alternating between the ranks call by
call as the FSDP2 jobs did, stretched alike. With 2-20 ms of compute between the calls a share of them releases the later rank a
scheduler slice late and the rest together; how often follows the FSDP job's own load (across 63 kept pairs its mean release
was 0.20 ms + 3.5 ms x (its stretch - 1)), which no load the DDP profile records tracks (its stretch: Spearman -0.08; priced
from it, the kept pairs lost): so the quiet price, which the jobs at a stretch below 1.1 met (a median 0.34 ms a call).
Nor does the interval carry more (``search.whatif``; ``conversion_note`` says the point assumes a quiet release): it held 74 of
95 kept FSDP2 jobs' median unprofiled steps, 41 of the 48 it was examined on; each all-gather's later rank released, at the
high end, a scheduler slice (3 ms) times the share of the DDP profile's busiest step spent waiting for a core, at the low end
not at all, took in one more of those 48 (width 68 -> 79 % of the point; 33 -> 36 of the other 47, 60 -> 70 %): not kept
(docs/evidence.md, branch fsdpiv). With the DTensor step re-measured and the bytes of a fit without bandwidth priced
(branch ddpfsdp57) it held 81 of the 95 (43 of those 48, 38 of the other 47); with two lanes' bytes at gloo's
blocking price (``beside_compute``, branch ddpfsdp58) the same 81, median miss 12.2 -> 10.8 %.
A copy-out is a pass over memory and a call, like DDP's
bucket enqueue (which scales each bucket in place, then dispatches): it costs what the profile's fastest enqueues cost
per call and per byte, stretched as the hooks (``_enqueue_price``: under load DDP's enqueues ran 10-40x their fastest).

With FSDP2's costs measured on the user's machine (``dagprof calibrate --fsdp``: ``costmodel.fsdp_costs``), two of
those rules give way to what was measured, since a DDP profile holds neither: the optimizer step is the profiled one
times the measured ratio of the same optimizer on DTensor shards to plain whole tensors at this job's tensor count
and bytes (DTensor's fixed cost per tensor is what makes FSDP's step cost more than 1/N of DDP's on models of many
small tensors), a copy-out costs the measured time per byte of FSDP2's own copy-out into new storage (DDP's
in-place bucket scaling is a different pass over memory: 0.6-2.6x it on the held-out models), and each unit gets
what a unit measured beyond its collectives, as an ``fsdp hooks`` node before its forward all-gather and one
after its reduce-scatter: FSDP's hooks, copy-in and reshard, and each rank's wake-up after a blocking collective
(on a 2-core machine 1-3 ms per all-gather and reduce-scatter, on both ranks, where DDP's all-reduces block nothing),
at the unit's bytes (``FsdpCosts.unit_us``: a small unit's cost, grown by what the calibration's units of MBs cost
more per byte beyond their copy-outs).

The same file prices each collective kind at its measured sizes (``Topology.kind_factor``): a large embedding's root unit
gathers tens of MBs, where gloo's all-gather measured 1.4-1.7x the wire time and the kind's fit, weighted to every size
alike, priced it 20-40 % low.

Still not predicted (``conversion_note``): how the wake-up after a blocking collective grows with the machine's load
beyond what the calibration met, and the compute DDP's overlapping all-reduces slowed on a machine whose cores the
collectives share (FSDP's block it instead), and the lag of the reduce-scatter FSDP2 issues from its final backward
callback for a unit whose forward inputs need no gradient (``final_callback_units``: the first trained block behind
frozen layers, reduce-scattered after the root; in the kept MLP-Mixer and LoRA FSDP2 profiles its wait lagged 2.6-10.1 ms
a step beyond its transfer where each other reduce-scatter's lagged 0.3-1.4 ms, where a stack of ``fully_shard`` blocks
alone returned it no later than the others (``bench/fsdp_final_rs.py``, quiet): said, priced as every reduce-scatter; the conversion
reduce-scatters it after the root's, from the root's last backward layer, as FSDP2 does: ``_plan``'s ``late``).
``clip_grad_norm_``: on FSDP2's DTensor gradients it all-reduces the
norm in the shard group, blocking, before the optimizer step (``_c10d_functional::all_reduce``), where DDP's clip is
local: in Kineto the LoRA job's clip (``bench/fsdp_fresh/lora_finetune.py``, first norm to the step) ran 1.4-3.9 ms a
step under FSDP2, its all-reduce and wait 0.1-2.6 of it, against 0.3-0.4 ms under DDP (a step of 32 / 23 ms, 2 gloo
ranks, load 2.3). It opens no ``record_function`` (unnamed compute between the backward and the step, under Kineto
too), so the collector records each call (``collect.hooks.grad_clip``: ``GraphMeta.grad_clips``); where it did, each
step gets the all-reduce of the norm (4 bytes, priced by the link model, with its two wake-ups) before the optimizer
step, and with ``calibrate --fsdp``'s file DTensor's dispatch beyond the plain clip the profile timed, at the
optimizer's measured DTensor-to-plain ratio for the clipped tensors (both are passes over the same gradients); without
it that dispatch is said with the count of gradients, not priced (``blocking_note``).

Measured (``bench/bench_fsdp.py --part 7``, 2 gloo ranks on a 2-core machine at load 5-10): DDP -> FSDP predicts
low, -5 to -31 %, most at 200 Mbit/s and on loopback. Read from the FSDP profiles there, what it lacks: gloo's
all-gather releases one of the two ranks about 0.45 of its transfer after the other (median over every
all-gather at 200 Mbit/s; its reduce-scatter releases both together), its all-gathers and reduce-scatters cost
1-3x the all-reduce per byte when CPU-bound (loopback), and FSDP's optimizer step on DTensor shards and its hooks
run longer than their share of DDP's. None of that is in a DDP profile; the pricing rules stay those of the FSDP
what-ifs (which keep each FSDP profile's measured waits). With ``dagprof calibrate --fsdp`` on the same link
(``--link-model-calibrate``, 2 rounds, load 2.2-4.2): -1.5 and -8.3 % at 200 Mbit/s, -12.2 and -7.5 % at 1 Gbit/s,
-32.5 and -5.7 % on loopback (transformer, embedding; the per-kind fit alone -19 to -40 %); on an idle machine
(load 0.7, one pair on loopback) +1.3 and -10.7 %. On a quiet machine after every merge (2 rounds, load 0.3-2.9):
-17.8 and -2.3 % at 200 Mbit/s, -12.3 and -2.6 % at 1 Gbit/s, -15.5 and -16.8 % on loopback. Under load a blocking
collective's wake-up costs FSDP far more than the small unit measured at another moment: the transformer's FSDP
loopback job ran 147 ms idle, 220 ms at load 2.5. The transformer's 200 Mbit/s miss was mostly its all-gathers' lag:
in its FSDP profile (kept, load 2-5) each 3 MiB all-gather released the first rank after 68 ms and the other 31 ms
later, 99.6 ms in all, which the slowest rank's median of a sweep priced at 78 ms in one calibration and 99 in
another (the last rank out alternates); timed at each repetition's slowest rank (``collect.measure.calibrate``) two
calibrations priced it 99.4 and 103.4 ms and the job came out +3.8 and -0.5 % (the earlier rule's two: -15.3 and -4.5 %).
The growth of each unit's cost with its bytes (``FsdpCosts.unit_us``, in CPU time: 0.7 ms per MiB of a unit over
forward and backward on loopback, 2.8 at 200 Mbit/s, load 3-5) added +2.3 points there. One round per model and link
at load 1.1-2.8 (kept; each cell's FSDP profile against its prediction from the DDP profile on a calibration by this
code, then on one by the code before, run right after): transformer -3.9, -0.8, -4.0 % (loopback, 1 Gbit/s,
200 Mbit/s; before -11.5, -8.2, -8.3 %), MLP with an embedding -5.3, -5.3, -3.4 % (before -16.6, -9.6, -4.7 %); the
growth is 3.6-6.1 points of that on loopback and 1 Gbit/s, 0.9-2.0 at 200 Mbit/s.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from ..costmodel.alphabeta import AlphaBeta
from ..costmodel.fsdp_costs import DTENSOR_STEP, FSDP_HOST, FsdpCosts, FsdpHost, StepFit, optimizer_ratio
from ..costmodel.topology import Topology
from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.dag import Graph, GraphBuilder
from ..graph.meta import FsdpGraphUnit, FsdpRecord, FsdpShards, WakeFrom, WakeUp
from ..graph.provenance import provenance
from ..traces.events import CommKind, Kind
from ..traces.meta import runnable_stretch
from ..traces.run_schema import FSDP1_API, FSDP_ROOT
from .buckets import chain_lanes, main_lane, profiled_buckets
from .comm import current_scheme, current_topology, retime_collectives
from .fsdp import default_reshard, set_reshard
from .fsdp_to_ddp import fsdp_to_ddp
from .gradients import unhooked
from .link_fit import graph_world_size, hybrid, one_host

TARGETS = ("ddp", "fsdp", "fsdp:keep")  # fsdp: fully_shard's default reshard_after_forward; fsdp:keep: False on every unit
_EPS = 1e-7  # us: an inserted node's order next to the node it precedes or follows (below the profile's 1 ns)


RESHARD_NOTE = ("units resharded after forward as fully_shard's default does (reshard_after_forward=None: the root kept gathered through its "
                "backward, every other unit resharded; fsdp:keep keeps every unit, --reshard-after-forward on|off passes the flag to every "
                "unit, the root too); ")


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One conversion's miss on held-out pairs, as last judged: the one place these figures live (``conversion_note`` and
    ``conversion_summary`` say them); ``source`` re-judges the pairs, and its figures are updated here by hand."""

    off: str  # how far the held-out jobs' measured steps fell from the point (and its interval)
    memory: str  # their peak memory against the prediction's
    source: str  # the pairs, their machine and the command that judges them


class Conversion(enum.Enum):
    """A conversion judged on held-out pairs, the key of its figures in ``HELD_OUT`` (a member, not a string: a misspelt
    one fails where it is written). ``_MEASURED``: FSDP2's costs from ``dagprof calibrate --fsdp``."""

    FSDP1_TO_DDP = enum.auto()
    FSDP_TO_DDP = enum.auto()
    FSDP_TO_DDP_MEASURED = enum.auto()
    DDP_TO_FSDP = enum.auto()
    DDP_TO_FSDP_MEASURED = enum.auto()


HELD_OUT = {
    Conversion.FSDP1_TO_DDP: HeldOut("-40 to +44 % off the DDP job's median unprofiled step, median miss 17 %, 6 of 10 inside the interval",
                                     "within 1 %", "10 pairs of bench/fsdp_fresh/fsdp1_sgo_frozen.py and its --wrap ddp, loopback, load 1.1-2.3"),
    Conversion.FSDP_TO_DDP_MEASURED: HeldOut("DDP 0.1 % slower to 11.1 % faster than the point", "-0 to +10 %",
                                             "2 rounds on a quiet machine, bench/bench_fsdp.py --part 7"),
    Conversion.FSDP_TO_DDP: HeldOut("-41 to +109 % off the point, median +17 %", "-0 to +10 %",
                                    "an MLP-Mixer and a ResNet, 16 pairs at load 1-23, bench/fsdp_fresh/mixer_rounds.sh"),
    Conversion.DDP_TO_FSDP_MEASURED: HeldOut("FSDP 8-18 % slower than the point on a quiet machine, more under load", "within about 10 %",
                                             "a transformer-like stack and an MLP with an embedding, loopback, two calibrations, "
                                             "bench/bench_fsdp.py --part 7 --link-model-calibrate"),
    Conversion.DDP_TO_FSDP: HeldOut("median miss 10.8 %; the interval held 81 of 95 FSDP2 jobs' steps, 4 below it and 10 above (a busier machine "
                                    "runs FSDP slower)", "within about 10 %", "95 kept pairs, bench/fsdp_fresh/judge_pairs.py"),
}


def _held_out(target: str, measured: bool, g: Graph) -> HeldOut:
    if target == "ddp" and g.meta.fsdp is not None and g.meta.fsdp.api == FSDP1_API:
        return HELD_OUT[Conversion.FSDP1_TO_DDP]
    if target == "ddp":
        return HELD_OUT[Conversion.FSDP_TO_DDP_MEASURED if measured else Conversion.FSDP_TO_DDP]
    return HELD_OUT[Conversion.DDP_TO_FSDP_MEASURED if measured else Conversion.DDP_TO_FSDP]


def conversion_note(target: str, measured: bool, g: Graph) -> str:
    """Said beside every converted row: what the conversion cannot see, and how far it missed on held-out jobs;
    ``measured``: FSDP2's costs came from ``dagprof calibrate --fsdp`` (``ddp_to_fsdp``, ``fsdp_to_ddp``); ``g``: the
    profile converted (a DDP one's blocking collectives and clip: ``blocking_note``)."""
    h = _held_out(target, measured, g)
    held = f"held-out ({h.source}): {h.off}; peak memory {h.memory}"
    if target == "ddp" and g.meta.fsdp is not None and g.meta.fsdp.api == FSDP1_API:
        return ("the optimizer step on whole tensors as FSDP1's on plain tensor shards times the ranks (FSDP1 steps no DTensor), "
                "FSDP1's hooks dropped, DDP's buckets as DDP forms them; the two jobs of a pair ran their layers apart as the "
                "machine's load moved, and the compute DDP's all-reduces slowed beside them is within the interval's high end; " + held)
    if target == "ddp":
        if measured:
            return ("the optimizer step on whole tensors over FSDP2's on DTensor shards as dagprof calibrate --fsdp measured them here; "
                    "FSDP's hooks are dropped; " + held)
        return ("the optimizer step on whole tensors over FSDP2's on DTensor shards at DTensor's measured ratio for the profile's torch "
                "version (bench/dtensor_optimizer.py; none measured: the ranks times the step); " + held)
    if measured:
        return RESHARD_NOTE + blocking_note(g, measured) + final_scatter_note(g) + (
            "the optimizer step on DTensor shards, FSDP2's copy-out, each unit's hooks and wake-ups beyond its collectives at its "
            "bytes and each collective kind at its swept sizes (its last rank out included) are as dagprof calibrate --fsdp measured "
            "them here; not predicted: how the wake-ups grow with the machine's load (a blocking collective's wake-up grows with "
            "it), and compute that DDP's overlapping all-reduces slowed; " + held)
    return RESHARD_NOTE + blocking_note(g, measured) + final_scatter_note(g) + dtensor_note(g) + host_note(g) + (
        "the point assumes a quiet release: gloo's all-gather lets its later rank go as on a quiet machine, where how often a call "
        "releases it a scheduler slice late follows the FSDP job's own load at its moment (beside another job the release came out "
        "2.5-12x later; bench/fsdp_release.py), which a DDP profile does not record, nor a reduce-scatter's lag beyond a wake-up "
        "(dagprof calibrate --fsdp measures them for --link-model); the interval spans the replayed steps, the link fit, the level "
        "the point stands on and the shared cores' bounds, and the jobs above it released their later ranks later than the DDP "
        "profile's moment did, so FSDP may run slower than its high end on a machine busier than when profiled; " + held)


def conversion_summary(target: str, measured: bool, g: Graph) -> str:
    """``conversion_note`` in the few lines a user reads beside the rows: what is priced and what not, how far held-out jobs
    missed, what to do. The derivation stays in ``conversion_note`` (``--json``'s ``conversion_detail``)."""
    h = _held_out(target, measured, g)
    held = f"held-out: {h.off}; memory {h.memory}"
    if target == "ddp":
        if g.meta.fsdp is not None and g.meta.fsdp.api == FSDP1_API:
            return "the optimizer step on whole tensors as FSDP1's on plain tensor shards times the ranks, FSDP1's hooks dropped: " + held
        if measured:
            return "the optimizer step on whole tensors as calibrate --fsdp measured it here, FSDP's hooks dropped: " + held
        return "the optimizer step on whole tensors at DTensor's measured ratio, FSDP's hooks dropped: " + held
    layout, clips, late = "fully_shard's default reshard (the root kept gathered); ", g.meta.grad_clips, final_callback_units(g)
    missing = ([] if clips else ["clip_grad_norm_ (not recorded)"]) + ([f"the late reduce-scatter of {', '.join(late)} (its lag)"] if late else [])
    if measured:
        return (layout + "FSDP2's hooks, copy-out, optimizer step and collectives as calibrate --fsdp measured them here; "
                + (f"unpriced: {', '.join(missing)}; " if missing else "")
                + "not predicted: wake-ups growing with load; " + held)
    host = FSDP_HOST.get(g.meta.torch_minor)
    version = f"torch {g.meta.torch_minor or g.meta.torch or '(not recorded)'}"
    priced = [("FSDP2's hooks and calls", host is not None),
              ("the DTensor optimizer step", g.meta.torch_minor in DTENSOR_STEP and bool(_stepped_params(g))),
              ("the blocking calls' wake-ups", host is not None or wake_up(g) is not None)]
    if clips:
        priced.append(("clip_grad_norm_'s dispatch", g.meta.torch_minor in DTENSOR_STEP))
    said = ", ".join(w for w, ok in priced if ok)
    unpriced = [w for w, ok in priced if not ok] + missing
    stretch = _stretch(g) if host is not None and g.meta.loop_steps is not None and any(g.meta.loop_steps.sched.values()) else {}
    load = (f" (stretched {min(stretch.values()):.2f}-{max(stretch.values()):.2f}x by the profile's waits for a core)" if stretch else
            " (not stretched by the job's load: profile again with this dagprof to record it)" if host else "")
    return (layout + (f"priced at {version}'s measured costs{load}: {said}; " if said else "")
            + (f"unpriced: {', '.join(unpriced)}; " if unpriced else "")
            + held)


def dtensor_note(g: Graph) -> str:
    """What the conversion of ``g`` without ``calibrate --fsdp`` priced of FSDP2's optimizer step on DTensor shards
    (``optimizer_ratio``)."""
    if g.meta.torch_minor in DTENSOR_STEP and _stepped_params(g):
        return (f"the optimizer step on DTensor shards as the profile's own step times DTensor's measured ratio for torch {g.meta.torch_minor} "
                "(AdamW on 2 gloo ranks, bench/dtensor_optimizer.py; another optimizer at AdamW's ratio); ")
    if g.meta.torch_minor in DTENSOR_STEP:
        return ("the optimizer step on DTensor shards unpriced (1/N of the profile's): the profile records no DDP buckets, so not the "
                "parameter tensors it steps; ")
    return (f"the optimizer step on DTensor shards unpriced (1/N of the profile's): DTensor's ratio to a plain step is not measured for "
            f"torch {g.meta.torch or '(not recorded)'} (bench/dtensor_optimizer.py measures it); ")


def host_note(g: Graph) -> str:
    """What the conversion of ``g`` without ``calibrate --fsdp`` priced of FSDP2's hooks per unit and gloo's fixed cost per
    call (``FSDP_HOST``)."""
    host = FSDP_HOST.get(g.meta.torch_minor)
    if host is None:
        return (f"FSDP2's hooks per unit unpriced and each collective's fixed cost per call at the profile's fitted "
                f"{current_topology(g).overhead_us / 1e3:.2f} ms per collective: not measured for torch {g.meta.torch or '(not recorded)'} "
                "(bench/fsdp_host_costs.py measures them); ")
    stretch = _stretch(g)
    said = (f"stretched by each rank's waits for a core as profiled ({min(stretch.values()):.2f}-{max(stretch.values()):.2f}x)"
            if g.meta.loop_steps is not None and any(g.meta.loop_steps.sched.values()) else
            "not stretched by the job's load (the profile does not record its thread's waits for a core: profile again with this dagprof)")
    return (f"FSDP2's hooks per unit at the CPU time measured for torch {g.meta.torch_minor} (bench/fsdp_host_costs.py: "
            f"{host.forward.us / 1e3:.2f} / {host.backward.us / 1e3:.2f} ms a unit forward / backward, more per tensor and byte) "
            f"and each copy-out at DDP's fastest bucket enqueue, both {said}; each FSDP collective's fixed cost per call at gloo's "
            f"measured {host.call_us / 1e3:.2f} ms (wall time, 2 ranks; so stretched, at the slowest rank's, where the fitted "
            f"overhead held the load) in place of the profile's fitted {current_topology(g).overhead_us / 1e3:.2f} ms per collective, "
            f"and each reduce-scatter's wait {host.scatter_us / 1e3:.2f} ms more (gloo's mean tail: about a third of its calls "
            "return 4 ms late, bench/fsdp_call_sizes.py)"
            + (f", and each all-gather's later rank {host.release_us / 1e3:.2f} ms + {host.release_us_per_byte * 2**20 / 1e3:.2f} ms "
               "per MiB gathered after the other (bench/fsdp_release.py, quiet, compute between the calls; which rank alternates)"
               if host.release_us or host.release_us_per_byte else "")
            + _bytes_said(g, host, stretch) + "; ")


def _bytes_said(g: Graph, host: FsdpHost, stretch: dict[int, float]) -> str:
    """``host_note``'s words where FSDP's bytes cost gloo's blocking call's price, not the profile's fit (``ddp_to_fsdp``)."""
    topo, price = current_topology(g), f"{host.call_us_per_byte * 1e3:.2f} ns per all-reduce-equivalent byte (bench/fsdp_call_sizes.py)"
    if not host.call_us_per_byte:
        return ""
    if no_bandwidth(topo):
        return (f"; the profile's all-reduces showed no bandwidth (their time did not grow with their size), so FSDP's bytes at gloo's "
                f"measured {price}, stretched as the call")
    if beside_compute(g, topo, AlphaBeta(0.0, host.call_us_per_byte * _call_load(g, stretch))):
        return (f"; the profile's all-reduces ran on two gloo lanes beside the backward on one host's cores, their bytes fitted at "
                f"{topo.intra.beta_us_per_byte * 1e3:.2f} ns each, so FSDP's blocking calls' bytes at gloo's measured {price}, "
                "stretched as the call")
    return ""


def layer_params(g: Graph) -> dict[str, int]:
    """Each layer's parameter bytes in the DDP profile ``g``: those with a gradient and the frozen ones (gathered, never
    reduce-scattered nor stepped)."""
    grad, frozen = g.meta.layer_grad_bytes, g.meta.layer_frozen_bytes
    return {x: grad.get(x, 0) + frozen.get(x, 0) for x in {*grad, *frozen}}


def final_callback_units(g: Graph) -> list[str]:
    """The trained units of the DDP profile ``g`` as ``user_units`` that FSDP2 reduce-scatters from its final backward
    callback, after the root: those whose forward inputs need no gradient (no layer with a gradient ran before the unit's
    first one in a step's forward: the first trained block behind a frozen stem or frozen blocks), so their post-backward
    hook never fires (``_root_post_backward_final_callback`` runs it). Read on the first profiled step of the lowest rank."""
    grad, params = g.meta.layer_grad_bytes, layer_params(g)
    ranks = np.unique(g.rank[g.rank >= 0])
    if not g.layers or not any(grad.values()) or not len(ranks) or not g.meta.steps:
        return []
    layer_unit = {x: name for name, ls in user_units(g.layers, params) for x in ls}
    out, seen, trained = [], set(), False
    for v in main_lane(g, int(g.meta.steps[0]), int(ranks[0])).tolist():
        if g.kind[v] != Kind.FORWARD or g.layer[v] < 0:
            continue
        layer = g.layers[int(g.layer[v])]
        unit = layer_unit.get(layer, FSDP_ROOT)
        if unit != FSDP_ROOT and unit not in seen:
            seen.add(unit)
            if not trained and any(grad.get(x, 0) for x, u in layer_unit.items() if u == unit):
                out.append(unit)
        trained = trained or grad.get(layer, 0) > 0
    return out


def final_scatter_note(g: Graph) -> str:
    """Said where ``final_callback_units`` finds one: the lag of that reduce-scatter, which no DDP profile shows, is unpriced."""
    late = final_callback_units(g)
    if not late:
        return ""
    return (f"{', '.join(late)} ha{'ve' if len(late) > 1 else 's'} no input that needs a gradient (frozen layers before it), so FSDP2 "
            "reduce-scatters it from its final backward callback, after the root (so priced): in kept gloo profiles of such jobs (an "
            "MLP-Mixer behind frozen blocks, a LoRA fine-tune) that call's wait lagged 2.6-10.1 ms a step beyond its transfer, the "
            "others 0.3-1.4 ms, where a stack of fully_shard blocks alone (bench/fsdp_final_rs.py, quiet) returned it no later than "
            "the others: priced as every reduce-scatter, with gloo's mean tail, not more; ")


def _stepped_params(g: Graph) -> set[str]:
    """The parameter tensors DDP's buckets hold: those its optimizer steps."""
    return {p for bk in g.meta.buckets for p in bk.params}


def blocking_note(g: Graph, measured: bool) -> str:
    """What the DDP -> FSDP conversion of ``g`` priced of its blocking collectives' wake-ups and of ``clip_grad_norm_``,
    and what not, with counts (a step at ``fully_shard``'s default)."""
    grad, params = g.meta.layer_grad_bytes, layer_params(g)
    units = user_units(g.layers, params) if g.layers and params else []
    trained = _unit_sizes(units, grad) if units else {}
    plan = _plan([u for u, _ in units], wrapper_reshard([u for u, _ in units], "fsdp", None)) if units else []
    clips = max((c.calls for c in g.meta.grad_clips.values()), default=0)
    tensors = max((c.tensors for c in g.meta.grad_clips.values()), default=0)
    colls = sum(p.kind == PlanKind.ALL_GATHER or (p.kind == PlanKind.REDUCE_SCATTER and trained[p.unit] > 0) for p in plan) + clips
    wake = wake_up(g)
    out = (f"{colls} blocking collectives a step, their wake-ups as the calibration's blocking calls met them; " if measured else
           f"{colls} blocking collectives a step, their wake-ups in gloo's measured cost per call (FSDP_HOST, timed from a "
           "barrier to the slowest rank's return); " if FSDP_HOST.get(g.meta.torch_minor) is not None else
           f"{colls} blocking collectives a step, each with 2 wake-ups (the hand-off to gloo's worker, the rank's own after it) at "
           f"{wake.said()}; " if wake else
           f"the wake-ups of {colls} blocking collectives a step (2 each, on every rank) unpriced: no wait of this profile blocked, and it "
           "does not record how often its thread got a core (profile again with this dagprof); ")
    if not g.meta.grad_clips:
        return out + ("clip_grad_norm_ not recorded in this profile (an older file, or the job does not call torch.nn.utils.clip_grad_norm_): "
                      "if it clips, FSDP2's blocking all-reduce of the norm and DTensor's dispatch on each gradient are unpriced; ")
    return out + (f"clip_grad_norm_ ({clips} call(s) a step on {tensors} gradients): its blocking all-reduce of the norm priced"
                  + (", DTensor's dispatch on its gradients at the optimizer's measured DTensor-to-plain ratio; "
                     if measured or g.meta.torch_minor in DTENSOR_STEP else
                     f"; DTensor's dispatch on its {tensors} gradients unpriced (dagprof calibrate --fsdp measures it for --link-model); "))


def parse_target(text: str) -> str:
    if text not in TARGETS:
        raise ValueError(f"expected ddp, fsdp or fsdp:keep, got {text!r}")
    return text


def unit_name(path: str) -> str:
    """The unit a module path falls in as a user wraps the model: the first number in it ends the unit's name
    (``blocks.0.up`` -> ``blocks.0``, a numbered child of a container), else the root."""
    parts = path.split(".")
    k = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    return FSDP_ROOT if k is None else ".".join(parts[: k + 1])


def user_units(layers: list[str], param_bytes: dict[str, int]) -> list[tuple[str, list[str]]]:
    """(unit, its layers) as a user wraps the model: each numbered child of a container (``unit_name``), then the
    root with the rest. Units without parameters (of any module in them: ``param_bytes`` by owner) are the root's. Where
    some numbered children are blocks (modules with layers inside), a numbered child that is a single layer (a stem's
    ``nn.Sequential(conv, norm)``) is the root's too: a user wraps the blocks (the held-out ResNet,
    ``bench/fsdp_fresh/resnet_ddp.py``, had its stem's conv and norm as two units more, 6 collectives a step that its
    FSDP job did not run). The root comes first; the others in the layers' order."""
    members: dict[str, list[str]] = {FSDP_ROOT: []}
    for layer in layers:
        members.setdefault(unit_name(layer), []).append(layer)
    owned = _by_unit(param_bytes)
    blocks = any(ls != [name] for name, ls in members.items() if name != FSDP_ROOT)
    out = [(FSDP_ROOT, members.pop(FSDP_ROOT))]
    for name, ls in members.items():
        if owned.get(name, 0) > 0 and not (blocks and ls == [name]):
            out.append((name, ls))
        else:
            out[0][1].extend(ls)
    root = set(out[0][1])
    return [(FSDP_ROOT, [x for x in layers if x in root])] + out[1:]


def _by_unit(sizes: dict[str, int]) -> dict[str, int]:
    """``sizes`` (per owning module path) summed per ``unit_name``."""
    out: dict[str, int] = {}
    for path, nb in sizes.items():
        out[unit_name(path)] = out.get(unit_name(path), 0) + nb
    return out


def _unit_sizes(units: list[tuple[str, list[str]]], sizes: dict[str, int]) -> dict[str, int]:
    """Bytes per unit of ``units`` of ``sizes`` (per owning module path): a unit name that is none of theirs is the root's."""
    out = {name: 0 for name, _ in units}
    for name, nb in _by_unit(sizes).items():
        out[name if name in out else FSDP_ROOT] += nb
    return out


def wrapper_reshard(units: list[str], target: str, reshard: bool | None) -> dict[str, bool]:
    """Whether each of ``units`` reshards after forward under ``--data-parallel target`` (fsdp or fsdp:keep) and
    ``--reshard-after-forward`` (``reshard``, None: not asked): that flag on every unit, the root too, where asked; else
    none (fsdp:keep); else ``fully_shard``'s default (``default_reshard``)."""
    return {u: reshard if reshard is not None else target != "fsdp:keep" and default_reshard(u) for u in units}


def to_data_parallel(g: Graph, target: str, bucket_mb: float | None = None, costs: FsdpCosts | None = None,
                     reshard: bool | None = None) -> Graph:
    """``g`` (a DDP or FSDP2 profile) under ``target``: ddp, fsdp or fsdp:keep, each unit resharding after forward as
    ``wrapper_reshard`` says (``reshard``: ``--reshard-after-forward``, on every unit); ``costs``: FSDP2's measured on
    this machine, for DDP -> FSDP (``ddp_to_fsdp``) and FSDP -> DDP's optimizer step (``fsdp_to_ddp``)."""
    if is_fsdp_graph(g) and any(len(u.mesh) > 1 for u in g.meta.fsdp.units):
        raise DagprofError("--data-parallel: this profile is an HSDP job (2-D mesh); only plain FSDP <-> DDP is modelled")
    if hybrid(g):
        raise DagprofError("--data-parallel: this profile is a hybrid job (DP beside TP/PP/EP); DDP <-> FSDP is modelled for plain data parallelism only")
    if is_fsdp_graph(g):
        mixed = next((u for u in g.meta.fsdp.units if u.param_dtype and u.orig_dtype and u.param_dtype != u.orig_dtype), None)
        if target == "ddp" and mixed is not None:  # the forward and backward ran in param_dtype; DDP runs them in the parameters'
            raise DagprofError(f"--data-parallel ddp: this FSDP job computes in {mixed.param_dtype} (MixedPrecisionPolicy) over "
                               f"{mixed.orig_dtype} parameters; DDP's compute in {mixed.orig_dtype} is not modelled (profile it without param_dtype)")
        if target == "ddp":
            return fsdp_to_ddp(g, bucket_mb, costs)
        return set_reshard(g, wrapper_reshard([u.name for u in g.meta.fsdp.units], target, reshard))
    if not ((g.kind == Kind.COMM) & (g.bucket >= 0)).any() or g.meta.framework or g.meta.horovod is not None:
        raise DagprofError("--data-parallel needs a dagprof profile of a PyTorch DDP or FSDP2 job (DDP's gradient buckets or FSDP's units); "
                           "this profile has neither")
    if target != "ddp" and g.meta.zero is not None:  # its broadcasts and sharded step would stay beside FSDP's own
        raise DagprofError(f"--data-parallel {target}: this DDP job shards its optimizer (ZeroRedundancyOptimizer); DDP + ZeRO-1 -> FSDP "
                           "is not modelled (profile it with a plain optimizer to compare with FSDP)")
    if target != "ddp" and unhooked(g):
        raise DagprofError("--data-parallel fsdp: no units to shard" + unhooked(g))
    return g if target == "ddp" else ddp_to_fsdp(g, target, reshard, costs)


def ddp_to_fsdp(g: Graph, target: str = "fsdp", reshard: bool | None = None, costs: FsdpCosts | None = None) -> Graph:
    """The DDP profile ``g`` as an FSDP2 job with ``user_units``, each resharded after forward as ``wrapper_reshard``
    says (``target`` fsdp: ``fully_shard``'s default; fsdp:keep; ``reshard``: passed to every unit, the root too); with
    ``costs``, its optimizer step, copy-outs and each unit's hooks as measured (module docstring)."""
    grad = g.meta.layer_grad_bytes
    if not grad or not any(grad.values()):
        raise DagprofError("--data-parallel fsdp: the profile does not say which layer owns which parameters (no layer gradient bytes); "
                           "profile the job with dagprof's hooks (dagprof.profile or dagprof profile --)")
    _refuse_uneven_gradients(g, grad)
    n = graph_world_size(g)
    params = layer_params(g)
    units = user_units(g.layers, params)
    pb = profiled_buckets(g)
    element = _element_size(g)
    dtype = {2: "bfloat16", 4: "float32", 8: "float64"}.get(element, "float32")
    unit_bytes = _unit_sizes(units, grad)  # what a unit reduce-scatters
    unit_full = _unit_sizes(units, params)  # what it gathers
    stepped_params = _stepped_params(g)
    tensors = len(stepped_params)  # the parameter tensors DDP steps
    # the copy-out as measured, else as the profile's enqueues cost (``_enqueue_price``); the step by DTensor's measured ratio,
    # else 1/N of the profile's (a torch version ``DTENSOR_STEP`` lacks: said by ``conversion_note``)
    copy_out = StepFit(0.0, costs.copy_out_us_per_byte) if costs is not None and tensors else _enqueue_price(g, pb)
    step = optimizer_ratio(costs, g.meta.torch_minor, tensors, sum(unit_bytes.values()), n) or 1.0 / n
    channel = int(g.device[pb.comm_ids[0]])
    sinks = {v for vs in pb.sinks.values() for v in vs if g.kind[v] == Kind.COMM_WAIT}

    # one wake-up's price per rank (None: priced in each call already, or not recorded: ``priced_wake_up``)
    wake = priced_wake_up(g, costs)
    woken = (lambda r: wake.us[r]) if wake else (lambda r: 0.0)
    dur, gap = g.dur.copy(), g.gap.copy()
    wait = np.fromiter(sinks, dtype=np.int64, count=len(sinks))
    dur[wait], gap[wait] = 0.0, 0.0  # DDP's finalize: nothing left to wait for
    upd = np.flatnonzero(g.kind == Kind.UPDATE)
    dur[upd] *= step  # the optimizer steps this rank's shards
    b, remap = GraphBuilder.from_graph(g.replace(dur=dur, gap=gap), ~pb.drop)
    layer_unit = {x: name for name, ls in units for x in ls}
    # the trained tensors each unit steps (a parameter's owner is its name less the last part; FSDP -> DDP prices the step by them)
    stepped: dict[str, int] = defaultdict(int)
    for p in stepped_params:
        stepped[layer_unit.get(p.rpartition(".")[0], FSDP_ROOT)] += 1
    host = FSDP_HOST.get(g.meta.torch_minor) if costs is None else None
    stretch = _stretch(g) if costs is None else {}  # the profile's CPU work on its loaded cores: FSDP2's hooks and copy-outs
    call_load = _call_load(g, stretch)
    # what gloo's reduce-scatter costs beyond an all-gather's fixed cost per call (``FsdpHost.scatter_us``: its tail), as the
    # lag of each reduce-scatter's wait: it returns that much after its transfer, on every rank
    scatter_lag = host.scatter_us * call_load if host is not None else 0.0
    # gloo's all-gather releases one rank later than the other, by more the more it gathers (``FsdpHost.release_us_per_byte``),
    # which rank alternating: the later rank's wait carries it, the other rank reaches the next call first and waits there
    release = (host.release_us * call_load, host.release_us_per_byte * call_load) if host is not None else (0.0, 0.0)
    gathers = 0

    def hooks_us(phase: str, unit: str, r: int) -> float | None:
        """A unit's FSDP2 hooks in ``phase`` on rank ``r``: as calibrated, else ``FSDP_HOST``'s CPU time at the unit's trained
        tensors and bytes, stretched by the rank's waits for a core; None: neither."""
        if costs is not None:
            return costs.unit_us(phase, unit_full[unit])
        fit = None if host is None else host.forward if phase == "forward" else host.backward
        return None if fit is None else fit.at(stepped[unit], unit_full[unit]) * stretch[r]

    again = wrapper_reshard([name for name, _ in units], target, reshard)  # resharded after forward
    late = tuple(final_callback_units(g))  # reduce-scattered from FSDP2's final backward callback, after the root
    seq = 0
    ranks = sorted(int(r) for r in np.unique(g.rank[g.rank >= 0]))
    for step in g.meta.steps:
        lanes = {r: main_lane(g, step, r) for r in ranks}
        anchors = {r: _anchors(g, lanes[r], layer_unit) for r in ranks}
        plan = _plan([name for name, _ in units], again, late)
        shift: dict[tuple[int, bool], int] = defaultdict(int)  # nodes already inserted at an anchor (keeps their order)
        for p in plan:
            kind, unit, phase, where, before = p.kind.label, p.unit, p.phase, p.where, p.before
            nodes, label = _at(anchors, p.anchor or unit, where), unit
            if nodes is None and (p.kind, phase) == (PlanKind.ALL_GATHER, "backward") and _at(anchors, unit, "fwd_first") is not None:
                # a unit that ran forward but no backward (frozen whole): the next unit's pre-backward still prefetches it
                by = _prefetcher([name for name, _ in units], unit)
                nodes, label = _at(anchors, by, where), f"{unit} (prefetched by {by})"
            if nodes is None:
                continue  # a unit that ran no layer in this step (on some rank): FSDP would not gather it either
            full = unit_bytes[unit] if p.kind == PlanKind.REDUCE_SCATTER else unit_full[unit]
            if p.kind == PlanKind.REDUCE_SCATTER and not full:
                continue  # a unit of frozen parameters only: FSDP reduce-scatters nothing for it
            if p.kind == PlanKind.RESHARD:
                for r, at in nodes.items():
                    _insert(b, g, remap, at, before, shift, f"rank{r}.fsdp reshard {unit} ({phase})", Kind.OTHER, 0.0)
                continue
            sync = b.add_node(f"sync.{kind} {unit}.{seq}", Kind.SYNC, step=step)
            comm = b.add_node(f"{kind} {label}.{seq}", Kind.COMM, device=channel, order=max(float(g.order[a]) for a in nodes.values()),
                              step=step, nbytes=int(full), comm_kind=p.kind.comm)
            b.add_edge(sync, comm)
            seq += 1
            later = ranks[gathers % len(ranks)] if p.kind == PlanKind.ALL_GATHER else None
            gathers += p.kind == PlanKind.ALL_GATHER
            for r, at in nodes.items():
                if (p.kind, phase) == (PlanKind.ALL_GATHER, "forward") and (us := hooks_us("forward", unit, r)) is not None:
                    _insert(b, g, remap, at, before, shift, f"rank{r}.fsdp hooks {unit} (forward)", Kind.OTHER, us)
                enq = _insert(b, g, remap, at, before, shift, f"rank{r}.fsdp {kind} {unit}", Kind.COMM_ENQUEUE, woken(r), nbytes=int(full))
                lag = scatter_lag if p.kind == PlanKind.REDUCE_SCATTER else release[0] + release[1] * full if r == later else 0.0
                w = _insert(b, g, remap, at, before, shift, f"rank{r}.wait {kind} {unit}", Kind.COMM_WAIT, 0.0, gap=woken(r) + lag)
                b.add_edge(enq, sync)
                b.add_edge(comm, w)
                if p.kind == PlanKind.ALL_GATHER:
                    _insert(b, g, remap, at, before, shift, f"rank{r}.fsdp copy-out {unit} ({phase})", Kind.OTHER,
                            copy_out.us(1, full) * stretch.get(r, 1.0))
                elif (us := hooks_us("backward", unit, r)) is not None:
                    _insert(b, g, remap, at, before, shift, f"rank{r}.fsdp hooks {unit} (backward)", Kind.OTHER, us)
        if (clip := g.meta.grad_clips.get(step)) is not None:
            ratio = optimizer_ratio(costs, g.meta.torch_minor, clip.tensors, sum(unit_bytes.values()), n) or 1.0
            seq = _clip_all_reduce(b, g, remap, lanes, step, seq, channel, woken, clip.us * max(ratio - 1.0, 0.0))
    chain_lanes(b)
    out = b.build()
    fs_units = [FsdpGraphUnit(name, int(unit_full[name] // element), int(math.ceil(unit_full[name] / n)), dtype, dtype, dtype,
                              again[name], again[name], [n], [], list(ls), tensors=stepped[name],
                              frozen_numel=int((unit_full[name] - unit_bytes[name]) // element))
                for name, ls in units]
    total, trained = sum(unit_full.values()), sum(unit_bytes.values())
    shards = FsdpShards(int(math.ceil(total / n)), int(math.ceil(trained / n)), 0)  # optimizer state: unknown to a DDP profile (``with_optimizer_state``)
    # as FSDP's collector would see them: a layer's gathered weight is no parameter, so it counts among what the layer saved,
    # and is named as gathered (``search.fsdp_memory.fsdp_peak`` takes it out again)
    saved = {k: v + params.get(k, 0) for k, v in g.meta.layer_saved_bytes.items()}  # none recorded: fsdp_peak refuses
    saved |= {k: v for k, v in params.items() if v > 0 and k not in saved} if saved else {}
    record = FsdpRecord(fs_units, {r: shards for r in ranks}, g.meta.backend or "gloo", n, saved, dict(grad),
                        layer_saved_gathered_bytes={k: params[k] for k in saved if params.get(k, 0) > 0},
                        layer_output_bytes=dict(g.meta.layer_output_bytes) or None)  # the gradient reaching each layer: as large
    out = out.replace(meta=out.meta.replace(fsdp=record, buckets=(), bucket_cap_mb=None))
    topo = current_topology(g)
    if costs is not None:
        # the profile's fixed cost per collective was fitted on DDP's all-reduces (with a bucket or two of one size a step, each
        # step's excess over the fastest): charged on every FSDP collective it came on top of what the calibration measured
        # of each call (its kind's swept time to the last rank out, each unit's hooks and wake-ups). On the quiet
        # transformer (4 blocks, 2 ranks) that was 4.15 ms on each of 14 collectives a step: +30 % where without it -8 %
        topo = dataclasses.replace(topo, overhead_us=0.0)
    elif host is not None:
        # the same fitted excess (the held-out ResNet's DDP profiles: 0.55-8.0 ms, its mixer's 0) gives way to gloo's fixed
        # cost per blocking call as measured (``FSDP_HOST``): hand-offs between the ranks' threads and gloo's. Where the fit put
        # the slower instances' excess there (one bucket size: bandwidth from the fastest), the load's waits for a core went
        # with it, so the call's cost is stretched as the hooks are, at the slowest rank's (a call ends when its last rank's
        # threads ran): unstretched, the held-out ResNet's FSDP2 collectives at load 13-22 took 66-119 ms a step, priced 9-26.
        # Where it kept every instance's time in its bandwidth (two gloo lanes: total time over bytes), the load is in the
        # bytes' price already: stretched again, the loaded mixer's came to 81-120 ms a step where they took 55-73
        topo = dataclasses.replace(topo, overhead_us=host.call_us * call_load)
        blocking = AlphaBeta(0.0, host.call_us_per_byte * call_load)
        if no_bandwidth(topo) or beside_compute(g, topo, blocking):
            # the fit put every DDP all-reduce's time in that overhead, just replaced, or its bytes' price holds the backward
            # DDP's all-reduces shared the cores with: FSDP's bytes at gloo's measured cost per byte of a blocking call,
            # stretched as the call's (the load sat in the overhead with the rest)
            topo = dataclasses.replace(topo, intra=blocking, inter=blocking)
    return retime_collectives(out, topo, current_scheme(g), lags_on=topo)


def no_bandwidth(topo: Topology) -> bool:
    """The DDP profile's link fit saw no bandwidth (``passes.link_fit.fit_link``: its all-reduces' durations did not grow
    with their size, all latency): without the fitted overhead, which the DDP -> FSDP conversion replaces by gloo's cost per
    call (``FSDP_HOST``), its collectives' bytes would cost nothing. DDP's few buckets of two sizes a step, overlapping a
    loaded backward, gave 12 of the 28 kept LM/GRU DDP profiles such a fit (their 8 all-reduces 0.04-11.9 ms at 1 and 3
    MiB), 1 of the 67 other pairs': there the conversion priced each 0.8 MiB reduce-scatter 0.58 ms where their FSDP2 jobs
    took 1.5-2.7 (docs/evidence.md, branch ddpfsdp57)."""
    return not topo.kinds and topo.intra.beta_us_per_byte == 0 and topo.inter.beta_us_per_byte == 0


def beside_compute(g: Graph, topo: Topology, blocking: AlphaBeta) -> bool:
    """The DDP profile ``g``'s fitted bytes' price (``topo``) is dearer than gloo's blocking call's (``blocking``) where that
    price holds the compute DDP's all-reduces ran beside: its ranks on one host (``one_host``), whose loopback
    transfer is their own CPU work, no wire named (``--profiled-bandwidth``, ``--half-duplex``), and the all-reduces on two
    gloo lanes at once (``passes.link_fit``: their total time over their bytes) beside a backward on the same cores. FSDP2's
    blocking calls run with the rank's compute stopped."""
    return (one_host(g) is not None and g.meta.comm_lanes > 1 and g.meta.wire_bytes_per_s is None and not g.meta.half_duplex and not topo.kinds
            and min(topo.intra.beta_us_per_byte, topo.inter.beta_us_per_byte) > blocking.beta_us_per_byte)


def _call_load(g: Graph, stretch: dict[int, float]) -> float:
    """What stretches gloo's fixed cost per call (``FSDP_HOST``) in the conversion of ``g``: the slowest rank's
    ``stretch`` where the profile's link fit held the load in its overhead per collective, else 1 (``ddp_to_fsdp``)."""
    return max(stretch.values(), default=1.0) if current_topology(g).overhead_us > 0 else 1.0


def _stretch(g: Graph) -> dict[int, float]:
    """Each rank's CPU work on the profile's cores over the same on a core of its own: its training thread's CPU plus its
    waits for a core over its CPU in the profiled steps (``traces.meta.runnable_stretch``), 1 where not recorded (said by
    ``host_note``)."""
    loop = g.meta.loop_steps
    out = {}
    for r in sorted(int(x) for x in np.unique(g.rank[g.rank >= 0])):
        steps = [] if loop is None else [loop.sched.get(r, {}).get(s) for s in loop.profiled.get(r, {})]
        out[r] = max(runnable_stretch([x for x in steps if x is not None]), 1.0)
    return out


def _refuse_uneven_gradients(g: Graph, grad: dict[str, int]) -> None:
    """Refuse a DDP profile whose ranks made gradients of different layers in one step (DDP's ``find_unused_parameters``:
    a top-1 mixture of experts whose batch on one rank picked no token for an expert). FSDP2 reduce-scatters only the
    parameters that got a gradient, so its ranks' reduce-scatters would not match: bench/ddp_fresh/moe_loader.py under
    ``fully_shard`` aborts in gloo ("Received data size doesn't match expected size"), where ``--data-parallel fsdp``
    priced every unit's reduce-scatter in full."""
    bwd = np.flatnonzero((g.kind == Kind.BACKWARD) & (g.layer >= 0) & (g.rank >= 0))
    trained = np.array([bool(grad.get(name, 0)) for name in g.layers] + [False])
    bwd = bwd[trained[g.layer[bwd]]]
    ranks = np.unique(g.rank[bwd])
    for step in g.meta.steps:
        here = bwd[g.step[bwd] == step]
        made = [set(g.layer[here[g.rank[here] == r]].tolist()) for r in ranks]
        uneven = sorted(set.union(*made) - set.intersection(*made)) if made else []
        if uneven:
            names = ", ".join(g.layers[k] for k in uneven[:3]) + (f" and {len(uneven) - 3} more" if len(uneven) > 3 else "")
            raise DagprofError(f"--data-parallel fsdp: in step {step} {len(uneven)} layer(s) with parameters ({names}) ran backward on "
                               "some ranks only (DDP's find_unused_parameters): FSDP2 reduce-scatters only the parameters that got a "
                               "gradient, so its ranks' reduce-scatters would not match (gloo aborts on the size); not modelled")


def with_optimizer_state(g: Graph, per_param: float) -> Graph:
    """``g`` (from ``ddp_to_fsdp``) with ``per_param`` times each rank's trained parameter shard (its gradient shard's
    size) as optimizer state (Adam: 2)."""
    fs = g.meta.fsdp
    mem = {r: dataclasses.replace(m, optim_state_bytes=int(m.grad_shard_bytes * per_param)) for r, m in fs.memory.items()}
    return g.replace(meta=g.meta.replace(fsdp=dataclasses.replace(fs, memory=mem)))


def _element_size(g: Graph) -> int:
    """Bytes per gradient element, from the profiled buckets' shapes (4 when they are not recorded)."""
    shapes = [(math.prod(s), bk.nbytes) for bk in g.meta.buckets for s in [x for x in (bk.shapes or ()) if x is not None]]
    numel = sum(s for s, _ in shapes)
    total = sum(bk.nbytes for bk in g.meta.buckets if bk.shapes and all(x is not None for x in bk.shapes))
    return max(1, round(total / numel)) if numel and total else 4


def _enqueue_price(g: Graph, pb) -> StepFit:
    """A copy-out's price where nothing of FSDP2 was measured: DDP's bucket enqueue (scaling the bucket in place, then
    the all-reduce's dispatch) per call and per byte on a core of its own, fitted over the profile's buckets, each at its
    fastest instance over ranks and steps (the conversion stretches it by the rank's waits for a core, as FSDP2's hooks:
    ``_stretch``). At their median, the held-out mixer's DDP profiles at load 13-22 (``bench/fsdp_fresh/mixer_rounds.sh``,
    docs/evidence.md) priced its 8 copy-outs at 30-64 ms a step where the FSDP jobs' took 7-16: under load DDP's enqueues
    took 10-40x their fastest (0.26 ms for 1.1 MB), where the ranks' waits for a core stretched CPU work 4-6x. Per byte
    alone, as the buckets' fastest enqueues over their bytes (one rank's), where the buckets are all of one size and cannot
    split the two: on the LoRA job's DDP profile (``tests/data/lora``) a 1 MiB bucket's enqueue took 0.20 ms and a 79 KB
    one's 0.24, each a call's cost, and their sum per byte priced a unit's copy-out of its frozen and trained 0.8 MiB at
    3.2 ms where the FSDP job's took 0.29-0.39."""
    enq = np.flatnonzero(pb.enqueue)
    points = []
    for k in np.unique(g.bucket[enq]):
        e = enq[g.bucket[enq] == k]
        timed = g.dur[e][g.dur[e] > 0]
        points.append((1, int(g.nbytes[e[0]]), float(timed.min()) if len(timed) else 0.0))
    if len({nb for _, nb, _ in points}) >= 2 and all(us > 0 for _, _, us in points):
        return StepFit.fit(points)
    nbytes = float(sum(nb for _, nb, _ in points))
    return StepFit(0.0, sum(us for _, _, us in points) / nbytes if nbytes else 0.0)


class PlanKind(enum.Enum):
    """What FSDP2 does at one point of a step (``_plan``): a collective of the kind ``comm`` names, or a reshard (no
    transfer). ``label`` is the name the built graph's nodes carry (``all_gather``)."""

    ALL_GATHER = CommKind.ALL_GATHER
    REDUCE_SCATTER = CommKind.REDUCE_SCATTER
    RESHARD = None

    @property
    def comm(self) -> CommKind | None:
        return self.value

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclasses.dataclass(frozen=True)
class Planned:
    """One point of ``_plan``: ``kind`` on ``unit`` in ``phase`` (forward, backward), at its anchor ``where`` (``_anchors``),
    before that node or after it."""

    kind: PlanKind
    unit: str
    phase: str
    where: str
    before: bool
    anchor: str = ""  # the unit whose anchor ``where`` is, where not ``unit``'s own (a reduce-scatter of the final callback's: the root's)


def _plan(units: list[str], again: dict[str, bool], late: tuple[str, ...] = ()) -> list[Planned]:
    """FSDP2's sequence of one step (``Planned``): the root first in forward and last in
    backward, inner units in forward order, then reversed (the order matters where two share an anchor); ``again``: the
    units that reshard after forward, so gather again in backward. Every unit reshards after its backward (FSDP2's
    ``reshard_after_backward``, on by default: a kept unit's profile has that reshard too). ``late``: the units whose
    post-backward never fires (``final_callback_units``): ``_root_post_backward_final_callback`` reduce-scatters and
    reshards them after the root, in forward order (the root's state comes first in its ``all_states``)."""
    root, inner = units[0], units[1:]
    gather, scatter, reshard = PlanKind.ALL_GATHER, PlanKind.REDUCE_SCATTER, PlanKind.RESHARD
    plan = [Planned(gather, u, "forward", "fwd_first", True) for u in units]
    plan += [Planned(reshard, u, "forward", "fwd_last", False) for u in [*inner, root] if again[u]]
    if again[root]:
        plan.append(Planned(gather, root, "backward", "bwd_first", True))
    for u in [*inner[::-1], root]:
        if again[u] and u != root:
            plan.append(Planned(gather, u, "backward", "bwd_first", True))
        if u not in late:
            plan.append(Planned(scatter, u, "backward", "bwd_last", False))
            plan.append(Planned(reshard, u, "backward", "bwd_last", False))
    for u in [x for x in inner if x in late]:
        plan.append(Planned(scatter, u, "backward", "bwd_last", False, anchor=root))
        plan.append(Planned(reshard, u, "backward", "bwd_last", False, anchor=root))
    return plan


def _at(anchors: dict[int, dict[tuple[str, str], int]], unit: str, where: str) -> dict[int, int] | None:
    """Each rank's anchor node ``where`` of ``unit`` (``_anchors``), or None where some rank ran no layer of it."""
    nodes = {r: a.get((unit, where)) for r, a in anchors.items()}
    return None if any(v is None for v in nodes.values()) else nodes


def _prefetcher(units: list[str], unit: str) -> str:
    """The unit whose pre-backward gathers ``unit`` (an inner one) by FSDP2's backward prefetch: the next in forward
    order (``FSDPParamGroup._backward_prefetch`` takes the reversed post-forward order, whatever runs backward), the
    root after the last; ``units``: the root first, then the others in forward order."""
    inner = units[1:]
    k = inner.index(unit) + 1
    return inner[k] if k < len(inner) else units[0]


def _anchors(g: Graph, lane: np.ndarray, layer_unit: dict[str, str]) -> dict[tuple[str, str], int]:
    """(unit, fwd_first|fwd_last|bwd_first|bwd_last) -> the lane node there; the root's span the whole pass.

    A layer forward after the step's first backward node is activation checkpointing's recomputation: it belongs to its
    unit's backward, which FSDP gathers before it runs (``bench/ddp_fresh/ckpt_static_tied.py``: each block's forward
    ran again in backward, and taken for forward, every unit's backward all-gather went after its recomputation, the
    root's forward span into the backward)."""
    out: dict[tuple[str, str], int] = {}
    layered = [int(v) for v in lane if g.layer[v] >= 0 and g.kind[v] in (Kind.FORWARD, Kind.BACKWARD)]
    first_bwd = next((k for k, v in enumerate(layered) if g.kind[v] == Kind.BACKWARD), len(layered))
    for tag, ops in (("fwd", layered[:first_bwd]), ("bwd", layered[first_bwd:])):
        if not ops:
            continue
        out[(FSDP_ROOT, f"{tag}_first")], out[(FSDP_ROOT, f"{tag}_last")] = ops[0], ops[-1]
        for v in ops:
            unit = layer_unit.get(g.layers[int(g.layer[v])], FSDP_ROOT)
            if unit != FSDP_ROOT:
                out.setdefault((unit, f"{tag}_first"), v)
                out[(unit, f"{tag}_last")] = v
    return out


def _insert(b: GraphBuilder, g: Graph, remap: np.ndarray, at: int, before: bool, shift: dict, name: str, kind: Kind, dur: float,
            nbytes: int = 0, gap: float = 0.0) -> int:
    """A node on ``at``'s lane just before or after it (``chain_lanes`` links it in by order); later insertions at the
    same place follow earlier ones."""
    key = (at, before)
    k = shift[key] = shift[key] + 1
    order = float(g.order[at]) + (-_EPS * (10_000 - k) if before else _EPS * k)
    return b.add_node(name, kind, rank=int(g.rank[at]), device=int(g.device[at]), dur=dur, gap=gap, order=order, step=int(g.step[at]),
                      nbytes=nbytes)


CLIP_NORM_BYTES = 4  # the total norm FSDP2's clip_grad_norm_ all-reduces: one fp32 scalar


def _clip_all_reduce(b: GraphBuilder, g: Graph, remap: np.ndarray, lanes: dict[int, np.ndarray], step: int, seq: int, channel: int,
                     woken: Callable[[int], float], dtensor_us: float) -> int:
    """``clip_grad_norm_`` under FSDP2 (the DDP profile recorded the calls: ``GraphMeta.grad_clips``): its norm over
    DTensor gradients is all-reduced in the shard group, blocking, before the optimizer step (Kineto's
    ``_c10d_functional::all_reduce`` in the LoRA job's FSDP2 profile), where DDP's clip is local. On each rank's main lane
    just before its optimizer step: ``dtensor_us`` of DTensor's dispatch beyond the plain clip the profile timed (its
    measured time per tensor, ``FsdpCosts.step_ratio``; 0 without ``calibrate --fsdp``: said by ``blocking_note``), the
    all-reduce's issue and wait with a wake-up each (``woken``). Returns the next collective number."""
    ups = {r: next((int(v) for v in lane if g.kind[v] == Kind.UPDATE), None) for r, lane in lanes.items()}
    if any(v is None for v in ups.values()):
        return seq  # a step without its optimizer step on some rank: nothing to place the clip before
    shift: dict[tuple[int, bool], int] = defaultdict(int)
    sync = b.add_node(f"sync.all_reduce clip_grad_norm_.{seq}", Kind.SYNC, step=step)
    comm = b.add_node(f"all_reduce clip_grad_norm_.{seq}", Kind.COMM, device=channel, order=max(float(g.order[v]) for v in ups.values()),
                      step=step, nbytes=CLIP_NORM_BYTES, comm_kind=CommKind.ALL_REDUCE)
    b.add_edge(sync, comm)
    for r, at in ups.items():
        if dtensor_us > 0:
            _insert(b, g, remap, at, True, shift, f"rank{r}.fsdp clip_grad_norm_ (DTensor)", Kind.OTHER, dtensor_us)
        enq = _insert(b, g, remap, at, True, shift, f"rank{r}.fsdp all_reduce clip_grad_norm_", Kind.COMM_ENQUEUE, woken(r),
                      nbytes=CLIP_NORM_BYTES)
        w = _insert(b, g, remap, at, True, shift, f"rank{r}.wait all_reduce clip_grad_norm_", Kind.COMM_WAIT, 0.0, gap=woken(r))
        b.add_edge(enq, sync)
        b.add_edge(comm, w)
    return seq + 1


def wake_up(g: Graph) -> WakeUp | None:
    """What one wake-up costs a rank of the DDP profile ``g``. A DDP job's all-reduces block nothing until the finalize;
    under FSDP2 on gloo every collective blocks the rank, which hands the call to gloo's worker thread (woken to run it)
    and is woken when it completes: two wake-ups a collective, on every rank. Where the profile's ranks waited on a
    collective that had not ended (DDP's finalize behind its last bucket), the median measured lag of those waits, pooled
    over the ranks (``_blocked_lags``): a thread woken after a voluntary sleep, which is what FSDP2's waits are. The
    median, since the lags' tail is no wake-up but gloo's: on quiet ResNet and mixer DDP profiles (2026-12-05, branch
    ``fsdpconv``) the finalize lags were 0.05-0.4 ms or 1.2-2.5 ms (once 9.9), the long ones both ranks alike on one
    collective, as gloo's calls return about 4 ms late now and then (``bench/fsdp_call_sizes.py``), which the conversion
    prices per call (``FSDP_HOST``: each kind's mean, the reduce-scatter's excess on its waits); the mean counted that tail
    twice (pairs' median miss 16.3 % with it, 14.2 % with the median, 30 quiet pairs). Before the tail was priced per call,
    the mean was kept: a step's cost is the lags' sum, and on 12 kept pairs of the held-out mixer (load 0.5-17,
    ``bench/fsdp_fresh/mixer_rounds.sh``) the median, a trimmed and a winsorized mean, Hodges-Lehmann's and the mean
    clipped at 5 medians of the DDP profile's 7-8 lags spread as much or more about the FSDP job's own mean lag
    (standard deviation of the log ratio 0.79-0.96, the mean's 0.77) and sat further below it (median ratio 0.30-0.37,
    the mean's 0.50). So the mean stays, and its sampling error goes into the interval (``stderr_us``): 7-8
    heavy-tailed lags (one of them 3-20x the median) make a wide one. What the mean misses is not a wake-up: on the same
    pairs the FSDP jobs' all-gathers' waits lagged 1.15x the DDP profile's mean (median over the pairs), their
    reduce-scatters' 3.5x (the quiet ones 1.4-2.1 ms on average where the all-gathers' took 0.24-0.59), which no DDP
    wait shows (said in the note, unpriced).
    Else (no wait blocked, or a graph a pass rebuilt) each rank's wait for a core per time its training thread got one
    over its profiled steps (the kernel's schedstat, ``LoopSteps.sched``), which counts the busy thread's preemptions
    too, its standard error from the steps' own ratios; None where neither was recorded. A price ``keep_wake_up`` kept
    before ``passes.workers`` rebuilt the ranks (which drops the provenance and has no loop records for a copy) is that
    price, each copy at its source rank's."""
    ranks = sorted(int(x) for x in np.unique(g.rank[g.rank >= 0]))
    if g.meta.wake_up is not None:
        return g.meta.wake_up.on_ranks(ranks)
    lags = _blocked_lags(g)
    if len(lags):
        err = float(lags.std(ddof=1) / math.sqrt(len(lags))) if len(lags) >= 2 else 0.0
        return WakeUp(dict.fromkeys(ranks, float(np.median(lags))), WakeFrom.BLOCKED_WAITS, len(lags), err, len(lags) - 1)
    return run_queue_wake(g)


def run_queue_wake(g: Graph) -> WakeUp | None:
    """``wake_up``'s schedstat price: each rank's wait for a core per time its training thread got one over its profiled
    steps; None where the runs were not recorded."""
    loop = g.meta.loop_steps
    if loop is None:
        return None
    out, total, ratios = {}, 0, []
    for r in sorted(int(x) for x in np.unique(g.rank[g.rank >= 0])):
        steps = [loop.sched.get(r, {}).get(s) for s in loop.profiled.get(r, {})]
        runs = sum(x.runs or 0 for x in steps if x is not None)
        if not steps or any(x is None or x.runs is None for x in steps) or runs <= 0:
            return None
        out[r], total = sum(x.wait_us for x in steps) / runs, total + runs
        ratios += [x.wait_us / x.runs for x in steps if x.runs]
    err = float(np.std(ratios, ddof=1) / math.sqrt(len(ratios))) if len(ratios) >= 2 else 0.0
    return WakeUp(out, WakeFrom.RUN_QUEUE, total, err, max(len(ratios) - 1, 0))


def priced_wake_up(g: Graph, costs: FsdpCosts | None) -> WakeUp | None:
    """The wake-up the DDP -> FSDP conversion of ``g`` adds to each blocking collective's issue and wait (``wake_up``), or
    None where each call's measured cost holds its wake-ups already: a calibrated link model's collectives were timed as
    blocking calls, and ``FSDP_HOST``'s fixed cost per call is a call's time from a barrier to its slowest rank's return
    (``bench/fsdp_call_sizes.py``), the hand-off to gloo's worker and the rank's own wake-up after it inside. Added on
    top, they were counted twice: on 20 held-out quiet pairs the conversion's all-gathers held the ranks a median 1.4 ms
    a step longer than the FSDP2 jobs' did (branch ``fsdpag``)."""
    if costs is not None or FSDP_HOST.get(g.meta.torch_minor) is not None:
        return None
    return wake_up(g)


def keep_wake_up(g: Graph) -> Graph:
    """``g`` with its wake-up price kept in its meta, for a DDP -> FSDP conversion after ``--workers`` rebuilt its ranks
    (without it a rank count other than the profile's priced every wake-up at 0, or at rank 0's run queue alone)."""
    return g.replace(meta=g.meta.replace(wake_up=wake_up(g)))


def wake_ups_per_step(converted: Graph) -> float:
    """The wake-ups a step of the DDP -> FSDP conversion ``converted`` priced on its busiest rank: two for each FSDP
    collective it issues (all its issues are the conversion's: DDP's bucket enqueues went with the buckets)."""
    enq = (converted.kind == Kind.COMM_ENQUEUE) & (converted.rank >= 0)
    if not enq.any() or not converted.meta.steps:
        return 0.0
    return 2.0 * np.bincount(converted.rank[enq]).max() / len(converted.meta.steps)


def _blocked_lags(g: Graph) -> np.ndarray:
    """The measured gap (``graph.build``: its end beyond what it waited for) of each wait of ``g`` that blocked: the
    collective it waited for ended, as its rank saw it, after the rank's previous op did. Empty without provenance."""
    p = provenance(g)
    waits = np.flatnonzero((g.kind == Kind.COMM_WAIT) & (g.rank >= 0))
    if p is None or not len(waits):
        return np.empty(0)
    edge = np.isin(p.dst, waits)
    src, dst, end = p.src[edge], p.dst[edge], p.seen_end[edge]
    comm = g.kind[src] == Kind.COMM
    done, before = np.full(len(g), -np.inf), np.full(len(g), -np.inf)
    np.maximum.at(done, dst[comm], end[comm])
    np.maximum.at(before, dst[~comm], end[~comm])
    blocked = waits[np.isfinite(before[waits]) & (done[waits] > before[waits])]
    return g.gap[blocked].astype(float)
