"""``dagprof sgd``: predict data-parallel scaling from a layer-wise profile with the S-SGD DAG model."""
from __future__ import annotations

import argparse
import os

from ..analysis.critical_path import critical_path
from ..costmodel import AlphaBeta, parse_bandwidth, preset
from ..costmodel.osu import read_osu_allreduce
from ..errors import DagprofError
from ..fsutil import atomic_open
from ..replay import replay
from ..report.svg import speedup_chart
from ..report.timeline import write_replay_trace
from ..sgd import CommModel, Policy, anchor, build_sgd_graph, make_schedule, predict
from ..traces.layerwise import LayerProfile, read_layer_file

HELP = "predict iteration time, exposed communication and speed-up over worker counts from per-layer times (S-SGD DAG model)"


def add_arguments(p) -> None:
    p.add_argument("layers", help="layer CSV (layer,forward_us,backward_us,grad_bytes[,allreduce_us]), a B-Caffe log, or a dagprof run folder")
    p.add_argument("--workers", type=_counts, default=[1, 2, 4, 8, 16], help="worker counts, e.g. 1,2,4,8,16")
    p.add_argument("--net", help="interconnect for all-reduce costs: a preset (10gbe, 25gbe, 100gbe, ib56, ib-edr, ib-hdr, pcie3, pcie4, nvlink) or a bandwidth (10Gbit, 25GB/s)")
    p.add_argument("--osu", action="append", default=[], metavar="FILE", help="OSU all-reduce latency table (allreduceN.log); fitted per worker count; repeatable")
    p.add_argument("--comm-log", action="append", default=[], metavar="FILE", help="measured per-layer all-reduce times (B-Caffe log or CSV with workers=N); repeatable")
    p.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.WFBP.value, help="policy of the main table (all are computed)")
    p.add_argument("--iter-time-1", type=float, metavar="SECONDS", help="measured single-worker iteration time; fills what the layer file lacks (forward for B-Caffe logs)")
    p.add_argument("--replay", action="store_true", help="also replay the DAG of every case and report its largest disagreement with the closed forms")
    p.add_argument("--svg", metavar="PATH", help="write a speed-up chart (SVG) of every policy")
    p.add_argument("--trace", metavar="PATH", help="write the replayed DAG (policy, largest worker count, 3 iterations) as a Perfetto/Chrome trace, critical path marked")


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes integers like 1,2,4,8, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"--workers must be >= 1, got {text!r}")
    return counts


def _link(text: str) -> tuple[AlphaBeta, str]:
    try:
        return preset(text), text
    except DagprofError as unknown:
        try:
            return AlphaBeta.from_bandwidth(parse_bandwidth(text)), f"{text} (no latency)"
        except DagprofError:
            raise DagprofError(f"--net {text!r}: {unknown}; or give a bandwidth like 10Gbit, 25GB/s") from None


def comm_model(profile: LayerProfile, net: str | None, osu: list[str], comm_logs: list[str], notes: list[str]) -> CommModel:
    comm = CommModel()
    if net:
        link, name = _link(net)
        comm = CommModel(default=link, default_name=name)
    for path in osu:
        table = read_osu_allreduce(path)
        # fit over the sizes the model will price: small messages use another MPI protocol
        comm = comm.with_link(table.workers, table.fit(min_bytes=int(profile.grad_bytes[profile.grad_bytes > 0].min(initial=0))), table.describe())
    sources = [profile] + [read_layer_file(p) for p in comm_logs]
    for src in sources:
        if src.allreduce_us is None:
            if src is not profile:
                raise DagprofError("no allreduce_us column / communication times", src.source)
            continue
        if src.workers is None and src is profile:
            notes.append("the layer file's all-reduce times are unused: its worker count is unknown (name it tmpNcomm.log or add '# workers=N')")
            continue
        if src.workers is None:
            raise DagprofError("cannot tell the worker count of these all-reduce times (name it tmpNcomm.log or add '# workers=N')", src.source)
        if src.num_layers != profile.num_layers:
            raise DagprofError(f"{src.num_layers} layers, the profile has {profile.num_layers}", src.source)
        comm = comm.with_measured(src.workers, profile.grad_bytes, src.allreduce_us, os.path.basename(src.source))
    return comm


def run(args) -> dict:
    profile = read_layer_file(args.layers)
    notes = list(profile.meta.get("warnings", []))
    iter_1 = args.iter_time_1 * 1e6 if args.iter_time_1 is not None else (profile.iter_us if profile.workers == 1 else None)
    if iter_1 is not None:
        if iter_1 <= 0:
            raise DagprofError(f"--iter-time-1 must be positive, got {args.iter_time_1}")
        profile = anchor(profile, iter_1)
        notes.append(profile.meta["anchored"])
    elif profile.forward_us is None:
        notes.append("no forward times and no --iter-time-1: forward taken as 0, so communication looks relatively larger")
    comm = comm_model(profile, args.net, args.osu, args.comm_log, notes)
    scaling = predict(profile, args.workers, comm, Policy(args.policy), check_replay=args.replay)
    policies = {}
    for p, preds in scaling.by_policy.items():
        base = scaling.single[p].iter_us
        policies[p.value] = [
            {"workers": n, "iter_time_s": pr.iter_us / 1e6, "comm_exposed_s": pr.comm_exposed_us / 1e6, "speedup": n * base / pr.iter_us}
            for n, pr in zip(scaling.workers, preds)
        ]
    seq = scaling.by_policy[Policy.SEQUENTIAL]
    gains = {p.value: [s.iter_us / pr.iter_us for s, pr in zip(seq, preds)] for p, preds in scaling.by_policy.items() if p != Policy.SEQUENTIAL}
    result = {
        "source": profile.source,
        "layers": profile.num_layers,
        "grad_bytes": profile.params_bytes,
        "policy": scaling.policy.value,
        "rows": [
            {"workers": r.workers, "iter_time_s": r.iter_us / 1e6, "comm_exposed_s": r.comm_exposed_us / 1e6, "comm_total_s": r.comm_us / 1e6,
             "speedup": r.speedup, "efficiency": r.efficiency, "comm_source": r.comm_source}
            for r in scaling.rows
        ],
        "policies": policies,
        "gain_over_sequential": gains,
        "mg_wfbp_groups": {str(n): g for n, g in scaling.groups.items()},
        "iter_time_1_s": None if iter_1 is None else iter_1 / 1e6,
        "replay_max_rel_diff": scaling.max_replay_rel_diff,
        "notes": notes,
    }
    if args.trace:
        n, iterations = max(scaling.workers), 3
        g = build_sgd_graph(profile, make_schedule(profile, scaling.policy, n, comm), iterations)
        res = replay(g)
        path = critical_path(g, res)
        write_replay_trace(args.trace, g, res, path.nodes)
        result["trace"] = args.trace
        result["critical_path"] = {"workers": n, **path.to_dict(per=iterations)}
    if args.svg:
        with atomic_open(args.svg) as f:
            f.write(speedup_chart(scaling.workers, policies, title=f"S-SGD DAG model: {os.path.basename(profile.source)}"))
        result["svg"] = args.svg
    return result


def to_text(r: dict) -> str:
    lines = [f"{os.path.basename(r['source'])}: {r['layers']} layers, {r['grad_bytes'] / 1e6:.1f} MB of gradients; policy {r['policy']}"]
    lines.append(f"{'workers':>7} {'iter (s)':>9} {'exposed comm (s)':>16} {'speed-up':>9} {'efficiency':>10}  all-reduce cost")
    for row in r["rows"]:
        lines.append(f"{row['workers']:>7} {row['iter_time_s']:>9.4f} {row['comm_exposed_s']:>16.4f} {row['speedup']:>9.2f} {100 * row['efficiency']:>9.1f}%  {row['comm_source']}")
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
