"""A held-out DDP job, written as a user would: a click-through-rate style MLP over a 16,384 x 64 embedding.

The model of ``bench/fsdp1_heldout.py`` (token ids embedded, mean-pooled, concatenated with dense
features, a 4-layer MLP to a binary label) under plain DDP, gloo on CPU, one thread per rank. Its
gradients are the three shapes PowerSGD meets in a CTR model: a tall embedding (dense gradient),
wide linears, biases. The script knows nothing of dagprof:

    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_heldout_embed.py --steps 16" --ranks 2
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fsdp1_heldout import CTR

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(CTR(args.vocab, args.dim, 32, 512))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, 20), generator=g)
        dense = torch.randn(args.batch, 32, generator=g)
        loss = F.binary_cross_entropy_with_logits(model(ids, dense), (ids[:, 0] % 2).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
