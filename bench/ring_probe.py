"""The pace of a gloo ring when a host's ranks outnumber its cores, measured apart from any training job: N
torch.distributed gloo ranks, every thread pinned to the same C cores, run small all-reduces back to back (a few kB:
loopback moves them in microseconds, so a ring step's time is the ranks' threads getting a core). Per (N, C): the
all-reduce's time per ring step (2(N-1) a call), the median over ranks of each repeat, and a rank's process CPU per ring
step. And the scheduler's quantum as enforced: two spinning processes on one core, the median run one gets before the
other takes the core (a periodic tick's multiple where the kernel preempts at the tick).

Issue 21 (jaxring67): JAX's 4 workers on 2 cores took ~1 ms per gloo call and ring step whatever the script; this asks
the host, not the jobs, what a ring step costs beyond the cores.

    python bench/ring_probe.py [--ranks 2,3,4] [--cores 1,2] [--calls 300] [--floats 1024] [--repeats 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

SPIN_S = 1.5  # each quantum spinner's run
GAP_NS = 50_000  # a clock gap this long in a spin loop is a time off the core


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, n: int, cores: int, port: int, calls: int, floats: int, repeats: int, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    for tid in os.listdir("/proc/self/task"):  # every thread so far (imported unpinned: faster); gloo's inherit it
        os.sched_setaffinity(int(tid), set(range(cores)))

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    t = torch.ones(floats)
    for _ in range(30):
        dist.all_reduce(t)
    got = []
    for _ in range(repeats):
        dist.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            dist.all_reduce(t)
        got.append((time.perf_counter() - w0, time.process_time() - c0))
    dist.destroy_process_group()
    out.put((rank, got))


def ring_pace(n: int, cores: int, calls: int, floats: int, repeats: int) -> dict:
    """Per repeat, the median over ranks of ms per ring step, and a rank's process CPU per ring step (ms, median)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, n, cores, port, calls, floats, repeats, out)) for r in range(n)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    steps = calls * 2 * (n - 1)
    wall = [statistics.median(got[r][k][0] for r in got) * 1e3 / steps for k in range(repeats)]
    cpu = [statistics.median(got[r][k][1] for r in got) * 1e3 / steps for k in range(repeats)]
    return {"ranks": n, "cores": cores, "ms_per_ring_step": wall, "cpu_ms_per_ring_step": cpu}


def _spin(seconds: float, out: mp.Queue) -> None:
    os.sched_setaffinity(0, {0})
    runs, start = [], time.perf_counter_ns()
    last = run_from = start
    while (now := time.perf_counter_ns()) - start < seconds * 1e9:
        if now - last > GAP_NS:
            runs.append(last - run_from)
            run_from = now
        last = now
    out.put(runs[1:])


def quantum_ms() -> dict:
    """Two spinners on core 0: the median and quartiles of a run on the core between two times off it, ms."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(SPIN_S, out)) for _ in range(2)]
    for p in procs:
        p.start()
    runs = [r for _ in procs for r in out.get(timeout=60)]
    for p in procs:
        p.join()
    q = statistics.quantiles([r / 1e6 for r in runs], n=4) if len(runs) > 1 else [0.0, 0.0, 0.0]
    return {"runs": len(runs), "median_ms": q[1], "q25_ms": q[0], "q75_ms": q[2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--cores", default="2", help="the cores each ring's threads are pinned to, a list: 1,2")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--floats", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cores = [int(c) for c in a.cores.split(",")]
    if min(cores) < 1 or max(cores) > len(os.sched_getaffinity(0)):
        ap.error(f"--cores must be 1..{len(os.sched_getaffinity(0))}")
    q = quantum_ms()  # each result printed as it comes (one JSON object a line with --json): a time limit keeps the ones done
    print(json.dumps({"quantum": q}) if a.json else
          f"quantum (2 spinners, 1 core): median {q['median_ms']:.2f} ms (quartiles {q['q25_ms']:.2f}-{q['q75_ms']:.2f}; {q['runs']} runs)",
          flush=True)
    for c in cores:
        for n in a.ranks.split(","):
            r = ring_pace(int(n), c, a.calls, a.floats, a.repeats)
            w, cpu = r["ms_per_ring_step"], r["cpu_ms_per_ring_step"]
            print(json.dumps(r) if a.json else f"{n} ranks on {c} cores: {min(w):.3f}-{max(w):.3f} ms a ring step (repeats), "
                  f"a rank's CPU {min(cpu):.3f}-{max(cpu):.3f} ms a ring step", flush=True)


if __name__ == "__main__":
    main()
