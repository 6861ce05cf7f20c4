"""How far the codec measurement's PowerSGD prices drift between processes and within one, and why.

``measure_codec_costs`` prices torch's ``powerSGD_hook`` per gradient shape, stretch by stretch (to its first
all-reduce, between, after), by the fastest of 15 runs alternating with an empty bucket. This runs that timing in
``--processes`` fresh processes one after another, ``--reps`` times inside each (a fresh bucket each time), on the
held-out embedding job's shapes (``bench/ddp_heldout_embed.py``, rank 2), recording every run's stretches and the
process's minor page faults in each stretch, the core, the reference op and the load. Per shape and stretch it prints
the fastest per process (first repetition), their spread between processes (max / min), the spread between
repetitions inside a process (median over processes of max / min), the share of runs that page-faulted and the
fastest faulting and fault-free run:

    PYTHONPATH=src .venv/bin/python bench/bench_codec_drift.py [--processes 8] [--reps 3] [--json OUT]
    PYTHONPATH=src .venv/bin/python bench/bench_codec_drift.py --in-job 40   # the hook's page faults inside the job

``--in-job STEPS`` runs a held-out job itself (``--script``, default the embedding's) on 2 ranks over loopback (gloo),
its DDP given torch's hook on one bucket, as the kept embedding and LSTM strategies have it, and prints per rank and
compressed step the page faults of the hook's issue (entry to its first all-reduce, the training thread's own).

On the 2-core VM (2026-12-03, under the other helpers' load; the medians below are of the fastest per process):
- at load 6.7-8.0 (8 processes x 3 repetitions, 11:37) the 16,384 x 64 embedding's fastest of 15 drifted as much
  between repetitions inside a process as between processes: issue 1.24x between / 1.21x within, middle 1.46 / 1.26x,
  decode 3.38 / 3.13x; the linears (512 x 512 and smaller, L2-resident) 1.16-1.36x between.
- at load 18.6-20.5 (6 x 2, 12:23): issue 1.19 / 1.21x, middle 1.25 / 1.19x, decode 2.95 / 1.48x; the linears
  1.04-1.25x between and 1.01-1.08x within (one process slower on every small shape: 1.57-1.92x on the smallest).
  The embedding's runs page-faulted in 53 (issue) and 69 (decode) of 180, about 1,000-1,500 faults each (its clone of the
  bucket or its new 4 MB error on pages glibc had returned to the kernel), how often by process: 0-529 faults per run
  at the issue, 204-546 at the decode. Which core the process ran on made no difference.
So the fastest of 15 is a tail estimate that moves 1.2x from one draw to the next at any load, and the allocator's
state, which differs by process, decides how often the large gradient's stretches take about 2 ms of page faults that
the fastest leaves out (a faulting run's own fastest was 1.2-1.8 ms slower). Inside the held-out embedding job with
the kept strategy's one bucket (torch's hook, 2 ranks on loopback, 36 steps) the hook's clone page-faulted at the
issue in 11-24 of 36 steps per rank (420-2,952 faults each, 464-977 per step on average; four runs at load 11-26,
the last two by ``--in-job 40``). By workload (``--in-job 40 --script bench/ddp_heldout_X.py``, load 19-23, 12:28):
embedding 977 / 549 faults per step (ranks 0 / 1), conv 634 / 1,464 (one bucket; its kept strategy has two), LSTM
0 / 146: the jobs whose PowerSGD speed-up is predicted high (conv, embedding) fault at the issue, the LSTM's hardly,
where the codec measurement's processes faulted 445-1,075 times per run on the LSTM's gradients.
``--keep-freed`` runs the job with glibc keeping freed memory mapped (2026-12-03 15:05 UTC):
at load 2.3-2.4 the issue's faults per step and rank went 1,304 / 345 -> 13 / 13 (embedding; issue median 4.85 / 2.73 ->
2.87 / 2.94 ms), 593 / 628 -> 14 / 39 (conv; 4.86 / 4.55 -> 4.31 / 4.17 ms), 17 / 16 -> 0 / 0 (LSTM; 2.92 / 2.84 ->
2.97 / 2.88 ms): the faults are the embedding's issue excess on the rank that takes them.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _shapes() -> dict[str, tuple[int, ...]]:
    sys.path.insert(0, HERE)
    from fsdp1_heldout import CTR

    return {n: tuple(p.shape) for n, p in CTR(16384, 64, 32, 512).named_parameters() if p.dim() == 2 and min(p.shape) > 4}  # compressed


def _fault_us(pages: int = 1024, repeats: int = 5) -> float:
    """Microseconds per minor page fault: the fastest of ``repeats`` first writes to ``pages`` fresh anonymous pages."""
    import mmap

    import numpy as np

    best = float("inf")
    for _ in range(repeats):
        with mmap.mmap(-1, pages * 4096) as m:
            a = np.frombuffer(m, dtype=np.uint8)
            t0 = time.perf_counter()
            a[::4096] = 1
            best = min(best, time.perf_counter() - t0)
            del a
    return best * 1e6 / pages


def _one(reps: int, pairs: int, rank: int) -> dict:
    """Every run of the codec measurement's hook timing, ``reps`` times over, in this process: its stretches and the
    process's minor page faults in each (counted at the hook's all-reduces, which ``_PowerSGDHooks`` times)."""
    import torch
    import torch.distributed as dist

    from dagprof.collect.measure.codec_costs import _PowerSGDHooks
    from dagprof.collect.measure.overlap import reference_op_us

    torch.set_num_threads(1)

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def core() -> int:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])

    out = []
    with _PowerSGDHooks() as hooks:
        timed, at = dist.all_reduce, []

        def all_reduce(*args, **kwargs):
            at.append(faults())
            return timed(*args, **kwargs)

        dist.all_reduce = all_reduce
        try:
            for _ in range(reps):
                rep = {"core": core(), "load": os.getloadavg()[0], "reference_op_us": reference_op_us(), "fault_us": _fault_us(), "shapes": {}}
                empty = hooks.bucket((1,), rank)
                for name, shape in _shapes().items():
                    whole = hooks.bucket(shape, rank)

                    def run() -> list[float]:
                        at.clear()
                        f0 = faults()
                        s = whole()
                        return [*s, at[0] - f0, at[-1] - at[0], faults() - at[-1]]

                    for _ in range(2):  # warm-up, as measure_codec_costs
                        whole(), empty()
                    runs = []
                    for i in range(pairs):  # alternating with the empty bucket, as measure_codec_costs
                        if i % 2:
                            empty()
                        runs.append(run())
                        if not i % 2:
                            empty()
                    rep["shapes"][name] = runs
                out.append(rep)
        finally:
            dist.all_reduce = timed
    return {"pid": os.getpid(), "reps": out}


def summary(procs: list[dict]) -> list[str]:
    lines = []
    for name, shape in _shapes().items():
        lines.append(name)
        bar = max(16, -(-4 * shape[0] * shape[1] // 4096) // 4)  # a quarter of the gradient's pages: a bucket-sized allocation on fresh pages
        for j, part in enumerate(("issue", "middle", "decode")):
            fast = [[min(r[j] for r in rep["shapes"][name]) for rep in p["reps"]] for p in procs]
            first = [f[0] for f in fast]
            per_run = [sum(r[3 + j] for r in p["reps"][0]["shapes"][name] if r[3 + j] >= bar) / len(p["reps"][0]["shapes"][name]) for p in procs]
            runs = [r for p in procs for rep in p["reps"] for r in rep["shapes"][name]]
            hit = [r[j] for r in runs if r[3 + j] >= bar]
            clean = [r[j] for r in runs if r[3 + j] < bar]
            lines.append(f"  {part:<6} fastest per process {' '.join(f'{x:.0f}' for x in first)} us: between {max(first) / min(first):.2f}x, "
                         f"within (repetitions) {statistics.median(max(f) / min(f) for f in fast):.2f}x; runs page-faulted {len(hit)} of {len(runs)}"
                         + (f" (fastest {min(hit):.0f} us, fault-free {min(clean):.0f})" if hit and clean else "")
                         + (f"; faults per run by process {' '.join(f'{x:.0f}' for x in per_run)}" if hit else ""))
    lines.append("cores: " + " ".join("/".join(str(rep["core"]) for rep in p["reps"]) for p in procs)
                 + "; reference op us: " + " ".join("/".join(f"{rep['reference_op_us']:.0f}" for rep in p["reps"]) for p in procs))
    lines.append("us per page fault: " + " ".join("/".join(f"{rep['fault_us']:.2f}" for rep in p["reps"]) for p in procs))
    lines.append("load: " + " ".join(f"{p['load']:.1f}" for p in procs))
    return lines


def _rank(script: str, steps: int, keep: bool) -> None:
    """One rank of a held-out job (``script --steps``, untouched) whose DDP gets torch's PowerSGD hook on one bucket, as
    the kept embedding and LSTM strategies have it: per compressed step, the issue's faults and time; ``keep``: with
    glibc's mmap and trim thresholds fixed at 32 / 64 MiB (where its dynamic rule would take them after freeing a 32 MiB
    chunk), so memory freed at a heap's top is kept mapped rather than given back and faulted in again."""
    import ctypes
    import runpy

    if keep and not (ctypes.CDLL(None).mallopt(-3, 32 << 20) == 1 and ctypes.CDLL(None).mallopt(-1, 64 << 20) == 1):  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
        raise SystemExit("bench_codec_drift: --keep-freed: glibc's mallopt refused the thresholds")

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    rows: list[list[float]] = []

    def hook(state, bucket):
        f0, t0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt, time.perf_counter()
        fut = psgd.powerSGD_hook(state, bucket)
        rows.append([resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0, (time.perf_counter() - t0) * 1e6])
        return fut

    plain = DDP.__init__

    def init(self, module, *args, **kwargs):
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30  # one bucket
        plain(self, module, *args, **{**kwargs, "bucket_cap_mb": 1000})
        self.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=2,
                                                   use_error_feedback=True, warm_start=True), hook)

    DDP.__init__ = init
    sys.argv = [script, "--steps", str(steps)]
    runpy.run_path(script, run_name="__main__")
    print(json.dumps(rows[4:]), flush=True)  # past PowerSGD's start (iteration 2) and two more


def in_job(script: str, steps: int, keep: bool = False) -> list[str]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000), "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-of-job", str(steps), "--script", script]
                              + ["--keep-freed"] * keep, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    lines = []
    for r, proc in enumerate(ranks):
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"bench_codec_drift: rank {r} of the job failed")
        rows = json.loads(out)
        hit = [f for f, _ in rows if f >= 256]  # a megabyte or more of fresh pages
        lines.append(f"rank {r}: the hook's issue page-faulted in {len(hit)} of {len(rows)} steps ({min(hit, default=0):.0f}-{max(hit, default=0):.0f} "
                     f"faults, {sum(hit) / len(rows):.0f} per step); issue median {statistics.median(t for _, t in rows):.0f} us "
                     f"(load {os.getloadavg()[0]:.1f}); faults by step: {' '.join(str(int(f)) for f, _ in rows)}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="repetitions inside each process")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--json", default=None, help="write every run here")
    ap.add_argument("--in-job", type=int, default=0, metavar="STEPS", help="instead, the hook's page faults inside a held-out job (--script)")
    ap.add_argument("--script", default=os.path.join(HERE, "ddp_heldout_embed.py"), help="the held-out job --in-job runs (default the embedding's)")
    ap.add_argument("--keep-freed", action="store_true", help="--in-job with glibc keeping freed memory mapped (mmap / trim thresholds 32 / 64 MiB)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: its runs as JSON
    ap.add_argument("--rank-of-job", type=int, default=0, help=argparse.SUPPRESS)  # a child: one rank of --in-job
    args = ap.parse_args()
    if args.rank_of_job:
        _rank(args.script, args.rank_of_job, args.keep_freed)
        return
    if args.in_job:
        print("\n".join(in_job(args.script, args.in_job, args.keep_freed)))
        return
    if args.one:
        print(json.dumps(_one(args.reps, args.pairs, args.rank)), flush=True)
        os._exit(0)  # skip the teardown: the one-process gloo group's threads aborted it once in six at load 28
    procs = []
    for i in range(args.processes):
        l0, t0 = os.getloadavg()[0], time.time()
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--reps", str(args.reps), "--pairs", str(args.pairs),
                              "--rank", str(args.rank)], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"bench_codec_drift: process {i} failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
        out = out.stdout
        procs.append({**json.loads(out), "load": (l0 + os.getloadavg()[0]) / 2, "seconds": time.time() - t0})
        print(f"process {i}: {procs[-1]['seconds']:.1f} s, load {procs[-1]['load']:.1f}", file=sys.stderr, flush=True)
    print("\n".join(summary(procs)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(procs, f)


if __name__ == "__main__":
    main()
