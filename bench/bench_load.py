"""Loading Kineto traces: dagprof vs Meta's HolisticTraceAnalysis (HTA), same files, one run.

Each measurement runs in a fresh subprocess (imports done before the clock starts, and the CPU their threads burn
after, such as numpy's OpenBLAS threads spinning for about 0.1 s, left to settle) so peak
RSS is honest; the figure is the median of ``--reps`` runs (the machine is shared: expect
noise, compare the ratios; the one-rank cases alternate HTA and dagprof run by run, and "cpu range" is the
lowest and highest ratio of one round). Cases:
- one rank, cold: ``read_kineto(file)`` vs ``TraceAnalysis(trace_dir=<folder with only that file>)``;
- a folder of N ranks, cold: ``read_trace_dir(folder, use_cache=False)`` (parallel processes)
  vs ``TraceAnalysis(trace_dir=folder)`` (HTA's own multiprocessing pool);
- the same folder again through dagprof's parse cache (the user cache folder), per rank.
The N-rank folder replicates one public rank trace with ``distributedInfo.rank`` rewritten to
0..N-1 (a textual edit of that one object; events untouched), written as .json.gz.
Peak RSS is the largest single process (the measured one by VmHWM, or any of its workers), in MiB.
"speed" is the wall-time ratio (events/s); "cpu" the ratio of CPU seconds (the process plus its
workers), which stays meaningful when other jobs share the cores and parallel workers starve.

    python bench/bench_load.py [--reps 3] [--ranks 8] [--data DIR] [--hta-python PY]

in an environment with dagprof and HolisticTraceAnalysis (``pip install -e '.[bench]'``; the header line says
whether ISA-L's gunzip, a dagprof dependency where it has wheels, was there), or with HTA in
another environment whose interpreter ``--hta-python`` (or ``DAGPROF_HTA_PYTHON``) names; DIR defaults to
../shared/data beside the repository (see bench/benchdata.py). ``--ranks 0`` skips the folder cases.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import add_data_argument, require  # noqa: E402

FILES = {  # relative to --data
    "df_index_resolver (216k events, V100)": "kineto-public/df_index_resolver/df_index_resolver.json.gz",
    "nccl_data (40k events, A100)": "kineto-public/nccl_parser_config/nccl_data.json.gz",
    "ns_resolution rank 0 (GPU)": "kineto-public/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "owlv2 (TraceLens, H100)": "kineto-corpus/tracelens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz",
    "param resnet (112k events, RTX 2080 Ti)": "kineto-corpus/param/resnet_kineto.json.gz",
    "tb_plugin resnet50 (76k events, V100)": "kineto-corpus/kineto/tb_plugin_samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",
}

_CHILD = r"""
import json, os, resource, sys, time, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
tool, target = sys.argv[1], sys.argv[2]
if tool == "hta":
    from hta.trace_analysis import TraceAnalysis
    run = lambda: TraceAnalysis(trace_dir=target)
elif tool == "dagprof-file":
    from dagprof.traces.kineto import read_kineto
    run = lambda: read_kineto(target)
elif tool == "dagprof-dir":
    from dagprof.traces.kineto_dir import read_trace_dir
    run = lambda: read_trace_dir(target, use_cache=False)
elif tool == "dagprof-cached":
    from dagprof.traces.kineto_dir import read_trace_dir
    read_trace_dir(target)  # fills the cache if needed; the measured call below hits it
    run = lambda: read_trace_dir(target)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
# The imports' aftermath is not the load's either: numpy's OpenBLAS threads spin for about 0.1 s after import on an
# idle machine. Wait (at most 3 s) until no thread of the process burns CPU, the same for both tools.
t0, last = time.perf_counter(), cpu()
while time.perf_counter() - t0 < 3:
    time.sleep(0.05)
    now = cpu()
    if now - last < 0.002:
        break
    last = now
t, c = time.perf_counter(), cpu()
run()
wall, cpu_s = time.perf_counter() - t, cpu() - c
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would inherit its parent's peak
own = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall": wall, "cpu": cpu_s, "rss_mib": max(own, kids) / 1024}))
"""


def run_child(tool: str, target: str, python: str = sys.executable) -> dict[str, float]:
    out = subprocess.run([python, "-c", _CHILD, tool, target], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{tool} on {target} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu", "rss_mib")}


def interleaved(cases: list[tuple[str, str, str]], reps: int) -> list[list[dict[str, float]]]:
    """Each (tool, target, python) run ``reps`` times in alternation (one round runs each once): load from other jobs
    then falls on every tool alike."""
    runs: list[list[dict[str, float]]] = [[] for _ in cases]
    for _ in range(reps):
        for out, case in zip(runs, cases):
            out.append(run_child(*case))
    return runs


def measure(tool: str, target: str, reps: int, python: str = sys.executable) -> dict[str, float]:
    return median(interleaved([(tool, target, python)], reps)[0])


def event_count(path: str) -> int:
    with gzip.open(path, "rb") as f:
        return len(json.load(f)["traceEvents"])


def replicate(src: str, ranks: int, folder: str) -> None:
    with gzip.open(src, "rb") as f:
        text = f.read()
    m = re.search(rb'"distributedInfo"\s*:\s*\{[^{}]*\}', text)
    if not m:
        raise SystemExit(f"{src}: no flat distributedInfo object to rewrite")
    info = json.loads(text[m.start():m.end()].split(b":", 1)[1])
    for r in range(ranks):
        info.update(rank=r, world_size=ranks)
        body = text[:m.start()] + b'"distributedInfo": ' + json.dumps(info).encode() + text[m.end():]
        with gzip.open(os.path.join(folder, f"rank-{r}.json.gz"), "wb", compresslevel=1) as f:
            f.write(body)


def row(label: str, events: int, hta: dict[str, float], ours: dict[str, float], spread: str = "") -> str:
    return (f"{label:<44} {events / hta['wall']:>12,.0f} {events / ours['wall']:>12,.0f} {hta['wall'] / ours['wall']:>7.1f}x"
            f" {hta['cpu'] / max(ours['cpu'], 1e-9):>7.1f}x {spread:>11} {hta['rss_mib']:>8.0f} {ours['rss_mib']:>8.0f}"
            f" {ours['rss_mib'] / hta['rss_mib']:>6.2f}")


def cpu_spread(hta: list[dict[str, float]], ours: list[dict[str, float]]) -> str:
    """The lowest and highest CPU ratio of a round (HTA's run over dagprof's run beside it)."""
    ratios = [h["cpu"] / max(o["cpu"], 1e-9) for h, o in zip(hta, ours)]
    return f"{min(ratios):.1f}-{max(ratios):.1f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--hta-python", default=os.environ.get("DAGPROF_HTA_PYTHON", sys.executable),
                    help="an interpreter that imports hta (default: this one)")
    add_data_argument(ap)
    args = ap.parse_args()
    files = {label: str(require(args.data) / rel) for label, rel in FILES.items()}
    import importlib.metadata as md

    hta_version = subprocess.run([args.hta_python, "-c", "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"],
                                 capture_output=True, text=True).stdout.strip() or "?"
    hta = lambda target, reps: measure("hta", target, reps, args.hta_python)  # noqa: E731
    import importlib.util

    gunzip = "ISA-L" if importlib.util.find_spec("isal") else "zlib (no isal installed)"
    print(f"HTA {hta_version} vs dagprof {md.version('dagprof')}; median of {args.reps} interleaved rounds; "
          f"{os.cpu_count()} CPUs (shared, load average {os.getloadavg()[0]:.2f} at start); dagprof's gunzip: {gunzip}")
    print(f"{'case':<44} {'HTA ev/s':>12} {'dagprof ev/s':>12} {'speed':>8} {'cpu':>8} {'cpu range':>11} {'HTA MiB':>8}"
          f" {'ours MiB':>8} {'mem':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in files.items():
            solo = os.path.join(tmp, label.split()[0])
            os.makedirs(solo)
            os.symlink(path, os.path.join(solo, os.path.basename(path)))
            n = event_count(path)
            theirs, ours = interleaved([("hta", solo, args.hta_python), ("dagprof-file", path, sys.executable)], args.reps)
            print(row(f"1 rank cold: {label}", n, median(theirs), median(ours), cpu_spread(theirs, ours)), flush=True)
        if args.ranks <= 0:
            print(f"load average at the end: {os.getloadavg()[0]:.2f}")
            return
        folder = os.path.join(tmp, "ranks")
        os.makedirs(folder)
        src = files["df_index_resolver (216k events, V100)"]
        replicate(src, args.ranks, folder)
        n = event_count(src) * args.ranks
        reps = max(1, args.reps - 1)
        theirs = hta(folder, reps)
        print(row(f"{args.ranks} ranks cold (df_index_resolver x{args.ranks})", n, theirs, measure("dagprof-dir", folder, reps)), flush=True)
        cached = measure("dagprof-cached", folder, reps)
        print(row(f"{args.ranks} ranks cached", n, theirs, cached))
        print(f"cached re-load: {cached['wall'] / args.ranks * 1000:.1f} ms per rank")
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
