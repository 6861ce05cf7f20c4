"""``dagprof sgd``: predict data-parallel scaling from a layer-wise profile with the S-SGD DAG model."""
from __future__ import annotations

import os

from ..analysis.critical_path import critical_path
from ..errors import DagprofError
from ..fsutil import atomic_open
from ..replay import replay
from ..report.svg import speedup_chart
from ..report.timeline import write_replay_trace
from ..sgd import Policy, ScalingRow, anchor_single_worker, build_sgd_graph, comm_model, make_schedule, measured_iteration_note, predict
from ..traces.layerwise import read_layer_file
from ..units import MB, count
from .common import MAX_WORKERS, add_out_argument, comma_list, finite_positive, outputs, worker_count

MAX_JITTER = 10_000  # replays per policy and worker count: more only costs time

HELP = "predict iteration time, exposed communication and speed-up over worker counts from per-layer times (S-SGD DAG model)"


def add_arguments(p) -> None:
    p.add_argument("layers", help="layer CSV (layer,forward_us,backward_us,grad_bytes[,allreduce_us]), a B-Caffe log, or a dagprof run folder")
    p.add_argument("--workers", type=comma_list(worker_count), default=[1, 2, 4, 8, 16],
                   help=f"worker counts (default 1,2,4,8,16; at most {MAX_WORKERS:,})")
    p.add_argument("--net", help="interconnect for all-reduce costs: a preset (10gbe, 25gbe, 100gbe, ib56, ib-edr, ib-hdr, pcie3, pcie4, "
                                 "nvlink) or a bandwidth (10Gbit, 25GB/s)")
    p.add_argument("--osu", action="append", default=[], metavar="FILE",
                   help="OSU all-reduce latency table (allreduceN.log); fitted per worker count; repeatable")
    p.add_argument("--link-model", action="append", default=[], metavar="FILE",
                   help="`dagprof calibrate` link model: its all-reduce fit at the worker count(s) it was measured with "
                        "(any count when it names none); repeatable")
    p.add_argument("--comm-log", action="append", default=[], metavar="FILE",
                   help="measured per-layer all-reduce times (B-Caffe log or CSV with workers=N); repeatable")
    p.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.WFBP.value,
                   help="policy of the main table, all being computed (default wfbp: each layer's all-reduce as its backward ends)")
    p.add_argument("--iter-time-1", type=finite_positive, metavar="SECONDS",
                   help="measured single-worker iteration time; fills what the layer file lacks (forward for B-Caffe logs)")
    p.add_argument("--jitter", type=int, default=0, metavar="SAMPLES",
                   help="run folders: replay SAMPLES times with each worker running a profiled step drawn at random, so every "
                        "all-reduce waits for the slowest worker (the closed forms use the median step); 0: off")
    p.add_argument("--no-contention", action="store_true",
                   help="ignore a --link-model file's overlap measurement (calibrate --overlap): by default compute and all-reduces "
                        "overlapping each other on the measured worker count are slowed as measured")
    p.add_argument("--replay", action="store_true", help="also replay the DAG of every case and report its largest disagreement with the closed forms")
    p.add_argument("--svg", nargs="?", const="speedup.svg", metavar="FILE", help="write a speed-up chart (SVG) of every policy (default name speedup.svg)")
    p.add_argument("--trace", nargs="?", const="sgd.trace.json", metavar="FILE",
                   help="write the replayed DAG (policy, largest worker count, 3 iterations) as a Perfetto/Chrome trace, critical path marked")
    add_out_argument(p, "--svg and --trace files given without a folder")


def _row(r: ScalingRow) -> dict:
    return {"workers": r.workers, "iter_time_s": r.iter_us / 1e6, "comm_exposed_s": r.comm_exposed_us / 1e6, "comm_total_s": r.comm_us / 1e6,
            "speedup": r.speedup, "efficiency": r.efficiency, "comm_source": r.comm_source}


def run(args) -> dict:
    with outputs(args.out, args.layers, write=bool(args.trace or args.svg)) as staged:
        result = _predict(args, staged.path if staged else None)
    return staged.final_path(result) if staged else result


def _predict(args, folder: str | None) -> dict:
    profile = read_layer_file(args.layers)
    notes = list(profile.meta.warnings)
    profile, iter_1 = anchor_single_worker(profile, None if args.iter_time_1 is None else args.iter_time_1 * 1e6, notes)
    comm = comm_model(profile, args.net, args.osu, args.comm_log, notes, args.link_model)
    for n in sorted({w for w in args.workers if w > 1} - set(comm.measured)):
        try:
            comm.link(n)
        except DagprofError as err:  # said of the input, which measured none there (a replicate() or FSDP run's layers)
            raise DagprofError(f"{err} (it measured no all-reduce at {n} workers)", profile.source) from None
    if not 0 <= args.jitter <= MAX_JITTER:
        raise DagprofError(f"--jitter takes a sample count from 0 to {MAX_JITTER:,}, got {args.jitter}")
    if args.jitter and profile.step_backward_us is None:
        raise DagprofError("--jitter needs per-step layer times: give a dagprof run folder", profile.source)
    scaling = predict(profile, args.workers, comm, Policy(args.policy), check_replay=args.replay, jitter_samples=args.jitter,
                      contention=not args.no_contention)
    notes += filter(None, [measured_iteration_note(profile, scaling.rows, iter_1)])
    contention = {n: comm.contention_at(n) for n in scaling.workers if comm.contention_at(n) is not None}
    if contention and not args.no_contention:
        notes += [f"on {n} workers: {c.describe()}; the DAG replayed until both agree (no closed form)" for n, c in contention.items()]
    if args.jitter:
        notes.append(f"on more than one worker: the mean of {args.jitter} replays, each worker running profiled steps drawn at random "
                     f"({profile.step_backward_us.shape[0]} steps)")
    shadowed = [n for n in scaling.workers if n > 1 and (n in comm.measured or n in comm.links)]
    if args.net and shadowed:  # --net 100Mbit answered the log's measured 10GbE times at 4 workers with no word
        notes.append(f"--net {args.net} unused on {count(len(shadowed), 'worker count')} ({', '.join(map(str, shadowed))}): the "
                     "all-reduce times measured there (or a link fitted there) price them, being more specific; the other counts take --net")
    policies = {p.value: [_row(r) for r in rows] for p, rows in scaling.table.items()}
    priced = {r["comm_source"] for r in policies[scaling.policy.value] if r["workers"] > 1}
    if len(priced) > 1:  # a measured log at 8 workers beside a preset at 16 made 16 workers look faster than 8
        notes.append(f"the rows' all-reduces are priced from {len(priced)} different sources (the all-reduce cost column): "
                     "compare worker counts priced alike")
    result = {
        "source": profile.source,
        "layers": profile.num_layers,
        "grad_bytes": profile.params_bytes,
        "policy": scaling.policy.value,
        "rows": policies[scaling.policy.value],
        "policies": policies,
        "gain_over_sequential": {p.value: scaling.gain_over_sequential(p) for p in Policy if p != Policy.SEQUENTIAL},
        "mg_wfbp_groups": {str(n): g for n, g in scaling.groups.items()},
        "iter_time_1_s": None if iter_1 is None else iter_1 / 1e6,
        "replay_max_rel_diff": scaling.max_replay_rel_diff,
        "jitter_samples": args.jitter,
        "contention": {} if args.no_contention else {str(n): {"compute_slowdown": c.compute, "comm_slowdown": c.comm, "source": c.source}
                                                     for n, c in contention.items()},
        "notes": notes,
    }
    if args.trace:
        n, iterations = max(scaling.workers), 3
        g = build_sgd_graph(profile, make_schedule(profile, scaling.policy, n, comm), iterations)
        res = replay(g)
        path = critical_path(g, res)
        result["trace"] = write_replay_trace(os.path.join(folder, args.trace), g, res, path.nodes)
        result["critical_path"] = {"workers": n, **path.to_dict(per=iterations)}
    if args.svg:
        result["svg"] = os.path.join(folder, args.svg)
        with atomic_open(result["svg"]) as f:
            f.write(speedup_chart(scaling.workers, policies, title=f"S-SGD DAG model: {os.path.basename(profile.source)}"))
    return result


def to_text(r: dict) -> str:
    lines = [f"{os.path.basename(r['source'])}: {r['layers']} layers, {r['grad_bytes'] / MB:.1f} MB of gradients; policy {r['policy']}"]
    lines.append(f"{'workers':>7} {'iter (s)':>9} {'exposed comm (s)':>16} {'speed-up':>9} {'efficiency':>10}  all-reduce cost")
    for row in r["rows"]:
        lines.append(f"{row['workers']:>7} {row['iter_time_s']:>9.4f} {row['comm_exposed_s']:>16.4f} {row['speedup']:>9.2f} "
                     f"{100 * row['efficiency']:>9.1f}%  {row['comm_source']}")
    workers = [row["workers"] for row in r["policies"]["sequential"]]
    lines.append("")
    lines.append("iteration time (s) per policy, and gain over no overlap:")
    lines.append(f"{'policy':>11} " + " ".join(f"{f'N={n}':>15}" for n in workers))
    for p, rows in r["policies"].items():
        gain = r["gain_over_sequential"].get(p)
        cells = [f"{row['iter_time_s']:.4f}" + (f" x{g:.2f}" if gain else "") for row, g in zip(rows, gain or [None] * len(rows))]
        lines.append(f"{p:>11} " + " ".join(f"{c:>15}" for c in cells))
    lines.append("mg-wfbp groups: " + ", ".join(f"N={n}: {g}" for n, g in r["mg_wfbp_groups"].items()))
    if r["replay_max_rel_diff"] is not None:
        lines.append(f"DAG replay vs closed forms: largest relative difference {r['replay_max_rel_diff']:.2e}")
    lines += [f"note: {n}" for n in r["notes"]]
    if r.get("critical_path"):
        cp = r["critical_path"]
        parts = ", ".join(f"{k} {v:.1f} ms" for k, v in cp["by_category_ms"].items())
        lines.append(f"critical path at {cp['workers']} workers, per iteration: {parts}")
    if r.get("trace"):
        lines.append(f"replay trace: {r['trace']}")
    if r.get("svg"):
        lines.append(f"speed-up chart: {r['svg']}")
    return "\n".join(lines)
