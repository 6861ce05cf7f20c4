"""A fresh pipeline of one stage per rank (3 or 4 ranks) for reviewing dagprof's send/recv pairing (issue 16).

``init_device_mesh("cpu", (N,), mesh_dim_names=("pp",))``: rank s runs stage s; every send/recv is in the one
pipeline group of N ranks, so only each op's peer argument tells whom it exchanges with (in a 2-rank group the other
member does). Hand-written GPipe: each step sends ``--micro`` micro-batches' activations forward stage by stage
(``dist.send``/``recv`` over the ``pp`` group, the peer given as a group rank), then their gradients back.

    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/pp_stages.py --trace traces/pp4
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    args = parse(__doc__, micro=(int, 2), width=(int, 128), batch=(int, 16))
    width, batch = args.width, args.batch
    init()
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("pp",))
    stage, pp = mesh["pp"].get_local_rank(), mesh["pp"].get_group()
    first, last = stage == 0, stage == n - 1
    torch.manual_seed(stage)
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width), nn.ReLU())
    if last:
        model.append(nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(10)
    xs = [torch.randn(batch, width) for _ in range(args.micro)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(args.micro)]

    def step() -> None:
        opt.zero_grad()
        outs, ins = [], []
        for m in range(args.micro):  # forward of every micro-batch, stage by stage
            if first:
                act = xs[m]
            else:
                act = torch.empty(batch, width)
                dist.recv(act, group=pp, group_src=stage - 1)
                act.requires_grad_()
            ins.append(act)
            out = model(act)
            if last:
                out = F.cross_entropy(out, ys[m])
            else:
                dist.send(out.detach(), group=pp, group_dst=stage + 1)
            outs.append(out)
        for m in range(args.micro):  # then their backward, last stage first
            if last:
                outs[m].backward()
            else:
                grad = torch.empty(batch, width)
                dist.recv(grad, group=pp, group_src=stage + 1)
                outs[m].backward(grad)
            if not first:
                dist.send(ins[m].grad, group=pp, group_dst=stage - 1)
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
