"""A fresh FSDP2 user script for reviewing dagprof (issues 16 and 20, stop 58): a small DETR-style set-prediction detector.

Habits it exercises, as users write them (no other fresh script has this model family):
- a strided conv backbone -> a flattened feature map with learned positions -> ``nn.TransformerEncoderLayer`` x
  ``--enc`` -> ``nn.TransformerDecoderLayer`` x ``--dec`` over learned object queries -> a class head (with a
  no-object class) and a box MLP (sigmoid cx, cy, w, h); a greedy bipartite matcher (the user had no scipy) and
  the set loss: cross-entropy with the no-object class down-weighted, L1 on matched boxes;
- ``fully_shard(layer, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))``
  per encoder and decoder layer, on the backbone, then the root;
- a ``Dataset`` of images with 1-4 painted boxes and a ``collate_fn`` that keeps targets as lists, ``DataLoader``
  with ``DistributedSampler`` and ``set_epoch``;
- ``AdamW`` with a lower learning rate for the backbone (two param groups), ``LambdaLR`` warm-up then decay,
  ``clip_grad_norm_(0.1)`` on the DTensor gradients;
- gradient accumulation with ``set_requires_gradient_sync(False)`` on all but the last micro-batch (``--accum``);
- a matched-box IoU on a validation batch every ``--eval-every`` steps (``all_reduce`` of the sums), logging on rank
  0, a full state dict (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``) saved by rank 0 at the end.

    dagprof profile -o runs/detr -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/detr_setpred.py
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CLASSES, SIDE, DIM, QUERIES = 6, 64, 96, 10


class Boxes(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 7919 + i)
        img = 0.3 * torch.randn(3, SIDE, SIDE, generator=g)
        k = int(torch.randint(1, 5, (1,), generator=g))
        wh = 0.15 + 0.3 * torch.rand(k, 2, generator=g)
        c = wh / 2 + (1 - wh) * torch.rand(k, 2, generator=g)
        labels = torch.randint(0, CLASSES, (k,), generator=g)
        for (cx, cy), (w, h), lab in zip(c.tolist(), wh.tolist(), labels.tolist()):
            x0, x1 = int((cx - w / 2) * SIDE), int((cx + w / 2) * SIDE)
            y0, y1 = int((cy - h / 2) * SIDE), int((cy + h / 2) * SIDE)
            img[lab % 3, y0:y1, x0:x1] += 1.0 + lab / CLASSES
        return img, {"labels": labels, "boxes": torch.cat([c, wh], 1)}


def collate(batch):
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


class Detr(nn.Module):
    def __init__(self, enc: int, dec: int) -> None:
        super().__init__()
        def conv(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, stride=2, padding=1), nn.GroupNorm(8, o), nn.ReLU())
        self.backbone = nn.Sequential(conv(3, 32), conv(32, 64), conv(64, DIM))      # 64 -> 8 x 8
        self.pos = nn.Parameter(torch.randn(1, (SIDE // 8) ** 2, DIM) * 0.02)
        self.encoder = nn.ModuleList(nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, 0.1, batch_first=True)
                                     for _ in range(enc))
        self.decoder = nn.ModuleList(nn.TransformerDecoderLayer(DIM, 4, 4 * DIM, 0.1, batch_first=True)
                                     for _ in range(dec))
        self.queries = nn.Parameter(torch.randn(QUERIES, DIM) * 0.02)
        self.cls = nn.Linear(DIM, CLASSES + 1)
        self.box = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, 4))

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mem = self.backbone(img).flatten(2).transpose(1, 2) + self.pos
        for layer in self.encoder:
            mem = layer(mem)
        q = self.queries.unsqueeze(0).expand(img.shape[0], -1, -1)
        for layer in self.decoder:
            q = layer(q, mem)
        return self.cls(q), self.box(q).sigmoid()


def greedy_match(cost: torch.Tensor) -> tuple[list[int], list[int]]:
    """Query and target indices, cheapest pair first (the Hungarian matcher's stand-in)."""
    cost = cost.clone()
    qi, ti = [], []
    for _ in range(cost.shape[1]):
        flat = int(cost.argmin())
        q, t = divmod(flat, cost.shape[1])
        qi.append(q)
        ti.append(t)
        cost[q, :], cost[:, t] = float("inf"), float("inf")
    return qi, ti


def set_loss(logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict], weight: torch.Tensor):
    logits, boxes = logits.float(), boxes.float()
    cls_target = torch.full(logits.shape[:2], CLASSES, dtype=torch.long)
    l1, n, ious = boxes.new_zeros(()), 0, []
    for b, t in enumerate(targets):
        with torch.no_grad():
            cost = -logits[b].softmax(-1)[:, t["labels"]] + 5 * torch.cdist(boxes[b], t["boxes"], p=1)
            qi, ti = greedy_match(cost)
        cls_target[b, qi] = t["labels"][ti]
        l1 = l1 + F.l1_loss(boxes[b, qi], t["boxes"][ti], reduction="sum")
        n += len(ti)
        ious.append(box_iou(boxes[b, qi].detach(), t["boxes"][ti]))
    ce = F.cross_entropy(logits.transpose(1, 2), cls_target, weight=weight)
    return ce + 5 * l1 / n, torch.cat(ious)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def corners(x):
        return torch.cat([x[:, :2] - x[:, 2:] / 2, x[:, :2] + x[:, 2:] / 2], 1)
    a, b = corners(a), corners(b)
    lo, hi = torch.maximum(a[:, :2], b[:, :2]), torch.minimum(a[:, 2:], b[:, 2:])
    inter = (hi - lo).clamp(min=0).prod(1)
    area = lambda x: (x[:, 2:] - x[:, :2]).prod(1)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def main() -> None:
    p = argparse.ArgumentParser(description="a DETR-style detector under FSDP2")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--enc", type=int, default=2)
    p.add_argument("--dec", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--no-mp", action="store_true", help="no MixedPrecisionPolicy (fp32 everywhere)")
    p.add_argument("--ckpt", default=os.environ.get("TMPDIR", "/tmp") + "/detr_ckpt.pt")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Detr(args.enc, args.dec)
    mp = MixedPrecisionPolicy() if args.no_mp else MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                         reduce_dtype=torch.float32)
    fully_shard(model.backbone, mp_policy=mp)
    for layer in [*model.encoder, *model.decoder]:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    backbone = {id(q) for q in model.backbone.parameters()}
    opt = torch.optim.AdamW([
        {"params": [q for q in model.parameters() if id(q) in backbone], "lr": args.lr / 10},
        {"params": [q for q in model.parameters() if id(q) not in backbone]}], lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / args.warmup) * (0.1 if s >= 0.75 * args.steps else 1.0))
    weight = torch.ones(CLASSES + 1)
    weight[CLASSES] = 0.1
    data = Boxes(2048, seed=1)
    sampler = DistributedSampler(data, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, collate_fn=collate, drop_last=True)
    val_img, val_t = collate([Boxes(16, seed=77)[i] for i in range(16)])
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)      # one optimizer step's peak: every micro-batch of it (accumulated gradients)
    step, micro, epoch = 0, 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for img, targets in loader:
            last = (micro + 1) % args.accum == 0
            if micro % args.accum == 0:
                scope = contextlib.ExitStack()
                scope.enter_context(peaks.step())
            model.set_requires_gradient_sync(last)
            logits, boxes = model(img)
            loss, _ = set_loss(logits, boxes, targets, weight)
            (loss / args.accum).backward()
            micro += 1
            if not last:
                continue
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            scope.close()
            step += 1
            if rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss.item():.4f} grad norm {norm.full_tensor().item():.3f}", flush=True)
            if step % args.eval_every == 0:
                model.eval()
                with torch.no_grad():
                    _, ious = set_loss(*model(val_img), val_t, weight)
                model.train()
                s = torch.tensor([float(ious.sum()), float(len(ious))])
                dist.all_reduce(s)
                if rank == 0:
                    print(f"step {step} val matched IoU {s[0] / s[1]:.3f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    peaks.save(rank)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": state, "step": step}, args.ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
