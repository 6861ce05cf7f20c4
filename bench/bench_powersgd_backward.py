"""The backward beside PowerSGD's hook against the backward beside DDP's buckets, and alone, in one round.

``passes.overlap`` prices the backward of a PowerSGD strategy from the defaults' profile: it takes the defaults'
backward out of the overlap slowdown ``calibrate --overlap`` measured (beside a matrix loop: compute slowed per unit
of the time a collective is in flight), then charges the strategy's own overlap and the hook's callback CPU
(``passes.compression``'s steal) back. On the held-out conv and LSTM rounds that gave the strategy's backward 0.60-0.86
of the defaults' where the rounds measured 0.73-1.08. This tells the two candidates apart: as root, on an emulated
2-host cluster (``--link``), one job per workload runs the same model three ways in one process, blocks of steps
interleaved -- ``none`` (a comm hook that returns at once: the backward with no collective beside it), ``defaults``
(DDP's buckets, all-reduced as DDP does), ``strategy`` (the kept strategy deployed by ``dagprof.apply``, PowerSGD
chained) -- and times, per step and rank, the backward on the training thread (its start to the last bucket's ready,
less what hooks ran inline), its CPU and run-queue wait (``/proc`` schedstat), the other threads' CPU meanwhile
(gloo's, and PowerSGD's callbacks), and the share of it a bucket (or a chain) was in flight. It then measures the
overlap slowdown as ``calibrate --overlap`` does (beside the matrix loop), beside the job's own backward, and on a
stock network's backward beside its own DDP buckets against none (``stock_backward``, the same A/B on a model the job
does not own).

    sudo .venv/bin/python bench/bench_powersgd_backward.py --workload conv --strategy KEPT/wI-R/lossy/strategy.json

The model, for the backward beside a collective in flight for a share f: none x (1 + s f), s the slowdown.

On 2026-12-05 (the strategies kept by the 03:08-03:19 rounds, ``--blocks 5``, load 7-8): beside DDP's buckets (in flight
0.91-0.93 of the conv's backward, 0.54-0.60 of the LSTM's) the backward's own CPU grew, 47.7 / 46.1 -> 59.7 / 69.6 ms
(conv, ranks 0 / 1) and 47.9 / 49.9 -> 58.8 / 56.8 (LSTM), about the other threads' CPU meanwhile (gloo's, 21.5 / 17.5
and 8.4 / 9.3 ms); its wall 1.38 / 1.24x and 1.32 / 1.09x the backward alone, 0.26-0.42 (conv) and 0.15-0.59 (LSTM)
per unit of overlap, where the matrix loop measured 0.79 and 0.84 in the same processes (``calibrate --overlap`` 0.88
before the kept rounds). Beside the PowerSGD chain the backward's CPU stayed that of the backward alone (47.1 / 47.8
and 47.0 / 47.8 ms) with 13-16 ms of callbacks' CPU beside it on the conv: they cost it a core's time, not CPU of its
own. The first bucket's hook ran 8.8 / 13.3 ms on the training thread (conv; 8.8 / 8.7 LSTM) against 4.7 (3.5) priced
idle, the training thread's CPU plus its waits 2.0-2.1x (1.5-1.8x) its CPU. Rerun at load 9-14: the waits for a core
(213-375 ms a step) swamp the walls, the CPU split the same (conv 58.3 / 57.5 alone, 78.9 / 93.3 beside the buckets,
57.7 / 57.7 beside the chain). ``measure_overlap`` beside the job's own backward read 1.47 / 0.32 (conv) and 0.56 / 0.86
(LSTM) in the two runs: one alone-beside pair a repeat on the loaded machine does not settle it. Three more runs
(11:39-12:17, load 2.7-16.7) with the stock network's A/B beside: the job's defaults backward 0.01-1.63 per unit of
overlap, the loop 0.00-1.39, the stock 0.31-1.68; the loop nearer the job in 4 of 6, the stock following the loop.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_powersgd_parts import emulated, schedstat  # noqa: E402

from dagprof.collect.measure.overlap import OVERLAP_BYTES  # noqa: E402

CONFIGS = ("none", "defaults", "strategy")


def workload(name: str):
    """(module, loss(module, generator)) of a held-out job, as its script builds them."""
    import torch
    import torch.nn.functional as F

    if name == "conv":
        from ddp_heldout_conv import vgg

        def loss(m, g):
            x, y = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            return F.cross_entropy(m(x), y)

        return vgg(), loss
    if name == "embed":
        from fsdp1_heldout import CTR

        def ctr_loss(m, g):  # ddp_heldout_embed.py's batch of 64, 20 ids each, 32 dense features
            ids, dense = torch.randint(0, 16384, (64, 20), generator=g), torch.randn(64, 32, generator=g)
            return F.binary_cross_entropy_with_logits(m(ids, dense), (ids[:, 0] % 2).float())

        return CTR(16384, 64, 32, 512), ctr_loss
    from ddp_heldout_lstm import LanguageModel

    def lm_loss(m, g):
        chunk = torch.randint(0, 2048, (16, 36), generator=g)
        logits, _ = m(chunk[:, :-1], None)
        return F.cross_entropy(logits.reshape(-1, 2048), chunk[:, 1:].reshape(-1))

    return LanguageModel(2048, 128, 256), lm_loss


def marker(marks: list[list]):
    """Wraps a comm hook to append, per call, [entry, return, done (None until its future completes), entry sched,
    return sched, on the calling thread] to ``marks``; call it on the training thread."""
    main_tid = threading.get_ident()

    def marked(hook):
        def marked_hook(state, bucket):  # DDP requires the name "bucket"
            t0, s0 = time.perf_counter(), schedstat()
            fut = hook(state, bucket)
            row = [t0, time.perf_counter(), None, s0, schedstat(), threading.get_ident() == main_tid]
            marks.append(row)

            def done(f):
                row[2] = time.perf_counter()
                return f.value()

            return fut.then(done)

        return marked_hook

    return marked


def returns_at_once(state, bucket):
    """A comm hook that issues nothing: the backward with no collective beside it."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def covered(t0: float, spans: list[tuple[float, float]]) -> float:
    """Seconds after ``t0`` that at least one of ``spans`` (start, end) covers."""
    total, reach = 0.0, t0
    for a, b in sorted(spans):
        a = max(a, reach)
        if b > a:
            total, reach = total + b - a, b
    return total


def stock_net(nbytes: int):
    """A stock image classifier whose gradients DDP's defaults bucket as a small conv job's: two 3x3 conv blocks on
    32x32 images, then a hidden linear of ``nbytes`` (DDP's first bucket: the all-reduce in flight while the convs'
    backward runs, as a classifier head's is in such jobs) and the output layer."""
    import torch.nn as nn

    hidden = max(nbytes // 4 // (64 * 8 * 8), 1)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10))


@dataclass(frozen=True)
class StockBackward:
    """``stock_backward``'s answer, the slowest rank's."""

    slowdown: float  # per unit of overlap of the backward alone: beside / alone = 1 + slowdown * in_flight
    in_flight: float  # the share of the backward (beside) a bucket's all-reduce was in flight, the median step's
    samples: list[float]  # this rank's slowdown per block pair


def stock_backward(nbytes: int = OVERLAP_BYTES, blocks: int = 4, steps: int = 5, batch: int = 16) -> StockBackward:
    """The backward of ``stock_net`` through DDP with its buckets all-reduced (DDP's default hook) against the same
    backward with a comm hook that returns at once (no collective beside it), blocks of ``steps`` interleaved (every
    rank must call it). The backward is the training thread's time from ``backward()`` to the last bucket's ready,
    less what hooks ran inline before it. Tried as ``calibrate --overlap``'s compute in place of the matrix loop (a
    candidate for why a PowerSGD strategy's backward was priced too short) and not adopted: over six in-job A/Bs on
    2026-12-05 it followed the loop, not the job (docs/evidence.md, "calibrate --overlap on a stock network's backward")."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = stock_net(nbytes)
    marks: list[list] = []
    marked = marker(marks)
    models = []
    for hook in (returns_at_once, default_hooks.allreduce_hook):
        ddp = DDP(copy.deepcopy(base))
        ddp.register_comm_hook(None, marked(hook))
        models.append(ddp)
    g = torch.Generator().manual_seed(1 + dist.get_rank())

    def step(ddp) -> tuple[float, float]:
        """(the backward's seconds, the share of it a bucket was in flight)."""
        marks.clear()
        x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
        loss = F.cross_entropy(ddp(x), y)
        ddp.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss.backward()
        last = max(marks, key=lambda m: m[0])
        inline = sum(m[1] - m[0] for m in marks if m[5] and m is not last)
        span = last[0] - t0
        return span - inline, covered(t0, [(m[0], min(m[2] or last[0], last[0])) for m in marks if m is not last]) / max(span, 1e-9)

    for ddp in models:  # warm-up: buckets rebuilt after the first step, connections set up
        dist.barrier()
        step(ddp)
        step(ddp)
    samples, shares = [], []
    for _ in range(blocks):
        medians = []
        for ddp in models:
            dist.barrier()
            timed = [step(ddp) for _ in range(steps)]
            medians.append((statistics.median(t for t, _ in timed), statistics.median(f for _, f in timed)))
        (alone, _), (beside, f) = medians
        shares.append(f)
        samples.append(max(beside / max(alone, 1e-9) - 1.0, 0.0) / max(f, 1e-9))
    t = torch.tensor([statistics.median(samples), statistics.median(shares)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return StockBackward(float(t[0]), float(t[1]), samples)


def job(out: str, name: str, strategy: str, blocks: int, steps: int) -> None:
    """One rank: the three ways in interleaved blocks, then the overlap slowdown; writes ``out``.RANK."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dagprof
    from dagprof.collect.measure.overlap import backward_work, measure_overlap

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    base, loss = workload(name)
    marks: list[list] = []
    marked = marker(marks)
    models = {}
    for cfg in CONFIGS:
        ddp = DDP(copy.deepcopy(base))
        if cfg == "none":
            ddp.register_comm_hook(None, marked(returns_at_once))
        elif cfg == "defaults":
            ddp.register_comm_hook(None, marked(default_hooks.allreduce_hook))
        else:
            plain = ddp.register_comm_hook
            ddp.register_comm_hook = lambda state, hook, plain=plain: plain(state, marked(hook))
            dagprof.apply(ddp, strategy)
        models[cfg] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    rows = []
    for b in range(blocks):
        for cfg in CONFIGS:
            ddp, opt = models[cfg]
            dist.barrier()
            for k in range(steps):
                marks.clear()
                t0 = time.perf_counter()
                value = loss(ddp, g)
                opt.zero_grad()
                tb, sb = time.perf_counter(), schedstat()
                value.backward()
                tw = time.perf_counter()
                opt.step()
                t1 = time.perf_counter()
                rows.append({"config": cfg, "block": b, "step": k, "t0": t0, "bwd": tb, "bwd_sched": sb, "after_bwd": tw, "end": t1,
                             "hooks": [list(m) for m in marks]})
    dist.barrier()
    work = backward_work(lambda: loss(models["none"][0].module, g))
    stock = stock_backward()
    overlap = {"matmul": measure_overlap(repeats=8).model_slowdown, "backward": measure_overlap(repeats=8, work=work).model_slowdown,
               "stock": stock.slowdown, "stock_in_flight": stock.in_flight}
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump({"rows": rows, "overlap": overlap}, f)
    dist.barrier()
    dist.destroy_process_group()


def summarise(rows: list[dict], skip: int) -> dict[str, dict[str, float]]:
    """Per configuration, medians over its steps (past each block's first ``skip``) of the backward's parts, ms."""
    per: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if r["step"] < skip or not r["hooks"]:
            continue
        t0, s0 = r["bwd"], r["bwd_sched"]
        last = max(r["hooks"], key=lambda h: h[0])  # the last bucket ready: the backward's end on the training thread
        inline = [h for h in r["hooks"] if h[5] and h is not last]
        inline_wall = sum(h[1] - h[0] for h in inline)
        inline_cpu = sum(h[4][2] - h[3][2] for h in inline) / 1e9
        inline_wait = sum(h[4][3] - h[3][3] for h in inline) / 1e9
        inline_all = sum(h[4][0] - h[3][0] for h in inline) / 1e9
        s1 = last[3]
        span = last[0] - t0
        busy = covered(t0, [(h[0], min(h[2] or last[0], last[0])) for h in r["hooks"] if h is not last])
        cpu = (s1[2] - s0[2]) / 1e9 - inline_cpu
        others = ((s1[0] - s0[0]) - (s1[2] - s0[2])) / 1e9 - (inline_all - inline_cpu)
        d = per.setdefault(r["config"], {})
        for k, v in (("backward", span - inline_wall), ("cpu", cpu), ("wait", (s1[3] - s0[3]) / 1e9 - inline_wait),
                     ("others_cpu", others), ("inline", inline_wall), ("overlap", busy / max(span, 1e-9)),
                     ("to_ready_end", r["after_bwd"] - t0), ("step", r["end"] - r["t0"])):
            d.setdefault(k, []).append(v)
    return {c: {k: statistics.median(v) * (1 if k == "overlap" else 1e3) for k, v in d.items()} for c, d in per.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("conv", "lstm"), default="conv")
    ap.add_argument("--strategy", help="a kept strategy.json (bench_optimize.py --keep's wI-R/lossy/strategy.json)")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="steps per block; each block's first 2 are not counted")
    ap.add_argument("--link", default="200Mbit")
    ap.add_argument("--keep", default=None, help="keep the per-step marks (marks.RANK) in this folder")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--job", nargs=5, metavar=("OUT", "WORKLOAD", "STRATEGY", "BLOCKS", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.job[0], args.job[1], args.job[2], int(args.job[3]), int(args.job[4]))
        return 0
    if not args.strategy:
        ap.error("--strategy is required")
    from dagprof.collect.jobs.netns import run_ranks

    load = os.getloadavg()[0]
    with emulated("bench_powersgd_backward", args.link, args.keep) as (work, cluster):
        if cluster is None:
            return 0
        out = os.path.join(work, "marks")
        run_ranks([sys.executable, os.path.abspath(__file__), "--job", out, args.workload, os.path.abspath(args.strategy), str(args.blocks),
                   str(args.steps)], 2, os.path.join(work, "logs"), cluster=cluster)
        measured = [json.load(open(f"{out}.{r}")) for r in (0, 1)]
    summary = [summarise(m["rows"], 2) for m in measured]
    s = measured[0]["overlap"]
    print(f"{args.workload}, 2 ranks, {args.link}, load average {load:.1f} (after {os.getloadavg()[0]:.1f}); overlap slowdown s measured "
          f"beside the matrix loop {s['matmul']:.2f}, beside the job's backward {s['backward']:.2f}, a stock network's backward beside its DDP "
          f"buckets {s['stock']:.2f} (in flight {s['stock_in_flight']:.2f} of it; slowest rank's); medians per step, ms")
    for rank, per in enumerate(summary):
        none = per["none"]["backward"]
        for cfg in CONFIGS:
            x = per[cfg]
            f = x["overlap"]
            print(f"rank {rank} {cfg:<9} backward {x['backward']:7.1f} ({x['backward'] / none:.2f}x none; CPU {x['cpu']:6.1f}, waiting for a core "
                  f"{x['wait']:5.1f}; other threads' CPU {x['others_cpu']:5.1f}; hooks inline {x['inline']:5.1f}); in flight {f:.2f} of it: "
                  f"none x (1 + s f) = {none * (1 + s['matmul'] * f):7.1f} (matrix loop's s) / {none * (1 + s['backward'] * f):7.1f} "
                  f"(backward's s) / {none * (1 + s['stock'] * f):7.1f} (stock's s); step {x['step']:7.1f}")
    if args.json:
        print(json.dumps({"load": load, "load_after": os.getloadavg()[0], "overlap": s, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
