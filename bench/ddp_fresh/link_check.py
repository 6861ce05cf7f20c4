"""``whatif --bandwidth 200Mbit`` of the fresh scripts, predicted from a 1 Gbit/s profile then measured at 200 Mbit/s
on the namespace testbed (run as root).

Per round and script (in a shuffled order): a dagprof profile at 1 Gbit/s (steps 5-9), and the script unprofiled at
200 Mbit/s (its step times: the median over steps after the first third of the slowest rank's optimizer step). Each
profile predicts 200 Mbit/s with ``dagprof whatif --bandwidth 200Mbit --profiled-bandwidth 1Gbit``. With ``--old-src``,
``fp16_hook`` is also profiled and predicted by that tree (its collector recorded the fp32 bucket bytes, not those on
the wire of the user's ``fp16_compress_hook``).

    sudo .venv/bin/python bench/ddp_fresh/link_check.py --rounds 2 --old-src /path/to/main/src
    sudo .venv/bin/python bench/ddp_fresh/link_check.py --scripts fp16_hook --rounds 2 --old-src OLD --args "--steps 20 --width 4096"
    sudo .venv/bin/python bench/ddp_fresh/link_check.py --wire-bytes fp16_hook   # bytes each rank sent per step, no prediction
    .venv/bin/python bench/ddp_fresh/link_check.py --repredict KEPT   # the rounds a --keep folder holds, predicted again (no root)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NEW_SRC = os.path.abspath(os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, NEW_SRC)

from dagprof.collect.hooks.steptimes import read_times  # noqa: E402
from dagprof.collect.jobs.launch import Bootstrap, launch  # noqa: E402
from dagprof.collect.jobs.netns import Cluster  # noqa: E402

SCRIPTS = ("accum_amp", "unused_branch", "gan", "fp16_hook", "fsdp2_ckpt")


def run_cell(cluster: Cluster, script: str, rate: float, src: str, boot: Bootstrap, log: str, extra: list[str]) -> None:
    os.environ["PYTHONPATH"] = src  # the job's dagprof (Bootstrap puts its sitecustomize first)
    cluster.set_rate(rate)
    launch([sys.executable, os.path.join(HERE, f"{script}.py"), *extra], boot, ranks=2, cluster=cluster, log_dir=log)


def step_ms(folder: str) -> float:
    """Median optimizer step of the slowest rank after the first third (not per micro-batch: a GAN's three DDP
    forwards a step are one iteration)."""
    per_rank = read_times(folder)
    n = min(len(t["step_s"]) for t in per_rank)
    return 1e3 * statistics.median(max(t["step_s"][i] for t in per_rank) for i in range(n // 3, n))


def wire_bytes(cluster: Cluster, script: str, root: str) -> None:
    """Bytes each rank's interface sent per step: the difference between a 24-step and a 4-step job (start-up cancels)."""
    def sent() -> list[int]:
        return [json.loads(subprocess.run(["ip", "netns", "exec", cluster.ns(r), "ip", "-s", "-j", "link", "show", cluster.ifname(r)],
                                          capture_output=True, text=True).stdout)[0]["stats64"]["tx"]["bytes"] for r in range(2)]
    cluster.set_rate(1e9)
    got = []
    for steps in (4, 24):
        before = sent()
        launch([sys.executable, os.path.join(HERE, f"{script}.py"), "--steps", str(steps)], None, ranks=2, cluster=cluster,
               log_dir=os.path.join(root, f"wire{steps}"))
        got.append([a - b for a, b in zip(sent(), before)])
    print(f"{script}: bytes sent per step by rank 0, 1: " + ", ".join(f"{(b - a) / 20 / 2**20:.3f} MiB" for a, b in zip(*got)))


def predict(src: str, run: str) -> tuple[float, float]:
    """(predicted ms at 200 Mbit/s, the model's error on the profiled run, %)"""
    done = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", run, "--bandwidth", "200Mbit", "--profiled-bandwidth",
                           "1Gbit", "--allow-model-error", "--no-trace", "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": src})
    if done.returncode:
        raise SystemExit(f"whatif failed on {run}: {done.stderr.strip()[-300:]}")
    out = json.loads(done.stdout)
    return out["scenarios"][0]["predicted_iter_ms"], out["model_error_pct"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--args", default="--steps 20", help="arguments of every script, e.g. '--steps 20 --width 4096' (fp16_hook)")
    p.add_argument("--old-src", help="another dagprof's src folder: fp16_hook is also profiled and predicted by it")
    p.add_argument("--keep", help="folder for the runs (default: a temporary one)")
    p.add_argument("--wire-bytes", metavar="SCRIPT", help="only measure the bytes SCRIPT's ranks send per step")
    p.add_argument("--repredict", metavar="KEPT", help="run nothing: predict the rounds a --keep folder holds again")
    args = p.parse_args()
    if args.repredict:
        show(repredict(args.repredict, args.scripts.split(",")), args.repredict)
        return
    root = args.keep or tempfile.mkdtemp(prefix="link_check_")
    if args.wire_bytes:
        with Cluster(2) as cluster:
            wire_bytes(cluster, args.wire_bytes, root)
        return
    scripts = args.scripts.split(",")
    rows = []
    with Cluster(2) as cluster:
        for k in range(args.rounds):
            cells = [(s, c) for s in scripts for c in ("profile", "measure")]
            cells += [("fp16_hook", "old")] if args.old_src and "fp16_hook" in scripts else []
            random.Random(k).shuffle(cells)
            for script, cell in cells:
                out = os.path.join(root, f"r{k}-{script}-{cell}")
                if cell == "measure":
                    run_cell(cluster, script, 200e6, NEW_SRC, Bootstrap(times=out), out + "-log", args.args.split())
                else:
                    src = args.old_src if cell == "old" else NEW_SRC
                    run_cell(cluster, script, 1e9, src, Bootstrap(profile=out, steps=range(5, 10)), out + "-log", args.args.split())
                print(f"round {k} {script} {cell}: load {os.getloadavg()[0]:.1f}", flush=True)
            for script in scripts:
                measured = step_ms(os.path.join(root, f"r{k}-{script}-measure"))
                for cell, src in (("profile", NEW_SRC), ("old", args.old_src)):
                    if os.path.isdir(os.path.join(root, f"r{k}-{script}-{cell}")):
                        pred, model = predict(src, os.path.join(root, f"r{k}-{script}-{cell}"))
                        rows.append((k, script, "new" if cell == "profile" else "old", measured, pred, model))
    show(rows, root)


def repredict(kept: str, scripts: list[str]) -> list[tuple]:
    """Each kept round's profile (this tree's, ``new``) predicted again with this dagprof, against its round's measurement."""
    rows = []
    for k in range(sum(1 for d in os.listdir(kept) if d.endswith("-measure"))):
        for script in scripts:
            run, measure = (os.path.join(kept, f"r{k}-{script}-{cell}") for cell in ("profile", "measure"))
            if os.path.isdir(run) and os.path.isdir(measure):
                rows.append((k, script, "new", step_ms(measure), *predict(NEW_SRC, run)))
    return rows


def show(rows: list[tuple], root: str) -> None:
    print(f"{'round':>5} {'script':<14} {'tree':<4} {'measured':>10} {'predicted':>10} {'error':>8} {'model of profiled':>18}")
    for k, script, tree, m, pred, model in rows:
        print(f"{k:>5} {script:<14} {tree:<4} {m:>7.1f} ms {pred:>7.1f} ms {100 * (pred / m - 1):>+7.1f}% {model:>+16.1f} %")
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
