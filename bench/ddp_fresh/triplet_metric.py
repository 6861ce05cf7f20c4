"""A fresh DDP user script for reviewing dagprof: a Siamese/triplet metric-learning model (issues 16 and 20, stop 58).

Habits it exercises, as users write them (no other fresh script has this model family):
- a small conv embedding net whose anchor, positive and negative go through ONE forward (concatenated, the
  habit DDP needs: three forwards before a backward would sync three times), an L2-normalised 64-d embedding and
  ``TripletMarginLoss``; an auxiliary classifier head trained only every ``--aux-every`` steps, so
  ``find_unused_parameters=True`` (set by the user "to be safe") matters;
- a map-style ``Dataset`` sampling triplets, ``DataLoader`` with ``DistributedSampler`` and ``set_epoch`` each epoch;
- ``SGD`` with momentum, ``OneCycleLR``, ``clip_grad_norm_``; bf16 ``autocast`` on CPU (``--amp``);
- gradient accumulation with ``no_sync`` (``--accum``), ``torch.compile`` of the module (``--compile``);
- recall@1 on a held-out gallery every ``--eval-every`` optimizer steps (each rank scores its half, one
  ``all_reduce`` of the hit count), logging on rank 0, a checkpoint ``torch.save`` by rank 0 at the end.

    dagprof profile -o runs/triplet -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/triplet_metric.py
"""
from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CLASSES, SIDE, EMB = 40, 32, 64


class Triplets(Dataset):
    """Images of CLASSES prototypes with noise; item i is (anchor, positive, negative, anchor class)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.protos = torch.randn(CLASSES, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(7))
        self.cls = torch.randint(0, CLASSES, (n, 2), generator=g)
        self.seed, self.n = seed, n

    def __len__(self) -> int:
        return self.n

    def _img(self, c: int, g: torch.Generator) -> torch.Tensor:
        return self.protos[c] + 0.8 * torch.randn(3, SIDE, SIDE, generator=g)

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        a, n = int(self.cls[i, 0]), int(self.cls[i, 1])
        n = (n + 1) % CLASSES if n == a else n
        return self._img(a, g), self._img(a, g), self._img(n, g), a


class EmbedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        def block(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))
        self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128))
        self.proj = nn.Sequential(nn.Flatten(), nn.Linear(128 * (SIDE // 8) ** 2, 256), nn.ReLU(), nn.Linear(256, EMB))
        self.aux = nn.Linear(EMB, CLASSES)      # only on some steps

    def forward(self, x: torch.Tensor, with_aux: bool = False):
        z = F.normalize(self.proj(self.features(x)), dim=1)
        return (z, self.aux(z)) if with_aux else (z, None)


@torch.no_grad()
def recall_at_1(net: nn.Module, gallery: torch.Tensor, labels: torch.Tensor, rank: int, world: int) -> float:
    net.eval()
    z = net(gallery)[0]
    sim = z @ z.T
    sim.fill_diagonal_(-2)
    mine = torch.arange(rank, len(labels), world)
    hits = torch.tensor([float((labels[sim[mine].argmax(1)] == labels[mine]).sum())])
    dist.all_reduce(hits)
    net.train()
    return hits.item() / len(labels)


def main() -> None:
    p = argparse.ArgumentParser(description="triplet metric learning under DDP")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch", type=int, default=16, help="triplets per rank per micro-batch")
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--aux-every", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--amp", action="store_true", help="bf16 autocast on CPU")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--no-find-unused", action="store_true")
    p.add_argument("--ckpt", default=os.environ.get("TMPDIR", "/tmp") + "/triplet_ckpt.pt")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = EmbedNet()
    model = DDP(net, find_unused_parameters=not args.no_find_unused)
    fwd = torch.compile(model) if args.compile else model
    data = Triplets(4096, seed=1)
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=0, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps)
    triplet = nn.TripletMarginLoss(margin=0.2)
    ev = Triplets(192, seed=99)
    gallery = torch.stack([ev[i][0] for i in range(len(ev))])
    glabels = torch.tensor([ev[i][3] for i in range(len(ev))])
    step, micro, epoch = 0, 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for a, pos, neg, cls in loader:
            with_aux = step % args.aux_every == 0
            last = (micro + 1) % args.accum == 0
            sync = contextlib.nullcontext() if last else model.no_sync()
            amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.amp else contextlib.nullcontext()
            with sync:
                with amp:
                    z, logits = fwd(torch.cat([a, pos, neg]), with_aux)
                    za, zp, zn = z.float().chunk(3)
                    loss = triplet(za, zp, zn)
                    if with_aux:
                        loss = loss + 0.1 * F.cross_entropy(logits.float()[: len(cls)], cls)
                (loss / args.accum).backward()
            micro += 1
            if not last:
                continue
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss.item():.4f} grad norm {norm.item():.3f} lr {sched.get_last_lr()[0]:.4f}",
                      flush=True)
            if step % args.eval_every == 0:
                r1 = recall_at_1(net, gallery, glabels, rank, world)
                if rank == 0:
                    print(f"step {step} recall@1 {r1:.3f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0:
        torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, args.ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
