"""``dagprof whatif RUN --workers 4`` of fresh FSDP2 scripts, predicted from a 2-rank profile then measured at 4 ranks on
the namespace testbed as hosts (run as root, under the machine-wide lock).

Each rank is a host of its own (a namespace, its egress port shaped at ``--rate``: ``collect.jobs.netns.Cluster``), so a
4-rank ring's links run at the rate a 2-rank one's did and the what-if keeps the profile's link. Per round and script,
in a shuffled order: the 2-rank job profiled (steps 5-9), the 2-rank and the 4-rank job unprofiled (their step times: the
median over the steps after the first third of the slowest rank's step), and the 4-rank job profiled, for reading
afterwards where a prediction misses. The scaling column (predicted over the model of the profiled run, against the
4-rank step measured over the 2-rank one) takes out the level the load put each job at. The 4 ranks share this
machine's 2 cores: each profile is predicted as ``--workers 4`` alone and with ``--cores 2`` (the tool's price for ranks
queueing on a host's cores). Peak memory per rank: predicted from the 2-rank
profile against the 4-rank profile's own (a model of a recording of the target); measured by the scripts' ``--memory``.

    sudo flock /tmp/dagprof-measure.lock .venv/bin/python bench/fsdp_fresh/workers_rounds.py --keep DIR --rounds 1
    .venv/bin/python bench/fsdp_fresh/workers_rounds.py --repredict DIR   # the kept rounds predicted again (no root)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, SRC)
sys.path.insert(0, os.path.join(HERE, "..", "ddp_fresh"))
sys.path.insert(0, os.path.join(HERE, ".."))

from link_check import step_ms  # noqa: E402  (the slowest rank's median step after the first third)
from whatif_cli import Refused, whatif_json  # noqa: E402

from dagprof.collect.jobs.launch import Bootstrap, launch  # noqa: E402
from dagprof.collect.jobs.netns import Cluster  # noqa: E402

SCRIPTS = {"resnet": ("resnet_ddp.py", ["--wrap", "fsdp"]), "mixer": ("mixer_frozen.py", ["--wrap", "fsdp"])}
CELLS = ("profile2", "measure2", "measure4", "profile4")


def run_cell(cluster: Cluster, name: str, cell: str, out: str, steps: int) -> None:
    script, args = SCRIPTS[name]
    ranks = int(cell[-1])
    boot = Bootstrap(times=out) if cell.startswith("measure") else Bootstrap(profile=out, steps=range(5, 10), kineto=False)
    launch([sys.executable, os.path.join(HERE, script), *args, "--steps", str(steps)], boot, ranks=ranks, cluster=cluster,
           log_dir=out + "-log", timeout_s=400)


def whatif(run: str, *extra: str, src: str = SRC) -> dict:
    try:
        return whatif_json(run, *extra, src=src)
    except Refused as e:
        raise SystemExit(f"whatif failed on {run}: {e}") from None


def peak_mb(row: dict) -> float | None:
    mem = row.get("memory_per_rank") or {}
    return max((m["total_mb"] for m in mem.values()), default=None)


def judge(root: str, k: int, name: str, cores: int, src: str = SRC) -> dict:
    """One round of one script: the 2-rank profile's ``--workers 4`` (with and without ``--cores``) against the 4-rank job."""
    run2, meas2, meas4, run4 = (os.path.join(root, f"r{k}-{name}-{c}") for c in CELLS)
    got = {"round": k, "script": name, "measured4_ms": step_ms(meas4)}
    if os.path.isdir(meas2):
        got["measured2_ms"] = step_ms(meas2)
    for key, extra in (("own_cores", []), ("host_cores", ["--cores", str(cores)])):
        d = whatif(run2, "--workers", "4", *extra, src=src)
        row = d["scenarios"][0]
        got[key] = {"predicted_ms": row["predicted_iter_ms"], "peak_mb": peak_mb(row), "model_pct": d["model_error_pct"],
                    "model_ms": d["model_iter_ms"]}
    if os.path.isdir(run4):
        d4 = whatif(run4, "--workers", "4", src=src)  # its own count: the model of the 4-rank recording
        got["profile4"] = {"model_ms": d4["model_iter_ms"], "measured_ms": d4["measured_iter_ms"], "peak_mb": peak_mb(d4["scenarios"][0])}
    return got


def show(rows: list[dict]) -> None:
    print(f"{'round':>5} {'script':<7} {'4 ranks':>9} {'--workers 4':>12} {'err':>7} {'+--cores':>9} {'err':>7} {'scaling':>15} "
          f"{'4-rank profiled':>15} {'peak 2->4':>10} {'4-rank own':>10}")
    for r in rows:
        m = r["measured4_ms"]
        a, b = r["own_cores"], r["host_cores"]
        own = r.get("profile4", {})
        # the step's growth 2 -> 4 ranks, --cores predicted over its model of the 2-rank run, against measured over measured
        scaling = (f"{b['predicted_ms'] / b['model_ms']:.2f} vs {m / r['measured2_ms']:.2f}" if "measured2_ms" in r else "")
        print(f"{r['round']:>5} {r['script']:<7} {m:>6.1f} ms {a['predicted_ms']:>9.1f} ms {100 * (a['predicted_ms'] / m - 1):>+6.1f}% "
              f"{b['predicted_ms']:>6.1f} ms {100 * (b['predicted_ms'] / m - 1):>+6.1f}% {scaling:>15} "
              f"{own.get('measured_ms', float('nan')):>12.1f} ms {a['peak_mb'] or float('nan'):>7.2f} MiB {own.get('peak_mb') or float('nan'):>7.2f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--first-round", type=int, default=0, help="the first round's number (rounds added to a --keep folder)")
    p.add_argument("--rate", type=float, default=100e6, help="each port's rate, bit/s")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--keep", help="folder for the runs (default: a temporary one)")
    p.add_argument("--repredict", metavar="KEPT", help="run nothing: predict the rounds a --keep folder holds again")
    p.add_argument("--src", default=SRC, help="the dagprof src folder that predicts (--repredict)")
    args = p.parse_args()
    names = args.scripts.split(",")
    if args.repredict:
        ks = sorted({int(d.split("-")[0][1:]) for d in os.listdir(args.repredict) if d.endswith("-measure4")})
        rows = [judge(args.repredict, k, n, args.cores, args.src) for k in ks for n in names
                if os.path.isdir(os.path.join(args.repredict, f"r{k}-{n}-measure4"))]
        show(rows)
        return
    root = args.keep or os.path.abspath("workers_rounds")
    os.makedirs(root, exist_ok=True)
    os.environ["PYTHONPATH"] = SRC
    rows = []
    with Cluster(4) as cluster:
        cluster.set_rate(args.rate)
        for k in range(args.first_round, args.first_round + args.rounds):
            cells = [(n, c) for n in names for c in CELLS]
            random.Random(k).shuffle(cells)
            for name, cell in cells:
                load = os.getloadavg()[0]
                run_cell(cluster, name, cell, os.path.join(root, f"r{k}-{name}-{cell}"), args.steps)
                print(f"round {k} {name} {cell}: load {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
            rows += [judge(root, k, n, args.cores) for n in names]
    with open(os.path.join(root, f"rounds-{args.first_round}-{'-'.join(names)}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    show(rows)
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
