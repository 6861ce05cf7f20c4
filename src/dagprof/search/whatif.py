"""What-if answers: every scenario (``search.scenario``) replayed, held against the profiled run, with its interval and notes.

Two different ratios answer two questions, and ``COLUMNS`` defines every other column of a row:
- is it faster than what I have? ``speedup_vs_profiled``: the scenario's throughput over the
  profiled run's (both as replayed, so the model's own error cancels out of the ratio);
- does it scale? ``scaling_efficiency``: the throughput of N workers over N times that of ONE
  worker under the same conditions (weak scaling: t(1) / t(N), 1.0 = linear). A faster device or
  link raises the first and can lower the second: less compute leaves less to hide comm behind.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ..analysis import job_iteration_us
from ..analysis.breakdown import by_kind, other_workers_us, own_collectives
from ..analysis.foreign_cpu import ForeignRemoval, foreign_cpu_note, remove_foreign_load, shared_cores_load_note
from ..analysis.interval import LEVEL, PredictionInterval, cost_factors, link_residuals, predict_interval, run_level, student_halfwidth, typical_iteration_us
from ..analysis.operand_stall import held_us, stall_bound_us, stall_note, stall_outweighs
from ..costmodel.topology import CollectiveSpec, Scheme, Topology
from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..passes.buckets import hook_wire_note
from ..passes.comm import activation_comm, current_topology, in_op_prices, job_comm, own_call_cost
from ..passes.compute import gloo_cpu_note, own_cores_note, process_cpu_note, ring_pace_note, server_cores_note
from ..passes.data_parallel import conversion_note, conversion_summary, priced_wake_up, wake_ups_per_step, wrapper_reshard
from ..passes.fsdp import set_reduce_dtype
from ..passes.fsdp_mesh import merged_rings_note, uncalibrated_step_note, with_mesh, workers_mesh
from ..passes.fsdp_units import with_units
from ..passes.horovod import crowded_hosts
from ..passes.link_fit import LinkFit, graph_world_size, link_fit, pipelined
from ..passes.overlap import core_bound_slowdown
from ..passes.profiler_cost import correct_profiler_cost, measure_profiler_cost, scale_host_work
from ..passes.workers import in_pass_gathers_note, replica_ranks, shared_port_note
from ..passes.zero import even_share_note
from ..progress import progress
from ..replay import ReplayResult
from ..traces.events import Kind
from ..traces.parallelism import Aside, Dim
from ..traces.run_schema import FSDP2_API
from ..units import MB, count, figure
from .fsdp_memory import GATHERED_UNRECORDED, ddp_peak_of_fsdp, fsdp_peak, missing_sizes, offload_note, roots_note
from .memory import autograd_host
from .scenario import (
    Cluster,
    Scenario,
    apply,
    base_topology,
    beside,
    disturb,
    fixed_workers,
    measured_comm,
    on_link,
    profiled_at,
    refuse_link_from_elsewhere,
    undisturb,
)
from .shared_cores import TERM, comm_slowdown_beside, on_shared_cores, shared_cores_note, unslowed_profile, with_shared_cores
from .whatif_row import WhatifRow
from .wire_notes import profiled_wire_notes, waiting_notes

COLUMNS = {
    "workers": "ranks (data-parallel workers) in the scenario",
    # a parameter server's workers' mean (``evaluate``: GraphMeta.job_name)
    "predicted_iter_ms": "predicted iteration time of the slowest rank, ms: the mean over the replayed steps, as the profiled run's is measured",
    "iters_per_s": "iterations per second (1 / predicted_iter_ms); every rank runs one per iteration",
    "speedup_vs_profiled": "throughput (workers / iteration time) over the profiled run's, both replayed; > 1 = more samples/s than now",
    "speedup_vs_one_worker": "throughput over ONE worker's under the same conditions = workers x scaling_efficiency",
    "scaling_efficiency": "weak scaling: one worker's iteration time / this one, same conditions; 1.0 = linear, lower = overhead of scale",
    "vs_measured_pct": "predicted iteration time against the measured one of the profiled run (less the profiler's cost unless --raw), % (+ = slower)",
    "predicted_median_ms": "predicted median step (each the slowest rank's) over the replayed steps, ms: the point the interval stands "
                           "around, to hold against a run's median step (a stalled step moves the mean, not the median)",
    "lo_ms": "low end of the interval a run's median step should fall in (``level``; a run as long as the profiled window), from the "
             "replayed steps' median's error, the link fit's and the level the point stands on (not a single step's spread: wider)",
    "hi_ms": "high end of that interval, ms",
    "level": "the share of runs whose median step the interval should hold (0.9 = 90 %)",
    "interval": "predicted iteration time (lo_ms-hi_ms, level)",
    "peak_memory_mb": "FSDP jobs and --data-parallel: predicted peak memory of the fullest rank, MiB (memory_per_rank: each rank's "
                      "breakdown at its peak)",
}


MODEL_TOLERANCE_PCT = 2.0  # a model further than this from the profiled run predicts nothing


def check_model(model_us: float, measured_us: float | None, tolerance_pct: float | None, built: Graph,
                corrected: Graph | None = None, share: float = 0.0, link: str = "the link fitted to its collectives") -> float:
    """The model's error on the profiled run itself, %; refused beyond ``tolerance_pct`` (None: never).

    Every prediction inherits that error, and a link fitted to small or noisy collectives can
    be off by far more than the effect asked about, so such a model must not predict. Compare like
    with like: a model of the raw op times (``--raw``) against the profiled steps as measured; a model
    whose op times had the profiler's cost removed (``corrected``: ``built`` with its host work shortened)
    against the job without the profiler, that is the measured iteration less the ``share`` the correction removed
    (``passes.profiler_cost.removed_share``: the measured share, or less where the profiler's CPU held the correction;
    ``measured_us`` is then that reference). Since the correction makes the model drop by that same share,
    the gate passes or refuses the same model either way: the correction moves the predictions, not the check.
    A refusal splits the miss along the chain that made the model, each part with its own figure: the
    replay of the graph as built (collectives as measured) against the measured run, the correction against
    the replay less the share (it is fitted on the model, so the measured-link replay need not drop by
    exactly that), and ``link`` against the replay it reprices.
    """
    base_us = job_iteration_us(built if corrected is None else corrected)  # the replay the model reprices
    ref = measured_us or base_us
    err = 100.0 * (model_us - ref) / ref
    if tolerance_pct is None or abs(err) <= tolerance_pct:
        return err
    what, parts = "replayed", []
    if measured_us:
        what = "measured less the profiler's cost" if corrected is not None else "measured"
        built_us, as_measured = job_iteration_us(built), ref / (1.0 - share)
        parts.append(f"the replay of the graph as built {_pct(built_us, as_measured)} off the measured run"
                     + (f" ({as_measured / 1e3:.2f} ms)" if corrected is not None else ""))
        if corrected is not None:
            parts.append(f"the profiler-cost correction ({-100 * share:+.1f} %) {_pct(base_us, built_us * (1.0 - share))} off that replay less the cost")
    parts.append(f"{link} {_pct(model_us, base_us)} off the replay it reprices")
    raise DagprofError(f"not predicting: the model the what-ifs start from gives the profiled run {model_us / 1e3:.2f} ms/iter (mean step both), {what} "
                       f"{ref / 1e3:.2f} ms ({err:+.1f} %, more than {tolerance_pct:g} %): {', '.join(parts)}; --allow-model-error predicts anyway")


def _refuse_looped(g: Graph, scenarios: list[Scenario]) -> None:
    """Refuse other setups when data-parallel collectives ran inside an XLA loop op: the graph has them only as part of
    the loop's measured time, so no scenario can re-price them, and its answer would leave them as profiled."""
    par = g.meta.parallel
    if par is None or not par.looped_dp[0] or all(s == Scenario() for s in scenarios):
        return
    steps = max(len(g.meta.steps), 1) * max(graph_world_size(g), 1)
    raise DagprofError(f"not predicting: {par.in_loop_text(steps)}; those timed as their loop op cannot be re-priced by a what-if")


def _pct(x: float, ref: float) -> str:
    return f"{100.0 * (x - ref) / ref:+.1f} %"


def evaluate(g0: Graph, scenarios: list[Scenario], cluster: Cluster | None = None, measured_us: float | None = None,
             timeline: Callable[[int, Graph, ReplayResult], str | None] | None = None, steps_graph: Graph | None = None,
             tolerance_pct: float | None = MODEL_TOLERANCE_PCT, raw: bool = False) -> dict:
    """Replay every scenario; one ``WhatifRow`` per scenario (its ``to_json`` has the ``COLUMNS``).

    Refused when the model of the profiled run misses it by more than ``tolerance_pct`` (None: never), or (unless None)
    when a row that only slows the link below what the profile's largest collectives moved predicts a faster step
    (``wire_notes.waiting_notes``).
    Scaling efficiency needs one worker under the same conditions: that scenario is replayed
    too (once per distinct set of conditions). ``timeline(i, graph, result)`` may save scenario
    ``i``'s predicted timeline and return its path. Each row's interval comes from the scenario
    replayed step by step: on ``g0``, or on ``steps_graph`` (each step with its own times) when
    ``g0`` is the averaged iteration, and widened by the level it stands on (``analysis.interval.run_level``).
    Rows that change the link, the workers or the scheme carry a ``caveat`` when the link fitted to the
    profile cannot tell latency from bandwidth, and a ``stall_outweighs`` when they change the step less than a JAX job's
    per-array stall on gloo moves one (``analysis.operand_stall.stall_outweighs``).
    Unless ``raw``, the profiler's own cost measured on the run is removed from the op times first
    (``passes.profiler_cost.correct_profiler_cost``, as ``dagprof optimize`` does, but keeping the compute's pace in the
    window where optimize takes the pace after it, and saying so), and ``measured_us`` and ``vs_measured_pct`` then mean the job without
    the profiler (``check_model``); ``profiler_cost`` in the result says what was done, or why not.
    """
    t0 = time.perf_counter()
    cluster = cluster or Cluster()
    _refuse_looped(g0, scenarios)
    if cluster.link_from is not None:
        refuse_link_from_elsewhere(g0, cluster.link_from)
    g0 = profiled_at(g0, cluster)
    steps_graph = None if steps_graph is None else profiled_at(steps_graph, cluster)
    n0 = graph_world_size(g0)
    unit = replica_ranks(g0)  # ranks of one data-parallel replica: "one worker" of a hybrid job is one replica
    base_topo = measured_comm(g0, scenarios, cluster)
    cost = measure_profiler_cost(g0 if steps_graph is None else steps_graph)
    # other processes' work on a rank's own core is no part of the job: taken out first, --raw or not (``remove_foreign_load``)
    foreign = remove_foreign_load(g0, steps_graph, lambda x: job_iteration_us(on_link(x, base_topo)))
    if foreign is not None:
        g0, steps_graph = foreign.graph, foreign.steps_graph
        measured_us = None if not measured_us else measured_us * (1.0 - foreign.removed)
    built, corrected, host, removed, fix = g0, None, (1.0, 1.0), 0.0, None
    if not raw:  # optimize's correction; the compute kept at the window's pace, by choice (``correct_profiler_cost`` says why)
        fix = correct_profiler_cost(built, cost, job_iteration_us, model=on_link(built, base_topo), measured=steps_graph,
                                    pace_after_window=False)
    if fix is not None and (cost.usable or fix.steady_applied):
        g0 = corrected = fix.graph
        removed = fix.share
        host = cost_factors(built, cost, fix.factor, job_iteration_us, model=on_link(built, base_topo))
        steps_graph = None if steps_graph is None else scale_host_work(steps_graph, fix.factor)
        measured_us = None if not measured_us else measured_us * (1.0 - removed)
    g0 = undisturb(g0, on_link(g0, base_topo), cluster)
    if steps_graph is not None:
        steps_graph = undisturb(steps_graph, on_link(steps_graph, base_topo), cluster)
    model = job_iteration_us(*disturb(on_link(g0, base_topo), cluster))
    given = base_topo is None or cluster.topology or cluster.link_model or g0.meta.topology  # else the link is fitted to the profile's collectives
    # a script's own queued calls: the wire beside each call's measured cost (``passes.comm.own_call_link``), no fit extrapolated
    fit = None if given or own_call_cost(g0) is not None else link_fit(g0)
    # a refusal names a weak fit's reason: the BERT MLM's 2.1-2.5 % misses (Horovod) were fits whose message size explained 19-42 %
    fitted = "the link fitted to its collectives" + ("" if fit is None or fit.weak is None else f" ({fit.weak})")
    model_error = check_model(model, measured_us, tolerance_pct, built, corrected, removed if corrected is not None else 0.0,
                              "the collectives as measured" if base_topo is None else "the link model" if given else fitted)
    caveat = None if fit is None or fit.weak is None else f"extrapolates a link fit too weak to split latency from bandwidth: {fit.weak}"
    wire, wire_notes = profiled_wire_notes(g0, fit, cluster, scenarios)
    stepwise = g0 if steps_graph is None else steps_graph
    residuals = link_residuals(stepwise, on_link(stepwise, base_topo))
    level = run_level(stepwise, cost, corrected is not None, model, measured_us, host)
    one_worker: dict[str, float] = {}
    rows, relinked, held, predicted, outweighed, bounds = [], False, held_us(g0), [], 0, []
    # a compiled FSDP model's modules are left unhooked (collect.hooks.collector.compiled), a job ended in the window had no shard
    # sizes (before 2026-12-05): their times, not their memory
    unsized = missing_sizes(g0.meta.fsdp) if is_fsdp_graph(g0) else None
    for i, s in enumerate(progress(scenarios, "what-if scenarios", unit="scenario")):
        t1 = time.perf_counter()
        g, res = disturb(apply(g0, s, cluster, base_topo), beside(cluster, s))
        it = _iteration_us(g0, s, cluster, base_topo, g, res)
        predicted.append((s, it))
        n = graph_world_size(g)
        single = replace(s, workers=unit, mesh=None)  # one replica: no mesh
        key = repr(single)
        if key not in one_worker:
            one_worker[key] = it if n == unit else _one_replica_us(g0, single, cluster, base_topo)
        eff = None if one_worker[key] is None else one_worker[key] / it
        gs, rs = (g, res) if steps_graph is None else disturb(apply(steps_graph, s, cluster, base_topo), beside(cluster, s))
        relinks = (s.bandwidth is not None or s.latency_us is not None or s.link_to is not None or s.workers not in (None, n0) or s.scheme is not None
                   or s.reduce_dtype is not None or s.data_parallel is not None or s.units is not None or s.mesh is not None)
        # the interval is for a run's median step, so it stands around the replayed steps' median (the benches' and
        # --verify's statistic), not their mean: hvd_text's profiled steps, a stalled one among them, put its 90 % interval
        # around a mean 9 % above the median its round measured against
        interval = predict_interval(gs, rs, typical_iteration_us(gs, rs), residuals, run=level, stall_bound_us=stall_bound_us(g0) if relinks else 0.0,
                                    stall_held_us=held, wake_up=_wake_up_spread(g0, g, s, cluster))
        unpriced = _overlap_bound_us(g0, s, cluster, gs, rs)
        interval = _shared_cores(interval.above(unpriced, "overlap"), g0, s, cluster, base_topo, stepwise, gs, rs)
        bounds += [unpriced] * (unpriced > 0)
        seconds = time.perf_counter() - t1
        stall = stall_outweighs(g0, it - model) if relinks else None
        outweighed += bool(stall)
        relinked = relinked or relinks
        peaks = None if unsized else _peaks(g0, g, s)
        rows.append(WhatifRow(s, n, interval, it, (n / n0) * model / it, None if eff is None else n / unit * eff, eff,
                              None if not measured_us else 100.0 * (it - measured_us) / measured_us, seconds,
                              caveat=caveat if relinks else None, stall_outweighs=stall, memory_per_rank=peaks or None,
                              trace=timeline(i, g, res) if timeline else None, note=row_note(g0, s)))
    waiting = waiting_notes(g0, fit, cluster, predicted, model, refuse=tolerance_pct is not None)
    link = None if fit is None else {
        "latency_us": fit.link.alpha_us, "bandwidth_bytes_per_s": fit.link.bandwidth_bytes_per_s if fit.link.beta_us_per_byte else None,
        "collectives": fit.collectives, "sizes": fit.sizes, "r2": fit.r2, "weak": fit.weak, "profiled_wire": wire}
    profiler = cost.to_dict() | ({"corrected": False, "verdict": "--raw", "text": "op times as profiled (--raw)"} if raw else
                                 {"text": fix.describe(built, cost)} | ({"removed_pct": 100 * removed} if corrected is not None else {}))
    return {"workers": n0, "model_iter_ms": model / 1e3, "model_error_pct": model_error, "profiler_cost": profiler,
            "foreign_load": None if foreign is None else foreign.to_dict(),
            "reference_iter_ms": None if not measured_us else measured_us / 1e3, "link": link_text(base_topo), "link_fit": link,
            "columns": COLUMNS | {"predicted_iter_ms": f"predicted iteration time of the {g0.meta.job_name}, ms: the mean over the replayed steps"},
            "scenarios": rows,
            "overlap_slowdown": cluster.slowdown, "overlap_rate_bytes_per_s": cluster.comm_rate,
            "notes": _unused_link_notes(base_topo, cluster) + _hybrid_notes(g0, scenarios) + _stall_notes(fit, pipelined(g0))
                     + _conversion_notes(g0, scenarios, cluster)
                     + _overlap_bound_notes(g0, bounds)
                     + _crowded_notes(g0, scenarios) + _unsized_own_notes(g0, scenarios) + _in_ops_notes(g0, scenarios)
                     + _job_own_notes(g0, scenarios) + _in_pass_gathers_notes(g0, scenarios)
                     + _hook_notes(g0, scenarios)
                     + _shared_cores_notes(g0, cluster) + _loopback_notes(g0, rows, cluster) + _foreign_cpu_notes(g0, foreign) + _overlap_notes(cluster)
                     + _own_cores_notes(g0, predicted, cluster) + _process_cpu_notes(g0, predicted, cluster) + _ring_pace_notes(g0, scenarios, cluster)
                     + _gloo_cpu_notes(g0, cluster)
                     + _server_cores_notes(g0, scenarios)
                     + _shared_port_notes(g0, scenarios) + _floor_notes(rows) + _refusion_notes(g0, scenarios, cluster, base_topo, model)
            + _link_to_notes(scenarios, cluster) + _mesh_notes(g0, scenarios) + _zero_notes(g0, scenarios) + _fsdp_step_notes(g0, scenarios, cluster)
            + wire_notes + waiting
            + ([f"no peak memory in {count(len(rows), 'row')}: {unsized}"] if unsized else [])
            + ([f"peak memory in {count(len(rows), 'row')}: {GATHERED_UNRECORDED}"] if _threshold_rule(g0) and not unsized else [])
            + ([note] if is_fsdp_graph(g0) and not unsized and (note := offload_note(g0.meta.fsdp)) else [])
            + ([note] if is_fsdp_graph(g0) and not unsized and (note := roots_note(g0.meta.fsdp, any(s.data_parallel == "ddp" for s in scenarios))) else [])
            + ([note] if (is_fsdp_graph(g0) or any(s.data_parallel is not None for s in scenarios)) and not unsized
               and (note := autograd_host(g0).note) else [])
            + ([note] if relinked and (note := stall_note(g0)) else [])
            + ([f"{outweighed} of {count(len(rows), 'row')} (marked ~) change the step less than that stall moves one step at even odds: "
                "their points are not told apart from the profiled run's, read their intervals"] if outweighed else []),
            "conversion_detail": _conversion_detail(g0, scenarios, cluster),
            "seconds": time.perf_counter() - t0}


def row_note(g0: Graph, s: Scenario) -> str | None:
    """``--reshard-after-forward on`` on an FSDP2 profile whose root was kept gathered after forward (``fully_shard``'s
    default): the flag reshards the root too, so the row is not the profiled setup even where every other unit resharded
    (``set_reshard``), which its cell alone does not tell."""
    if s.reshard_after_forward is not True or s.data_parallel is not None or not is_fsdp_graph(g0) or g0.meta.fsdp.api != FSDP2_API:
        return None
    if not any(u.is_root and not u.resharded_after_forward for u in g0.meta.fsdp.units):
        return None
    return "on reshards the root unit too, which the profile kept gathered after forward (fully_shard's default)"


def _unused_link_notes(base_topo: Topology | None, c: Cluster) -> list[str]:
    """A link given (``--topology``, ``--link-model``) to a trace with no data-parallel collective to price on it
    (``scenario.measured_comm``: a 1-rank or tensor-parallel-only trace): read, and checked, but unused; said, since the
    table alone reads as if it were applied."""
    if base_topo is not None:
        return []
    given = [f"{flag} {v}" for flag, v in (("--topology", c.topology), ("--link-model", c.link_model)) if v]
    return [f"{' and '.join(given)} read but unused: this trace has no data-parallel collective to price on it (its "
            "collectives, if any, keep their measured times)"] if given else []


def _overlap_bound_us(g0: Graph, s: Scenario, c: Cluster, g: Graph, res: ReplayResult) -> float:
    """FSDP -> DDP with no slowdown beside collectives measured (``Cluster.slowdown``, from ``calibrate --overlap``): how much
    longer the median step of ``g``, the conversion (replayed as ``res``), takes with its compute beside DDP's all-reduces
    slowed as much as the host's cores allow (``core_bound_slowdown``, each all-reduce counted whole). The FSDP profile
    measures none of it: its collectives block its ranks, so none of its compute ran beside one. 0 for other rows."""
    if s.data_parallel != "ddp" or not is_fsdp_graph(g0) or c.slowdown:
        return 0.0
    slowed, slowed_res = disturb(g, replace(c, slowdown=core_bound_slowdown(g0), comm_rate=None))
    return max(0.0, typical_iteration_us(slowed, slowed_res) - typical_iteration_us(g, res))


def _shared_cores(interval: PredictionInterval, g0: Graph, s: Scenario, c: Cluster, base_topo: Topology | None, stepwise: Graph,
                  g: Graph, res: ReplayResult) -> PredictionInterval:
    """``interval`` with the ``shared_cores`` bounds (``search.shared_cores``, as ``bench/testbed/run.py`` puts them on its
    unshaped cells) where the row prices collectives that are the ranks' own CPU work, timed alone (``on_shared_cores``);
    ``g`` the row replayed step by step (``res``), ``stepwise`` the profile's steps it was built from."""
    if base_topo is None or not on_shared_cores(g0, s, c):
        return interval
    ran = base_topo if c.link_model is None else base_topology(g0, Cluster())  # the profile's compute beside its collectives as they ran
    unslowed = None if c.slowdown else apply(unslowed_profile(stepwise, on_link(stepwise, ran), g0), s, c, base_topo)
    return with_shared_cores(interval, g, res, comm_slowdown_beside(g0, c.link_model), 0.0 if c.slowdown else core_bound_slowdown(g0),
                             unslowed)


def _loopback_notes(g0: Graph, rows: list[WhatifRow], c: Cluster) -> list[str]:
    """Said where ``_shared_cores`` widened some rows' intervals."""
    n = sum(TERM in row.interval.terms for row in rows)
    return [shared_cores_note(g0, n, len(rows), c)] if n else []


def _overlap_bound_notes(g0: Graph, bounds: list[float]) -> list[str]:
    """Said where ``_overlap_bound_us`` raised an interval's high end: why, and by how much."""
    if not bounds:
        return []
    cores = "; ".join(f"{k.ranks} ranks on {k.cores} cores" + g0.meta.pinned_said(h)
                      for h, k in g0.meta.host_cpus.items()) or "cores not recorded"
    more = f"{min(bounds) / 1e3:.2f}" + (f"-{max(bounds) / 1e3:.2f}" if max(bounds) > min(bounds) else "")
    return [f"--data-parallel ddp from an FSDP profile: the point leaves out how DDP's all-reduces slow the compute beside them (the "
            f"FSDP profile ran none; no slowdown measured here); the interval's high end holds it at up to {1 + core_bound_slowdown(g0):g}x "
            f"({cores}), {more} ms more a median step; dagprof calibrate --overlap -o link.json, then --link-model link.json, prices it"]


def _wake_up_spread(g0: Graph, g: Graph, s: Scenario, c: Cluster) -> tuple[float, float]:
    """DDP -> FSDP where the conversion priced wake-ups (``passes.data_parallel.priced_wake_up``): the half-width (us a
    step, at ``LEVEL``) that the sampling error of their price puts on a step of ``g``, the conversion, and the wake-ups'
    time the point holds (``wake_ups_per_step``, on the busiest rank; all on its main lane, so each moves the step). (0, 0) else."""
    if s.data_parallel in (None, "ddp") or is_fsdp_graph(g0):
        return 0.0, 0.0
    wake = priced_wake_up(g0, c.link_file.fsdp if c.link_file is not None else None)
    if wake is None:
        return 0.0, 0.0
    n = wake_ups_per_step(g)
    return n * student_halfwidth(wake.stderr_us, wake.dof, LEVEL), n * max(wake.us.values())


def _threshold_rule(g0: Graph) -> bool:
    """The FSDP profile's memory comes from the rule for profiles that did not name the gathered parameters a layer saved."""
    return is_fsdp_graph(g0) and g0.meta.fsdp.layer_saved_gathered_bytes is None


def _peaks(g0: Graph, g: Graph, s: Scenario) -> dict | None:
    """The scenario's peak memory per rank: FSDP jobs and DDP <-> FSDP (None for a DDP job's own what-ifs)."""
    if s.data_parallel is not None and is_fsdp_graph(g0) != is_fsdp_graph(g):  # DDP <-> FSDP: the scenario's own record
        return fsdp_peak(g) if is_fsdp_graph(g) else ddp_peak_of_fsdp(g0, s.workers)  # the conversion's units reshard as asked
    if not is_fsdp_graph(g0):
        return None
    grouped = g0 if s.units is None else with_units(g0, s.units)  # the memory model reads the units and dtypes from meta
    grouped = grouped if s.mesh is None else with_mesh(grouped, *s.mesh)
    dtyped = grouped if s.reduce_dtype is None else set_reduce_dtype(grouped, s.reduce_dtype)
    reshard = s.reshard_after_forward if s.data_parallel is None else \
        wrapper_reshard([u.name for u in g0.meta.fsdp.units], s.data_parallel, s.reshard_after_forward)
    return fsdp_peak(dtyped, reshard=reshard, workers=s.workers)


def _refusion_notes(g0: Graph, scenarios: list[Scenario], c: Cluster, base_topo: Topology | None, model_us: float) -> list[str]:
    """``--fusion-mb``/``--cycle-ms`` rows come from Horovod's cycles simulated again, not from the model of the profiled run:
    where that simulation at the profiled settings misses the row it changes by more than ``MODEL_TOLERANCE_PCT``, say by
    how much (a fresh autoencoder job with fp16 and 2 backward passes a step: -4 %, the text fixture: +7 %, for settings
    unchanged). Checked for each other change the rows make with them (``--bandwidth 200Mbit --fusion-mb 128`` against
    ``--bandwidth 200Mbit``): the simulation prices a response on a new link by its fitted line scaled by the two links'
    ratio, latency and all: a ViT profiled at 1 Gbit/s on the two-host testbed (2026-12-06, docs/evidence.md, hvdfuse60) gave
    247 ms/iter at 200 Mbit/s with its own settings, the link row alone 166 ms, its job measured there 181 ms."""
    hv = g0.meta.horovod
    if hv is None or not any(s.fusion_mb is not None or s.cycle_ms is not None for s in scenarios):
        return []
    profiled = {"fusion_mb": (hv.fusion_threshold_bytes or 0) / MB, "cycle_ms": hv.cycle_time_ms or 0.0}
    others = {repr(r): r for r in (replace(s, fusion_mb=None, cycle_ms=None) for s in scenarios if s.fusion_mb is not None or s.cycle_ms is not None)}
    notes = []
    for rest in others.values():
        at = job_iteration_us(*disturb(apply(g0, replace(rest, **profiled), c, base_topo), c))
        alone = rest == Scenario()
        ref = model_us if alone else job_iteration_us(*disturb(apply(g0, rest, c, base_topo), c))
        err = 100.0 * (at - ref) / ref
        if abs(err) <= MODEL_TOLERANCE_PCT:
            continue
        said = "the model of the profiled run" if alone else "the same row without them"
        where = "" if alone else " with " + ", ".join(f"{k} {v}" for k, v in rest.label().items() if v is not None)
        notes.append(f"--fusion-mb/--cycle-ms simulate Horovod's cycles again: at the profiled settings ({profiled['fusion_mb']:g} MB, "
                     f"{profiled['cycle_ms']:g} ms){where} that simulation gives {at / 1e3:.2f} ms/iter, {err:+.1f} % from {said} "
                     f"({ref / 1e3:.2f} ms): read those rows against it, not against the measured run")
    return notes


def _link_to_notes(scenarios: list[Scenario], c: Cluster) -> list[str]:
    """What a ``--link-to`` row rests on: the two calibrations' ratio, not a fit."""
    if not any(s.link_to is not None for s in scenarios):
        return []
    return [f"--link-to: each collective as profiled plus what its kind and size took more on the row's link than on "
            f"--link-from's ({c.link_from}, the first rank out's time), each exit lag times their ratio, the nearest swept sizes "
            "interpolated (beyond the sweep, its end's); the two files must "
            "be measured alike (on a loaded machine each size's time grows by about the same amount on both links, and the ratio shrinks)"]


def _foreign_cpu_notes(g: Graph, removal: ForeignRemoval | None) -> list[str]:
    """Ranks that waited for their cores beyond the job's own CPU (``analysis.foreign_cpu``): pinned alone to a core, what was
    taken out of their op times where it was, else the note; sharing one host's cores, the note."""
    note = removal.describe() if removal is not None else foreign_cpu_note(g.meta) or shared_cores_load_note(g.meta)
    return [note] if note else []


def _overlap_notes(c: Cluster) -> list[str]:
    if not c.slowdown:
        return []
    per = "" if c.comm_rate is None else (f", each collective weighted by its bytes per second against the measured all-reduce's "
                                          f"{c.comm_rate / 1e9:.3g} GB/s (at most 1)")
    return [f"compute beside in-flight collectives runs (1 + {c.slowdown:.2f} x overlap) slower (measured){per}: taken out of the "
            "profiled op times and charged again under each scenario; measured on one link, the weighting is not validated at another "
            "rate (on the testbed 200 Mbit/s slowed compute as much as an unshaped link)"]


def _conversion_targets(g0: Graph, scenarios: list[Scenario]) -> list[str]:
    """The wrappers the rows convert the profile to (``ddp``, ``fsdp``), each once."""
    fsdp = is_fsdp_graph(g0)
    return [t for t in sorted({"ddp" if s.data_parallel == "ddp" else "fsdp" for s in scenarios if s.data_parallel is not None})
            if (t == "fsdp") != fsdp]


def _conversion_notes(g0: Graph, scenarios: list[Scenario], c: Cluster) -> list[str]:
    """The known limits of a DDP <-> FSDP answer, once per target wrapper asked for: a short note; the derivation and
    its held-out figures in ``conversion_detail``."""
    measured = c.link_file is not None and c.link_file.fsdp is not None
    return [f"--data-parallel {t} from a{'n FSDP' if is_fsdp_graph(g0) else ' ' + g0.meta.ddp_label} profile: {conversion_summary(t, measured, g0)} "
            "(detail: --json's conversion_detail)" for t in _conversion_targets(g0, scenarios)]


def _conversion_detail(g0: Graph, scenarios: list[Scenario], c: Cluster) -> dict[str, str]:
    """Each target wrapper's ``conversion_note``: what every cost of the conversion is priced at and how held-out jobs fared."""
    measured = c.link_file is not None and c.link_file.fsdp is not None
    return {t: conversion_note(t, measured, g0) for t in _conversion_targets(g0, scenarios)}


def _shared_cores_notes(g: Graph, c: Cluster) -> list[str]:
    """Ranks that outnumbered the cores they shared when profiled (``GraphMeta.crowded_groups``: ranks pinned apart share
    none): each op's time holds the sharing as it fell then."""
    over = {h: groups[0] for h in g.meta.host_cpus if (groups := g.meta.crowded_groups(h, 1))}
    if not over or c.cores:
        return []
    h, group = next(iter(sorted(over.items())))
    ranks, cores = group.ranks, group.cores
    more = f" (and {count(len(over) - 1, 'more host')} alike)" if len(over) > 1 else ""
    return [f"{ranks} ranks shared {count(cores, 'core')} on host {h}{g.meta.pinned_said(h)}{more} when profiled: their ops ran "
            f"slower where more than {cores} computed "
            f"at once, and a what-if that changes when they compute (units, reshard, DDP <-> FSDP, the link) keeps the profiled "
            f"op times unless --cores {cores} models the sharing (a 4-rank HSDP job on 2 cores: --units merge:all -27 and -42 % "
            "off the measured job in two rounds without it, -4 and -26 % with it)"]


def _own_cores_notes(g: Graph, predicted: list[tuple[Scenario, float]], c: Cluster) -> list[str]:
    """More parameter-server workers than the profiled host's cores, without --cores: the assumption said, with its numbers
    against the shortest step predicted for the most workers."""
    most = max((s.workers or 0 for s, _ in predicted), default=0)
    step = min((it for s, it in predicted if (s.workers or 0) == most), default=None)
    note = None if c.cores or not is_ps_graph(g) else own_cores_note(g, most, step)
    return [note] if note else []


def _process_cpu_notes(g: Graph, predicted: list[tuple[Scenario, float]], c: Cluster) -> list[str]:
    """More TF/JAX workers than the profiled host's cores: not priced for ranks sharing them (``process_cpu_note``), said
    against the shortest step predicted for the most workers."""
    most = max((s.workers or 0 for s, _ in predicted), default=0)
    step = min((it for s, it in predicted if (s.workers or 0) == most), default=None)
    note = process_cpu_note(g, most, step, c.cores)
    return [note] if note else []


def _ring_pace_notes(g: Graph, scenarios: list[Scenario], c: Cluster) -> list[str]:
    """--cores with more JAX workers a host than cores: their ring steps at the scheduler's pace (``ring_pace_note``),
    said for the most workers asked."""
    most = max((s.workers or int(g.world_size) for s in scenarios), default=0)
    note = ring_pace_note(g, most, c.cores, c.ranks_per_host) if most else None
    return [note] if note else []


def _gloo_cpu_notes(g: Graph, c: Cluster) -> list[str]:
    """--cores on an FSDP profile on gloo some of whose ranks recorded no process CPU: gloo's CPU not priced (``gloo_cpu_note``)."""
    note = gloo_cpu_note(g, c.cores)
    return [note] if note else []


def _server_cores_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """More parameter servers than profiled on a host with fewer cores than workers and servers (``server_cores_note``)."""
    most = max((s.scheme.servers for s in scenarios if s.scheme is not None and s.scheme.scheme is Scheme.PS), default=0)
    note = server_cores_note(g, most) if is_ps_graph(g) else None
    return [note] if note else []


def _in_pass_gathers_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """Worker what-ifs of a job whose own all-gathers ran within its passes: kept at the profiled size (``in_pass_gathers_note``)."""
    return [note for w in sorted({s.workers for s in scenarios if s.workers is not None}) if (note := in_pass_gathers_note(g, w))]


def _shared_port_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """More parameter-server workers than profiled: their messages share each server's port in lockstep (``shared_port_note``)."""
    note = shared_port_note(g, max(s.workers or 0 for s in scenarios)) if is_ps_graph(g) else None
    return [note] if note else []


def _zero_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """Other worker counts of a ZeRO-1 job whose shards the record cannot re-split (``passes.zero.even_share_note``)."""
    return even_share_note(g.meta.zero, [s.workers for s in scenarios if s.workers is not None])


def _mesh_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """``--mesh`` layouts whose rings merge profiled groups: what the profile does not measure of them."""
    notes = [merged_rings_note(g, *s.mesh) for s in scenarios if s.mesh is not None]
    return list(dict.fromkeys(n for n in notes if n))


def _fsdp_step_notes(g: Graph, scenarios: list[Scenario], c: Cluster) -> list[str]:
    """An FSDP profile's new shard degrees (``--mesh RxS``; ``--workers`` on plain FSDP) without FSDP's measured costs."""
    if not is_fsdp_graph(g) or (c.link_file is not None and c.link_file.fsdp is not None):
        return []
    shards = [s.mesh[1] if s.mesh is not None else workers_mesh(g, s.workers)[1] for s in scenarios
              if s.mesh is not None or (s.workers is not None and s.workers > 1)]
    note = uncalibrated_step_note(g, shards) if shards else None
    return [note] if note else []


def _floor_notes(rows: list[WhatifRow]) -> list[str]:
    """Intervals the job's own unprofiled steps made wider than the replayed steps: say why they are wide."""
    floors = [100 * row.interval.floor for row in rows if row.interval.floor > 0]
    if not floors:
        return []
    return [f"{len(floors)} of {len(rows)} intervals are at least +-{max(floors):.0f} % wide: the median of the job's own unprofiled "
            "steps around the profile varies that much, more than the profiled ones' (the machine's load moved?); profile on a "
            "steadier machine for a narrower interval"]


def _crowded_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """Horovod ranks sharing too few cores: what their spinning waits take from compute is kept as measured, and rows with
    more workers keep the per-byte price of the collectives beyond the wire and the compute as profiled (``--cores`` queues
    it). On the 2-core testbed (2026-12-03, 500 Mbit/s, ``bench/bench_workers_testbed.py``) 2 -> 4 workers came out
    hvd_text -15 / -19 % (+4 / +5 % with --cores 2; load 14-15), hvd_transformer -42 / -37 % (-31 / -24 %; load 3.5-4.9:
    its collectives 8 % short, the rest of its step 1.8-2.2 times the queued prediction) and hvd_autoencoder
    -51 / -36 / -30 % (-42 / -22 / -18 %; load 7.5-16: its collectives 1.8-3.6 times the wire where priced at 1.1-1.5).
    The waits of Horovod's threads and of its spinning synchronize() grow with the ranks on the cores, and no part of the
    profile measures by how much."""
    crowded = crowded_hosts(g)
    if not crowded:
        return []
    hosts = ', '.join(f'{h}: {count(g.meta.host_cpus[h].ranks, "rank")} on {count(g.meta.host_cpus[h].cores, "core")}'
                      + g.meta.pinned_said(h) for h in crowded)
    note = (f"{count(len(crowded), 'host')} ({hosts}) {'has' if len(crowded) == 1 else 'have'} fewer cores than their ranks' main and Horovod "
            "threads, and Horovod's synchronize() spins a core while it waits: "
            "compute there slows as the waits grow (a slower link, more workers), which is not modelled; the predictions "
            "keep compute as profiled (one such job measured 25 % slower at 200 Mbit/s than predicted from 500)")
    more = sum(s.workers is not None and s.workers > graph_world_size(g) for s in scenarios)
    if more:
        note += (f"; {count(more, 'row')} adding workers: those waits, and the collectives' beyond the wire, grow with the ranks sharing the "
                 "cores, which is not modelled either (2 -> 4 workers on a 2-core host: -15 to -51 %; with --cores 2 +4 / +5 % for "
                 "fp32 gradients, -18 to -42 % for fp16 ones)")
    return [note]


def _stall_notes(fit: LinkFit | None, horovod: bool = False) -> list[str]:
    """Collectives that stalled beyond the link fitted to the others (``passes.link_fit.keep_stalls``; Horovod's:
    ``passes.comm._horovod_stalls``): said, with their time."""
    if fit is None or fit.stalls is None:
        return []
    late = fit.stalls[fit.stalls > 0]
    kept = ("kept on their own transfers, which a slower wire hides as far as it takes longer" if horovod
            else "kept in their own steps as measured, not re-priced with the link")
    return [f"{len(late)} of {fit.collectives} profiled collectives took {late.sum() / 1e3:.1f} ms beyond the link fitted to the others "
            f"(the most {late.max() / 1e3:.1f} ms): {kept}"]


def _unsized_own_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """A DDP job's own collectives (``analysis.breakdown.own_collectives``: barriers, logging and metric all-reduces)
    carry no size where Kineto recorded no shapes (gloo writes none), so a link or worker what-if prices them as 0-byte
    messages: right for a loss, short for a large tensor the job all-reduces itself. Counted, by kind."""
    if not any(_reprices_link(s) for s in scenarios):
        return []
    own = np.flatnonzero(own_collectives(g) & (g.nbytes <= 0))
    if not len(own):
        return []
    return [f"{len(own)} profiled collectives beside DDP's gradient buckets (the job's own: "
            f"{', '.join(by_kind(g, own.tolist()))}) have no recorded size: link and worker what-ifs "
            "price them as 0-byte messages (a loss or a metric; a large tensor the job all-reduces itself would take longer)"]


def _reprices_link(s: Scenario) -> bool:
    """Does the scenario price collectives on another link or group size?"""
    return s.bandwidth is not None or s.latency_us is not None or s.link_to is not None or s.workers is not None


def _in_ops_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """The model's own collectives timed inside its ops (``Parallelism.in_ops_text``), under a what-if that re-prices
    or re-buckets the others: what it leaves as measured, said with its count and time."""
    par = g.meta.parallel
    if par is None or not par.in_ops[0] or not any(_reprices_link(s) or s.bucket_mb is not None for s in scenarios):
        return []
    return [par.in_ops_text()]


def _hook_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """Under a what-if that re-prices the link or the ranks, what the job's own DDP comm hook leaves as measured."""
    note = hook_wire_note(g) if any(_reprices_link(s) for s in scenarios) else None
    return [note] if note else []


def _hybrid_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """What a hybrid job's answers leave as measured."""
    par = g.meta.parallel
    if par is None or not par.hybrid or par.dp_mesh:  # HSDP: every collective is data-parallel and modelled
        return []
    unit = replica_ranks(g)
    acts = activation_comm(g)
    unsized = int(((g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.UNKNOWN)).sum()) - len(acts)
    # what the trace shows around them (``traces.parallelism._issuer``), not a guess: a DCP save's gathers were once said a loss's
    seen = par.aside(Aside.ACTIVATIONS)
    moved = (f"; the {len(acts)} unknown ones in the data-parallel group that exchange no gradients ({'; '.join(seen)}) are "
             "re-priced by link what-ifs, their price on the profiled link replaced by the new one"
             + (f" ({unsized} more have no recorded size and keep their measured times)" if unsized else "")) if len(acts) else ""
    # a dagprof run sees the data-parallel collectives only: a replica's others (a TP layer's all-reduces, their waits) are
    # inside its layers' op times, which --compute-speed divides (bench/tp_fresh/mixer_dp_tp.py: about a quarter of its step)
    inside = 0 < par.dp_size < par.world_size and par.mesh_dims <= {Dim.DP}  # describe() says the ranks per replica already
    faster = ("; --compute-speed speeds up the tensor-parallel all-reduces timed inside the ops with them: the gain is an upper "
              "bound") if inside and any(s.compute_speed for s in scenarios) else ""
    return [f"parallelism {par.describe()}: only the data-parallel collectives are modelled; the others keep their measured "
            "times and group sizes" + (f" ({unit} ranks per data-parallel replica)" if unit > 1 and not inside else "") + moved + faster
            + _inside_ops_clause(g, scenarios)]


def _job_own_notes(g: Graph, scenarios: list[Scenario]) -> list[str]:
    """What the answers do with the job's own collectives (``Dim.JOB``: issued between an optimizer step and the next forward, a DCP save's
    object gathers and broadcasts), which ``--workers`` scaled as gradient traffic while they read "DP" from their group:
    link what-ifs re-price those of known size and group at their profiled size (``passes.comm.job_comm``), worker
    what-ifs keep them as profiled, since how they grow with more ranks (a save's plans, gathered to one) the trace does
    not show."""
    par = g.meta.parallel
    n = int(((g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.JOB)).sum()) if par is not None else 0
    if not n or not any(_reprices_link(s) for s in scenarios):
        return []
    priced = len(job_comm(g)[0])
    what = ["--workers keeps them at their profiled size and time (how they grow with more ranks, a save's plans gathered to "
            "one, the trace does not show)"] * any(s.workers is not None for s in scenarios)
    if any(s.workers is None for s in scenarios if _reprices_link(s)):
        what.append(f"link what-ifs re-price the {priced} of known size and group at their profiled size"
                    + (f", the {n - priced} others keep their measured time" if n > priced else ""))
    return [f"{n} collectives in the {len(g.meta.steps)} profiled steps ran between an optimizer step and the next forward pass "
            f"({'; '.join(par.aside(Aside.JOB_OWN))}): the job's own (a checkpoint's, a logger's), no gradients, not in the link fit; "
            + "; ".join(what)]


def _inside_ops_clause(g: Graph, scenarios: list[Scenario]) -> str:
    """How many of a dagprof run's collectives of other dimensions than DP ran inside the ops (``Parallelism.in_op_groups``: a
    DP x TP job's tensor-parallel all-reduces), per step and rank, and what the scenarios do with them: a worker what-if
    keeps them all as measured, a link what-if re-prices those the collector sized (``passes.comm.in_op_prices``: pieces
    of the op they blocked, in a group of the link's ranks; they too may be a DP one's, clipping's norm)."""
    par = g.meta.parallel
    rows = [x for x in par.in_op_groups if x.dim != Dim.DP.text]
    rank_steps = max(len(g.meta.steps) * graph_world_size(g), 1)
    if not rows:
        return ""
    dims = "/".join(sorted({x.dim for x in rows}))
    n, mb = sum(x.count for x in rows) / rank_steps, sum(x.nbytes for x in rows) / rank_steps / MB
    what = [f"--workers keeps the {n:g} at their measured time and group size"] * any(s.workers is not None for s in scenarios)
    if any(_reprices_link(s) and s.workers is None for s in scenarios):
        priced = len(in_op_prices(g, current_topology(g), CollectiveSpec())[0]) / rank_steps
        what.append(f"link what-ifs re-price {priced:.1f} a step per rank of the collectives inside the ops (sized, where they "
                    f"blocked their op, in a group of the link's ranks), the others keep their measured time")
    return (f"; {n:g} {dims} collectives a step per rank ran inside the ops"
            + (f" ({mb:.3f} MB recorded)" if mb else " (no bytes recorded)") + (": " + "; ".join(what) if what else ""))


def _iteration_us(g0: Graph, s: Scenario, cluster: Cluster, base_topo: Topology | None, g: Graph, res: ReplayResult) -> float:
    """The scenario's iteration (``g`` replayed as ``res``); a parameter server's job on another worker count from the
    same row at the profiled count (``analysis.breakdown.other_workers_us``: 1 worker, a copy of worker 0 alone, came out
    slower than 2 where worker 0 alone did the logging; ``tests/data/mxnet/user_gru_forecast`` at 10 Gbit/s: 28.61
    against 27.16 ms)."""
    if not is_ps_graph(g0) or s.workers in (None, graph_world_size(g0)):
        return job_iteration_us(g, res)
    ref, ref_res = disturb(apply(g0, replace(s, workers=None), cluster, base_topo), cluster)
    return other_workers_us(ref, ref_res, g, res)


def _one_replica_us(g0: Graph, single: Scenario, cluster: Cluster, base_topo: Topology | None) -> float | None:
    """One data-parallel replica's iteration under the same conditions; None where the job's worker count cannot change
    (``scenario.fixed_workers``: the scaling columns are then n/a). Any other refusal of the replica is the scenario's
    own and stops the what-if."""
    try:
        return _iteration_us(g0, single, cluster, base_topo, *disturb(apply(g0, single, cluster, base_topo), cluster))
    except DagprofError:
        if not fixed_workers(g0, single.workers, base_topo):
            raise
        return None


def link_text(t: Topology | None) -> str:
    if t is None:
        return "collectives as measured (no data-parallel collective to fit a link to)"
    ab = t.inter
    rate = f"{ab.bandwidth_bytes_per_s * 8 / 1e9:.3g} Gbit/s" if math.isfinite(ab.bandwidth_bytes_per_s) else "of no bandwidth limit seen"
    # the model's hosts are the ends of its link, not the machines the ranks ran on (a loopback job's ranks shared one)
    ends = (f"{count(t.hosts, 'rank')}, one per end of the link" if t.devices_per_host == 1
            else f"{count(t.hosts, 'link end')} of {count(t.devices_per_host, 'rank')}")
    # a script's own queued calls: their per-call cost a floor beside the wire (``passes.comm.own_call_link``)
    call = f", each at least its {figure(t.floor.overhead_us)} us call" if t.floor is not None and t.floor.inter.beta_us_per_byte == 0 else ""
    return f"{ends}, link {rate}, latency {figure(ab.alpha_us)} us, {figure(t.overhead_us)} us per collective{call}"
