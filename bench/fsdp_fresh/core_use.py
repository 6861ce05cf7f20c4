"""Where a host's cores go while ``fsdp_train.py`` jobs run: ``record`` samples ``/proc`` every 0.25 s until killed (the
cpu line of ``/proc/stat``, ksoftirqd's schedstat, and per ``fsdp_train.py`` process each thread's schedstat: CPU ns,
run-queue wait ns, runs) into JSON lines; ``report`` splits each job's steady steps (its ``--times`` file's steps from
the fifth on, the last ones before its processes ended) per step of rank 0: the ranks' training threads' CPU and waits
for a core, their other threads' (gloo's), the times a rank's gloo threads were put on a core a step (its wake-ups) and
their wait a wake-up, and the cores' user, system, softirq, steal and idle time, ksoftirqd's and
every other process's CPU. Beside a ``bench_fsdp.py --part 12`` round under ``dp-excl`` (one record, 0.25 s of Python a
sample):

    python bench/fsdp_fresh/core_use.py record OUT.jsonl &  ... ; kill %1
    python bench/fsdp_fresh/core_use.py report OUT.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import time

TICK_MS = 10.0  # /proc/stat counts USER_HZ (100) ticks


def _sched(pid: str, tid: str) -> list[int] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return None


def _kind(pid: str) -> str | None:
    """``ksoftirqd``, an ``fsdp_train.py`` rank's arguments, or None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return None
    if comm.startswith("ksoftirqd"):
        return "ksoftirqd"
    return cmd.split("fsdp_train.py", 1)[1][:300] if "fsdp_train.py" in cmd and "torch.distributed.run" not in cmd else None


def record(path: str) -> None:
    kinds: dict[str, str | None] = {}
    with open(path, "w") as out:
        while True:
            t = time.time()
            with open("/proc/stat") as f:
                cpu = [int(x) for x in f.readline().split()[1:]]
            procs, ksoft = {}, [0, 0, 0]
            for p in filter(str.isdigit, os.listdir("/proc")):
                kind = kinds[p] if p in kinds else kinds.setdefault(p, _kind(p))
                if kind == "ksoftirqd":
                    ksoft = [a + b for a, b in zip(ksoft, _sched(p, p) or [0, 0, 0])]
                elif kind is not None:
                    try:
                        tids = os.listdir(f"/proc/{p}/task")
                    except OSError:
                        continue
                    procs[p] = (kind, {tid: s for tid in tids if (s := _sched(p, tid))})
            out.write(json.dumps({"t": t, "cpu": cpu, "ksoftirqd": ksoft, "procs": procs}) + "\n")
            out.flush()
            time.sleep(0.25)


def report(path: str) -> None:
    samples = [json.loads(line) for line in open(path)]
    jobs: dict[str, list[int]] = {}
    for i, d in enumerate(samples):
        for kind, _ in d["procs"].values():
            if "--times " in kind:
                jobs.setdefault(kind.split("--times ")[1].split()[0], []).append(i)
    print(f"{'job':34s} {'ranks':>5s} {'step':>6s} | {'main cpu':>8s} {'wait':>6s} {'gloo cpu':>8s} {'wait':>6s} | "
          f"{'user':>6s} {'sys':>6s} {'softirq':>7s} {'steal':>6s} {'idle':>6s} {'ksoftirqd':>9s} {'others':>6s} | "
          f"{'g runs':>7s} {'wait/run':>8s} {'m runs':>7s}   ms a step, all ranks; runs a step per rank (gloo's, the training thread's)")
    for times, idx in sorted(jobs.items(), key=lambda x: min(x[1])):
        with open(times) as f:
            steps = json.load(f)[4:]
        step = sum(steps) / len(steps)
        end = samples[max(idx)]["t"] - 0.3
        a = min(i for i in idx if samples[i]["t"] >= end - sum(steps))
        b = max(i for i in idx if samples[i]["t"] <= end)
        A, B = samples[a], samples[b]
        n = (B["t"] - A["t"]) / step
        pids = [p for p, (k, _) in B["procs"].items() if times in k]
        own = {"main": [0.0, 0.0, 0.0], "gloo": [0.0, 0.0, 0.0]}  # CPU ms, wait ms, runs (times put on a core)
        for p in pids:
            before = A["procs"].get(p, (None, {}))[1]
            for tid, s in B["procs"][p][1].items():
                s0 = before.get(tid, [0, 0, 0])
                part = own["main" if tid == p else "gloo"]
                part[0] += (s[0] - s0[0]) / 1e6
                part[1] += (s[1] - s0[1]) / 1e6
                part[2] += s[2] - s0[2]
        user, nice, system, idle, iowait, irq, softirq, steal = [(y - x) * TICK_MS for x, y in zip(A["cpu"], B["cpu"])][:8]
        ksoft = (B["ksoftirqd"][0] - A["ksoftirqd"][0]) / 1e6
        others = user + nice + system + irq + softirq - own["main"][0] - own["gloo"][0] - ksoft
        cols = (*own["main"][:2], *own["gloo"][:2], user + nice, system, softirq, steal, idle + iowait, ksoft, others)
        runs = own["gloo"][2] / n / max(len(pids), 1)
        print(f"{os.path.basename(os.path.dirname(times)):34s} {len(pids):5d} {1e3 * step:6.1f} | "
              + " ".join(f"{c / n:{w}.1f}" for c, w in zip(cols, (8, 6, 8, 6, 6, 6, 7, 6, 6, 9, 6)))
              + f" | {runs:7.1f} {own['gloo'][1] / max(own['gloo'][2], 1):8.3f} {own['main'][2] / n / max(len(pids), 1):7.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("record", "report"))
    p.add_argument("path")
    a = p.parse_args()
    (record if a.mode == "record" else report)(a.path)


if __name__ == "__main__":
    main()
