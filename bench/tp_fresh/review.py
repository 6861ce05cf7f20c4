"""Run the fresh tensor/pipeline/expert-parallel jobs of bench/tp_fresh through dagprof as a reviewer would (issue 16).

Each job is recorded four ways: a stock torch.profiler export (``--trace``: Kineto JSON per rank, as a user brings
them), the same traces with their process groups stripped (``stripped``: no ``pg_config``, as a Megatron-style trace
where only position and size tell; ``nodist``: no ``distributedInfo`` at all, as older torch writes, the rank in the
file name), and ``dagprof profile -- torchrun ...`` (zero-code). Each then goes through analyze,
replay, report and the what-ifs (bandwidth, workers, a new TP or PP degree, a faster device), each also with
``--json``. A line per command says ok, "refused: <the one line>" (exit 2) or FAILED (a traceback, or ``--json`` that is
not one JSON object), and each recording's labels (``analyze --json``) are compared with what the job is.

    python bench/tp_fresh/review.py                       # every job, every source (about 15 minutes on 2 cores)
    python bench/tp_fresh/review.py --jobs tp-sp,pp-dp --sources stock,stripped
    python bench/tp_fresh/review.py --fixtures tests/data/tp-fresh   # re-record the vendored stock traces (gzipped)
    python bench/tp_fresh/review.py --fixtures tests/data/tp-fresh --jobs pp-stages   # only one of them
"""
from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fsdp_chain", os.path.join(HERE, "..", "fsdp_fresh", "chain.py"))
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)

# job -> (script, ranks, arguments, labels as `analyze` should summarise the stock trace)
JOBS = {
    "tp-sp": ("mesh_tp.py", 2, ["--mesh", "tp:2"], "TP x2"),
    "tp-inner": ("mesh_tp.py", 4, ["--mesh", "dp:2,tp:2"], "DP x2, TP x2"),
    "tp-outer": ("mesh_tp.py", 4, ["--mesh", "tp:2,dp:2", "--optim", "sgd"], "DP x2, TP x2"),
    "pp-dp": ("pp_dp.py", 4, [], "DP x2, PP x2"),
    "pp-stages": ("pp_stages.py", 4, [], "PP x4"),
    "ep-dp": ("ep_dp.py", 2, [], "DP x2, EP/CP x2"),
    "fsdp-tp": ("fsdp_tp.py", 4, ["--layers", "1"], "DP x2, TP x2"),  # one block: a fixture under 400 KB
    "pipe-dp": ("pipe_dp.py", 4, [], "DP x2, PP x2"),
    "moe-sub": ("moe_subgroups.py", 4, [], "DP x4, EP/CP x2"),
}
SOURCES = ("stock", "stripped", "nodist", "dagprof")


def torchrun(job: str) -> list[str]:
    script, ranks, extra, _ = JOBS[job]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            os.path.join(HERE, script), *extra]


def record_stock(job: str, out: str, extra: tuple[str, ...] | list[str] = ()) -> bool:
    """Stock traces of steps 2-3, renamed rank-N.pt.trace.json; ``extra``: the job's own arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([*torchrun(job), *extra, "--steps", "5", "--trace", tmp], capture_output=True, text=True)
        if done.returncode:
            print(f"FAILED   record {job}: {done.stderr[-400:]}")
            return False
        os.makedirs(out, exist_ok=True)
        for path in glob.glob(os.path.join(tmp, "*.json")):
            shutil.move(path, os.path.join(out, os.path.basename(path).split(".")[0] + ".pt.trace.json"))
    return True


def strip_groups(src: str, out: str, identity: bool) -> None:
    """The traces without their process groups (names, descriptions, ranks); ``identity`` False: without any
    ``distributedInfo`` (rank, world size, backend too)."""
    os.makedirs(out, exist_ok=True)
    for path in glob.glob(os.path.join(src, "*.json")):
        with open(path) as f:
            doc = json.load(f)
        if identity:
            doc.get("distributedInfo", {}).pop("pg_config", None)
        else:
            doc.pop("distributedInfo", None)
        for e in doc["traceEvents"]:
            args = e.get("args") or {}
            for k in [k for k in args if k.startswith("Process Group") or k in ("pg_name", "pg_desc", "Group size", "In split size")]:
                del args[k]
        with open(os.path.join(out, os.path.basename(path)), "w") as f:
            json.dump(doc, f)


def commands(job: str) -> list[tuple[str, list[str]]]:
    ranks = JOBS[job][1]
    return [("analyze", ["analyze"]), ("replay", ["replay"]), ("report", ["report"]),
            ("whatif --bandwidth 1Gbit,10Gbit", ["whatif", "--bandwidth", "1Gbit,10Gbit", "--allow-model-error"]),
            (f"whatif --workers {2 * ranks}", ["whatif", "--workers", str(2 * ranks), "--allow-model-error"]),
            ("whatif --tp-degree 4", ["whatif", "--tp-degree", "4", "--allow-model-error"]),
            ("whatif --pp-degree 4", ["whatif", "--pp-degree", "4", "--allow-model-error"]),
            ("whatif --compute-speed 2", ["whatif", "--compute-speed", "2", "--allow-model-error"])]


def labels(run: str) -> str:
    done = chain.dagprof("analyze", run, "--json")
    try:
        return json.loads(done.stdout)["parallelism"]["summary"]
    except (ValueError, KeyError, TypeError):
        return "n/a"


def review(job: str, source: str, root: str) -> None:
    run = os.path.join(root, f"{job}-{source}")
    if source == "stock" and not record_stock(job, run):
        return
    if source in ("stripped", "nodist"):
        stock = os.path.join(root, f"{job}-stock")
        if not os.path.isdir(stock) and not record_stock(job, stock):
            return
        strip_groups(stock, run, identity=source == "stripped")
    if source == "dagprof":
        done = chain.dagprof("profile", "-o", run, "--steps", "2:4", "--", *torchrun(job), "--steps", "6")
        if done.returncode:  # exit 2: refused in one line (the zero-code mode sees DDP and FSDP models only)
            last = done.stderr.strip().splitlines()[-1:] or [""]
            print(f"{'refused ' if done.returncode == 2 else 'FAILED  '} profile {job}: {last[0][:300]}")
            return
    got, want = labels(run), JOBS[job][3]
    verdict = "labels ok" if source != "stock" or got == want else f"labels WRONG (want {want!r})"
    print(f"== {job} {source}: {got!r}  {verdict}")
    for label, args in commands(job):
        chain.check(f"{job} {source} {label}", [args[0], run, *args[1:]])


def fixtures(out: str, jobs: list[str]) -> None:
    """The stock recordings of ``jobs``, gzipped, into ``out``/<job>/ (replacing what was there)."""
    for job in jobs:
        if job == "tp-inner":  # tests/data/hybrid-dp-tp already has a TP-inner 2-D job
            continue
        dest = os.path.join(out, job)
        shutil.rmtree(dest, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tmp:
            if not record_stock(job, tmp):
                sys.exit(1)
            os.makedirs(dest)
            for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):  # the same JSON without its whitespace
                with open(path) as src, gzip.open(os.path.join(dest, os.path.basename(path) + ".gz"), "wt", 9) as dst:
                    json.dump(json.load(src), dst, separators=(",", ":"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default=",".join(JOBS))
    p.add_argument("--sources", default=",".join(SOURCES))
    p.add_argument("--keep", help="folder for the recordings (default: a temporary one)")
    p.add_argument("--fixtures", help="only re-record the stock traces, gzipped, into this folder")
    args = p.parse_args()
    if args.fixtures:
        fixtures(args.fixtures, args.jobs.split(","))
        return
    root = args.keep or tempfile.mkdtemp(prefix="tp_fresh_")
    for job in args.jobs.split(","):
        for source in args.sources.split(","):
            review(job, source, root)
    print(f"recordings kept in {root}")


if __name__ == "__main__":
    main()
