"""Does a training step compute slower when its cores idle between steps? The held-out embedding job's step, no network.

The held-out embedding job (``bench/ddp_heldout_embed.py``'s CTR model, Adam, one thread per process) at 200 Mbit/s waits
about 250 ms a step for its wire under DDP's defaults and about 17 ms under PowerSGD; the strategy runs' forward and
optimizer, with no collective in flight in either run, took x0.80-0.88 the defaults' time in the same round
(``bench/bench_overlap_ops.py``'s control, docs/evidence.md, branch psgdcontend). This times that step (forward,
backward, optimizer; no DDP, no gloo) in ``--procs`` processes at once, as the ranks share the host's cores, with
something between steps, block by block, interleaved so the machine's load falls on every mode alike:

- ``dense``: nothing (a compute-bound step);
- ``sleep``: ``--pause-ms`` asleep (a rank waiting for its wire: gloo's threads block);
- ``spin``: ``--pause-ms`` spinning on the core (the core kept busy, nothing touched);
- ``sleep+copy``: a copy of the gradient's bytes twice through a buffer (what gloo's threads stream), then asleep;
- ``spin+copy``: the copy, then spinning.

Per mode, the median step's compute (wall) and the thread's CPU over the ``dense`` mode's, and the step's two parts apart
(Adam's step; the forward and backward): ``sleep`` slow and ``spin`` not says the idle cores (their clock or the host's
scheduling of them), ``+copy`` slow the cache gloo's traffic leaves; a part slow where the other is not says which work
the pause costs (branch psgd60: the strategy runs' optimizer moved, their forward hardly):

    dp-excl .venv/bin/python bench/bench_idle_pace.py [--pause-ms 250] [--cycles 4] [--block 6] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

MODES = ("dense", "sleep", "spin", "sleep+copy", "spin+copy")


def _pause(mode: str, pause_s: float, src, dst) -> None:
    if mode.endswith("+copy"):
        dst.copy_(src)
        src.copy_(dst)
    if mode.startswith("sleep"):
        time.sleep(pause_s)
    elif mode.startswith("spin"):
        end = time.perf_counter() + pause_s
        while time.perf_counter() < end:
            pass


def _worker(rank: int, args: argparse.Namespace, barrier, out) -> None:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fsdp1_heldout import CTR

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = CTR(args.vocab, args.dim, 32, 512)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    n = sum(p.numel() for p in model.parameters())
    src, dst = torch.randn(n), torch.empty(n)
    rows: list[tuple[str, float, float, float]] = []
    for cycle in range(args.cycles + 1):  # the first cycle warms up, not kept
        for mode in MODES:
            barrier.wait()
            for _ in range(args.block):
                ids = torch.randint(0, args.vocab, (args.batch, 20), generator=g)
                dense = torch.randn(args.batch, 32, generator=g)
                w0, c0 = time.perf_counter(), time.thread_time()
                loss = F.binary_cross_entropy_with_logits(model(ids, dense), (ids[:, 0] % 2).float())
                opt.zero_grad()
                loss.backward()
                wo = time.perf_counter()
                opt.step()
                w1, c1 = time.perf_counter(), time.thread_time()
                if cycle:
                    rows.append((mode, (w1 - w0) * 1e3, (c1 - c0) * 1e3, (w1 - wo) * 1e3))
                _pause(mode, args.pause_ms / 1e3, src, dst)
    out.put((rank, rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--pause-ms", type=float, default=250.0)
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--block", type=int, default=6, help="steps per mode in a cycle")
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(args.procs), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, args, barrier, out)) for r in range(args.procs)]
    t0 = time.time()
    for p in procs:
        p.start()
    got = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    table = {}
    for mode in MODES:
        wall = [w for r in got.values() for m, w, _, _ in r if m == mode]
        cpu = [c for r in got.values() for m, _, c, _ in r if m == mode]
        opt = [o for r in got.values() for m, _, _, o in r if m == mode]
        table[mode] = {"wall_ms": statistics.median(wall), "cpu_ms": statistics.median(cpu), "opt_ms": statistics.median(opt),
                       "rest_ms": statistics.median(w - o for r in got.values() for m, w, _, o in r if m == mode), "n": len(wall)}
    base = table["dense"]
    print(f"{args.procs} processes, {args.pause_ms:.0f} ms between steps, {args.cycles} cycles of {args.block} steps a mode "
          f"({time.time() - t0:.0f} s); median step, over dense:")
    for mode, t in table.items():
        print(f"  {mode:11s} wall {t['wall_ms']:6.2f} ms (x{t['wall_ms'] / base['wall_ms']:.2f})  thread CPU {t['cpu_ms']:6.2f} ms "
              f"(x{t['cpu_ms'] / base['cpu_ms']:.2f}); Adam {t['opt_ms']:5.2f} ms (x{t['opt_ms'] / base['opt_ms']:.2f}), forward and backward "
              f"{t['rest_ms']:5.2f} ms (x{t['rest_ms'] / base['rest_ms']:.2f})  n={t['n']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "modes": table, "per_process": {str(k): v for k, v in got.items()}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
