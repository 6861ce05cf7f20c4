"""A fresh DDP user script for reviewing dagprof (issues 16 and 20, stop 59): a small VQ-VAE on random images.

Habits it exercises, as users write them (no other fresh script has this model family or these habits together):
- a vector-quantised autoencoder (conv encoder, a codebook of 128 codes looked up by ``torch.cdist`` + ``argmin``,
  straight-through gradients, commitment loss; a transposed-conv decoder whose convs carry
  ``parametrizations.weight_norm``);
- an EMA copy of the weights with ``torch.optim.swa_utils.AveragedModel(get_ema_multi_avg_fn(0.99))`` updated after
  each optimizer step, evaluated every ``--eval-every`` steps;
- gradient accumulation over 2 micro-batches with ``model.no_sync()`` on the first, ``gradient_as_bucket_view=True``,
  ``bucket_cap_mb=1``, AdamW with a ``OneCycleLR``;
- dead-code restart: every ``--restart-every`` steps rank 0 picks fresh encoder outputs for the codes nobody used
  (usage counts all-reduced) and broadcasts them: two collectives of its own outside DDP's buckets;
- ``--dagprof DIR``: the Python API form (``dagprof.profile(DIR, steps=...)``, ``prof.step()``) instead of the zero-code
  command; ``--trace DIR``: the user's own ``torch.profiler`` with ``schedule(wait=1, warmup=1, active=2, repeat=2)``
  and ``tensorboard_trace_handler(DIR)`` (two traces per rank).

    dagprof profile -o runs/vq -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/vqvae_ema.py --steps 16
    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/vqvae_ema.py --dagprof runs/vq-api
    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/vqvae_ema.py --trace /tmp/vq-tb && dagprof analyze /tmp/vq-tb
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.parametrizations import weight_norm
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class Quantizer(nn.Module):
    def __init__(self, codes: int, dim: int, beta: float = 0.25) -> None:
        super().__init__()
        self.book = nn.Embedding(codes, dim)
        nn.init.uniform_(self.book.weight, -1 / codes, 1 / codes)
        self.beta = beta

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, c, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, c)
        idx = torch.cdist(flat, self.book.weight).argmin(dim=1)
        q = self.book(idx).view(b, h, w, c).permute(0, 3, 1, 2)
        loss = F.mse_loss(q, z.detach()) + self.beta * F.mse_loss(z, q.detach())
        return z + (q - z).detach(), loss, idx


class VQVAE(nn.Module):
    def __init__(self, ch: int = 64, dim: int = 32, codes: int = 128) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, ch, 4, 2, 1), nn.ReLU(), nn.Conv2d(ch, ch, 4, 2, 1), nn.ReLU(),
                                 nn.Conv2d(ch, ch, 3, 1, 1), nn.ReLU(), nn.Conv2d(ch, dim, 1))
        self.vq = Quantizer(codes, dim)
        self.dec = nn.Sequential(weight_norm(nn.Conv2d(dim, ch, 3, 1, 1)), nn.ReLU(),
                                 weight_norm(nn.ConvTranspose2d(ch, ch, 4, 2, 1)), nn.ReLU(),
                                 nn.ConvTranspose2d(ch, 3, 4, 2, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        z = self.enc(x)
        q, vq_loss, idx = self.vq(z)
        return self.dec(q), vq_loss, idx, z


def restart_dead_codes(net: VQVAE, counts: torch.Tensor, z: torch.Tensor) -> int:
    """Give the codes no rank used an encoder output of rank 0's batch (broadcast, so every replica agrees)."""
    dist.all_reduce(counts)
    dead = (counts == 0).nonzero().flatten()
    fresh = torch.zeros(len(dead), net.vq.book.weight.shape[1])
    if len(dead) and dist.get_rank() == 0:
        flat = z.detach().permute(0, 2, 3, 1).reshape(-1, fresh.shape[1])
        fresh = flat[torch.randint(0, len(flat), (len(dead),))]
    if len(dead):
        dist.broadcast(fresh, src=0)
        with torch.no_grad():
            net.vq.book.weight[dead] = fresh
    return len(dead)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--micro", type=int, default=8, help="images per micro-batch (2 micro-batches a step)")
    p.add_argument("--restart-every", type=int, default=5)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--no-accum", action="store_true", help="one micro-batch of twice the size, no no_sync()")
    p.add_argument("--dagprof", metavar="DIR", help="profile with dagprof.profile(DIR) in the loop")
    p.add_argument("--trace", metavar="DIR", help="the user's own torch.profiler, two windows per rank into DIR")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = VQVAE()
    model = DDP(net, gradient_as_bucket_view=True, bucket_cap_mb=1)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.99))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.99), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps)
    g = torch.Generator().manual_seed(100 + rank)
    images = torch.rand(args.steps * 2 + 2, args.micro, 3, 32, 32, generator=g) * 2 - 1
    held = torch.rand(args.micro, 3, 32, 32, generator=g) * 2 - 1
    counts = torch.zeros(net.vq.book.num_embeddings)
    prof = contextlib.nullcontext()
    if args.dagprof:
        import dagprof
        prof = dagprof.profile(args.dagprof, steps=range(5, args.steps - 1))
    elif args.trace:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                       schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                       on_trace_ready=tensorboard_trace_handler(args.trace))
    stamps: list[float] = []
    with prof as p_:
        for step in range(args.steps):
            micro = [images[2 * step:2 * step + 2].flatten(0, 1)] if args.no_accum else [images[2 * step], images[2 * step + 1]]
            for i, x in enumerate(micro):
                sync = contextlib.nullcontext() if i == len(micro) - 1 else model.no_sync()
                with sync:
                    recon, vq_loss, idx, z = model(x)
                    loss = (F.mse_loss(recon, x) + vq_loss) / len(micro)
                    loss.backward()
                counts += torch.bincount(idx, minlength=len(counts)).float()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            ema.update_parameters(net)
            if (step + 1) % args.restart_every == 0:
                dead = restart_dead_codes(net, counts, z)
                counts.zero_()
                if rank == 0:
                    print(f"step {step} loss {loss.item() * len(micro):.4f} restarted {dead} codes", flush=True)
            if (step + 1) % args.eval_every == 0:
                with torch.no_grad():
                    err = F.mse_loss(ema.module(held)[0], held)
                dist.all_reduce(err)
                if rank == 0:
                    print(f"step {step} EMA reconstruction {err.item() / dist.get_world_size():.4f}", flush=True)
            if p_ is not None:
                p_.step()
            stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
