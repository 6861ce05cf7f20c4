from __future__ import annotations

import os

from ..demo import DemoSettings, run_demo, verdict
from .common import ms, pct

HELP = "profile a real 2-rank gloo DDP training on this CPU, replay, explain, optimise, and write a report"


def add_arguments(p) -> None:
    p.add_argument("-o", "--out", default="dagprof-demo", help="output folder (default: ./dagprof-demo)")
    p.add_argument("--ranks", type=int, default=2, help="DDP ranks to start (default 2)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb of the profiled run (default 25, DDP's own)")
    p.add_argument("--no-verify", action="store_true", help="do not re-run the job with the best bucket size")
    p.add_argument("--small", action="store_true", help="a tiny model: seconds instead of a minute (for tests)")


def run(args) -> dict:
    if args.ranks < 1:
        from ..errors import DagprofError

        raise DagprofError(f"--ranks must be at least 1, got {args.ranks}")
    return run_demo(DemoSettings(out_dir=args.out, world_size=args.ranks, bucket_cap_mb=args.bucket_mb, verify=not args.no_verify, small=args.small))


def to_text(r: dict) -> str:
    lines = ["", f"{'rank':>5} {'measured':>11} {'replayed':>11} {'compute':>9} {'comm':>8} {'overlap':>8} {'exposed':>8}  (ms per iteration)"]
    for b in r["per_rank"]:
        lines.append(f"{b['rank']:>5} {b['measured_iter_ms']:>11.2f} {b['predicted_iter_ms']:>11.2f} {b['compute_ms']:>9.2f} "
                     f"{b['comm_ms']:>8.2f} {b['overlap_ms']:>8.2f} {b['exposed_comm_ms']:>8.2f}")
    lines.append(f"iteration: measured {ms(r['measured_iter_ms'])}, replayed {ms(r['predicted_iter_ms'])}, error {pct(r['error_pct'])}")
    cp = r["critical_path_per_iter"]
    lines.append("critical path per iteration: " + ", ".join(f"{k} {v:.1f} ms" for k, v in cp["by_category_ms"].items()))
    lines += ["findings:"] + [f"  - {f['title']}: {f['detail']}" for f in r["findings"]]
    lines.append("what if (predicted from this one profile):")
    for w in r["whatifs"]:
        what = ", ".join(f"{k.replace('_', ' ')} {w[k]}" for k in ("workers", "bandwidth", "compute_speed") if w[k] is not None)
        lines.append(f"  {what:<40} {w['predicted_iter_ms']:9.1f} ms  {w['speedup_vs_profiled']:7.2f} x the profiled throughput, "
                     f"scaling efficiency {w['scaling_efficiency']:.2f}")
    o = r["optimisation"]
    best = o["best"]
    lines.append(f"optimisation: best bucket size by replay {best['bucket_cap_mb'] or 'as profiled'} MB, predicted {o['predicted_gain_pct']:.1f} % faster")
    if o["applied"]:
        ap = o["applied"]
        lines.append(f"  applied to the real job: {ap['measured_before_ms']:.1f} ms -> {ap['measured_after_ms']:.1f} ms "
                     f"({ap['measured_gain_pct']:+.1f} % measured): "
                     + verdict(ap))
    lines += [f"{k.replace('_', ' ')}: {os.path.relpath(v)}" for k, v in r["files"].items()]
    return "\n".join(lines)
