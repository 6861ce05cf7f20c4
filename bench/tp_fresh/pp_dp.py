"""A fresh pipeline-parallel x data-parallel job for reviewing dagprof's mesh labels (issue 16), 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))``: ranks {0,1} run stage 0, {2,3} stage 1; the
pipeline pairs are {0,2} and {1,3}. Hand-written GPipe: each step sends ``--micro`` micro-batches' activations forward
(``dist.send``/``recv`` over the ``pp`` group), then their gradients back; each stage is DDP over its ``dp`` group
(``no_sync`` on all but the last micro-batch), so the gradient all-reduce follows the last backward. ``--repeat K`` runs
each stage's layers K times per micro-batch (their outputs averaged: K times the compute, the same messages), so a
recording at K = 2 and one at K = 1 check ``whatif --compute-speed 2`` (``bench/tp_fresh/pp_compute.py``).

    dagprof profile -o runs/pp -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/pp_dp.py
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/pp_dp.py --trace traces/pp_dp
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP


class Repeat(nn.Module):
    """``body`` applied ``times`` times to the same input, averaged: the compute of ``times`` layers, one output."""

    def __init__(self, body: nn.Module, times: int) -> None:
        super().__init__()
        self.body, self.times = body, times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.body(x) for _ in range(self.times)) / self.times


def main() -> None:
    args = parse(__doc__, micro=(int, 2), width=(int, 128), batch=(int, 16), repeat=(int, 1))
    width, batch = args.width, args.batch
    init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage, pp = mesh["pp"].get_local_rank(), mesh["pp"].get_group()
    peer = dist.get_global_rank(pp, 1 - stage)
    torch.manual_seed(stage)
    body = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width), nn.ReLU())
    body = body if args.repeat == 1 else Repeat(body, args.repeat)
    model = DDP(body if stage == 0 else nn.Sequential(body, nn.Linear(width, 10)), device_mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(10 + mesh["dp"].get_local_rank())
    xs = [torch.randn(batch, width) for _ in range(args.micro)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(args.micro)]

    def step() -> None:
        opt.zero_grad()
        outs, ins = [], []
        for m in range(args.micro):  # forward of every micro-batch
            ctx = model.no_sync() if m < args.micro - 1 else contextlib.nullcontext()
            with ctx:
                if stage == 0:
                    out = model(xs[m])
                    dist.send(out.detach(), peer, group=pp)
                else:
                    act = torch.empty(batch, width)
                    dist.recv(act, peer, group=pp)
                    act.requires_grad_()
                    ins.append(act)
                    out = F.cross_entropy(model(act), ys[m])
                outs.append(out)
        for m in range(args.micro):  # then their backward
            ctx = model.no_sync() if m < args.micro - 1 else contextlib.nullcontext()
            with ctx:
                if stage == 0:
                    grad = torch.empty(batch, width)
                    dist.recv(grad, peer, group=pp)
                    outs[m].backward(grad)
                else:
                    outs[m].backward()
                    dist.send(ins[m].grad, peer, group=pp)
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
