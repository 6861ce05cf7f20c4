"""``dagprof whatif RUN --bandwidth 10Gbit --workers 16 --bucket-mb 5 --scheme ps:4``.

Every axis flag (``search.scenario.AXES``) takes a comma-separated list; the scenarios are all combinations
(``sweep``), one table row each, evaluated by ``search.whatif`` (which documents the pass order and the columns).
"""
from __future__ import annotations

import os

from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..passes.average_steps import average_steps
from ..passes.fsdp import refuse_prefetch
from ..passes.workers import refuse_degree
from ..pipeline import open_run
from ..replay import replay
from ..report.timeline import write_replay_trace
from ..search.measured import slowdown_of
from ..search.scenario import AXES, Cluster, sweep
from ..search.whatif import MODEL_TOLERANCE_PCT, evaluate
from ..traces.completeness import refuse_lone_rank
from ..traces.parallelism import Dim
from .common import (
    MAX_CONTENDED_WORKERS,
    add_out_argument,
    add_profiled_bandwidth_argument,
    add_run_arguments,
    comma_list,
    outputs,
    positive_int,
    positive_number,
    shown,
    warning_lines,
)
from .terminal import wrap_lines

HELP = "predict iteration time under other bandwidth, latency, workers, buckets, schemes, compute speed"
MAX_TRACES = 8  # scenarios whose predicted timeline is written
_FSDP_AXES = ("reshard_after_forward", "reduce_dtype", "units", "mesh")  # what-ifs of an FSDP profile only


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.epilog = ("each axis flag (--workers .. --mesh) takes a comma-separated list, one row per combination; an axis not given "
                "stays as profiled. Example: dagprof whatif RUN --bandwidth 10Gbit,1Gbit --workers 16 --bucket-mb 5")
    for a in AXES:
        p.add_argument(a.flag, dest=a.name, metavar=a.flag[2:].upper().replace("-", "_"), type=comma_list(a.parse), help=a.help)
    p.add_argument("--link", choices=["inter", "intra", "all"], default="inter", help="which links --bandwidth/--latency change (default inter-host)")
    p.add_argument("--tp-degree", type=positive_int, help="tensor-parallel degree: refused unless it is the profiled one (not modelled)")
    p.add_argument("--pp-degree", type=positive_int, help="pipeline-parallel degree: refused unless it is the profiled one (not modelled)")
    p.add_argument("--first-bucket-mb", type=positive_number, default=None,
                   help="cap of the first bucket only (DDP's default is 1 when bucket_cap_mb is unset)")
    p.add_argument("--no-overlap", action="store_true", help="start all-reduces only after the whole backward")
    p.add_argument("--prefetch", metavar="X", help="FSDP prefetch depth: refused in one line that says why (on CPU/gloo the "
                   "depth was measured to change nothing: one all-gather in flight at any depth)")
    p.add_argument("--optimizer-state", default="momentum", choices=["sgd", "momentum", "adam"],
                   help="--data-parallel fsdp from a DDP profile: optimizer state per parameter, for the memory (default momentum: one copy)")
    p.add_argument("--topology", help="cluster: a JSON/TOML file, or presets like 10gbe or nvlink/100gbe:8")
    p.add_argument("--link-model", metavar="FILE", help="link model from `dagprof calibrate` (instead of fitting the run's collectives); a --overlap "
                   "file also prices compute slowed beside in-flight collectives")
    p.add_argument("--link-from", metavar="FILE", help="`dagprof calibrate` file of the link the run was profiled on, for --link-to "
                   "(measured as its files were: same ranks, sizes and machine)")
    add_profiled_bandwidth_argument(p)
    p.add_argument("--half-duplex", action="store_true",
                   help="every rank's traffic crosses one shaper both ways (the namespace testbed's loopback; on 2 ranks a half-duplex "
                   "link): --bandwidth is what each port gets while all carry, and a collective in which fewer ranks send at once "
                   "(scatter, gather, broadcast, gloo's all-to-all) costs its bytes on the one medium")
    p.add_argument("--cores", type=positive_int, default=None, help="cores per host shared by its ranks (default: ranks do not contend)")
    p.add_argument("--ranks-per-host", type=positive_int, default=None, help="with --cores: ranks per host (default all on one)")
    p.add_argument("--fine", action="store_true", help="per-message collectives on per-link queues (needs <= 64 ranks)")
    p.add_argument("--allow-model-error", action="store_true",
                   help=f"predict even when the model misses the profiled run by more than {MODEL_TOLERANCE_PCT:g} %% (refused otherwise)")
    p.add_argument("--raw", action="store_true",
                   help="predict from the op times as profiled (default: the profiler's own cost, measured on the run, removed first); "
                        "other processes' work on a pinned rank's core is taken out either way")
    p.add_argument("--template", action="store_true", help="start from the averaged iteration (each op at its mean over the steps)")
    add_out_argument(p, "whatif<i>.trace.json")
    p.add_argument("--no-trace", action="store_true", help="do not write predicted timelines")


def run(args) -> dict:
    if args.cores and max(args.workers or [0]) > MAX_CONTENDED_WORKERS:
        raise DagprofError(f"with --cores every rank is replayed (ranks sharing cores do not fold): at most {MAX_CONTENDED_WORKERS:,} "
                           f"workers, got {max(args.workers):,}", "--workers")
    if args.ranks_per_host and not args.cores:  # alone it changed nothing: ranks share a host's cores only under --cores
        raise DagprofError("is read only with --cores (the cores per host its ranks share): give both", "--ranks-per-host")
    if args.link_from and not args.link_to:  # alone it changed nothing and the table looked like an answer about the measured link
        raise DagprofError("is read only with --link-to (the target link's calibrate file): give both", "--link-from")
    with outputs(args.out, args.run, write=not args.no_trace) as staged:
        result = _evaluate(args, staged.path if staged else None)
    return staged.final_path(result) if staged else result


def _evaluate(args, folder: str | None) -> dict:
    prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker, allow_missing_ranks=args.allow_missing_ranks)
    refuse_lone_rank(prof.run, "a what-if (collectives re-priced across the ranks)")
    for degree, dim, flag in ((args.tp_degree, Dim.TP, "--tp-degree"), (args.pp_degree, Dim.PP, "--pp-degree")):
        if degree is not None:
            refuse_degree(prof.graph, dim, degree, flag)
    if args.prefetch is not None:
        refuse_prefetch(prof.graph)
    # DDP -> FSDP takes --reshard-after-forward (passes.data_parallel.to_data_parallel) where every row asks for FSDP
    converted = {"reshard_after_forward"} if args.data_parallel and "ddp" not in args.data_parallel else set()
    fsdp_only = [f for f, given in (("--prefetch", args.prefetch),
                                    *((a.flag, getattr(args, a.name)) for a in AXES if a.name in _FSDP_AXES and a.name not in converted))
                 if given is not None]
    if fsdp_only and not is_fsdp_graph(prof.graph):  # before the model's check, which would refuse it naming neither flag nor run
        raise DagprofError("is an FSDP what-if; this profile is not an FSDP job", fsdp_only[0])
    g0 = average_steps(prof.graph, replay) if args.template else prof.graph  # the averaged iteration; the intervals keep each step
    # compute slowed beside collectives, where the user gives a calibrate --overlap file: one measurement on one link, and the
    # weighting by bytes per second that carries it to another rate is not validated (the demo's own overlap.json stays the optimizer's)
    # (or --link-from's, the profiled link's, beside --link-to rows each priced by its own link's file: ``scenario.beside``)
    slowdown, rate = slowdown_of(None, args.link_model or args.link_from) if args.link_model or args.link_from else (0.0, None)
    cluster = Cluster(link=args.link, topology=args.topology, link_model=args.link_model, link_from=args.link_from,
                      profiled_bandwidth=args.profiled_bandwidth, first_bucket_mb=args.first_bucket_mb,
                      overlap=not args.no_overlap, cores=args.cores, ranks_per_host=args.ranks_per_host, fine=args.fine,
                      optimizer_state=args.optimizer_state, slowdown=slowdown, comm_rate=rate, half_duplex=args.half_duplex)
    measured = prof.analysis.measured_us

    def timeline(i: int, g, res) -> str | None:
        if folder is None or i >= MAX_TRACES:
            return None
        return write_replay_trace(os.path.join(folder, f"whatif{i}.trace.json"), g, res)

    out = evaluate(g0, sweep({a.name: getattr(args, a.name) for a in AXES}), cluster, measured, timeline, steps_graph=prof.graph if args.template else None,
                   tolerance_pct=None if args.allow_model_error else MODEL_TOLERANCE_PCT, raw=args.raw)
    out["scenarios"] = [row.to_json() for row in out["scenarios"]]
    if all(getattr(args, a.name) is None for a in AXES) and not (args.topology or args.link_model or args.cores or args.fine or args.no_overlap):
        out["notes"] = ["no what-if asked: the one row is the profiled setup as the model replays it "
                        "(give --bandwidth, --workers, --bucket-mb, ... for other setups; --help lists them)", *out["notes"]]
    return {"run": os.fspath(args.run), "measured_iter_ms": None if measured is None else measured / 1e3} | out | {
        "partial": prof.run.meta.partial, "warnings": prof.warnings, "warnings_per_rank": prof.rank_warnings}


_SHORT = {  # table heading of each column; ``COLUMNS`` (also in --json) defines them. One point per row: the interval's
    # (the median step, issue 20); the mean step and its rate stay in --json (predicted_iter_ms, iters_per_s)
    "speedup_vs_profiled": "x profiled", "speedup_vs_one_worker": "x 1 worker", "scaling_efficiency": "scaling eff",
    "vs_measured_pct": "vs measured",
}
_WORDS = {  # the legend of each heading in words (``COLUMNS`` names the --json keys)
    "x profiled": "throughput (workers / step time, mean steps) over the profiled run's, both replayed; above 1: more samples/s than now",
    "x 1 worker": "throughput over ONE worker's under the same conditions: workers x scaling eff",
    "scaling eff": "weak scaling: one worker's step time over this one's, same conditions; 1.0 = linear, lower: the cost of scale",
    "vs measured": "the predicted mean step against the profiled run's measured one (less the profiler's cost unless --raw), % (+ = slower)",
}


def to_text(r: dict) -> str:
    m = "n/a" if r["measured_iter_ms"] is None else f"{r['measured_iter_ms']:.2f} ms"
    corrected = r["profiler_cost"]["corrected"] and r["reference_iter_ms"] is not None
    against = f" against {r['reference_iter_ms']:.2f} ms without the profiler" if corrected else ""
    lines = warning_lines(r) + [f"profiled: {r['workers']} ranks, measured {m}/iter (mean step); model of it {r['model_iter_ms']:.2f} ms "
                                f"({r['model_error_pct']:+.1f} %{against}; {r['link']})", r["profiler_cost"]["text"]]
    fit = r["link_fit"]
    if fit and fit["weak"]:
        known = "" if fit["profiled_wire"] is not None else "; if you know the wire it ran on, --profiled-bandwidth RATE says it"
        lines.append(f"caution: the link fit cannot split latency from bandwidth ({fit['weak']}); rows marked * extrapolate it{known}")
    keys = [a.name for a in AXES if any(row[a.name] is not None for row in r["scenarios"])]
    width = {k: max(12, len(k) + 2, *(len(str(row[k])) + 2 for row in r["scenarios"])) for k in keys}  # a long value (a unit grouping) stays apart
    lines.append("".join(f"{k.replace('_', ' '):>{width[k]}}" for k in keys) + "".join(f"{h:>12}" for h in _SHORT.values()))
    for row in r["scenarios"]:
        cells = "".join(f"{'-' if row[k] is None else row[k]!s:>{width[k]}}" for k in keys)
        vs = "n/a" if row["vs_measured_pct"] is None else f"{row['vs_measured_pct']:+.1f} %"
        one, eff = ("n/a", "n/a") if row["scaling_efficiency"] is None else (f"{row['speedup_vs_one_worker']:.1f}", f"{row['scaling_efficiency']:.2f}")
        lines.append(f"{cells}{row['speedup_vs_profiled']:>12.2f}{one:>12}{eff:>12}{vs:>12}  median step {row['interval']}"
                     + (" *" if "caveat" in row else "") + (" ~" if "stall_outweighs" in row else "")
                     + (f"  peak {row['peak_memory_mb']:.2f} MiB/rank" if "peak_memory_mb" in row else ""))
        if "note" in row:  # what the row changes beyond its cells
            lines.append(f"    note: {row['note']}")
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines += ["where:"] + [f"  {h:<12} {_WORDS[h]}" for h in _SHORT.values()]
    lines += [f"  {'median step':<12} the replayed steps' median step, and the range a run's median step falls in, how often in brackets "
              "(90 %: nine runs in ten)", f"  {'':<12} single steps spread wider; load that moves after the profile is not in it "
              "(docs/usage.md, intervals; --json has the mean step too)"]
    traces = [row["trace"] for row in r["scenarios"] if "trace" in row]
    if traces:
        lines.append(f"predicted timelines: {shown(traces[0])}" + (f" .. {os.path.basename(traces[-1])}" if len(traces) > 1 else ""))
    lines.append(f"({r['seconds']:.2f} s)")
    return wrap_lines(lines)
