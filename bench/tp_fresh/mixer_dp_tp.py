"""A fresh 2-D DP x TP job for reviewing dagprof (issues 16 and 20, stop 58): an MLP-Mixer image classifier on 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
Habits it exercises, as users write them (no other tp_fresh job has this family: every block is two MLPs):
- each Mixer block's token-mixing MLP (over patches, on the transposed activations) and channel-mixing MLP both
  tensor parallel, ``parallelize_module`` with ``ColwiseParallel`` on ``fc1`` and ``RowwiseParallel`` on ``fc2`` (an
  all-reduce of each MLP's output in forward, one of its input's gradient in backward); patch embedding, norms and
  head replicated over TP;
- data parallel over the ``dp`` sub-mesh by FSDP2: ``fully_shard(block, mesh=mesh["dp"])`` per block and the root;
- ``DataLoader`` with ``DistributedSampler(num_replicas=dp size, rank=dp rank)`` (both TP ranks of a replica read
  the same batch) and ``set_epoch``; ``SGD`` with Nesterov momentum, ``CosineAnnealingLR``; bf16 ``autocast`` on CPU
  (``--amp``); gradient clipping by the total norm computed per mesh (``clip_grad_norm_`` refuses DTensors of two
  meshes) then ``clip_grads_with_norm_`` mesh by mesh;
- accuracy on a validation batch every ``--eval-every`` steps, logging on rank 0, a ``torch.distributed.checkpoint``
  save at the end.

    dagprof profile -o runs/mixer_tp -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/mixer_dp_tp.py
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SIDE, PATCH, DIM, TOK_H, CH_H, CLASSES = 32, 4, 96, 128, 384, 10
TOKENS = (SIDE // PATCH) ** 2


class Mlp(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MixerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.token, self.channel = Mlp(TOKENS, TOK_H), Mlp(DIM, CH_H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel(self.n2(x))


class Mixer(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.blocks = nn.ModuleList(MixerBlock() for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, CLASSES)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.stem(img).flatten(2).transpose(1, 2)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(1))


def clip_(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Total gradient norm over DTensors of several meshes: each group's norm made whole, then one scale."""
    groups: dict = {}
    for q in params:
        if q.grad is not None:
            groups.setdefault(q.grad.device_mesh if isinstance(q.grad, DTensor) else None, []).append(q)
    sq = torch.zeros(())
    for group in groups.values():
        n = torch.nn.utils.get_total_norm([q.grad for q in group])
        sq = sq + (n.full_tensor() if isinstance(n, DTensor) else n) ** 2
    total = sq.sqrt()
    for group in groups.values():            # one mesh per foreach call
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description="an MLP-Mixer, DP x TP on a 2 x 2 mesh")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="images per DP replica per step")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--amp", action="store_true", help="bf16 autocast on CPU")
    p.add_argument("--ckpt", default=os.path.join(os.environ.get("TMPDIR", tempfile.gettempdir()), "mixer_dcp"))
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Mixer(args.depth)
    for b in model.blocks:
        for mlp in (b.token, b.channel):
            parallelize_module(mlp, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        fully_shard(b, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    g = torch.Generator().manual_seed(11)
    protos = torch.randn(CLASSES, 3, SIDE, SIDE, generator=g)
    labels = torch.randint(0, CLASSES, (4096,), generator=g)
    images = protos[labels] + 1.5 * torch.randn(4096, 3, SIDE, SIDE, generator=g)
    data = TensorDataset(images, labels)
    dp = mesh["dp"]
    sampler = DistributedSampler(data, num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=2)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    val_x, val_y = images[-256:], labels[-256:]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import StepPeaks
    peaks = StepPeaks(args.memory, model, opt)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.amp else contextlib.nullcontext()
            with peaks.step():
                with amp:
                    loss = F.cross_entropy(model(x).float(), y)
                loss.backward()
                norm = clip_(list(model.parameters()), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss.item():.4f} grad norm {norm.item():.3f}", flush=True)
            if step % args.eval_every == 0:
                model.eval()
                with torch.no_grad():
                    acc = (model(val_x).argmax(1) == val_y).float().mean()
                model.train()
                if rank == 0:
                    print(f"step {step} val acc {acc.item():.3f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    peaks.save(rank)
    dcp.save({"model": model.state_dict()}, checkpoint_id=args.ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
