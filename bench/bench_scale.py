"""dagprof at scale: one huge trace, and cluster-sized trace sets built from real ones.

Two modes, each measured in fresh processes (time, and peak RSS of the largest process):

- ``big --events 500000,1000000,5000000``: one synthetic Kineto trace of tiny CPU ops (100 per
  ``ProfilerStep#N``, 20 distinct names, shapes recorded) through ``dagprof replay`` (its Perfetto
  traces included when asked, ``--write-traces``), and ``dagprof.load`` alone: its peak, the RSS it
  keeps per event after parsing (allocator slack included) and the bytes per event of the table's
  numpy columns and flows. Then ``dagprof analyze`` as a whole (time, peak RSS) and, in the same process, its walk of
  the critical path's gaps (``analysis.overhead.overhead_breakdown``, by array ops since branch overheadvec; one Python
  step per main-thread gap before): its wall and CPU time, and the most memory it allocated at once (tracemalloc, numpy's arrays included, in a
  second call after the timed one, whose time is taken off analyze's; analyze's times are its ``main``'s, imports left out).
- ``cluster --ranks 64,256,1024``: the real 8-rank DLRM set (``kineto-corpus/param/dlrm_kineto`` under
  ``--data``) replicated to N ranks: rank r is worker r mod 8 with ``distributedInfo`` rewritten, a
  per-rank clock offset (up to +-50 ms) and a per-rank speed jitter (every duration and gap scaled by
  1 +- 3 %, which keeps nesting and the order of collectives). ``dagprof analyze`` on each size, and
  HolisticTraceAnalysis's ``TraceAnalysis`` at the sizes given by ``--hta-ranks`` (``--hta-python``:
  an interpreter that imports ``hta``).

The traces are written to a temporary folder (``--tmp``), never into the repository.

    python bench/bench_scale.py big [--events 500000,1000000] [--write-traces]
    python bench/bench_scale.py cluster [--ranks 64,256,1024] [--hta-ranks 64] [--hta-python PY] [--data DIR] [--ray]

``cluster --ray`` (root, and a Python with ray: ``pip install 'dagprof[ray]'``) also starts a 2-node Ray cluster on this
machine: the head in the root network namespace, a worker node in its own namespace over a veth pair, one CPU each. Each
size is analysed again with ``--ray`` (cold parse cache): its time, the driver's peak RSS, each node's peak memory (PSS of
its Ray processes, sampled), and whether its JSON equals the local one. The namespace and the processes go afterwards.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import add_data_argument, require  # noqa: E402

DLRM = "kineto-corpus/param/dlrm_kineto"
OPS_PER_STEP = 100


# ---------------------------------------------------------------- generators
def write_big(path: str, events: int) -> int:
    """A Kineto trace of ``events`` tiny CPU ops on one thread, written as it is generated (bounded memory)."""
    steps = max(1, events // OPS_PER_STEP)
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "traceEvents": [\n')
        ts = 1_000_000.0
        first = True
        for s in range(steps):
            step_dur = OPS_PER_STEP * 3.0
            rows = [f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": 1, "tid": 1, '
                    f'"ts": {ts:.3f}, "dur": {step_dur:.3f}}}']
            for j in range(OPS_PER_STEP - 1):
                rows.append(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{j % 20}", "pid": 1, "tid": 1, '
                            f'"ts": {ts + 1 + 3 * j:.3f}, "dur": 2.0, "args": {{"External id": {s * OPS_PER_STEP + j}, '
                            f'"Input Dims": [[64, 64], [64]], "Input type": ["float", "float"]}}}}')
            f.write(("" if first else ",\n") + ",\n".join(rows))
            first = False
            ts += step_dur + 1
        f.write('\n]}\n')
    return steps * OPS_PER_STEP


def write_cluster(src_dir: str, ranks: int, out: str, seed: int = 0) -> int:
    """``ranks`` rank files from the real DLRM set: distributedInfo rewritten, per-rank clock offset and speed jitter."""
    srcs = sorted(Path(src_dir).glob("*.json*"))
    docs = []
    for p in srcs:
        with (gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")) as f:
            docs.append(msgspec.json.decode(f.read()))
    rng = random.Random(seed)
    total = 0
    os.makedirs(out, exist_ok=True)
    for r in range(ranks):
        doc = dict(docs[r % len(docs)])
        offset, speed = rng.uniform(-50_000, 50_000), 1 + rng.uniform(-0.03, 0.03)
        t0 = min(e["ts"] for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float)))
        evs = []
        for e in doc["traceEvents"]:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = round(t0 + (e["ts"] - t0) * speed + offset, 3)
            if isinstance(e.get("dur"), (int, float)):
                e["dur"] = round(e["dur"] * speed, 3)
            evs.append(e)
        doc["traceEvents"] = evs
        doc["distributedInfo"] = dict(doc.get("distributedInfo") or {}, rank=r, world_size=ranks)
        total += len(evs)
        with open(os.path.join(out, f"rank-{r}.json"), "wb") as f:
            f.write(msgspec.json.encode(doc))
    return total


# ---------------------------------------------------------------- measuring
_LOAD_CHILD = r"""
import json, sys, time, gc
def rss(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
import dagprof
base = rss("VmRSS")
t = time.perf_counter()
run = dagprof.load(sys.argv[1])
wall = time.perf_counter() - t
gc.collect()
n = sum(len(r.events.start) for r in run.ranks)
table = sum(getattr(r.events, c).nbytes for r in run.ranks for c in r.events.COLUMNS) + sum(r.flows.nbytes + r.flow_rule.nbytes for r in run.ranks)
print(json.dumps({"wall": wall, "events": n, "resident_b_per_event": (rss("VmRSS") - base) / max(n, 1), "table_b_per_event": table / max(n, 1),
                  "peak_mib": rss("VmHWM") / 2**20}))
"""

_ANALYZE_CHILD = r"""
import importlib, json, sys, time, tracemalloc
cp = importlib.import_module("dagprof.analysis.critical_path")  # the module: the package re-exports its function by that name
from dagprof.cli.main import main
inner, calls = cp.overhead_breakdown, []
def measured(g, nodes, category):
    t, c = time.perf_counter(), time.process_time()
    out = inner(g, nodes, category)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    tracemalloc.start()
    inner(g, nodes, category)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    traced[0] += time.perf_counter() - t
    traced[1] += time.process_time() - c
    calls.append({"wall": wall, "cpu": cpu, "peak_mib": peak / 2**20, "path": int(len(nodes)), "gaps": int((g.gap[nodes] > 0).sum())})
    return out
cp.overhead_breakdown = measured
traced = [0.0, 0.0]
t, c = time.perf_counter(), time.process_time()
code = main(sys.argv[1:])
print(json.dumps({"code": code, "wall": time.perf_counter() - t - traced[0], "cpu": time.process_time() - c - traced[1], "overhead": calls}))
"""

_HTA_CHILD = r"""
import json, sys, time, logging, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
print(json.dumps({"wall": time.perf_counter() - t}))
"""


class Timed(NamedTuple):
    wall: float  # s
    peak: float  # MiB: peak RSS of the largest process
    out: str  # stdout
    cpu: float  # s: the process and its waited-for workers


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> Timed:
    """Wall and CPU time, peak RSS and stdout of a fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, ru = os.wait4(proc.pid, 0)  # this process tree's own peak (its waited-for workers included)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[-6:])} failed ({proc.returncode}):\n{err.read().decode()[-2000:]}")
        return Timed(wall, ru.ru_maxrss / 1024, out.read().decode(), ru.ru_utime + ru.ru_stime)


def _dagprof_env(tmp: str) -> dict[str, str]:
    """This checkout's dagprof, no progress bars, and its parse cache in ``tmp`` (cold, and gone afterwards)."""
    env = dict(os.environ, DAGPROF_PROGRESS="0", DAGPROF_CACHE_DIR=os.path.join(tmp, "cache"))
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def cli(args: list[str]) -> list[str]:
    return [sys.executable, "-c", "import sys; from dagprof.cli.main import main; sys.exit(main())", *args]


def big(args: argparse.Namespace, tmp: str) -> None:
    print(f"{'events':>10} {'MB':>7} {'load s':>8} {'load MiB':>9} {'B/event':>8} {'table B/ev':>10} {'replay s':>9} {'CPU s':>7}"
          f" {'replay MiB':>11} {'analyze s':>10} {'CPU s':>7} {'analyze MiB':>12} {'overhead s':>11} {'CPU s':>7} {'overhead MiB':>13}"
          f" {'path gaps':>10}")
    for n in [int(x) for x in args.events.split(",")]:
        path = os.path.join(tmp, f"big-{n}.json")
        n = write_big(path, n)
        size = os.path.getsize(path) / 1e6
        load = json.loads(timed([sys.executable, "-c", _LOAD_CHILD, path], _dagprof_env(tmp)).out.strip().splitlines()[-1])
        flags = ["--write-traces"] if args.write_traces else []
        replay = timed(cli(["replay", path, "-o", os.path.join(tmp, f"out-{n}"), "--json", *flags]), _dagprof_env(tmp))
        run = timed([sys.executable, "-c", _ANALYZE_CHILD, "analyze", path, "--json"], _dagprof_env(tmp), cwd=tmp)
        an = json.loads(run.out.strip().splitlines()[-1])  # each overhead_breakdown call: analyze walks one critical path
        walk = (sum(c["wall"] for c in an["overhead"]), sum(c["cpu"] for c in an["overhead"]),
                max((c["peak_mib"] for c in an["overhead"]), default=0.0), sum(c["gaps"] for c in an["overhead"]))
        print(f"{n:>10,} {size:>7.0f} {load['wall']:>8.1f} {load['peak_mib']:>9.0f} {load['resident_b_per_event']:>8.0f} {load['table_b_per_event']:>10.0f}"
              f" {replay.wall:>9.1f} {replay.cpu:>7.1f} {replay.peak:>11.0f} {an['wall']:>10.1f} {an['cpu']:>7.1f}"
              f" {run.peak:>12.0f} {walk[0]:>11.2f} {walk[1]:>7.2f} {walk[2]:>13.1f} {walk[3]:>10,}", flush=True)
        os.remove(path)


# ---------------------------------------------------------------- a 2-node Ray cluster on this machine
RAY_NET, RAY_NS, RAY_PORT = "10.77.0", "dagprof-rayw", 6391  # the worker node's namespace and the link's addresses


def _sh(*cmd: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed ({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")


def _procs() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, network namespace, command line) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
                cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                out[int(d)] = (int(stat.rsplit(")", 1)[1].split()[1]), os.readlink(f"/proc/{d}/ns/net"), cmd)
            except OSError:
                pass
    return out


def _ray_procs(temp_dir: str) -> dict[int, str]:
    """pid -> network namespace of the cluster's own processes: those naming its temp dir, and their descendants."""
    procs = _procs()
    ours = {pid for pid, (_, _, cmd) in procs.items() if temp_dir in cmd}
    grew = True
    while grew:
        kids = {pid for pid, (ppid, _, _) in procs.items() if ppid in ours} - ours
        ours |= kids
        grew = bool(kids)
    return {pid: procs[pid][1] for pid in ours}


class NodeMemory(threading.Thread):
    """Peak proportional set size (shared object-store pages split between their users) of each node's processes, sampled;
    and per node, how many samples saw a parse task running there (Ray titles a busy worker ``ray::<task>``)."""

    def __init__(self, temp_dir: str):
        super().__init__(daemon=True)
        self.temp_dir, self.peak, self.parsing, self.stop = temp_dir, {}, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            now: dict[str, int] = {}
            for pid, ns in _ray_procs(self.temp_dir).items():
                try:
                    if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"ray::_parse_task"):
                        self.parsing[ns] = self.parsing.get(ns, 0) + 1
                    pss = next(line for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Pss:"))
                    now[ns] = now.get(ns, 0) + int(pss.split()[1])
                except (OSError, StopIteration):
                    pass
            for ns, kib in now.items():
                self.peak[ns] = max(self.peak.get(ns, 0), kib)


@contextlib.contextmanager
def ray_cluster(tmp: str, env: dict[str, str]):
    """A head node (root namespace, one CPU) and a worker node (one CPU) in its own network namespace over a veth
    pair; yields the head's address. Everything is removed afterwards, processes by pid."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short
    common = ["--num-cpus", "1", "--object-store-memory", str(300 << 20), "--disable-usage-stats", "--temp-dir", temp_dir]
    try:
        _sh("ip", "netns", "add", RAY_NS)
        _sh("ip", "link", "add", "dgp-rayh", "type", "veth", "peer", "name", "dgp-rayw", "netns", RAY_NS)
        _sh("ip", "addr", "add", f"{RAY_NET}.1/24", "dev", "dgp-rayh")
        _sh("ip", "link", "set", "dgp-rayh", "up")
        for cmd in (["addr", "add", f"{RAY_NET}.2/24", "dev", "dgp-rayw"], ["link", "set", "dgp-rayw", "up"], ["link", "set", "lo", "up"]):
            _sh("ip", "netns", "exec", RAY_NS, "ip", *cmd)
        head = f"{RAY_NET}.1:{RAY_PORT}"
        _sh(ray, "start", "--head", "--node-ip-address", f"{RAY_NET}.1", "--port", str(RAY_PORT), "--include-dashboard", "false", *common, env=env)
        _sh("ip", "netns", "exec", RAY_NS, ray, "start", "--address", head, "--node-ip-address", f"{RAY_NET}.2", *common, env=env)
        yield head, temp_dir
    finally:
        for sig in (15, 9):
            for pid in _ray_procs(temp_dir):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            time.sleep(2)
        subprocess.run(["ip", "link", "del", "dgp-rayh"], capture_output=True)
        subprocess.run(["ip", "netns", "del", RAY_NS], capture_output=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def cluster(args: argparse.Namespace, tmp: str) -> None:
    src = str(require(args.data) / DLRM)
    hta_sizes = {int(x) for x in args.hta_ranks.split(",") if x}
    with contextlib.ExitStack() as stack:
        if args.ray:
            # the workers' parse cache cold too; token auth (the token in ~/.ray, the same on both nodes here), which Ray asks for
            # as soon as a node joins from another address
            ray_env = dict(_dagprof_env(tmp), DAGPROF_CACHE_DIR=os.path.join(tmp, "cache-ray"), RAY_AUTH_MODE="token")
            head, temp_dir = stack.enter_context(ray_cluster(tmp, ray_env))
            print(f"Ray: head {head} (root namespace), worker {RAY_NET}.2 (namespace {RAY_NS}), one CPU each")
        print(f"{'ranks':>6} {'events':>10} {'analyze s':>10} {'analyze MiB':>12} {'HTA s':>8} {'HTA MiB':>8}"
              + (f" {'Ray s':>7} {'driver MiB':>10} {'head MiB':>9} {'worker MiB':>10} {'parsing h/w':>11} {'same':>5}" if args.ray else ""))
        for ranks in [int(x) for x in args.ranks.split(",")]:
            folder = os.path.join(tmp, f"dlrm-{ranks}")
            n = write_cluster(src, ranks, folder)
            wall, peak, local, _ = timed(cli(["analyze", folder, "--json"]), _dagprof_env(tmp), cwd=tmp)  # anything it writes stays in tmp
            hta = "-", "-"
            if ranks in hta_sizes:
                hwall, hpeak, *_ = timed([args.hta_python, "-c", _HTA_CHILD, folder])
                hta = f"{hwall:.1f}", f"{hpeak:.0f}"
            line = f"{ranks:>6} {n:>10,} {wall:>10.1f} {peak:>12.0f} {hta[0]:>8} {hta[1]:>8}"
            if args.ray:
                mem = NodeMemory(temp_dir)
                mem.start()
                rwall, rpeak, on_ray, _ = timed(cli(["analyze", folder, "--json", "--ray", head]), ray_env, cwd=tmp)
                mem.stop.set()
                mem.join()
                root, ns = os.readlink("/proc/self/ns/net"), os.readlink(f"/proc/{_worker_pid(temp_dir)}/ns/net")
                line += (f" {rwall:>7.1f} {rpeak:>10.0f} {mem.peak.get(root, 0) / 1024:>9.0f} {mem.peak.get(ns, 0) / 1024:>10.0f}"
                         f" {mem.parsing.get(root, 0):>5}/{mem.parsing.get(ns, 0):<5}"
                         f" {'yes' if json.loads(on_ray) == json.loads(local) else 'NO':>5}")
            print(line, flush=True)
            shutil.rmtree(folder)


def _worker_pid(temp_dir: str) -> int:
    """A process of the worker node (outside this namespace)."""
    root = os.readlink("/proc/self/ns/net")
    return next(pid for pid, ns in _ray_procs(temp_dir).items() if ns != root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("big")
    b.add_argument("--events", default="500000,1000000")
    b.add_argument("--write-traces", action="store_true", help="replay writes its Perfetto traces too (however large)")
    c = sub.add_parser("cluster")
    c.add_argument("--ranks", default="64,256,1024")
    c.add_argument("--hta-ranks", default="64", help="sizes at which HTA runs too (comma-separated; empty: none)")
    c.add_argument("--hta-python", default=os.environ.get("DAGPROF_HTA_PYTHON", sys.executable))
    c.add_argument("--ray", action="store_true", help="also analyze each size on a 2-node Ray cluster started here (root; the worker node "
                   "in its own network namespace): time, peak memory per node, and whether the results equal the local ones")
    add_data_argument(c)
    for p in (b, c):
        p.add_argument("--tmp", help="folder for the generated traces (default: a new temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        (big if args.mode == "big" else cluster)(args, tmp)


if __name__ == "__main__":
    main()
