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
from ..pipeline import default_out, open_run
from ..report.timeline import write_replay_trace
from ..search.whatif import Cluster, Scenario, evaluate
from .common import add_run_arguments

HELP = "predict iteration time under other bandwidth, latency, workers, buckets, schemes, compute speed"
MAX_TRACES = 8  # scenarios whose predicted timeline is written


def _list(parse):
    def f(text: str) -> list:
        items = [x for x in text.split(",") if x.strip()]
        if not items:
            raise DagprofError(f"empty list {text!r}")
        return [parse(x.strip()) for x in items]

    return f


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise DagprofError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise DagprofError(f"expected a number >= 1, got {v}")
    return v


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise DagprofError(f"expected a number, got {text!r}") from None


def _non_negative(text: str) -> float:
    v = _number(text)
    if not v >= 0:
        raise DagprofError(f"expected a number >= 0, got {text!r}")
    return v


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("--bandwidth", type=str, help="link bandwidth(s), e.g. 10Gbit,200Mbit,25GB/s")
    p.add_argument("--latency", type=str, help="link latency in us (per message), e.g. 5,50")
    p.add_argument("--link", choices=["inter", "intra", "all"], default="inter", help="which links --bandwidth/--latency change (default inter-host)")
    p.add_argument("--workers", type=str, help="number of ranks, e.g. 4,16,4096 (weak scaling: same per-rank batch)")
    p.add_argument("--bucket-mb", type=str, help="DDP bucket cap(s) in MB; 'inf' = one bucket per step")
    p.add_argument("--first-bucket-mb", type=float, default=None, help="cap of the first bucket only (DDP's default is 1 when bucket_cap_mb is unset)")
    p.add_argument("--no-overlap", action="store_true", help="start all-reduces only after the whole backward")
    p.add_argument("--scheme", type=str, help="collective algorithm(s): ring, tree, hier, ps:K (K servers)")
    p.add_argument("--partition", type=str, help="cut each tensor into K pieces (BytePS partition)")
    p.add_argument("--compute-speed", type=str, help="compute speed factor(s), 2 = twice as fast")
    p.add_argument("--fusion-mb", type=str, help="Horovod runs: HOROVOD_FUSION_THRESHOLD(s) in MiB, e.g. 0,4,64 (0 = no fusion)")
    p.add_argument("--cycle-ms", type=str, help="Horovod runs: HOROVOD_CYCLE_TIME(s) in ms, e.g. 1,5,20")
    p.add_argument("--topology", help="cluster: a JSON/TOML file, or presets like 10gbe or nvlink/100gbe:8")
    p.add_argument("--link-model", help="link model from `dagprof calibrate` (instead of fitting the run's collectives)")
    p.add_argument("--cores", type=int, default=None, help="cores per host shared by its ranks (default: ranks do not contend)")
    p.add_argument("--ranks-per-host", type=int, default=None, help="with --cores: ranks per host (default all on one)")
    p.add_argument("--fine", action="store_true", help="per-message collectives on per-link queues (needs <= 64 ranks)")
    p.add_argument("--template", action="store_true", help="start from the averaged iteration (each op at its mean over the steps)")
    p.add_argument("-o", "--out", help="folder for whatif<i>.trace.json (default: the run folder)")
    p.add_argument("--no-trace", action="store_true", help="do not write predicted timelines")


def _scenarios(args) -> list[Scenario]:
    axes = {
        "workers": _list(_positive_int)(args.workers) if args.workers else [None],
        "bandwidth": _list(lambda x: (parse_bandwidth(x), x))(args.bandwidth) if args.bandwidth else [(None, None)],
        "latency_us": _list(_number)(args.latency) if args.latency else [None],
        "bucket_mb": _list(_number)(args.bucket_mb) if args.bucket_mb else [None],
        "scheme": _list(CollectiveSpec.parse)(args.scheme) if args.scheme else [None],
        "partition": _list(_positive_int)(args.partition) if args.partition else [None],
        "speed": _list(_number)(args.compute_speed) if args.compute_speed else [None],
        "fusion_mb": _list(_non_negative)(args.fusion_mb) if args.fusion_mb else [None],
        "cycle_ms": _list(_non_negative)(args.cycle_ms) if args.cycle_ms else [None],
    }
    out = []
    for combo in itertools.product(*axes.values()):
        kw = dict(zip(axes, combo))
        bw, text = kw.pop("bandwidth")
        out.append(Scenario(bandwidth=bw, bandwidth_text=text, **kw))
    return out


def run(args) -> dict:
    prof = open_run(args.run, steps=args.steps, template=args.template)
    cluster = Cluster(link=args.link, topology=args.topology, link_model=args.link_model, first_bucket_mb=args.first_bucket_mb,
                      overlap=not args.no_overlap, cores=args.cores, ranks_per_host=args.ranks_per_host, fine=args.fine)
    measured = prof.analysis.measured_us
    out_dir = args.out or default_out(args.run)

    def timeline(i: int, g, res) -> str | None:
        if args.no_trace or i >= MAX_TRACES:
            return None
        return write_replay_trace(os.path.join(out_dir, f"whatif{i}.trace.json"), g, res)

    out = evaluate(prof.graph, _scenarios(args), cluster, measured, timeline)
    return {"run": os.fspath(args.run), "measured_iter_ms": None if measured is None else measured / 1e3} | out


def to_text(r: dict) -> str:
    m = "n/a" if r["measured_iter_ms"] is None else f"{r['measured_iter_ms']:.2f} ms"
    lines = [f"profiled: {r['workers']} ranks, measured {m}/iter; model of it {r['model_iter_ms']:.2f} ms ({r['link']})"]
    keys = [k for k in ("workers", "bandwidth", "latency_us", "bucket_mb", "scheme", "partition", "compute_speed", "fusion_mb", "cycle_ms")
            if any(row[k] is not None for row in r["scenarios"])]
    head = "".join(f"{k:>12}" for k in keys) + f"{'iter ms':>12}{'iter/s':>10}{'speed-up':>10}{'efficiency':>11}{'vs measured':>12}"
    lines.append(head)
    for row in r["scenarios"]:
        cells = "".join(f"{'-' if row[k] is None else row[k]!s:>12}" for k in keys)
        vs = "n/a" if row["vs_measured_pct"] is None else f"{row['vs_measured_pct']:+.1f} %"
        lines.append(f"{cells}{row['predicted_iter_ms']:>12.2f}{row['iters_per_s']:>10.2f}{row['speedup']:>10.2f}{row['scaling_efficiency']:>11.2f}{vs:>12}")
    traces = [row["trace"] for row in r["scenarios"] if "trace" in row]
    if traces:
        lines.append(f"predicted timelines: {os.path.relpath(traces[0])}" + (f" .. {os.path.basename(traces[-1])}" if len(traces) > 1 else ""))
    lines.append(f"({r['seconds']:.2f} s)")
    return "\n".join(lines)
