"""A Horovod (PyTorch, gloo, CPU) training job: dagprof's demo CNN, synthetic data, SGD.

Run under horovodrun (each rank one thread)::

    HOROVOD_TIMELINE=DYNAMIC horovodrun -np 2 -H localhost:2 --gloo \\
        python bench/horovod/train_hvd.py --steps 12 --profile 6:10 --out runs/hvd

``--profile A:B --out RUN`` profiles steps A..B-1 with ``dagprof.collect.horovod.profile``;
without it the job only trains. ``--times FILE`` makes rank 0 write every step's wall time
(seconds) as JSON: the measured side of the what-if benchmark. Horovod's knobs come from the
environment as usual (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME).
"""
from __future__ import annotations

import argparse
import json
import os
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--profile", default=None, metavar="A:B", help="steps to profile (needs --out)")
    p.add_argument("--out", default=None, help="dagprof run folder")
    p.add_argument("--times", default=None, help="rank 0 writes per-step seconds here (JSON)")
    p.add_argument("--no-mark-cycles", action="store_true", help="profile without Horovod's cycle markers")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--blocks", default="1,1,1", help="basic blocks per stage")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(argv)

    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    from dagprof.collect.jobs.demo_train import DemoConfig, build_model

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = DemoConfig(width=args.width, blocks=tuple(int(b) for b in args.blocks.split(",")), image_size=args.image_size,
                     batch_size=args.batch_size)
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    batches = [(torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=gen),
                torch.randint(0, 10, (cfg.batch_size,), generator=gen)) for _ in range(4)]
    times: list[float] = []

    def one_step(i: int) -> None:
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)

    if args.profile:
        from dagprof.collect.hooks.horovod import profile

        if not args.out:
            p.error("--profile needs --out")
        first, _, stop = args.profile.partition(":")
        with profile(args.out, steps=range(int(first), int(stop)), model=model, optimizer=opt, mark_cycles=not args.no_mark_cycles) as prof:
            for i in range(args.steps):
                one_step(i)
                prof.step()
    else:
        for i in range(args.steps):
            one_step(i)
    if args.times and hvd.rank() == 0:
        with open(args.times, "w") as f:
            json.dump({"step_s": times, "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}}, f)
    hvd.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
