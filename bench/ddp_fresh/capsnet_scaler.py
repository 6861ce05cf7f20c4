"""A fresh DDP job (issue 20/21 review): a capsule network trained with a loss scaler, epochs that end on a short batch.

Habits it exercises, as users write them (no other fresh script has this family or these habits together):
- a CapsNet (Sabour et al. 2017): a conv stem, primary capsules (a conv reshaped to 8-d vectors, squashed), digit
  capsules by dynamic routing (3 iterations of softmax agreement, ``torch.einsum``), the margin loss, and a small
  reconstruction decoder from the masked digit capsule;
- ``torch.autocast("cpu", dtype=torch.float16)`` around forward and loss, with ``torch.amp.GradScaler("cpu")``:
  ``scaler.scale(loss).backward()``, ``scaler.unscale_(opt)``, ``clip_grad_norm_``, ``scaler.step(opt)``,
  ``scaler.update()`` (a step whose gradients overflow is skipped: ``opt.step()`` is not called); ``--growth-interval``
  (the scaler's, default 2000) set low makes the scale grow into overflow every few steps, so skips land in a window;
- a ``DistributedSampler(drop_last=False)`` over a dataset whose size leaves each rank a short last batch every epoch
  (``--samples`` 300 over 2 ranks, batch 32: 4 full batches and one of 22 an epoch), ``set_epoch`` each epoch;
- at each epoch's end the mean loss is all-reduced by hand and drives ``ReduceLROnPlateau`` (a collective between steps);
- ``--trace DIR``: the user's own ``torch.profiler`` (no dagprof code): ``schedule(skip_first=3, wait=1, warmup=1,
  active=4)``, ``record_shapes=True``, ``profile_memory=True``, and ``on_trace_ready`` writing one gzipped Chrome trace
  per rank (``trace_rank{R}.json.gz``).

    dagprof profile -o runs/caps -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/capsnet_scaler.py --steps 20
    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/capsnet_scaler.py --steps 12 --trace traces/caps
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    n2 = (s * s).sum(dim, keepdim=True)
    return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)


class CapsNet(nn.Module):
    def __init__(self, classes: int = 10, iters: int = 3):
        super().__init__()
        self.iters = iters
        self.stem = nn.Conv2d(1, 32, 9)                       # 28 -> 20
        self.primary = nn.Conv2d(32, 8 * 8, 9, stride=2)     # 20 -> 6: 8 capsule maps of 8-d vectors
        n_primary = 8 * 6 * 6
        self.W = nn.Parameter(0.05 * torch.randn(1, n_primary, classes, 16, 8))
        self.decoder = nn.Sequential(nn.Linear(16 * classes, 256), nn.ReLU(), nn.Linear(256, 784), nn.Sigmoid())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        h = F.relu(self.stem(x))
        u = self.primary(h).view(b, 8, 8, 6, 6).permute(0, 1, 3, 4, 2).reshape(b, -1, 8)
        u = squash(u)
        u_hat = torch.einsum("pcij,bpj->bpci", self.W[0], u)      # b, primary, class, 16
        logits = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype, device=x.device)
        for it in range(self.iters):
            c = logits.softmax(dim=2)
            v = squash((c.unsqueeze(-1) * u_hat).sum(1))           # b, class, 16
            if it < self.iters - 1:
                logits = logits + (u_hat * v.unsqueeze(1)).sum(-1)
        lengths = v.norm(dim=-1)
        mask = F.one_hot(y, v.shape[1]).to(v.dtype).unsqueeze(-1)
        recon = self.decoder((v * mask).flatten(1))
        return lengths, recon


def margin_loss(lengths: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t = F.one_hot(y, lengths.shape[1]).float()
    lengths = lengths.float()
    return (t * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * F.relu(lengths - 0.1) ** 2).sum(1).mean()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--growth-interval", type=int, default=2000)
    p.add_argument("--trace", help="the user's own torch.profiler traces into this folder")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(args.samples, 1, 28, 28), torch.randint(0, 10, (args.samples,)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, drop_last=False)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = DDP(CapsNet())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=args.growth_interval)
    prof = None
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
            schedule=torch.profiler.schedule(skip_first=3, wait=1, warmup=1, active=4),
            on_trace_ready=lambda pr: pr.export_chrome_trace(os.path.join(args.trace, f"trace_rank{rank}.json.gz")))
        prof.start()
    step, epoch, times = 0, 0, []
    while step < args.steps:
        sampler.set_epoch(epoch)
        total, count = torch.zeros(2), 0
        for x, y in loader:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                lengths, recon = model(x, y)
                loss = margin_loss(lengths, y) + 5e-4 * F.mse_loss(recon.float(), x.flatten(1), reduction="sum") / x.shape[0]
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            scaler.step(opt)
            scaler.update()
            total += torch.tensor([loss.item() * x.shape[0], x.shape[0]])
            count += 1
            times.append(time.perf_counter() - t0)
            step += 1
            if prof is not None:
                prof.step()
            if step >= args.steps:
                break
        dist.all_reduce(total)
        plateau.step((total[0] / total[1]).item())
        epoch += 1
    if prof is not None:
        prof.stop()
    if rank == 0:
        steady = sorted(times[5:]) or sorted(times)
        print(f"median step {1000 * steady[len(steady) // 2]:.1f} ms over {len(times)} steps, {epoch} epochs")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
