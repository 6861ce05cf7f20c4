"""``dagprof whatif RUN --bandwidth 10Gbit --workers 16 --bucket-mb 5 --scheme ps:4``.

Every flag takes a comma-separated list; the scenarios are all combinations, one table row
each, evaluated by ``search.whatif`` (which documents the pass order and the columns).
"""
from __future__ import annotations

import itertools
import os

from ..costmodel.alphabeta import parse_bandwidth
from ..costmodel.topology import CollectiveSpec
from ..errors import DagprofError
from ..passes.average_steps import average_steps
from ..passes.fsdp import refuse_unmodelled
from ..passes.workers import refuse_degree
from ..pipeline import open_run
from ..report.timeline import write_replay_trace
from ..search.whatif import MODEL_TOLERANCE_PCT, Cluster, Scenario, evaluate
from ..traces.parallelism import Dim
from .common import (
    MAX_CONTENDED_WORKERS,
    MAX_WORKERS,
    add_out_argument,
    add_run_arguments,
    comma_list,
    finite_non_negative,
    finite_positive,
    outputs,
    positive_int,
    positive_number,
    warning_lines,
    worker_count,
)

HELP = "predict iteration time under other bandwidth, latency, workers, buckets, schemes, compute speed"
MAX_TRACES = 8  # scenarios whose predicted timeline is written


def _bandwidth(text: str) -> tuple[float, str]:
    return parse_bandwidth(text), text


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("--bandwidth", type=comma_list(_bandwidth), help="link bandwidth(s), e.g. 10Gbit,200Mbit,25GB/s")
    p.add_argument("--latency", type=comma_list(finite_non_negative), help="link latency in us (per message), e.g. 5,50")
    p.add_argument("--link", choices=["inter", "intra", "all"], default="inter", help="which links --bandwidth/--latency change (default inter-host)")
    p.add_argument("--workers", type=comma_list(worker_count),
                   help=f"number of ranks, e.g. 4,16,4096 (weak scaling: same per-rank batch); at most {MAX_WORKERS:,}, "
                        f"{MAX_CONTENDED_WORKERS:,} with --cores")
    p.add_argument("--tp-degree", type=positive_int, help="tensor-parallel degree: refused unless it is the profiled one (not modelled)")
    p.add_argument("--pp-degree", type=positive_int, help="pipeline-parallel degree: refused unless it is the profiled one (not modelled)")
    p.add_argument("--bucket-mb", type=comma_list(positive_number), help="DDP bucket cap(s) in MB (MiB, as DDP's bucket_cap_mb); 'inf' = one bucket per step")
    p.add_argument("--first-bucket-mb", type=positive_number, default=None,
                   help="cap of the first bucket only (DDP's default is 1 when bucket_cap_mb is unset)")
    p.add_argument("--no-overlap", action="store_true", help="start all-reduces only after the whole backward")
    p.add_argument("--scheme", type=comma_list(CollectiveSpec.parse), help="collective algorithm(s): ring, tree, hier, ps:K (K servers)")
    p.add_argument("--partition", type=comma_list(positive_int), help="cut each tensor into K pieces (BytePS partition)")
    p.add_argument("--compute-speed", type=comma_list(finite_positive), help="compute speed factor(s), 2 = twice as fast")
    p.add_argument("--fusion-mb", type=comma_list(finite_non_negative),
                   help="Horovod runs: HOROVOD_FUSION_THRESHOLD(s) in MiB, e.g. 0,4,64 (0 = no fusion)")
    p.add_argument("--cycle-ms", type=comma_list(finite_non_negative), help="Horovod runs: HOROVOD_CYCLE_TIME(s) in ms, e.g. 1,5,20")
    p.add_argument("--reshard-after-forward", type=comma_list(_on_off), help="FSDP jobs: reshard_after_forward of every unit, on or off (or both: on,off)")
    for flag, what in (("--prefetch", "FSDP all-gathers in flight"), ("--reduce-dtype", "FSDP reduce dtype"), ("--units", "FSDP unit granularity")):
        p.add_argument(flag, metavar="X", help=f"{what}: not modelled yet, refused in one line")
    p.add_argument("--topology", help="cluster: a JSON/TOML file, or presets like 10gbe or nvlink/100gbe:8")
    p.add_argument("--link-model", help="link model from `dagprof calibrate` (instead of fitting the run's collectives)")
    p.add_argument("--cores", type=positive_int, default=None, help="cores per host shared by its ranks (default: ranks do not contend)")
    p.add_argument("--ranks-per-host", type=positive_int, default=None, help="with --cores: ranks per host (default all on one)")
    p.add_argument("--fine", action="store_true", help="per-message collectives on per-link queues (needs <= 64 ranks)")
    p.add_argument("--allow-model-error", action="store_true",
                   help=f"predict even when the model misses the profiled run by more than {MODEL_TOLERANCE_PCT:g} %% (refused otherwise)")
    p.add_argument("--raw", action="store_true",
                   help="predict from the op times as profiled (default: the profiler's own cost, measured on the run, removed first)")
    p.add_argument("--template", action="store_true", help="start from the averaged iteration (each op at its mean over the steps)")
    add_out_argument(p, "whatif<i>.trace.json")
    p.add_argument("--no-trace", action="store_true", help="do not write predicted timelines")


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"expected on or off, got {text!r}")
    return text == "on"


def _scenarios(args) -> list[Scenario]:
    axes = {
        "workers": args.workers or [None],
        "bandwidth": args.bandwidth or [(None, None)],
        "latency_us": args.latency or [None],
        "bucket_mb": args.bucket_mb or [None],
        "scheme": args.scheme or [None],
        "partition": args.partition or [None],
        "speed": args.compute_speed or [None],
        "fusion_mb": args.fusion_mb or [None],
        "cycle_ms": args.cycle_ms or [None],
        "reshard": args.reshard_after_forward or [None],
    }
    out = []
    for combo in itertools.product(*axes.values()):
        kw = dict(zip(axes, combo))
        bw, text = kw.pop("bandwidth")
        out.append(Scenario(bandwidth=bw, bandwidth_text=text, **kw))
    return out


def run(args) -> dict:
    if args.cores and max(args.workers or [0]) > MAX_CONTENDED_WORKERS:
        raise DagprofError(f"with --cores every rank is replayed (ranks sharing cores do not fold): at most {MAX_CONTENDED_WORKERS:,} "
                           f"workers, got {max(args.workers):,}", "--workers")
    with outputs(args.out, args.run, write=not args.no_trace) as staged:
        result = _evaluate(args, staged.path if staged else None)
    return staged.final_path(result) if staged else result


def _evaluate(args, folder: str | None) -> dict:
    prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker, allow_missing_ranks=args.allow_missing_ranks)
    for degree, dim in ((args.tp_degree, Dim.TP), (args.pp_degree, Dim.PP)):
        if degree is not None:
            refuse_degree(prof.graph, dim, degree)
    asked = [k for k in ("prefetch", "reduce_dtype", "units") if getattr(args, k) is not None]
    if asked:
        refuse_unmodelled(prof.graph, asked)
        raise DagprofError(f"--{asked[0].replace('_', '-')} is an FSDP what-if; this profile is not an FSDP job")
    g0 = average_steps(prof.graph) if args.template else prof.graph  # the averaged iteration; the intervals keep each step
    cluster = Cluster(link=args.link, topology=args.topology, link_model=args.link_model, first_bucket_mb=args.first_bucket_mb,
                      overlap=not args.no_overlap, cores=args.cores, ranks_per_host=args.ranks_per_host, fine=args.fine)
    measured = prof.analysis.measured_us

    def timeline(i: int, g, res) -> str | None:
        if folder is None or i >= MAX_TRACES:
            return None
        return write_replay_trace(os.path.join(folder, f"whatif{i}.trace.json"), g, res)

    out = evaluate(g0, _scenarios(args), cluster, measured, timeline, steps_graph=prof.graph if args.template else None,
                   tolerance_pct=None if args.allow_model_error else MODEL_TOLERANCE_PCT, raw=args.raw)
    return {"run": os.fspath(args.run), "measured_iter_ms": None if measured is None else measured / 1e3} | out | {
        "partial": prof.run.meta.partial, "warnings": prof.warnings}


_SHORT = {  # table heading of each column; ``COLUMNS`` (also in --json) defines them
    "predicted_iter_ms": "iter ms", "iters_per_s": "iter/s", "speedup_vs_profiled": "x profiled",
    "speedup_vs_one_worker": "x 1 worker", "scaling_efficiency": "scaling eff", "vs_measured_pct": "vs measured",
}


def to_text(r: dict) -> str:
    m = "n/a" if r["measured_iter_ms"] is None else f"{r['measured_iter_ms']:.2f} ms"
    corrected = r["profiler_cost"]["corrected"] and r["reference_iter_ms"] is not None
    against = f" against {r['reference_iter_ms']:.2f} ms without the profiler" if corrected else ""
    lines = warning_lines(r) + [f"profiled: {r['workers']} ranks, measured {m}/iter; model of it {r['model_iter_ms']:.2f} ms "
                                f"({r['model_error_pct']:+.1f} %{against}; {r['link']})", r["profiler_cost"]["text"]]
    fit = r["link_fit"]
    if fit and fit["weak"]:
        lines.append(f"caution: the link fit cannot split latency from bandwidth ({fit['weak']}); rows marked * extrapolate it")
    keys = [k for k in ("workers", "bandwidth", "latency_us", "bucket_mb", "scheme", "partition", "compute_speed", "fusion_mb", "cycle_ms",
                        "reshard_after_forward")
            if any(row[k] is not None for row in r["scenarios"])]
    width = {k: max(12, len(k) + 2) for k in keys}
    lines.append("".join(f"{k.replace('_', ' '):>{width[k]}}" for k in keys) + "".join(f"{h:>12}" for h in _SHORT.values()))
    for row in r["scenarios"]:
        cells = "".join(f"{'-' if row[k] is None else row[k]!s:>{width[k]}}" for k in keys)
        vs = "n/a" if row["vs_measured_pct"] is None else f"{row['vs_measured_pct']:+.1f} %"
        one, eff = ("n/a", "n/a") if row["scaling_efficiency"] is None else (f"{row['speedup_vs_one_worker']:.1f}", f"{row['scaling_efficiency']:.2f}")
        lines.append(f"{cells}{row['predicted_iter_ms']:>12.2f}{row['iters_per_s']:>12.2f}{row['speedup_vs_profiled']:>12.2f}"
                     f"{one:>12}{eff:>12}{vs:>12}  predicted {row['interval']}" + (" *" if "caveat" in row else "")
                     + (f"  peak {row['peak_memory_mb']:.2f} MiB/rank" if "peak_memory_mb" in row else ""))
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines += ["where:"] + [f"  {h:<12} {r['columns'][k]}" for k, h in _SHORT.items()]
    lines.append(f"  {'predicted':<12} the interval one step's time falls in at the level shown: the replayed steps' spread, "
                 "widened by the link fit's residuals where communication is modelled")
    traces = [row["trace"] for row in r["scenarios"] if "trace" in row]
    if traces:
        lines.append(f"predicted timelines: {os.path.relpath(traces[0])}" + (f" .. {os.path.basename(traces[-1])}" if len(traces) > 1 else ""))
    lines.append(f"({r['seconds']:.2f} s)")
    return "\n".join(lines)
