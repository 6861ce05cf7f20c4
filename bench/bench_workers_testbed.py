"""``dagprof whatif --workers N`` against a measured N-worker job, for the user-style TF, JAX and Horovod scripts
(``bench/frameworks/``) on the namespace testbed of ``bench_frameworks.py --testbed``: per round a 2-worker job profiled
and an N-worker job measured, both on the one loopback shaped at the same rate (their order alternating by round), the
N workers predicted from the 2-worker profile. The workers share that loopback: a ring all-reduce of S bytes puts
2 (N - 1) S on it, so the model's link is rate / N for N workers, rate / 2 for the profile (``shaped_loopback.wire_rate``).

    DAGPROF_HOROVOD_VENV=/opt/hvd python bench/bench_workers_testbed.py --only hvd_autoencoder,hvd_text --workers 4 \\
        --rounds 2 --keep DIR [--json]
    python bench/bench_workers_testbed.py --repredict DIR --only hvd_autoencoder --workers 4 --rounds 2   # no job, no root

Two rows per round: the compute of each added worker as profiled (its own cores), and ``--cores`` the host's cores
(``os.cpu_count()``, measured: the N workers' compute queued on them). Judged on the median step (the slowest rank's,
replayed as measured), each round against its own measured job; the load average beside each job.

``--hosts`` (TF, JAX, Horovod): each worker a host of its own (a namespace, its port shaped at ``--rate``: the FSDP/DDP 2 -> 4
cells' ``collect.jobs.netns.Cluster``), so N workers' ring runs on links as fast as the 2 workers' and the prediction
is the user's own command, ``dagprof whatif RUN --workers N`` and ``--workers N --cores C`` (``whatif_cli``); the N-worker
job is judged on its unprofiled steps (the median of those outside its window, past the warm-up), and the step's growth
2 -> N (``change_error_pct``: the prediction over its model of the profiled run, against the N-worker job's unprofiled
median over the 2-worker job's) takes out the level each job ran at. Rounds go on in a kept folder with ``--first-round``:

    DAGPROF_TF_PYTHON=/opt/tf/bin/python python bench/bench_workers_testbed.py --hosts --only tf_siamese_loop,tf_mlp_fit \
        --workers 4 --rate 500e6 --rounds 1 [--first-round 1] --keep DIR
    python bench/bench_workers_testbed.py --repredict DIR --hosts --only tf_siamese_loop,tf_mlp_fit --workers 4 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from bench_frameworks import SCRIPTS, python_for, run_job  # noqa: E402
from shaped_loopback import DEFAULT_PAIR, PAIRS, hosts_namespaces, measured, median_step_ms, namespace, payload_share, wire_rate  # noqa: E402
from whatif_cli import Refused, whatif_json  # noqa: E402

from dagprof.errors import DagprofError  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.scenario import Cluster as Settings, Scenario, apply, base_topology, profiled_at  # noqa: E402
from dagprof.search.whatif import evaluate  # noqa: E402

PROFILED_WORKERS = 2


def predict_workers(out: str, rate: float, workers: int) -> dict:
    """From the 2-worker profile in ``out`` (run at ``rate`` bit/s), the iteration of ``workers`` workers on the same shaped
    loopback as ``dagprof whatif --workers N --bandwidth RATE/N --profiled-bandwidth RATE/2`` predicts it: the mean (the
    CLI's figure) and the median replayed step, with each worker's own cores and with the host's (``--cores``)."""
    p = open_run(out)
    share, how = payload_share(out, PROFILED_WORKERS)
    got = measured(out) | {"payload_share": how}
    scenario = Scenario(workers=workers, bandwidth=wire_rate(rate, workers, share))
    for key, cores in (("own_cores", None), ("host_cores", os.cpu_count())):
        settings = Settings(profiled_bandwidth=wire_rate(rate, PROFILED_WORKERS, share), cores=cores)
        res = evaluate(p.graph, [scenario], settings, measured_us=p.analysis.measured_us, tolerance_pct=None, raw=True)
        marked = profiled_at(p.graph, settings)
        what_if = apply(marked, scenario, settings, base_topology(marked, settings))
        got[key] = {"predicted_ms": res["scenarios"][0].predicted_iter_ms, "predicted_median_ms": median_step_ms(what_if),
                    "model_pct": res["model_error_pct"]}
    return got


def predict_hosts(out: str, workers: int, cores: int) -> dict:
    """From the 2-worker profile in ``out`` on the testbed as hosts, the N-worker step as the user's command predicts it:
    ``dagprof whatif RUN --workers N`` and ``--workers N --cores C`` (the point: the mean step; the replayed median and
    its interval; the model of the profiled run), beside the profiled job's own figures (``measured``)."""
    got = measured(out)
    for key, extra in (("own_cores", ()), ("host_cores", ("--cores", str(cores)))):
        try:
            d = whatif_json(out, "--workers", str(workers), *extra)
        except Refused as e:
            got[key] = {"refused": str(e)}
            continue
        row = d["scenarios"][0]
        got[key] = {"predicted_ms": row["predicted_iter_ms"], "predicted_median_ms": row["predicted_median_ms"],
                    "interval_ms": [row["lo_ms"], row["hi_ms"]], "model_pct": d["model_error_pct"], "model_ms": d["model_iter_ms"]}
    return got


def _round(k: int, profiled: dict, other: dict) -> dict:
    """One round: each row's median-step error against the N-worker job (and the mean's), %. Where both jobs timed their
    unprofiled steps (``--hosts``), also against the N-worker job's unprofiled median (``unprofiled_error_pct``), whether
    that median lies in the row's interval, and the step's growth 2 -> N predicted (the point over the model of the
    profiled run) against measured (the two jobs' unprofiled medians): ``change_error_pct``."""
    row = {"round": k, "profiled": profiled, "measured": other}
    if "measured_median_ms" in other:
        for key in ("own_cores", "host_cores"):
            if "predicted_median_ms" in profiled.get(key, {}):
                pred = profiled[key]
                row[f"{key}_error_pct"] = 100.0 * (pred["predicted_median_ms"] - other["measured_median_ms"]) / other["measured_median_ms"]
                row[f"{key}_mean_error_pct"] = 100.0 * (pred["predicted_ms"] - other["measured_ms"]) / other["measured_ms"]
                unprof, unprof2 = other.get("unprofiled_median_ms"), profiled.get("unprofiled_median_ms")
                if unprof and "interval_ms" in pred:
                    row[f"{key}_unprofiled_error_pct"] = 100.0 * (pred["predicted_median_ms"] - unprof) / unprof
                    row[f"{key}_in_interval"] = pred["interval_ms"][0] <= unprof <= pred["interval_ms"][1]
                    if unprof2:
                        row[f"{key}_change_error_pct"] = 100.0 * ((pred["predicted_ms"] / pred["model_ms"]) / (unprof / unprof2) - 1.0)
    return row


JUDGED = ("own_cores_error_pct", "host_cores_error_pct", "own_cores_unprofiled_error_pct", "host_cores_unprofiled_error_pct",
          "own_cores_change_error_pct", "host_cores_change_error_pct")


def _summary(rounds: list[dict]) -> dict:
    loads = [x["load"] for r in rounds for x in (r["profiled"], r["measured"]) if "load" in x]
    out = {"rounds": len(rounds), "load": [float(min(loads)), float(max(loads))] if loads else None}
    for key in JUDGED:
        vals = [r[key] for r in rounds if key in r]
        out[key] = {"median": float(np.median(vals)), "spread": [float(min(vals)), float(max(vals))]} if vals else None
    return out


def _predict(out: str, rate: float, args) -> dict:
    """The 2-worker profile's prediction of ``args.workers``: on hosts the user's command (``predict_hosts``), on the one
    shared loopback its link rate per worker count (``predict_workers``)."""
    return predict_hosts(out, args.workers, args.cores) if args.hosts else predict_workers(out, rate, args.workers)


def folders(keep: str, name: str, k: int, workers: int) -> tuple[str, str]:
    return os.path.join(keep, f"tbw-{name}-{k}-w{PROFILED_WORKERS}"), os.path.join(keep, f"tbw-{name}-{k}-w{workers}")


def live(names: list[str], args) -> dict:
    """The rounds run on a fresh namespace (root): a 2-worker job and an N-worker job per round at the script's faster rate."""
    from dagprof.collect.jobs.netns import available

    why = available()
    if why:
        print(f"bench_workers_testbed: skipped: {why}", file=sys.stderr)
        return {}
    results = {}
    testbed = hosts_namespaces("fwtw", args.keep, args.workers) if args.hosts else namespace("fwtw", args.keep)
    with testbed as (ns, keep):
        for name in names:
            python = python_for(name)
            if not python:
                continue
            rate = float(args.rate) if args.rate else PAIRS.get(name, DEFAULT_PAIR)[0]
            with open(os.path.join(keep, f"tbw-{name}-rate.json"), "w") as f:
                json.dump({"rate_bit": rate, "hosts": args.hosts}, f)
            rounds = []
            for k in range(args.first_round, args.first_round + args.rounds):
                prof, meas = folders(keep, name, k, args.workers)
                got = {}
                for n in ((PROFILED_WORKERS, args.workers) if k % 2 == 0 else (args.workers, PROFILED_WORKERS)):
                    out = prof if n == PROFILED_WORKERS else meas
                    job = argparse.Namespace(workers=n, timeout=args.timeout, script_args=args.script_args, shared_cores=True)
                    got[n] = run_job(name, python, out, ns, rate, job)
                    if "refused" not in got[n]:
                        try:
                            got[n] |= (_predict(out, rate, args) if n == PROFILED_WORKERS else measured(out))
                        except DagprofError as e:
                            got[n]["refused"] = str(e)
                    print(f"{name} round {k + 1}, {n} workers: {got[n]}", file=sys.stderr, flush=True)
                rounds.append(_round(k, got[PROFILED_WORKERS], got[args.workers]))
            results[name] = {"rate_bit": rate, "rounds": rounds, "summary": _summary(rounds)}
    return results


def repredict(kept: str, names: list[str], args) -> dict:
    """The rounds a ``--keep`` folder holds predicted again with this dagprof (no job, no root)."""
    results = {}
    for name in names:
        try:
            with open(os.path.join(kept, f"tbw-{name}-rate.json")) as f:
                kept_as = json.load(f)
        except OSError:
            continue
        rate, how = kept_as["rate_bit"], argparse.Namespace(**vars(args) | {"hosts": kept_as.get("hosts", args.hosts)})
        rounds = []
        for k in range(args.first_round, args.first_round + args.rounds):
            prof, meas = folders(kept, name, k, args.workers)
            if not (os.path.isdir(prof) and os.path.isdir(meas)):
                continue
            try:
                a = _predict(prof, rate, how)
            except DagprofError as e:
                a = {"refused": str(e)}
            try:
                b = measured(meas)
            except DagprofError as e:
                b = {"refused": str(e)}
            rounds.append(_round(k, a, b))
        if rounds:
            results[name] = {"rate_bit": rate, "rounds": rounds, "summary": _summary(rounds)}
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="hvd_autoencoder,hvd_text")
    ap.add_argument("--workers", type=int, default=4, help="the workers predicted and measured (profiled: 2)")
    ap.add_argument("--rate", type=float, help="the shaped loopback's rate, bit/s (default: the faster rate of the script's pair)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--first-round", type=int, default=0, help="the first round's number (rounds added to a --keep folder)")
    ap.add_argument("--hosts", action="store_true", help="each worker a host of its own, its port shaped at --rate (TF, JAX, Horovod): "
                    "predicted by dagprof whatif --workers N [--cores C], judged on the N-worker job's unprofiled steps")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="--hosts: the host's cores the N workers share (--cores C)")
    ap.add_argument("--script-args", default="", help="more arguments for each TF/JAX script (one string)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", help="keep the run folders here")
    ap.add_argument("--repredict", metavar="KEPT", help="run nothing; predict the rounds a --keep folder holds again")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if SCRIPTS[n][0] in ("tensorflow", "jax", "horovod")]  # MXNet: bench_mxnet_ps.py
    results = repredict(args.repredict, names, args) if args.repredict else live(names, args)
    print(json.dumps(results, indent=1) if args.json else "\n".join(f"{n}: {json.dumps(r['summary'])}" for n, r in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
