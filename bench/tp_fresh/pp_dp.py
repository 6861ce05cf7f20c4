"""A fresh pipeline-parallel x data-parallel job for reviewing dagprof's mesh labels (issue 16), 4 ranks.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))``: ranks {0,1} run stage 0, {2,3} stage 1; the
pipeline pairs are {0,2} and {1,3}. Hand-written GPipe: each step sends ``--micro`` micro-batches' activations forward
(``dist.send``/``recv`` over the ``pp`` group), then their gradients back; each stage is DDP over its ``dp`` group
(``no_sync`` on all but the last micro-batch), so the gradient all-reduce follows the last backward.

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

WIDTH, BATCH = 128, 16


def main() -> None:
    args = parse(__doc__, micro=(int, 2))
    init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage, pp = mesh["pp"].get_local_rank(), mesh["pp"].get_group()
    peer = dist.get_global_rank(pp, 1 - stage)
    torch.manual_seed(stage)
    body = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.ReLU(), nn.Linear(2 * WIDTH, WIDTH), nn.ReLU())
    model = DDP(body if stage == 0 else nn.Sequential(body, nn.Linear(WIDTH, 10)), device_mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(10 + mesh["dp"].get_local_rank())
    xs = [torch.randn(BATCH, WIDTH) for _ in range(args.micro)]
    ys = [torch.randint(0, 10, (BATCH,)) for _ in range(args.micro)]

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
                    act = torch.empty(BATCH, WIDTH)
                    dist.recv(act, peer, group=pp)
                    act.requires_grad_()
                    ins.append(act)
                    out = F.cross_entropy(model(act), ys[m])
                outs.append(out)
        for m in range(args.micro):  # then their backward
            ctx = model.no_sync() if m < args.micro - 1 else contextlib.nullcontext()
            with ctx:
                if stage == 0:
                    grad = torch.empty(BATCH, WIDTH)
                    dist.recv(grad, peer, group=pp)
                    outs[m].backward(grad)
                else:
                    outs[m].backward()
                    dist.send(ins[m].grad, peer, group=pp)
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
