"""A fresh expert-parallel x data-parallel job whose groups have no names, for reviewing dagprof's mesh labels (issue 16).

4 ranks, no DeviceMesh: the expert-parallel groups come from ``dist.new_subgroups(group_size=2)`` ({0,1},{2,3}) and
the expert-data-parallel ones from ``dist.new_group([0, 2])``, ``dist.new_group([1, 3])``, all without a description,
so only where each collective sits and which ranks meet in it tell its dimension. A top-1 router sends each token to
one of its EP group's two experts: per MoE layer a forward ``all_to_all_single`` of the token counts (no autograd),
then the tokens with uneven splits and back (autograd: ``torch.distributed.nn.functional``, so backward exchanges
their gradients too). No DDP: after backward the script averages the dense gradients itself with one all-reduce of a
flattened buffer over the world, and each expert's gradients per tensor over its expert-data-parallel group.

    dagprof profile -o runs/moe -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/moe_subgroups.py
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/moe_subgroups.py --trace traces/moe
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.nn.functional import all_to_all_single

WIDTH, TOKENS, CLASSES, EP = 64, 128, 10, 2


class MoE(nn.Module):
    """One expert per rank of the EP group; a gate on every rank picks each token's expert (top-1)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group
        self.gate = nn.Linear(WIDTH, EP)  # dense: replicated everywhere
        self.expert = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        prob = F.softmax(self.gate(h), dim=-1)
        weight, choice = prob.max(dim=-1)
        order = torch.argsort(choice, stable=True)
        send = torch.bincount(choice, minlength=EP)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # how many tokens each expert gets from each rank
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        routed = all_to_all_single(h.new_empty(sum(recv_sizes), WIDTH), h[order].contiguous(), recv_sizes, send_sizes,
                                   group=self.group)
        done = all_to_all_single(h.new_empty(len(order), WIDTH), self.expert(routed).contiguous(), send_sizes, recv_sizes,
                                 group=self.group)
        out = torch.empty_like(done).index_copy(0, order, done)
        return out * weight.unsqueeze(-1)


class Net(nn.Module):
    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.inp, self.moe1, self.mid, self.moe2 = nn.Linear(WIDTH, WIDTH), MoE(group), nn.Linear(WIDTH, WIDTH), MoE(group)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        h = h + self.moe1(h)
        h = F.relu(self.mid(h))
        return self.head(h + self.moe2(h))


def main() -> None:
    args = parse(__doc__)
    rank = init()
    ep_group, _ = dist.new_subgroups(group_size=EP)
    edp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % EP]
    torch.manual_seed(0)
    model = Net(ep_group)
    torch.manual_seed(100 + rank % EP)  # expert e alike on both of its replicas
    for moe in (model.moe1, model.moe2):
        moe.expert.apply(lambda m: m.reset_parameters() if isinstance(m, nn.Linear) else None)
    experts = [p for n, p in model.named_parameters() if ".expert." in n]
    dense = [p for n, p in model.named_parameters() if ".expert." not in n]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(10 + rank)
    x, y = torch.randn(TOKENS, WIDTH), torch.randint(0, CLASSES, (TOKENS,))
    world = dist.get_world_size()

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        flat = _flatten_dense_tensors([p.grad for p in dense])
        dist.all_reduce(flat)
        for p, g in zip(dense, _unflatten_dense_tensors(flat / world, [p.grad for p in dense])):
            p.grad.copy_(g)
        for p in experts:
            dist.all_reduce(p.grad, group=edp)
            p.grad.div_(2)
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
