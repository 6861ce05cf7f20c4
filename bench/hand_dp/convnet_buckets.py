"""A fresh data-parallel job with no DDP (stop 61): a small ResNet whose gradients the user buckets and averages by hand.

Habits it exercises, as users write them before (or instead of) DDP:
- a CIFAR-style ResNet (stem conv, ``BasicBlock``s with BatchNorm and a strided 1x1 shortcut, global pooling), built
  from ``nn.Sequential`` stages;
- after ``loss.backward()``, ``BucketedAllReduce`` packs the gradients, last layer first, into buckets of about
  ``--bucket-kb`` (``torch._utils._flatten_dense_tensors``), issues one ``dist.all_reduce(flat, async_op=True)`` per
  bucket, then waits on each handle in turn and copies the averaged bucket back (``_unflatten_dense_tensors``);
- the batch's correct counts per class gathered from every rank with ``dist.all_gather_into_tensor(..., async_op=True)``
  right after the forward, waited for only after the optimizer step (running accuracy, printed by rank 0);
- SGD with momentum and weight decay, ``torch.manual_seed`` per rank for the data;
- profiled by the Python API: ``--dagprof DIR`` wraps the loop in ``dagprof.profile(DIR, steps=..., model=model)``,
  ``--record-shapes`` adds ``record_shapes=True``.

    torchrun --standalone --nproc-per-node 2 bench/hand_dp/convnet_buckets.py --steps 8 --dagprof runs/convnet
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

CLASSES = 10


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


def resnet(width: int) -> nn.Module:
    stages, cin = [], width
    for k, cout in enumerate((width, 2 * width, 4 * width)):
        stages.append(nn.Sequential(BasicBlock(cin, cout, 1 if k == 0 else 2), BasicBlock(cout, cout, 1)))
        cin = cout
    return nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), *stages,
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


class BucketedAllReduce:
    """Gradient averaging by hand: buckets of about ``cap`` bytes, last parameters first, one async all-reduce each."""

    def __init__(self, model: nn.Module, cap: int) -> None:
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            if size and size + p.numel() * p.element_size() > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()

    def __call__(self) -> None:
        world = dist.get_world_size()
        flats = [_flatten_dense_tensors([p.grad for p in b]) for b in self.buckets]
        handles = [dist.all_reduce(f, async_op=True) for f in flats]
        for bucket, flat, handle in zip(self.buckets, flats, handles):
            handle.wait()
            flat.div_(world)
            for p, g in zip(bucket, _unflatten_dense_tensors(flat, [p.grad for p in bucket])):
                p.grad.copy_(g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-kb", type=int, default=256)
    p.add_argument("--dagprof", metavar="DIR", help="profile steps 3 to the second last with dagprof.profile(DIR)")
    p.add_argument("--record-shapes", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = resnet(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    average = BucketedAllReduce(model, args.bucket_kb * 1024)
    g = torch.Generator().manual_seed(rank)
    correct_total = torch.zeros(CLASSES)
    prof = contextlib.nullcontext()
    if args.dagprof:
        import dagprof
        prof = dagprof.profile(args.dagprof, steps=range(3, args.steps - 1), model=model, record_shapes=args.record_shapes)
    with prof:
        for step in range(args.steps):
            img = torch.randn(args.batch, 3, 32, 32, generator=g)
            label = torch.randint(0, CLASSES, (args.batch,), generator=g)
            out = model(img)
            loss = F.cross_entropy(out, label)
            hits = torch.bincount(label[out.argmax(1) == label], minlength=CLASSES).float()
            gathered = torch.empty(world * CLASSES)
            stats = dist.all_gather_into_tensor(gathered, hits, async_op=True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            average()
            opt.step()
            stats.wait()
            correct_total += gathered.view(world, CLASSES).sum(0)
            if args.dagprof:
                prof.step()
            if rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss.item():.3f} correct so far {int(correct_total.sum())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
