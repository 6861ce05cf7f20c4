from __future__ import annotations

import os
import shutil
import sys
import tempfile

from ..demo import DemoSettings, interval_notes, run_demo
from ..errors import DagprofError
from ..fsutil import Staged, staged_folder
from ..units import count
from .cmd_optimize import verification_lines
from .common import bandwidth, ms, pct, positive_int, seconds, shown
from .terminal import wrap_lines

HELP = ("profile a real gloo DDP training (as root: on an emulated 2-host cluster with a slow link), replay, explain, "
        "search a strategy, apply it and measure the gain; write a report")


def add_arguments(p) -> None:
    p.add_argument("-o", "--out", default="dagprof-demo", help="output folder (default: ./dagprof-demo)")
    p.add_argument("--ranks", type=positive_int, default=2, help="DDP ranks to start (default 2)")
    p.add_argument("--link", type=bandwidth, default="200Mbit", help="as root: the emulated link between the ranks (default 200Mbit)")
    p.add_argument("--loopback", action="store_true", help="no emulated cluster even as root: ranks on loopback")
    p.add_argument("--lossless", action="store_true",
                   help="search without gradient compression (by default the demo's synthetic job allows fp16, bf16, PowerSGD)")
    p.add_argument("--budget", type=seconds, default=10.0, metavar="SECONDS", help="search time budget (default 10, at most a week)")
    p.add_argument("--rounds", type=positive_int, default=3, help="interleaved verification rounds (default 3)")
    p.add_argument("--no-verify", action="store_true", help="do not apply the strategy to the real job")
    p.add_argument("--small", action="store_true", help="a tiny model: seconds instead of minutes (for tests)")


def run(args) -> dict:
    with staged_folder(args.out) as staged:
        try:
            result = run_demo(DemoSettings(out_dir=staged.path, world_size=args.ranks, link=None if args.loopback else args.link,
                                           verify=not args.no_verify, small=args.small, allow_lossy=not args.lossless,
                                           budget_s=args.budget, rounds=args.rounds),
                              say=lambda m: print(wrap_lines([m]), file=sys.stderr))  # its progress folded as its report
        except DagprofError as err:
            raise kept_for_a_look(err, staged) from None
    return staged.final_path(result)


def kept_for_a_look(err: DagprofError, staged: Staged) -> DagprofError:
    """``err`` with what the demo had written (its profile, its logs) moved to a new temporary folder, and the path
    the error names rewritten there. The staged folder goes with the failure, so its path would name nothing (a demo
    whose profile could not be read named a run folder already deleted); the output folder stays as it was."""
    try:
        kept = tempfile.mkdtemp(prefix="dagprof-demo-failed-")
        for name in os.listdir(staged.path):
            shutil.move(os.path.join(staged.path, name), os.path.join(kept, name))
    except OSError:
        return err
    path = err.path
    if path is not None and (path == staged.path or path.startswith(staged.path + os.sep)):
        path = kept + path[len(staged.path):]
    return DagprofError(f"{err.problem} (what the demo wrote is kept in {kept})", path)


def to_text(r: dict) -> str:
    lines = ["", f"cluster: {r['cluster']}"]
    lines += [f"note: {n}" for n in r["notes"]]
    lines.append(f"{'rank':>5} {'measured':>11} {'replayed':>11} {'compute':>9} {'comm':>8} {'overlap':>8} {'exposed':>8}  (ms per iteration)")
    for b in r["per_rank"]:
        lines.append(f"{b['rank']:>5} {b['measured_iter_ms']:>11.2f} {b['predicted_iter_ms']:>11.2f} {b['compute_ms']:>9.2f} "
                     f"{b['comm_ms']:>8.2f} {b['overlap_ms']:>8.2f} {b['exposed_comm_ms']:>8.2f}")
    lines.append(f"iteration: measured {ms(r['measured_iter_ms'])}, replayed {ms(r['predicted_iter_ms'])}, error {pct(r['error_pct'])}")
    cp = r["critical_path_per_iter"]
    lines.append("critical path per iteration: " + ", ".join(f"{k} {v:.1f} ms" for k, v in cp["by_category_ms"].items()))
    lines += ["findings:"] + [f"  - {f['title']}: {f['detail']}" for f in r["findings"]]
    lines.append("what if (predicted from this one profile):")
    labels = [", ".join(f"{k.replace('_', ' ')} {w[k]}" for k in ("workers", "bandwidth", "compute_speed") if w[k] is not None) for w in r["whatifs"]]
    width = max(map(len, labels), default=0)
    for what, w in zip(labels, r["whatifs"]):
        lines.append(f"  {what:<{width}}  {w['interval']:>26}  x profiled {w['speedup_vs_profiled']:7.2f}  "
                     f"efficiency {w['scaling_efficiency']:.2f}")
    o = r["optimisation"]
    lines.append("  (per step: the replayed steps' median, and the range a run's median step should fall in, 90 % of runs; "
                 "x profiled: throughput over the profiled run's; efficiency: over N x one worker's, 1.0 = linear; compute speed 2: 2x faster)")
    lines += _outlook_lines(r.get("scaling_outlook") or {})
    lines.append(f"optimisation ({count(o['candidates_replayed'], 'candidate')} replayed): {o['summary']}")
    lines += [f"  caveat: {c}" for c in o["caveats"]]
    if "interval" in o["best"]:
        best = "with the strategy" if o.get("strategy_file") else "with the best candidate (not written)"
        lines.append(f"  predicted {o['best']['interval']} per step {best}; profiled setup {o['baseline']['interval']}")
    lines += [f"  note: {n}" for n in [o["baseline_note"], *interval_notes(o["notes"])]]
    if o["applied"]:
        lines += ["  applied to the real job, " + ln.strip() if k == 0 else "  " + ln for k, ln in enumerate(verification_lines(o["applied"]))]
    lines += [f"{k.replace('_', ' ')}: {shown(v)}" for k, v in r["files"].items()]
    lines += _next_lines(r["files"])
    return wrap_lines(lines)


def _outlook_lines(o: dict) -> list[str]:
    """The S-SGD model's outlook in one line: each overlap policy's speed-up at the most workers (the report has the table)."""
    if not o.get("policies"):
        return []
    n = o["workers"][-1]
    at = ", ".join(f"{p} {rows[-1]['speedup']:.1f}x" for p, rows in o["policies"].items())
    return [f"scaling outlook (S-SGD model of this run's layers, {o['net']} ring), speed-up at {n} workers: {at}"]


def _next_lines(files: dict) -> list[str]:
    """What to open, and how to do the same on one's own training."""
    report = shown(files["report"]) if "report" in files else "the report"
    return [f"next: open {report} in a browser, and the .trace.json files in https://ui.perfetto.dev",
            "  on your own training: dagprof profile -o runs/exp1 -- torchrun --nproc-per-node 2 train.py, then dagprof report / optimize runs/exp1 (README)"]
