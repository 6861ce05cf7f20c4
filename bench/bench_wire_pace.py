"""Does a wire-bound DDP run compute slower than one that moves little, and is it the transfer's CPU? Runs of one job, apart.

``bench_strategy_pace.py`` found the kept PowerSGD runs' forward x0.78 of the wire-bound control's, folder by folder: a
run-level effect no single profile showed. This separates its candidates on an emulated 2-host cluster (root; each rank's
egress shaped by ``tc tbf``, ``--link``), the held-out embedding job (``ddp_heldout_embed.py``'s model, one thread per
rank), each run a fresh pair of processes, the three ways interleaved round by round:

- ``wire``: DDP's defaults, its buckets on the shaped wire (the defaults' and the lossless rounds' runs);
- ``idle``: DDP with a comm hook that returns at once: the same compute, nothing on the wire;
- ``powersgd``: torch's PowerSGD hook, rank 2, chained as ``dagprof.apply`` deploys it (the lossy rounds' runs).

Per step and rank: the forward's, backward's and optimizer's wall and the training thread's CPU and waits for a core
(``/proc`` schedstat), the other threads' CPU (gloo's); per run: the machine's softirq and steal time (``/proc/stat``) and
NET_RX/TIMER softirqs (``/proc/softirqs``), and the bytes the rank's port sent. After the steps, each run probes the
transfer's CPU directly: forwards of the same model back to back while an all-reduce of the gradients' bytes is in
flight, against as many forwards with the wire idle, blocks interleaved: the CPU the wire takes from the compute lane per
byte (forward wall and CPU busy over idle, gloo's threads' CPU per MB).

    sudo .venv/bin/python bench/bench_wire_pace.py --rounds 2 [--link 200Mbit] [--json FILE]
    .venv/bin/python bench/bench_wire_pace.py --summary FILE...

On 2026-12-05 (200 Mbit/s, 4 rounds in two runs, 17:29-17:34 at load 18 -> 14 and 17:52-17:57 at 26 -> 24): the
forward's thread CPU 2.31 / 2.28 / 2.37 ms a step (wire / idle / powersgd), idle over wire x0.99 (0.91-1.14) and PowerSGD
over wire x1.04 (0.92-1.17) per round and rank, where its wall moved 0.13-4.21x with the waits for a core: the run-level
pace is the load's, not the wire's. The probe: per MB a rank sent, gloo's threads 4.3 ms of CPU and the machine's softirq
16.7 ms; a forward beside it 2.2x its CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODES = ("wire", "idle", "powersgd")
WARMUP = 4  # steps left out: DDP rebuilds its buckets after the first, PowerSGD starts compressing at the second
PROBE_BLOCKS = 4


def thread_sched(tid: int | str = "thread-self") -> tuple[int, int]:
    """(CPU, run-queue wait) ns of one thread of this process (``/proc`` schedstat)."""
    path = "/proc/thread-self/schedstat" if tid == "thread-self" else f"/proc/self/task/{tid}/schedstat"
    with open(path) as f:
        cpu, wait = f.read().split()[:2]
    return int(cpu), int(wait)


def others_cpu(main_tid: int) -> int:
    """CPU ns of every thread of this process but ``main_tid`` (gloo's, autograd's)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != main_tid:
            try:
                total += thread_sched(tid)[0]
            except OSError:  # a thread that ended meanwhile
                pass
    return total


def machine() -> dict[str, float]:
    """The machine's softirq, irq and steal time (ms, all CPUs) and its NET_RX, NET_TX and TIMER+HRTIMER softirq counts."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    tick = 1e3 / os.sysconf("SC_CLK_TCK")
    out = {"irq_ms": cpu[5] * tick, "softirq_ms": cpu[6] * tick, "steal_ms": cpu[7] * tick}
    with open("/proc/softirqs") as f:
        for line in f:
            name, *counts = line.split()
            if name in ("NET_RX:", "NET_TX:", "TIMER:", "HRTIMER:"):
                key = "timers" if "TIMER" in name else name[:-1].lower()
                out[key] = out.get(key, 0) + sum(int(c) for c in counts)
    return out


def tx_bytes() -> int:
    """Bytes this namespace's interfaces sent (its own ``/proc/net/dev``)."""
    with open("/proc/net/dev") as f:
        return sum(int(line.split(":")[1].split()[8]) for line in f.readlines()[2:] if not line.strip().startswith("lo:"))


def job(out: str, mode: str, steps: int) -> None:
    """One rank of one run: the embedding job ``mode``'s way; writes its per-step and probe timings to ``out``.RANK."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from fsdp1_heldout import CTR
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect.deploy.apply import chained

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(CTR(16384, 64, 32, 512))
    if mode == "idle":
        def returns_at_once(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        model.register_comm_hook(None, returns_at_once)
    elif mode == "powersgd":
        model.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2),
                                    chained(psgd.powerSGD_hook))  # as dagprof.apply deploys it
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    main_tid = threading.get_native_id()
    rows = []

    def timed(fn):  # (wall, CPU, waits for a core) ms; the CPU by the thread's clock (schedstat's lags the running thread)
        t0, c0, w0 = time.perf_counter(), time.thread_time_ns(), thread_sched()[1]
        r = fn()
        c1, w1 = time.thread_time_ns(), thread_sched()[1]
        return r, ((time.perf_counter() - t0) * 1e3, (c1 - c0) / 1e6, (w1 - w0) / 1e6)

    def batch():
        ids = torch.randint(0, 16384, (64, 20), generator=g)
        return ids, torch.randn(64, 32, generator=g)

    m0, tx0 = None, None
    for s in range(steps):
        if s == WARMUP:
            dist.barrier()
            m0, tx0, t0 = machine(), tx_bytes(), time.perf_counter()
        ids, dense = batch()
        o0 = others_cpu(main_tid)
        loss, fw = timed(lambda: F.binary_cross_entropy_with_logits(model(ids, dense), (ids[:, 0] % 2).float()))
        opt.zero_grad()
        _, bw = timed(loss.backward)
        _, up = timed(opt.step)
        rows.append({"step": s, "forward": fw, "backward": bw, "optimizer": up, "others_cpu_ms": (others_cpu(main_tid) - o0) / 1e6})
    m1, tx1, wall = machine(), tx_bytes(), time.perf_counter() - t0
    # the probe: forwards with an all-reduce of the gradients' bytes in flight, against as many with the wire idle
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buf = torch.zeros(nbytes // 4)
    probe = []
    with torch.no_grad():
        for _ in range(PROBE_BLOCKS):
            dist.barrier()
            o0, tx_a, ma = others_cpu(main_tid), tx_bytes(), machine()
            work = dist.all_reduce(buf, async_op=True)
            busy = []
            while not work.is_completed():
                busy.append(timed(lambda: model.module(ids, dense))[1])
            work.wait()
            gloo_ms, sent, mb = (others_cpu(main_tid) - o0) / 1e6, tx_bytes() - tx_a, machine()
            dist.barrier()
            idle = [timed(lambda: model.module(ids, dense))[1] for _ in busy]
            mi = machine()
            probe.append({"busy": busy, "idle": idle, "gloo_cpu_ms": gloo_ms, "sent_bytes": sent,
                          "softirq_busy_ms": mb["softirq_ms"] - ma["softirq_ms"], "softirq_idle_ms": mi["softirq_ms"] - mb["softirq_ms"]})
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"mode": mode, "rank": rank, "steps": rows, "wall_s": wall, "sent_bytes": tx1 - tx0,
                   "machine": {k: m1[k] - m0[k] for k in m0}, "probe": probe, "probe_bytes": nbytes}, f)
    dist.destroy_process_group()


def summary(runs: list[dict]) -> None:
    """Per way: medians over runs of each run's median step, per rank-run; the probe's busy over idle."""
    med = statistics.median
    for mode in MODES:
        got = [r for r in runs if r["mode"] == mode]
        if not got:
            continue
        line = []
        for part in ("forward", "backward", "optimizer"):
            per = [[med(s[part][k] for s in r["steps"][WARMUP:]) for r in got] for k in range(3)]
            rest = med(med(s[part][0] - s[part][1] - s[part][2] for s in r["steps"][WARMUP:]) for r in got)
            line.append(f"{part} wall {med(per[0]):.2f} cpu {med(per[1]):.2f} wait {med(per[2]):.2f} rest {rest:.2f}")
        n = [len(r["steps"]) - WARMUP for r in got]
        m = {k: med(r["machine"][k] / x for r, x in zip(got, n)) for k in got[0]["machine"]}
        oth = med(med(s["others_cpu_ms"] for s in r["steps"][WARMUP:]) for r in got)
        sent = med(r["sent_bytes"] / x / 1e6 for r, x in zip(got, n))
        print(f"{mode:>8} ({len(got)} rank-runs), per step ms: " + "; ".join(line)
              + f"; other threads' CPU {oth:.2f}; sent {sent:.2f} MB; machine softirq {m['softirq_ms']:.2f} irq {m['irq_ms']:.2f} "
              f"steal {m['steal_ms']:.2f} ms, NET_RX {m['net_rx']:.0f} timers {m['timers']:.0f}")
    pairs: dict[tuple, dict[str, dict]] = {}  # the ways of one round and rank, side by side
    for r in runs:
        pairs.setdefault((r.get("batch", 0), r.get("round", 0), r.get("rank", 0)), {})[r["mode"]] = r
    for part in ("forward", "backward", "optimizer"):
        for other in MODES[1:]:
            for k, name in ((0, "wall"), (1, "cpu")):
                x = [med(p[other]["steps"][s][part][k] for s in range(WARMUP, len(p[other]["steps"])))
                     / med(p["wire"]["steps"][s][part][k] for s in range(WARMUP, len(p["wire"]["steps"])))
                     for p in pairs.values() if other in p and "wire" in p]
                if x and min(x) > 0:
                    print(f"{part} {name}, {other} over wire per round and rank: x{math.exp(statistics.mean(map(math.log, x))):.2f} "
                          f"({min(x):.2f}-{max(x):.2f}, {len(x)} pairs)")
    busy = [(b, i) for r in runs for p in r["probe"] for b, i in zip(p["busy"], p["idle"])]
    if busy:
        for k, name in ((0, "wall"), (1, "cpu"), (2, "wait")):
            print(f"probe forward {name}: busy {med(b[k] for b, _ in busy):.3f} ms, idle {med(i[k] for _, i in busy):.3f} ms "
                  f"(mean busy/idle x{statistics.mean(b[k] for b, _ in busy) / max(1e-9, statistics.mean(i[k] for _, i in busy)):.3f}, {len(busy)} pairs)")
        blocks = [p for r in runs for p in r["probe"]]
        mb = sum(p["sent_bytes"] for p in blocks) / 1e6
        per_mb = {name: sum(f(p) for p in blocks) / mb for name, f in (
            ("gloo's threads' CPU", lambda p: p["gloo_cpu_ms"]),
            ("the machine's softirq, busy less idle", lambda p: p["softirq_busy_ms"] - p["softirq_idle_ms"]),
            ("forward wall, busy less idle", lambda p: sum(b[0] for b in p["busy"]) - sum(i[0] for i in p["idle"])),
            ("forward CPU, busy less idle", lambda p: sum(b[1] for b in p["busy"]) - sum(i[1] for i in p["idle"])))}
        print(f"probe, ms per MB a rank sent ({mb:.0f} MB over {len(blocks)} blocks): " + "; ".join(f"{k} {v:.2f}" for k, v in per_mb.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--link", default="200Mbit")
    ap.add_argument("--json", default=None, help="write every rank-run here")
    ap.add_argument("--job", nargs=3, metavar=("OUT", "MODE", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--summary", nargs="+", metavar="JSON", help="run nothing: summarise --json files of earlier runs")
    args = ap.parse_args()
    if args.summary:
        summary([{**r, "batch": i} for i, path in enumerate(args.summary) for r in json.load(open(path))])
        return 0
    if args.job:
        job(args.job[0], args.job[1], int(args.job[2]))
        return 0
    from bench_powersgd_parts import emulated

    from dagprof.collect.jobs.netns import run_ranks

    runs = []
    print(f"load average before {os.getloadavg()[0]:.1f}", file=sys.stderr)
    with emulated("bench_wire_pace", args.link, None) as (work, cluster):
        if cluster is None:
            return 0
        for k in range(args.rounds):
            for mode in (MODES if k % 2 == 0 else MODES[::-1]):
                out = os.path.join(work, f"{mode}{k}")
                run_ranks([sys.executable, os.path.abspath(__file__), "--job", out, mode, str(args.steps)], 2,
                          os.path.join(work, f"logs-{mode}{k}"), cluster=cluster)
                for r in (0, 1):
                    with open(f"{out}.{r}") as f:
                        runs.append({**json.load(f), "round": k, "load": os.getloadavg()[0]})
                if args.json:  # after each run: a job cut short by a time limit keeps the runs before it
                    with open(args.json, "w") as f:
                        json.dump(runs, f)
    print(f"{args.link}, {args.rounds} rounds, load average after {os.getloadavg()[0]:.1f}")
    summary(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
