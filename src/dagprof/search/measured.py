"""What the job measured on its own machine that the search prices with: the compute slowdown beside
collectives (``collect.measure.overlap``; on the job's ranks, or by ``dagprof calibrate --overlap`` on its cluster) and the
codecs' costs (``collect.measure.codec_costs``), scaled to the job's load."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..collect.measure.overlap import Overlap, load_overlap, overlap_from_table
from ..costmodel.codecs import CodecCosts, powersgd_split, this_machine
from ..costmodel.topology import read_link_model
from ..errors import DagprofError
from ..passes.compression import Chained
from ..passes.gradients import GradientOrder
from ..traces.events import Run
from ..traces.meta import runnable_stretch


def job_overlap(run: Run | None) -> Overlap | None:
    """What the job measured on its own ranks (``overlap.json`` in its run folder, our demo job writes it), else None."""
    return load_overlap(run.source) if run is not None and run.source and os.path.isdir(run.source) else None


def or_calibrated(m: Overlap | None, link_model: str | None) -> Overlap | None:
    """``m`` (the job's own, ``job_overlap``), else what ``dagprof calibrate --overlap`` measured on the job's cluster
    (``link_model``, version 4), else None."""
    if m is not None or not link_model:
        return m
    table = read_link_model(link_model).overlap
    return None if table is None else overlap_from_table(table, link_model)


def overlap_of(run: Run | None, link_model: str | None = None) -> Overlap | None:
    """The compute slowdown beside collectives for this run: measured on the job's own ranks, else on the cluster,
    else None. ``run`` None: the link model's alone."""
    return or_calibrated(job_overlap(run), link_model)


def slowdown_of(run: Run | None, link_model: str | None = None) -> tuple[float, float | None]:
    """The compute slowdown beside collectives for this run (``overlap_of``), else 0, and the bytes per second of the
    all-reduce it was measured beside (None when not measured)."""
    return slowdown_in(overlap_of(run, link_model))


def slowdown_in(m: Overlap | None) -> tuple[float, float | None]:
    """(the slowdown in the model's units, the measured all-reduce's bytes per second) of ``m``; (0, None) for none."""
    return (0.0, None) if m is None else (m.model_slowdown, m.rate)


NOT_MEASURED = ("the backward's slowdown beside in-flight collectives is not measured for this run (priced as none): run "
                "dagprof calibrate --overlap -o link.json on the job's cluster and pass --link-model link.json")


def chained_unmeasured(count: int) -> str:
    """The warning for a PowerSGD strategy priced where no chained all-reduce was measured (``Chained.allreduce`` empty)."""
    return (f"PowerSGD's {count} all-reduces a step that carry data, each issued from the previous one's completion callback, are "
            "priced by the link model alone: what such a small all-reduce takes beyond it (thread hand-offs, wake-ups, waits for a "
            "core) is not measured for this run (priced as none; a held-out CTR ranker's on a 2-core host at 200 Mbit/s took 1.7-3.0 "
            "ms more each, its speed-up over-predicted by 17-40 %): run dagprof calibrate --overlap -o link.json on the job's "
            "cluster and pass --link-model link.json")


def in_job(costs: CodecCosts | None, m: Overlap | None) -> CodecCosts | None:
    """Codec costs as they run inside the job whose ranks measured ``m`` (``job_overlap``): scaled by how much slower
    the job's busy cores ran the reference op than the idle core that measured the codecs (never faster). Not from a
    ``calibrate --overlap`` file: its ranks ran the op minutes before the job's profile, and where the load moved in
    between it scaled held-out jobs' codecs for rounds that did not run them so (``optimize.predict_run``)."""
    if costs is None or m is None:
        return costs
    if not m.matmul_us or not costs.reference_op_us:
        return costs
    return costs.scaled(max(1.0, m.matmul_us / costs.reference_op_us))


def chained_in_job(m: Overlap | None, stretch: float) -> Chained:
    """PowerSGD's small all-reduces as they ran in the job's group (``m``: ``job_overlap``), else in ``calibrate --overlap``'s
    group on the job's cluster (``or_calibrated``), with the CPU between them at ``stretch`` (``profiled_stretch``: the
    priced profile's own load) where the profile measured it, else at what ``m`` measured (``chained_stretch``, minutes
    before the profile, at another load); unmeasured where neither measured them. The chain beside a busy backward
    (``chained_busy``) where measured; files written before it was measured price that chain as the idle one."""
    if m is None:
        return Chained((), stretch)
    return Chained(_pairs(m.chained_allreduce), stretch or m.chained_stretch, _pairs(m.chained_busy), m.chained_stretch)


def _pairs(table: list[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """A file's (bytes, us) lists as ``Chained``'s hashable pairs."""
    return tuple((int(b), float(us)) for b, us in table)


def profiled_stretch(run: Run) -> float:
    """How much longer CPU work took on the profiled job's cores than on a core of its own: the training thread's CPU plus
    its waits for a core over its CPU across the window (``RankMeta.train_thread``), the slowest rank's; 0 where the
    profile did not record it (profiles before it was, other formats)."""
    return max((runnable_stretch(r.meta.train_thread) for r in run.ranks), default=0.0)


# Ranks whose training threads waited for a core more than this apart, ms a profiled step, mean over the window: over every
# quiet profile kept by the PowerSGD rounds of issue 20 (120 of 157 searched and per-round defaults' profiles of 14 kept
# cells, each rank waiting under 15 % of its CPU) the ranks differed by at most 4.0 ms (p90 2.2); the two-tower's searched
# profile, one rank beside another load, by 26
RANK_WAIT_APART_MS = 5.0


def rank_load_note(run: Run) -> str | None:
    """One line where the profile's ranks' training threads waited for a core more than ``RANK_WAIT_APART_MS`` a step
    apart (``RankMeta.train_thread``): the defaults' wire wait hides one rank's extra load, a strategy that shortens the
    step pays it on that rank, so the predicted speed-up stands on that load (the two-tower's searched profile with its
    rank 0 loaded read -12 %; a fresh one with rank 1 loaded and its compute brought to the pace after the window, +20 %).
    None where they did not, or it was not recorded."""
    waits = {r.rank: sum(s.wait_us for s in r.meta.train_thread) / len(r.meta.train_thread) / 1e3
             for r in run.ranks if r.meta.train_thread}
    if len(waits) < 2 or len(waits) < len(run.ranks):
        return None
    most, least = max(waits, key=waits.get), min(waits, key=waits.get)
    if waits[most] - waits[least] <= RANK_WAIT_APART_MS:
        return None
    return (f"the searched profile's rank {most} waited {waits[most]:.1f} ms a step for a core on its training thread against "
            f"{waits[least]:.1f} ms on rank {least} (more than {RANK_WAIT_APART_MS:g} ms apart: another load on its cores): a strategy "
            f"that shortens the step pays that rank's pace, which the defaults' wire wait hid, so its predicted speed-up stands on a "
            "load its own runs need not meet; profile again on quiet cores")


@dataclass(frozen=True, slots=True)
class FoundCodecCosts:
    """The codecs' costs ``codec_costs`` found for a model, and the note (one line) saying where they came from."""

    costs: CodecCosts
    note: str


def codec_costs(order: GradientOrder, powersgd_ranks: tuple[int, ...], path: str | None, kept: str | None = None) -> FoundCodecCosts:
    """The codecs' costs for this model's gradients, and one line saying where they came from.

    ``kept``: an earlier run's file (``dagprof optimize``'s ``-o`` folder): read where it was measured on this machine for
    these gradients' names and shapes at every searched rank; measured again, saying why, where the machine or the model
    differ (a few seconds of torch); a damaged one is refused, naming it. The costs are an idle core's (the fastest of
    alternating runs, ``collect.measure.codec_costs``), scaled to the job's load by the reference op timed beside them
    (``in_job``), so a kept file stands while the load changes. ``path``: where the costs used are written (the run's
    output folder); without ``kept``, costs already there (a recorded run's, tests' and benches') are read as given,
    completed where something is missing."""
    shaped = [(p, s) for p, s in zip(order.params, order.shapes) if s is not None]
    why = ""
    if kept and os.path.exists(kept):
        try:
            costs = CodecCosts.load(kept)
        except DagprofError as err:
            raise DagprofError(f"{err.problem}: the codec costs an earlier run kept; delete it to measure them again", kept) from None
        why = _differs(costs, shaped, powersgd_ranks)
        if not why:
            if path and os.path.abspath(path) != os.path.abspath(kept):
                costs.save(path)
            return FoundCodecCosts(costs, f"codec costs read from {kept}, measured on this machine ({costs.machine}) for these gradients: "
                                          "delete it to measure them again")
    elif not kept and path and os.path.exists(path):
        costs = CodecCosts.load(path)
        if _complete(costs, shaped, powersgd_ranks):
            return FoundCodecCosts(costs, f"codec costs read from {path}")
    from ..collect.measure.codec_costs import measure_codec_costs

    costs = measure_codec_costs(shaped, tuple(powersgd_ranks))
    if path:
        costs.save(path)
    return FoundCodecCosts(costs, f"codec costs measured on this machine{f' again ({kept} {why})' if why else ''}"
                                  f"{f', kept in {kept} for the next run' if kept else ''}")


def _complete(costs: CodecCosts, shaped: list[tuple[str, tuple[int, ...]]], ranks: tuple[int, ...]) -> bool:
    """Whether ``costs`` price every gradient PowerSGD compresses at each of ``ranks``, and the fp16/bf16 casts."""
    have = all(r in costs.powersgd and all(p in costs.powersgd[r] or not powersgd_split(s, r)[1] for p, s in shaped)
               for r in ranks) and (costs.powersgd_bucket_us > 0 or not ranks)  # older files lack the hook measured whole
    return have and {"fp16", "bf16"} <= set(costs.encode_us_per_byte)


def _differs(costs: CodecCosts, shaped: list[tuple[str, tuple[int, ...]]], ranks: tuple[int, ...]) -> str:
    """Why a kept file does not price this model on this machine ("" where it does)."""
    if costs.machine != (here := this_machine()):
        return f"was measured on {costs.machine!r}, this is {here!r}"
    if not costs.shapes:
        return "keeps no gradient shapes (an older dagprof's)"
    for p, s in shaped:
        if costs.shapes.get(p) != tuple(s):
            old = costs.shapes.get(p)
            return f"holds {p} as {list(old)}, this model's is {list(s)}" if old else f"lacks this model's {p}"
    return "" if _complete(costs, shaped, ranks) else f"lacks PowerSGD rank {', '.join(map(str, ranks))} or the casts"
