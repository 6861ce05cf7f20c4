"""A user's Horovod script: a small DLRM-style click model (13 dense features through a bottom MLP, 4 categorical
features through ``nn.EmbeddingBag(mode="sum", sparse=True)`` tables, their pairwise dot-product interactions, a top
MLP, a logit) on synthetic click logs, binary cross-entropy, Adagrad.

Habits it exercises that the other Horovod scripts do not: ``DistributedOptimizer(..., sparse_as_dense=True)`` (the
embedding tables' SPARSE gradients turned dense and all-reduced with the rest, as Horovod's docs advise for
moderate tables), the forward pass under ``torch.autocast("cpu", dtype=torch.bfloat16)``, a map-style ``Dataset``
behind a ``DataLoader`` with ``num_workers=2`` (the default fork start method) and ``drop_last``, a
``DistributedSampler``, ``torch.optim.lr_scheduler.OneCycleLR`` stepped every step, ``model.zero_grad(set_to_none=True)``,
and the epoch number agreed with ``hvd.broadcast_object``. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_dlrm_dense.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

parser = argparse.ArgumentParser(description="Horovod DLRM-style click model")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--rows", type=int, default=20000, help="rows of each embedding table")
parser.add_argument("--adasum", action="store_true", help="op=hvd.Adasum instead of averaging")
args = parser.parse_args()

TABLES, DIM, DENSE = 4, 32, 13


class ClickLogs(Dataset):
    """Synthetic click logs, generated from the index so every worker process agrees on them."""

    def __init__(self, n: int, rows: int):
        g = torch.Generator().manual_seed(7)
        self.dense = torch.randn(n, DENSE, generator=g)
        self.cats = torch.randint(0, rows, (n, TABLES, 3), generator=g)  # 3 ids a feature (multi-hot)
        self.click = (torch.rand(n, generator=g) < 0.25).float()

    def __len__(self):
        return len(self.click)

    def __getitem__(self, i):
        return self.dense[i], self.cats[i], self.click[i]


def mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, rows):
        super().__init__()
        self.bottom = mlp([DENSE, 128, 64, DIM])
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True) for _ in range(TABLES))
        pairs = (TABLES + 1) * TABLES // 2
        self.top = mlp([DIM + pairs, 256, 128, 1])

    def forward(self, dense, cats):
        x = self.bottom(dense)
        feats = torch.stack([x] + [t(cats[:, k]) for k, t in enumerate(self.tables)], dim=1)  # (B, T+1, D)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(TABLES + 1, TABLES + 1, offset=1)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1)).squeeze(1)


def main():
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = ClickLogs(args.batch_size * hvd.size() * 12, args.rows)
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=2, drop_last=True)

    model = DLRM(args.rows)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.02 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), sparse_as_dense=True,
                                         op=hvd.Adasum if args.adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05 * hvd.size(), total_steps=args.steps + 1,
                                                cycle_momentum=False)
    epoch = hvd.broadcast_object(0, root_rank=0, name="epoch")  # as when resuming from rank 0's checkpoint

    step = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for dense, cats, click in loader:
            model.zero_grad(set_to_none=True)  # Horovod's optimizer takes no set_to_none
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logit = model(dense, cats)
            loss = F.binary_cross_entropy_with_logits(logit.float(), click)
            loss.backward()
            optimizer.step()
            sched.step()
            if hvd.rank() == 0 and step % 5 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
