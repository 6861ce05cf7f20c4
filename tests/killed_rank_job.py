"""A real gloo DDP training (torchrun) in which one rank is stopped by a signal inside the profiled window.

Run under torchrun, each rank trains the small demo model for ``--steps`` steps. Rank ``--die-rank``
sends itself ``--die-signal`` (KILL, TERM or INT) at the start of step ``--die-step``, as the OOM
killer, a scheduler or a user would; torchrun then tears the other ranks down (SIGTERM). With
``--profile RUN`` the ranks call ``dagprof.profile(RUN, steps=...)``; without it the job runs as
is (for ``dagprof profile -- torchrun ...``, the zero-code mode).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from datetime import timedelta


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--profile-steps", default="2:8")
    ap.add_argument("--kineto", action="store_true")
    ap.add_argument("--die-rank", type=int, default=1)
    ap.add_argument("--die-step", type=int, default=5)
    ap.add_argument("--die-signal", default="KILL")
    ap.add_argument("--tiny", action="store_true", help="a Linear(8,16)-ReLU-Linear(16,2) model (small files, for fixtures)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect.jobs.demo_train import DemoConfig, build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    cfg = DemoConfig.small()
    torch.manual_seed(0)
    if args.tiny:
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    else:
        net = build_model(cfg)
        x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size)
        y = torch.randint(0, 10, (cfg.batch_size,))
    model = DDP(net, bucket_cap_mb=cfg.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop(prof) -> None:
        for step in range(args.steps):
            if step == args.die_step and rank == args.die_rank:
                os.kill(os.getpid(), getattr(signal, "SIG" + args.die_signal))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if prof is not None:
                prof.step()

    if args.profile:
        import dagprof

        with dagprof.profile(args.profile, steps=args.profile_steps, model=model, kineto=args.kineto) as prof:
            loop(prof)
    else:
        loop(None)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
