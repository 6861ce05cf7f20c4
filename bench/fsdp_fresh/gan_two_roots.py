"""A GAN on FSDP2: the generator and the discriminator each ``fully_shard`` per block and at the root, two optimizers.

A user's habit dagprof was not built with: two ``fully_shard`` roots trained in turn (the discriminator on real and fake
samples, then the generator through it), the discriminator's first forward after the generator's (``--late-disc``: it
is sharded only after the generator's first forward). ``--ddp`` runs the same
loop with each model in its own ``DistributedDataParallel``. Run as::

    dagprof profile -o runs/gan -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/gan_two_roots.py --steps 8
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


def mlp(sizes: list[int], last: nn.Module | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers.append(nn.Sequential(nn.Linear(a, b), nn.LeakyReLU(0.2)))
    layers[-1] = nn.Sequential(nn.Linear(sizes[-2], sizes[-1]), *([last] if last is not None else []))
    return nn.Sequential(*layers)


def shard(model: nn.Sequential, reshard: bool) -> None:
    for block in model:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--late-disc", action="store_true", help="shard the discriminator after the generator's first forward")
    ap.add_argument("--reshard", choices=("on", "off"), default=None, help="every unit's reshard_after_forward (default: fully_shard's)")
    ap.add_argument("--ddp", action="store_true", help="wrap each model in its own DistributedDataParallel instead (the held-out run of "
                    "whatif --data-parallel ddp)")
    ap.add_argument("--strategy", metavar="FILE", help="a strategy of dagprof optimize, applied to both models (dagprof.apply)")
    ap.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = ap.parse_args()
    reshard = None if args.reshard is None else args.reshard == "on"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    gen = mlp([32, args.width, args.width, args.width, 64], nn.Tanh())
    disc = mlp([64, args.width, args.width, 1], None)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1 + int(os.environ.get("RANK", "0")))
    if args.ddp:
        gen, disc = DistributedDataParallel(gen), DistributedDataParallel(disc)
    for model in () if args.ddp else (gen,) if args.late_disc else (gen, disc):
        shard(model, reshard)
    if args.late_disc and not args.ddp:  # a habit: the second model built (or sharded) after a first forward of the first
        gen(torch.randn(2, 32, generator=g))
        shard(disc, reshard)
    if args.strategy:
        import dagprof

        dagprof.apply([gen, disc], args.strategy)  # the generator first: it runs forward first
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import Optimizers, StepPeaks
    peaks = StepPeaks(args.memory, nn.ModuleList([gen, disc]), Optimizers(opt_g, opt_d))
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        with peaks.step():
            real = torch.randn(args.batch, 64, generator=g).tanh()
            fake = gen(torch.randn(args.batch, 32, generator=g))
            loss_d = bce(disc(real), torch.ones(args.batch, 1)) + bce(disc(fake.detach()), torch.zeros(args.batch, 1))
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            loss_g = bce(disc(fake), torch.ones(args.batch, 1))
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
        times.append(time.perf_counter() - t0)
        if dist.get_rank() == 0 and step % 4 == 0:
            print(f"step {step} loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f}")
    peaks.save(dist.get_rank())
    if dist.get_rank() == 0:
        print(f"median step {sorted(times)[len(times) // 2] * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
