"""``dagprof whatif RUN --bandwidth 10Gbit --workers 16 --bucket-mb 5 --scheme ps:4``.

Every flag takes a comma-separated list; the scenarios are all combinations, one table row
each. Passes are applied in a fixed order (workers, cluster, scheme, link, buckets,
partition, compute, cores, fine-grained collectives) to the run's graph, and each scenario
is replayed. Speed-up is throughput (ranks / iteration time) against the model of the
profiled run (so the model's own error cancels out of the ratio); scaling efficiency is that
model's iteration time / the predicted one (weak scaling, 1.0 = perfect); ``vs measured`` is
the predicted iteration time against the measured one.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, replace

from ..analysis import iteration_times
from ..costmodel.alphabeta import parse_bandwidth
from ..costmodel.topology import CollectiveSpec, Topology, load_link_model, parse_topology
from ..errors import DagprofError
from ..graph.dag import Graph
from ..passes import expand_collectives, partition_tensors, scale_compute, scale_workers, set_buckets, set_link, set_scheme, set_topology
from ..passes.comm import current_topology, graph_world_size
from ..passes.compute import share_cores
from ..pipeline import default_out, open_run
from ..replay import replay
from ..report.timeline import write_replay_trace
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
    p.add_argument("--topology", help="cluster: a JSON/TOML file, or presets like 10gbe or nvlink/100gbe:8")
    p.add_argument("--link-model", help="link model from `dagprof calibrate` (instead of fitting the run's collectives)")
    p.add_argument("--cores", type=int, default=None, help="cores per host shared by its ranks (default: ranks do not contend)")
    p.add_argument("--ranks-per-host", type=int, default=None, help="with --cores: ranks per host (default all on one)")
    p.add_argument("--fine", action="store_true", help="per-message collectives on per-link queues (needs <= 64 ranks)")
    p.add_argument("--template", action="store_true", help="start from the averaged iteration (each op at its mean over the steps)")
    p.add_argument("-o", "--out", help="folder for whatif<i>.trace.json (default: the run folder)")
    p.add_argument("--no-trace", action="store_true", help="do not write predicted timelines")


@dataclass
class Scenario:
    workers: int | None = None
    bandwidth: float | None = None
    latency_us: float | None = None
    bucket_mb: float | None = None
    scheme: CollectiveSpec | None = None
    partition: int | None = None
    speed: float | None = None

    def label(self, bw_text: str | None) -> dict:
        return {
            "workers": self.workers, "bandwidth": bw_text, "latency_us": self.latency_us, "bucket_mb": self.bucket_mb,
            "scheme": None if self.scheme is None else str(self.scheme), "partition": self.partition, "compute_speed": self.speed,
        }


def _scenarios(args) -> list[tuple[Scenario, str | None]]:
    axes = {
        "workers": _list(_positive_int)(args.workers) if args.workers else [None],
        "bandwidth": _list(lambda x: (parse_bandwidth(x), x))(args.bandwidth) if args.bandwidth else [(None, None)],
        "latency_us": _list(_number)(args.latency) if args.latency else [None],
        "bucket_mb": _list(_number)(args.bucket_mb) if args.bucket_mb else [None],
        "scheme": _list(CollectiveSpec.parse)(args.scheme) if args.scheme else [None],
        "partition": _list(_positive_int)(args.partition) if args.partition else [None],
        "speed": _list(_number)(args.compute_speed) if args.compute_speed else [None],
    }
    out = []
    for combo in itertools.product(*axes.values()):
        kw = dict(zip(axes, combo))
        bw, text = kw.pop("bandwidth")
        out.append((Scenario(bandwidth=bw, **kw), text))
    return out


def apply(g: Graph, s: Scenario, args, base_topo: Topology) -> Graph:
    """The run's graph under scenario ``s`` (the CLI's fixed pass order)."""
    g = set_topology(g, base_topo)
    if s.workers is not None:
        if args.fine and s.workers > 64:
            raise DagprofError(f"--fine needs <= 64 ranks, got --workers {s.workers}")
        g = scale_workers(g, s.workers, replicate=True if (args.fine or args.cores) else None)
        n = s.workers
        if args.topology:
            g = set_topology(g, replace(parse_topology(args.topology, n), overhead_us=base_topo.overhead_us))
        elif args.link_model:  # a file fitted per worker count (nccl-tests) has a better link for n
            t, link = current_topology(g), load_link_model(args.link_model, n)
            g = set_topology(g, Topology(t.hosts, t.devices_per_host, link, link, t.overhead_us))
    if s.scheme is not None:
        g = set_scheme(g, s.scheme)
    if s.bandwidth is not None or s.latency_us is not None:
        g = set_link(g, s.bandwidth, s.latency_us, args.link)
    if s.bucket_mb is not None or args.no_overlap:
        cap = None if s.bucket_mb is None else (1e18 if s.bucket_mb == float("inf") else s.bucket_mb * 2**20)
        first = None if args.first_bucket_mb is None else args.first_bucket_mb * 2**20
        g = set_buckets(g, cap, overlap=not args.no_overlap, first_bucket_bytes=first)
    if s.partition is not None:
        g = partition_tensors(g, s.partition)
    if s.speed is not None:
        g = scale_compute(g, s.speed)
    if args.cores:
        g = share_cores(g, args.cores, args.ranks_per_host)
    if args.fine:
        g = expand_collectives(g)
    return g


def base_topology(g: Graph, args) -> Topology:
    """The cluster the run ran on: --topology, else --link-model, else fitted to its collectives."""
    n0 = graph_world_size(g)
    t = current_topology(g)
    if args.topology:  # the profile's per-collective software overhead stays
        return replace(parse_topology(args.topology, n0), overhead_us=t.overhead_us)
    if args.link_model:
        link = load_link_model(args.link_model, n0)
        return Topology(t.hosts, t.devices_per_host, link, link, t.overhead_us)
    return t


def run(args) -> dict:
    t0 = time.perf_counter()
    prof = open_run(args.run, steps=args.steps, template=args.template)
    g0 = prof.graph
    n0 = graph_world_size(g0)
    base_topo = base_topology(g0, args)
    measured = prof.analysis.measured_us
    model = _predict(set_topology(g0, base_topo))
    out_dir = args.out or default_out(args.run)
    rows = []
    scenarios = _scenarios(args)
    for i, (s, bw_text) in enumerate(scenarios):
        t1 = time.perf_counter()
        g = apply(g0, s, args, base_topo)
        res = replay(g)
        it = max(iteration_times(g, res).values())
        n = graph_world_size(g)
        row = {**s.label(bw_text), "workers": n, "predicted_iter_ms": it / 1e3, "iters_per_s": 1e6 / it,
               "speedup": (n / n0) * model / it, "scaling_efficiency": model / it,
               "vs_measured_pct": None if not measured else 100.0 * (it - measured) / measured, "seconds": time.perf_counter() - t1}
        if not args.no_trace and i < MAX_TRACES:
            row["trace"] = write_replay_trace(os.path.join(out_dir, f"whatif{i}.trace.json"), g, res)
        rows.append(row)
    return {
        "run": os.fspath(args.run), "workers": n0, "measured_iter_ms": None if measured is None else measured / 1e3,
        "model_iter_ms": model / 1e3, "link": _link_text(base_topo), "scenarios": rows, "seconds": time.perf_counter() - t0,
    }


def _predict(g: Graph) -> float:
    return max(iteration_times(g, replay(g)).values())


def _link_text(t: Topology) -> str:
    ab = t.inter
    return (f"{t.hosts} host(s) x {t.devices_per_host}, link {ab.bandwidth_bytes_per_s * 8 / 1e9:.3g} Gbit/s, latency {ab.alpha_us:.3g} us, "
            f"{t.overhead_us:.3g} us per collective")


def to_text(r: dict) -> str:
    m = "n/a" if r["measured_iter_ms"] is None else f"{r['measured_iter_ms']:.2f} ms"
    lines = [f"profiled: {r['workers']} ranks, measured {m}/iter; model of it {r['model_iter_ms']:.2f} ms ({r['link']})"]
    keys = [k for k in ("workers", "bandwidth", "latency_us", "bucket_mb", "scheme", "partition", "compute_speed")
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
