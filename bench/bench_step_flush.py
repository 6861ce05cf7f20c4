"""Cost of writing every completed step at once (``rank<R>.steps/step<S>.json``) on a real 2-rank gloo DDP job.

One job (the demo CNN, hooks only), so both variants share the machine's load: windows of
``--block`` steps alternate between the collector as it is (each step written when it ends) and
the collector with the step write turned off (what dagprof did before: everything at the window's
end). Per step, rank 0 times the whole step including ``prof.step()`` (where the write happens),
and ``prof.step()`` alone. Medians per round, then over rounds, with the spread.

    .venv/bin/python bench/bench_step_flush.py [--rounds 6] [--block 8] [--small]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from bench_overhead import ddp_job  # the same DDP job, beside this script

from dagprof.collect.jobs.demo_train import DemoConfig
from dagprof.collect.jobs.netns import free_port

VARIANTS = ("each step written (now)", "window end only (before)")


def _worker(rank: int, cfg: DemoConfig, rounds: int, block: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from dagprof.collect import profile
    from dagprof.collect.hooks.collector import Collector

    model, train_step = ddp_job(rank, cfg, port)
    write_step = Collector._write_step_part
    times: dict[str, list] = {v: [] for v in VARIANTS}
    sizes: list[int] = []
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds + 1):  # round 0 warms up (DDP rebuilds its buckets, hooks installed)
            for k, variant in enumerate(VARIANTS if r % 2 else VARIANTS[::-1]):
                Collector._write_step_part = write_step if variant == VARIANTS[0] else (lambda self: None)
                run = os.path.join(folder, f"r{r}{k}")
                per_round = []
                with profile(run, steps=range(1, block + 1), model=model, kineto=False) as prof:
                    for i in range(block + 2):
                        t0 = time.perf_counter()
                        train_step()
                        t1 = time.perf_counter()
                        prof.step()
                        t2 = time.perf_counter()
                        if 1 <= i < block:  # steps inside the window, not its last (that one writes rank<R>.json)
                            per_round.append((t2 - t0, t2 - t1))
                            steps_dir = os.path.join(run, f"rank{rank}.steps")
                            if variant == VARIANTS[0] and os.path.isdir(steps_dir):
                                sizes += [os.path.getsize(os.path.join(steps_dir, f)) for f in os.listdir(steps_dir) if f.startswith("step")]
                if r:
                    times[variant].append([statistics.median(s for s, _ in per_round), statistics.median(b for _, b in per_round)])
    Collector._write_step_part = write_step
    dist.destroy_process_group()
    with open(os.path.join(out, f"flush{rank}.json"), "w") as f:
        json.dump({"times": times, "sizes": sizes}, f)


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--block", type=int, default=8, help="steps per window")
    p.add_argument("--small", action="store_true", help="the tiny test model")
    args = p.parse_args()
    cfg = DemoConfig.small() if args.small else DemoConfig()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(cfg, args.rounds, args.block, free_port(), out), nprocs=cfg.world_size, join=True)
        with open(os.path.join(out, "flush0.json")) as f:
            res = json.load(f)
    print(f"2-rank gloo DDP demo CNN ({'small' if args.small else 'default'} model), hooks only, {args.rounds} rounds of "
          f"{args.block}-step windows per variant, rank 0")
    print(f"{'variant':28s} {'step ms (median, spread of round medians)':>44s} {'prof.step() us':>16s}")
    med = {}
    for v, rows in res["times"].items():
        steps, bounds = [s * 1e3 for s, _ in rows], [b * 1e6 for _, b in rows]
        med[v] = (statistics.median(steps), statistics.median(bounds))
        print(f"{v:28s} {med[v][0]:20.2f} ({min(steps):.2f}-{max(steps):.2f}) {'':>10s} {med[v][1]:12.0f}")
    now, before = med[VARIANTS[0]], med[VARIANTS[1]]
    paired = [a[0] / b[0] for a, b in zip(res["times"][VARIANTS[0]], res["times"][VARIANTS[1]])]
    print(f"step time now/before: {now[0] / before[0]:.3f} (per round {min(paired):.3f}-{max(paired):.3f}); "
          f"the write adds {now[1] - before[1]:.0f} us per step; step files {statistics.median(res['sizes']) / 1e3:.0f} kB median")


if __name__ == "__main__":
    main()
