"""User-style TensorFlow, JAX, MXNet and Horovod scripts (bench/frameworks/), each profiled N times as a user would:
crashes (a worker that died, by its exit status or signal), the model the what-ifs start from against the
profiled run (must be within 2 %; less the profiler's own cost, measured on the run, unless it could not be told:
``raw_model_pct`` is the model of the op times as profiled against the run as measured), and the averaged replay
(``--template``) against the measurement.

    DAGPROF_TF_PYTHON=/opt/tf/bin/python DAGPROF_JAX_PYTHON=/opt/jax/bin/python DAGPROF_MXNET_PYTHON=/opt/mx/bin/python \\
    DAGPROF_HOROVOD_VENV=/opt/hvd python bench/bench_frameworks.py --runs 20 [--only tf_text,jax_shardmap,mx_mlp,hvd_text] [--keep DIR]

MXNet scripts run as ``dist_sync`` jobs under ``python -m dagprof.collect.hooks.mxnet_ps run`` (scheduler, 1 server,
the workers), its exit status standing for the job's (a process that died fails the launcher). Horovod scripts carry
no dagprof line: ``dagprof profile -o RUN --steps A:B -- horovodrun -np N -H localhost:N --gloo python SCRIPT`` (the
venv of ``bench/horovod/build_horovod.sh``), whose exit status is the job's (dagprof's own refusal, 2, is told apart
by its message).

The framework's Python needs dagprof importable (this checkout's src/ is put on PYTHONPATH).
Workers share this host's loopback; on 2 busy cores figures vary from run to run: medians and spreads are reported.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from dagprof.collect.jobs.tf_train import free_ports  # noqa: E402  (stdlib only: TF is imported by the job, not here)
from dagprof.errors import DagprofError  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.whatif import Scenario, evaluate  # noqa: E402

SCRIPTS = {  # name -> (framework, environment variable naming its Python, extra environment)
    "tf_text": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_mlp_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_shardmap": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_jit_embed": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "tf_gru_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "tf_cnn_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_mixer": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_pmap_adam": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_mlp": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_embed": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_lstm": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_convnet": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_text": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_resnet": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_transformer": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_sparse_gru": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
}
# Horovod: (the profiled window, the script's arguments). Its fusion depends on timing, so the collectives differ from step
# to step and run to run: 10 steps, not 4 (one 117 ms step among 25-35 ms ones set a 4-step window's mean off by 80 %).
# The ResNet's window lies in its second epoch, clear of the first epoch's end (its sampler and scheduler).
HOROVOD_RUN = {"hvd_text": ("6:16", ["--steps", "20"]), "hvd_resnet": ("16:26", []), "hvd_transformer": ("6:16", ["--steps", "20"]),
               "hvd_sparse_gru": ("6:16", ["--steps", "20"])}


def launch(name: str, python: str, out: str, workers: int, timeout: float, src: str = SRC, prefix: tuple[str, ...] = ()) -> list[int]:
    """Run the script on ``workers`` processes with the collector in ``src``; their exit statuses (negative: killed by that signal).
    ``prefix`` goes before every command started (``ip netns exec NS``: the job in that namespace)."""
    framework, _, extra = SCRIPTS[name]
    script = os.path.join(HERE, "frameworks", f"{name}.py")
    env = dict(os.environ, PYTHONPATH=src, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    ports = free_ports(workers)
    if framework == "mxnet":
        cmd = [sys.executable, "-m", "dagprof.collect.hooks.mxnet_ps", "run", "--out", out, "--servers", "1", "--workers", str(workers),
               "--port", str(ports[0]), "--profile-steps", "5", "--timeout", str(int(timeout)), "--", python, script, "--steps", "16"]
        with open(os.path.join(out, "launcher.txt"), "w") as log:
            return [subprocess.run([*prefix, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=log, timeout=timeout + 60).returncode]
    if framework == "horovod":  # python names the venv's interpreter; horovodrun and the ranks' python come from its bin/
        bindir = os.path.dirname(python)
        env |= {"PATH": bindir + os.pathsep + env.get("PATH", ""), "OMP_NUM_THREADS": "1"}
        window, script_args = HOROVOD_RUN[name]
        cmd = [sys.executable, "-m", "dagprof.cli.main", "profile", "-o", out, "--steps", window, "--json", "--",
               os.path.join(bindir, "horovodrun"), "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", "python", script,
               *script_args]
        log_path = os.path.join(out, "launcher.txt")
        with open(log_path, "w") as log:
            code = subprocess.run([*prefix, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=log, timeout=timeout + 60).returncode
        with open(log_path) as log:
            said = re.search(r"the (?:profiled )?command exited with status (-?\d+)", log.read())
        return [int(said.group(1)) if said else 0 if code == 2 else code]  # 2 alone: dagprof refused a finished job (judge says why)
    procs = []
    for rank in range(workers):
        if framework == "tensorflow":
            cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
            penv = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}))
            cmd = [python, script, "--out", out]
        else:
            penv, cmd = env, [python, script, "--out", out, "--rank", str(rank), "--world", str(workers), "--port", str(ports[0])]
        procs.append(subprocess.Popen([*prefix, *cmd], env=penv, stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, f"log{rank}.txt"), "w")))
    deadline = time.monotonic() + timeout
    codes: list[int | None] = [None] * workers
    while any(c is None for c in codes):
        codes = [p.poll() for p in procs]
        if time.monotonic() > deadline or any(c not in (None, 0) for c in codes):
            time.sleep(2.0 if time.monotonic() <= deadline else 0.0)  # let the others fail on their own first
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            codes = [p.wait() for p in procs]
            break
        time.sleep(0.2)
    return [int(c) for c in codes]


def profiled_again(out: str) -> int:
    """How many times the TF/JAX collector profiled its window again because a rank's profile was lost (0 elsewhere)."""
    try:
        with open(os.path.join(out, "rank0.json")) as f:
            return sum("profiled again" in w for w in json.load(f).get("warnings", []))
    except (OSError, ValueError):
        return 0


def collecting_children_died(out: str) -> int:
    """TF: the collecting children that died, over every rank file's notes (a window's collection retried in a fresh child,
    or lost when all its children died); 0 elsewhere."""
    died = 0
    for name in os.listdir(out):
        if re.fullmatch(r"rank\d+\.json", name):
            try:
                with open(os.path.join(out, name)) as f:
                    notes = json.load(f).get("warnings", [])
            except (OSError, ValueError):
                continue
            died += sum(int(n) for w in notes
                        for n in re.findall(r"(?:crashed|failed) while collecting in (\d+) child", w))
    return died


def judge(out: str) -> dict:
    """The model's error on the profiled run (what-ifs start from it) and the averaged replay's, %; or the refusal."""
    try:
        p = open_run(out)
        measured = p.analysis.measured_us
        r = evaluate(p.graph, [Scenario()], measured_us=measured, tolerance_pct=None)
        raw = evaluate(p.graph, [Scenario()], measured_us=measured, tolerance_pct=None, raw=True)
        avg = open_run(out, template=True).analysis.error_pct
        fit, cost = r["link_fit"] or {}, r["profiler_cost"]
        return {"model_pct": r["model_error_pct"], "model_ms": r["model_iter_ms"], "reference_ms": r["reference_iter_ms"],
                "raw_model_pct": raw["model_error_pct"], "raw_model_ms": raw["model_iter_ms"], "measured_ms": measured / 1e3,
                "profiled_step_ms": cost["profiled_step_ms"], "unprofiled_step_ms": cost["unprofiled_step_ms"],
                "profiler_cost": cost["text"], "cost_corrected": cost["corrected"],
                "replay_pct": p.analysis.error_pct, "averaged_pct": avg, "weak_fit": fit.get("weak")}
    except DagprofError as e:
        return {"refused": str(e)}


# tbf's bucket, in ms of traffic at the rate (as netns.Cluster.set_rate). A full bucket passes at once: collectives of a few
# hundred KB, a bucket refilled between steps, would see a faster link than the rate.
BURST_MS = 1.0


def shape_loopback(ns: str, rate_bit: float) -> None:
    """``tc tbf`` at ``rate_bit`` on the loopback of namespace ``ns``, its MTU an Ethernet frame's (1500 B: TCP segments as on
    a wire, and tbf's bucket must hold a whole packet). Both workers live in ``ns``, so every byte between them, either way,
    crosses this one shaped device: the pair shares the rate, as on a half-duplex link."""
    burst = max(int(rate_bit / 8 / 1000 * BURST_MS), 8 * 1514)
    for cmd in (["ip", "link", "set", "lo", "mtu", "1500"], ["ip", "link", "set", "lo", "up"],
                ["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{int(rate_bit)}bit", "burst", str(burst), "latency", "50ms"]):
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)


def median_step_ms(g) -> float:
    """The median over a graph's steps of the slowest rank's step, replayed (as built, the measured steps): one load
    spike on the shared machine moves a mean over 4 steps by tens of %, a median much less."""
    from dagprof.analysis.interval import step_times
    from dagprof.replay import replay

    return float(np.median(step_times(g, replay(g)))) / 1e3


def comm_per_step_ms(g) -> float:
    """The priced collectives' transfer time per step (as measured, or as a what-if re-priced them): the link model's part
    alone, apart from the compute's drift between jobs on the shared machine."""
    from dagprof.passes.comm import priced_comm, profiled_collectives

    comm = priced_comm(g) & (g.dur > 0)
    return float(profiled_collectives(g)[1].sum()) / max(len(np.unique(g.step[comm])), 1) / 1e3


def measured(out: str) -> dict:
    """A profiled job's iteration: dagprof's measured figure (the slowest rank's, averaged over the window), the median step
    and the collectives' time per step."""
    p = open_run(out)
    return {"measured_ms": p.analysis.measured_us / 1e3, "measured_median_ms": median_step_ms(p.graph), "comm_ms": comm_per_step_ms(p.graph)}


def predict_rate(out: str, rate: float, other: float) -> dict:
    """From the profile at ``rate``, the iteration at ``other`` as ``dagprof whatif --bandwidth`` predicts it: the link fitted
    to the profile's collectives, its bandwidth scaled by the rate ratio (TCP/IP framing carries over), op times as profiled
    (``raw``: the measurement it is compared with is a profiled run too). Also the median replayed step of that what-if."""
    from dagprof.passes import set_link, set_topology
    from dagprof.search.whatif import Cluster as Settings, base_topology

    p = open_run(out)
    base = evaluate(p.graph, [Scenario()], measured_us=p.analysis.measured_us, tolerance_pct=None, raw=True)
    fit = base["link_fit"]
    bw = fit["bandwidth_bytes_per_s"] * other / rate
    row = evaluate(p.graph, [Scenario(bandwidth=f"{8 * bw / 1e6:.6g}Mbit")], measured_us=p.analysis.measured_us, tolerance_pct=None,
                   raw=True)["scenarios"][0]
    what_if = set_link(set_topology(p.graph, base_topology(p.graph, Settings())), bw)
    return measured(out) | {"model_pct": base["model_error_pct"], "predicted_ms": row["predicted_iter_ms"],
                            "predicted_median_ms": median_step_ms(what_if), "predicted_comm_ms": comm_per_step_ms(what_if),
                            "fit_bit_per_s": 8 * fit["bandwidth_bytes_per_s"],
                            "fit_latency_us": fit["latency_us"], "weak_fit": fit.get("weak")}


def testbed(names: list[str], args) -> dict:
    """Bandwidth what-if on the namespace testbed: per script and round, a profiled job at ``--rate`` and one at
    ``--other-rate`` (their order alternating by round), the second predicted from the first's profile.
    Both figures are a profiled window's measured iteration (dagprof's: the slowest rank's step, averaged)."""
    from dagprof.collect.jobs.netns import Cluster, available

    why = available()
    if why:
        print(f"bench_frameworks --testbed: skipped: {why}", file=sys.stderr)
        return {}
    results = {}
    with Cluster(1, tag="fwtb") as c, tempfile.TemporaryDirectory(prefix="dagprof-fwtb-") as tmp:
        ns = c.ns(0)
        for name in names:
            python = python_for(name)
            if not python:
                continue
            rounds = []
            for k in range(args.rounds):
                got: dict[float, dict] = {}
                for rate in ((args.rate, args.other_rate) if k % 2 == 0 else (args.other_rate, args.rate)):
                    out = os.path.join(args.keep or tmp, f"tb-{name}-{k}-{int(rate / 1e6)}M")
                    os.makedirs(out, exist_ok=True)
                    shape_loopback(ns, rate)
                    load = os.getloadavg()[0]
                    codes = launch(name, python, out, args.workers, args.timeout, prefix=("ip", "netns", "exec", ns))
                    try:
                        got[rate] = {"load": load, "exit": codes} | (predict_rate(out, rate, args.other_rate) if rate == args.rate
                                                                     else measured(out))
                    except DagprofError as e:
                        got[rate] = {"load": load, "exit": codes, "refused": str(e)}
                    print(f"{name} round {k + 1}, {rate / 1e6:g} Mbit/s: {got[rate]}", file=sys.stderr, flush=True)
                rounds.append(_round(k, got[args.rate], got[args.other_rate]))
            results[name] = {"rounds": rounds, "summary": _summary(rounds, args)}
    return results


def repredict(kept: str, names: list[str], args) -> dict:
    """``testbed``'s rounds kept by ``--keep`` (``tb-NAME-K-RATEM`` folders) predicted again with this dagprof: no job
    runs, no root; each round's own measurement at ``--other-rate`` is the reference."""
    results = {}
    for name in names:
        rounds = []
        for k in range(args.rounds):
            folder = {r: os.path.join(kept, f"tb-{name}-{k}-{int(r / 1e6)}M") for r in (args.rate, args.other_rate)}
            if not all(os.path.isdir(f) for f in folder.values()):
                continue
            got = {}
            for rate, out in folder.items():
                try:
                    got[rate] = {"load": float("nan")} | (predict_rate(out, rate, args.other_rate) if rate == args.rate else measured(out))
                except DagprofError as e:
                    got[rate] = {"load": float("nan"), "refused": str(e)}
            rounds.append(_round(k, got[args.rate], got[args.other_rate]))
            print(f"{name} round {k + 1}: {rounds[-1].get('error_pct', rounds[-1]['profiled'].get('refused'))}", file=sys.stderr, flush=True)
        if rounds:
            results[name] = {"rounds": rounds, "summary": _summary(rounds, args)}
    return results


def _round(k: int, a: dict, b: dict) -> dict:
    """One round's row: the profiled job ``a`` (with its prediction) against the job measured at the other rate ``b``."""
    row = {"round": k, "profiled": a, "other": b}
    if "predicted_ms" in a and "measured_ms" in b:
        row["error_pct"] = 100.0 * (a["predicted_ms"] - b["measured_ms"]) / b["measured_ms"]
        row["median_error_pct"] = 100.0 * (a["predicted_median_ms"] - b["measured_median_ms"]) / b["measured_median_ms"]
        row["comm_error_pct"] = 100.0 * (a["predicted_comm_ms"] - b["comm_ms"]) / b["comm_ms"]
    return row


def _summary(rounds: list[dict], args) -> dict:
    """The rounds' errors (mean step, median step, the collectives alone), the measured and predicted steps, the load."""
    errs = [r["error_pct"] for r in rounds if "error_pct" in r]
    med_errs = [r["median_error_pct"] for r in rounds if "median_error_pct" in r]
    comm_errs = [r["comm_error_pct"] for r in rounds if "comm_error_pct" in r]
    loads = [x["load"] for r in rounds for x in (r["profiled"], r["other"])]
    return {"rate_bit": args.rate, "other_rate_bit": args.other_rate, "rounds": len(rounds), "judged": len(errs),
            "median_error_pct": float(np.median(errs)) if errs else None, "error_spread_pct": [min(errs), max(errs)] if errs else None,
            "within_8": sum(abs(e) <= 8 for e in errs),
            "median_step": {"median_error_pct": float(np.median(med_errs)) if med_errs else None,
                            "error_spread_pct": [min(med_errs), max(med_errs)] if med_errs else None,
                            "within_8": sum(abs(e) <= 8 for e in med_errs)},
            "collectives": {"median_error_pct": float(np.median(comm_errs)) if comm_errs else None,
                            "error_spread_pct": [min(comm_errs), max(comm_errs)] if comm_errs else None},
            "measured_ms": {str(int(r / 1e6)) + "Mbit": float(np.median([x[key]["measured_ms"] for x in rounds if "measured_ms" in x[key]] or [np.nan]))
                            for r, key in ((args.rate, "profiled"), (args.other_rate, "other"))},
            "predicted_ms": float(np.median([x["profiled"]["predicted_ms"] for x in rounds if "predicted_ms" in x["profiled"]] or [np.nan])),
            "load_median": float(np.median(loads)), "load_max": float(max(loads))}


def python_for(name: str) -> str | None:
    """The framework's Python for a script (a Horovod venv's bin/python), or None (said on stderr)."""
    python = os.environ.get(SCRIPTS[name][1])
    if python and SCRIPTS[name][0] == "horovod":
        python = os.path.join(python, "bin", "python")
    if not python:
        print(f"{name}: skipped, set {SCRIPTS[name][1]} to a Python with {SCRIPTS[name][0]}", file=sys.stderr)
    return python or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default=",".join(SCRIPTS))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", help="keep the run folders here")
    ap.add_argument("--baseline-src", help="another checkout's src/ (e.g. before a collector fix): its collector profiles every "
                                           "other run, in interleaved rounds, and crashes are counted per collector")
    ap.add_argument("--testbed", action="store_true", help="(root) the bandwidth what-if on the namespace testbed instead: profile at "
                    "--rate, predict and measure --other-rate, in --rounds interleaved rounds per script (TF, JAX, Horovod)")
    ap.add_argument("--rate", type=float, default=500e6, help="--testbed: the profiled link rate, bit/s")
    ap.add_argument("--other-rate", type=float, default=200e6, help="--testbed: the rate predicted and measured, bit/s")
    ap.add_argument("--rounds", type=int, default=3, help="--testbed: rounds (each a job at either rate)")
    ap.add_argument("--repredict", metavar="KEPT", help="--testbed: run nothing; predict the rounds a --keep folder holds again "
                    "with this dagprof, against their measurements (give the kept run's --rate, --other-rate and --rounds)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.testbed:
        names = [n for n in args.only.split(",") if SCRIPTS[n][0] != "mxnet"]  # MXNet: bench_mxnet_ps.py
        results = repredict(args.repredict, names, args) if args.repredict else testbed(names, args)
        print(json.dumps(results, indent=1) if args.json else "\n".join(f"{n}: {json.dumps(r['summary'])}" for n, r in results.items()))
        return 0
    results = {}
    for name in args.only.split(","):
        python = python_for(name)
        if not python:
            continue
        rows = []
        collectors = [SRC, args.baseline_src] if args.baseline_src else [SRC]
        for i in range(args.runs * len(collectors)):
            src = collectors[(i + i // len(collectors)) % len(collectors)]  # A B, B A, ...
            out = os.path.join(args.keep, f"{name}-{i}") if args.keep else tempfile.mkdtemp(prefix=f"dagprof-{name}-")
            os.makedirs(out, exist_ok=True)
            t0 = time.monotonic()
            codes = launch(name, python, out, args.workers, args.timeout, src)
            row = {"run": i, "collector": "baseline" if src != SRC else "this", "exit": codes, "seconds": round(time.monotonic() - t0, 1)}
            died = [c for c in codes if c not in (0, -signal.SIGKILL)] or [c for c in codes if c != 0]  # not the ones stopped after it
            row |= {"crash": died[0]} if died else judge(out)
            row["profiled_again"] = profiled_again(out)
            row["children_died"] = collecting_children_died(out)
            rows.append(row)
            print(f"{name} run {i}: {row}", file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
        mine = [r for r in rows if r["collector"] == "this"]
        ok = [r for r in mine if "model_pct" in r]
        summary = {"runs": len(mine), "crashes": sum("crash" in r for r in mine), "refused": sum("refused" in r for r in mine),
                   "profiled_again": sum(r["profiled_again"] > 0 for r in mine),  # runs whose window was lost on a rank and profiled again
                   "children_died": sum(r["children_died"] for r in mine),  # TF: collecting children that died (each retried)
                   "cost_corrected": sum(bool(r.get("cost_corrected")) for r in ok)}  # runs whose profiler cost stood out and was removed
        if args.baseline_src:
            base = [r for r in rows if r["collector"] == "baseline"]
            summary["baseline"] = {"runs": len(base), "crashes": sum("crash" in r for r in base)}
        for key in ("model_pct", "averaged_pct"):
            vals = np.abs([r[key] for r in ok]) if ok else np.zeros(0)
            summary[key] = None if not len(vals) else {"median_abs": float(np.median(vals)), "max_abs": float(vals.max()),
                                                       "within_2": int((vals <= 2).sum()), "within_3": int((vals <= 3).sum())}
        results[name] = {"summary": summary, "rows": rows}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, r in results.items():
            print(f"{name}: {json.dumps(r['summary'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
