"""PowerSGD's first bucket's chain beside the backward, hand-off by hand-off: the callbacks' own CPU, their waits for a
core, and what is left (a thread asleep: the wire, the peer, a wake-up not yet given).

The held-out conv's first bucket (``ddp_heldout_conv.py``, the kept strategy's two buckets under PowerSGD rank 2) runs
its chain while the backward of its last layers still runs, and took 21-22 ms from its first all-reduce's issue to its
end in the strategy runs against 7-10 ms priced (docs/evidence.md, branch ``psgdconv``). This runs the same model and
strategy (``dagprof.apply``, chained) in one 2-rank job and marks, on the thread that runs each, the hook's entry, each
of its three all-reduces' issue and completion and the hook's end, reading at each mark every thread's schedstat (CPU,
time runnable but waiting for a core). Each hand-off -- the hook on the training thread, then the uncompressed
all-reduce to the P issue (the unpack), the P issue to the Q issue (the P all-reduce, orthogonalisation, Q = M^T P),
the Q issue to the end (the Q all-reduce, decode, error feedback) -- is split per rank into the callbacks' thread's
CPU and wait for a core, gloo's other threads' CPU and waits, the training thread's, and how long the peer issued the
all-reduce later. As root on an emulated 2-host cluster (``--link``), or ``--loopback`` (plain processes).

    sudo .venv/bin/python bench/bench_powersgd_chain.py --strategy KEPT/wI-R/lossy/strategy.json [--workload embed] [--steps 20] [--keep DIR]
    .venv/bin/python bench/bench_powersgd_chain.py --offline DIR   # the marks --keep kept, split again

A mark's own thread reads its CPU clock (its schedstat CPU is brought up to date only at a tick or a switch); a
completion's mark runs after the future woke its waiters, so the thread it woke may be ahead of it (``after`` a little
short, the all-reduce a little long). On 2026-12-06 07:01 (``/tmp/psgdconv``'s kept strategy, 200 Mbit/s, load 1.3,
24 steps, 40 rank-steps past the first 4; that run read the marking thread's CPU from schedstat too): the chain 17.6 ms
(p10-p90 12.1-25.3) from its first issue, ending as the backward did (median -0.03 ms from the last bucket's ready). Each
all-reduce 3.5 / 3.8 / 3.4 ms (uncompressed, P, Q; p90 11.2 / 7.5 / 6.3) against 1.4 / 1.2 / 2.8 ms for 4 / 16 / 64 KiB
chained on idle cores by ``calibrate --overlap`` minutes later: gloo's threads waited for a core 0.04 / 2.2 / 1.7 ms of
them, the peer issued at the same time (lag 0.00-0.05), the rest none of gloo's threads running or waiting. The
callbacks after each completion 0.13 / 1.6 / 2.5 ms, their idle price 0.05 / 1.27 / 2.17 (unpack / orthogonalisation
and Q = M^T P / decode and error feedback), waiting for a core 0.00 / 0.05 / 0.08. On loopback (``--loopback``, load 3-6
from other jobs: not the testbed's timing) their CPU, read on their own thread, was 2.6 / 3.4 ms for the middle and decode.
The held-out embedding's one bucket (``--workload embed``; its chain starts at the last gradient) on 2026-12-06 08:08
(load 3.1, 40 steps, 72 rank-steps): the chain 14.7 ms (p10-p90 10.6-21.0), its all-reduces 1.5 / 6.65 / 2.2 ms (the Q
one's gloo threads waiting for a core 1.4 of it), the callbacks 0.13 / 1.16 / 1.79 (the decode's CPU 1.72 against 1.08
idle), against 10.7 ms priced on its round's profile (docs/evidence.md, branch ``psgdfresh``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_powersgd_backward import workload  # noqa: E402
from bench_powersgd_parts import emulated  # noqa: E402


class Threads:
    """Every thread's schedstat (CPU ns, run-queue wait ns) of this process, read through files kept open."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def refresh(self) -> None:
        for tid in map(int, os.listdir("/proc/self/task")):
            if tid not in self._fds:
                try:
                    self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                except OSError:
                    pass

    def read(self) -> dict[int, tuple[int, int]]:
        out = {}
        for tid, fd in self._fds.items():
            try:
                f = os.pread(fd, 128, 0).split()
            except OSError:  # a thread that ended
                continue
            if f:
                out[tid] = (int(f[0]), int(f[1]))
        return out


def job(out: str, name: str, strategy: str, steps: int) -> None:
    """One rank: the held-out job ``name`` (conv, lstm, embed) under the kept strategy, its marks written to ``out``.RANK."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dagprof

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    base, loss = workload(name)
    threads = Threads()
    marks: list[list] = []  # [step, bucket, what, time, tid, {tid: (cpu, wait)}]
    cur = {"step": 0, "bucket": -1}
    plain_ar, plain_hook = dist.all_reduce, psgd.powerSGD_hook

    def mark(b: int, what: str) -> None:
        sched, tid = threads.read(), threading.get_native_id()
        if tid in sched:  # a running thread's schedstat CPU is brought up to date only at a tick or a switch: its own clock is
            sched[tid] = (time.thread_time_ns(), sched[tid][1])
        marks.append([cur["step"], b, what, time.perf_counter_ns(), tid, sched])

    def all_reduce(t, *a, **k):
        b = cur["bucket"]
        mark(b, "issue")
        work = plain_ar(t, *a, **k)
        work.get_future().then(lambda f: mark(b, "done"))
        return work

    def hook(state, bucket):
        b = cur["bucket"] = bucket.index()
        mark(b, "hook")
        return plain_hook(state, bucket).then(lambda f: (mark(b, "end"), f.value())[1])

    psgd.powerSGD_hook = hook  # dagprof.apply chains the module's hook as it finds it
    dist.all_reduce = all_reduce
    ddp = DDP(base)
    plain_register = ddp.register_comm_hook

    def register(state, outer):
        def ready(st, bucket):  # DDP requires the name "bucket"
            marks.append([cur["step"], -1, "ready", time.perf_counter_ns(), threading.get_native_id(), {}])
            return outer(st, bucket)

        plain_register(state, ready)

    ddp.register_comm_hook = register
    dagprof.apply(ddp, strategy)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    main = threading.get_native_id()
    for s in range(steps):
        threads.refresh()  # gloo's threads exist after the first collective
        cur["step"] = s
        value = loss(ddp, g)
        opt.zero_grad()
        mark(-1, "backward")
        value.backward()
        mark(-1, "backward_end")  # DDP's finalize done: every bucket completed
        opt.step()
    dist.barrier()
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump({"main": main, "marks": [m[:5] + [{str(k): v for k, v in m[5].items()}] for m in marks]}, f)
    dist.destroy_process_group()


def chains(doc: dict, bucket: int, skip: int) -> dict[int, dict[str, list]]:
    """Per compressed step, the bucket's marks in order: hook, issue x3, done x3, end (each [time, tid, sched])."""
    per: dict[int, dict[str, list]] = {}
    for step, b, what, t, tid, sched in doc["marks"]:
        if step < skip or b not in (bucket, -1):
            continue
        per.setdefault(step, {}).setdefault(what, []).append([t, tid, {int(k): v for k, v in sched.items()}])
    return {s: c for s, c in per.items() if len(c.get("issue", [])) == 3 and len(c.get("done", [])) == 3 and "end" in c and "hook" in c}


def _delta(s0: dict, s1: dict, tid: int) -> tuple[float, float]:
    """(CPU, wait for a core) of thread ``tid`` between two marks' reads, ms."""
    if tid not in s0 or tid not in s1:
        return 0.0, 0.0
    return (s1[tid][0] - s0[tid][0]) / 1e6, (s1[tid][1] - s0[tid][1]) / 1e6


def split(docs: list[dict], bucket: int = 0, skip: int = 4) -> dict[str, list[float]]:
    """Per rank-step (ms): the hook (entry to the first issue, on the training thread: its CPU and wait for a core); per
    all-reduce, the issue to its completion on this rank (``wire``; ``peer_lag``: how much later the peer issued it; the
    other threads' CPU and waits meanwhile: gloo's workers and transport; ``either_wait``: the larger of the two ranks'
    such waits, ``unexplained``: what neither it nor the peer's lag covers) and the completion to the next mark (``after``:
    the next issue, or the hook's end; on the thread that reached it, ``cb_cpu`` and ``cb_wait`` its CPU and wait for a
    core, ``asleep`` the rest: woken late, or waiting for the interpreter's lock)."""
    per = [chains(d, bucket, skip) for d in docs]
    out: dict[str, list[float]] = {}

    def gloo_wait(r: int, step: int, k: int) -> float:
        """Rank ``r``'s threads but its training thread's and its callbacks' waits for a core during all-reduce ``k``."""
        c = per[r][step]
        (_, _, si), (_, _, sd), (_, tid, _) = c["issue"][k], sorted(c["done"])[k], [*c["issue"][1:], c["end"][0]][k]
        return sum(_delta(si, sd, t)[1] for t in sd if t not in (docs[r]["main"], tid))

    def add(key: str, v: float) -> None:
        out.setdefault(key, []).append(v)

    for step in sorted(set(per[0]) & set(per[1])):
        for r in (0, 1):
            c, o, main = per[r][step], per[1 - r][step], docs[r]["main"]
            (h0, _, hs), (i0, _, is0) = c["hook"][0], c["issue"][0]
            cpu, wait = _delta(hs, is0, main)
            add("hook.wall", (i0 - h0) / 1e6)
            add("hook.cpu", cpu)
            add("hook.wait", wait)
            done = sorted(c["done"])
            nxt = [*c["issue"][1:], c["end"][0]]
            for k, name in enumerate(("unc", "p", "q")):
                (ti, _, si), (td, _, sd), (tn, tid, sn) = c["issue"][k], done[k], nxt[k]
                others = [t for t in sd if t not in (main, tid)]
                add(f"{name}.wire", (td - ti) / 1e6)
                add(f"{name}.peer_lag", max(0, o["issue"][k][0] - ti) / 1e6)
                add(f"{name}.gloo_cpu", sum(_delta(si, sd, t)[0] for t in others))
                add(f"{name}.gloo_wait", sum(_delta(si, sd, t)[1] for t in others))
                # the all-reduce ends when both ranks' gloo threads ran: the slower rank's waits, then the peer's lag, held it
                waits = min(max(gloo_wait(0, step, k), gloo_wait(1, step, k)), (td - ti) / 1e6)
                lag = min(max(0, o["issue"][k][0] - ti) / 1e6, (td - ti) / 1e6 - waits)
                add(f"{name}.either_wait", waits)
                add(f"{name}.unexplained", (td - ti) / 1e6 - waits - lag)
                cpu, wait = _delta(sd, sn, tid)
                add(f"{name}.after", (tn - td) / 1e6)
                add(f"{name}.cb_cpu", cpu)
                add(f"{name}.cb_wait", wait)
                add(f"{name}.asleep", (tn - td) / 1e6 - cpu - wait)
                add(f"{name}.on_training_thread", float(tid == main))
                tr = _delta(si, sn, main) if tid != main else (0.0, 0.0)
                add(f"{name}.train_cpu", tr[0])
                add(f"{name}.train_wait", tr[1])
            add("chain.wall", (c["end"][0][0] - i0) / 1e6)
            ready = [m[0] for m in c.get("ready", [])]
            if len(ready) > 1:
                add("chain.end_after_backward", (c["end"][0][0] - max(ready)) / 1e6)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", help="a kept strategy.json (bench_optimize.py --keep's wI-R/lossy/strategy.json)")
    ap.add_argument("--workload", choices=("conv", "lstm", "embed"), default="conv", help="the held-out job the strategy was found for")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=4, help="steps not counted (PowerSGD starts at step 2)")
    ap.add_argument("--link", default="200Mbit")
    ap.add_argument("--loopback", action="store_true", help="plain processes on loopback, no emulated link")
    ap.add_argument("--keep", default=None, help="keep the marks (marks.RANK) in this folder")
    ap.add_argument("--offline", default=None, metavar="KEPT", help="run nothing: split the marks a --keep folder kept")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--job", nargs=4, metavar=("OUT", "WORKLOAD", "STRATEGY", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.job[0], args.job[1], args.job[2], int(args.job[3]))
        return 0
    if args.offline:
        return report(kept_marks(args.offline), args, float("nan"), "kept marks")
    if not args.strategy:
        ap.error("--strategy is required")
    import tempfile

    from dagprof.collect.jobs.netns import run_ranks

    load = os.getloadavg()[0]
    argv = [sys.executable, os.path.abspath(__file__), "--job", "", args.workload, os.path.abspath(args.strategy), str(args.steps)]
    if args.loopback:
        with tempfile.TemporaryDirectory(prefix="dagprof-bench_powersgd_chain-") as tmp:
            work = args.keep or tmp
            argv[3] = os.path.join(work, "marks")
            run_ranks(argv, 2, os.path.join(work, "logs"))
            docs = [json.load(open(f"{argv[3]}.{r}")) for r in (0, 1)]
    else:
        with emulated("bench_powersgd_chain", args.link, args.keep) as (work, cluster):
            if cluster is None:
                return 0
            argv[3] = os.path.join(work, "marks")
            run_ranks(argv, 2, os.path.join(work, "logs"), cluster=cluster)
            docs = [json.load(open(f"{argv[3]}.{r}")) for r in (0, 1)]
    return report(docs, args, load, "loopback" if args.loopback else args.link)


def kept_marks(folder: str) -> list[dict]:
    """Both ranks' marks a ``--keep`` folder kept; a missing or unreadable file refused in one line naming it."""
    docs = []
    for r in (0, 1):
        path = os.path.join(folder, f"marks.{r}")
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"bench_powersgd_chain: {path}: not a kept marks file ({type(e).__name__}: {e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("marks"), list) or "main" not in doc:
            raise SystemExit(f"bench_powersgd_chain: {path}: not a kept marks file (no 'main' and 'marks')")
        docs.append(doc)
    return docs


def report(docs: list[dict], args: argparse.Namespace, load: float, where: str) -> int:
    """Prints the split's medians (and, with ``--json``, them as JSON)."""
    out = split(docs, 0, args.skip)
    med = {k: statistics.median(v) for k, v in out.items()}
    loads = "" if load != load else f", load average {load:.2f} (after {os.getloadavg()[0]:.2f})"  # nan: kept marks
    print(f"{args.workload}, bucket 0, 2 ranks, {where}{loads}; {len(out['chain.wall'])} rank-steps; "
          f"medians, ms: chain (first issue -> end) {med['chain.wall']:.2f}, its end {med.get('chain.end_after_backward', float('nan')):.2f} "
          f"after the last bucket's ready")
    m = {k: round(v, 2) for k, v in med.items()}
    print(f"  hook on the training thread {m['hook.wall']}: CPU {m['hook.cpu']}, waits for a core {m['hook.wait']}")
    for name in ("unc", "p", "q"):
        x = {k.split(".", 1)[1]: v for k, v in m.items() if k.startswith(name + ".")}
        print(f"  {name:<3} all-reduce {x['wire']:5.2f} (peer later by {x['peer_lag']:5.2f}; gloo's threads CPU {x['gloo_cpu']:5.2f}, waits "
              f"{x['gloo_wait']:5.2f}), then {x['after']:5.2f} to the next mark: callbacks' CPU {x['cb_cpu']:5.2f}, waits for a core "
              f"{x['cb_wait']:5.2f}, asleep {x['asleep']:5.2f} (on the training thread in {x['on_training_thread']:.0%} of steps)")
    for name in ("unc", "p", "q"):
        wire = sum(out[f"{name}.wire"])
        shares = [100 * sum(out[f"{name}.{k}"]) / wire for k in ("either_wait", "unexplained")]
        print(f"  {name:<3} all-reduces, summed: the slower rank's gloo threads waiting for a core {shares[0]:.0f} %, the peer's lag "
              f"{100 - sum(shares):.0f} %, neither {shares[1]:.0f} % (median {med[name + '.unexplained']:.2f} ms)")
    if args.json:
        print(json.dumps({"load": load, "where": where, "medians": med}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
