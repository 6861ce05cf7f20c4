"""A user's Horovod script: a temporal convolutional network (dilated causal ``Conv1d`` residual blocks with weight
norm, a Linear forecasting head) predicting the next values of synthetic multivariate series, Huber loss, Adam.
Habits it exercises that the other Horovod scripts do not: ``hvd.DistributedOptimizer(..., groups=2,
gradient_predivide_factor=2.0)`` (the gradients all-reduced as 2 explicit groups, each a grouped all-reduce Horovod
never splits or fuses with the other, half the averaging done before the sum), a ``torch.utils.data.Dataset`` of its
own behind a ``DataLoader`` with ``num_workers=2``, ``multiprocessing_context="forkserver"`` and
``persistent_workers`` (as Horovod's docs advise beside gloo) and a ``DistributedSampler`` whose ``set_epoch`` runs
every epoch (short epochs: one ends inside the profiled window), ``torch.nn.utils.parametrizations.weight_norm``,
``ReduceLROnPlateau`` fed a loss averaged over the workers by ``hvd.allreduce`` at each epoch's end, and
``hvd.join()`` before exiting, ``hvd.init()`` under the ``__main__`` guard (the loader's forkserver workers import the
script; Horovod's own examples guard it). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_tcn_groups.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import DataLoader, Dataset, DistributedSampler

parser = argparse.ArgumentParser(description="Horovod TCN forecaster, grouped all-reduces")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--groups", type=int, default=2)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

CHANNELS, WINDOW, HORIZON = 8, 64, 4


class Series(Dataset):
    """Sliding windows over one long random-walk series per channel."""

    def __init__(self, length=4096):
        g = torch.Generator().manual_seed(3)
        self.data = torch.cumsum(torch.randn(length, CHANNELS, generator=g), 0) / 20

    def __len__(self):
        return (self.data.shape[0] - WINDOW - HORIZON) // 16

    def __getitem__(self, i):
        s = i * 16
        return self.data[s:s + WINDOW].T, self.data[s + WINDOW:s + WINDOW + HORIZON].reshape(-1)


class Block(nn.Module):
    def __init__(self, c_in, c_out, dilation):
        super().__init__()
        self.pad = 2 * dilation
        self.conv1 = weight_norm(nn.Conv1d(c_in, c_out, 3, dilation=dilation))
        self.conv2 = weight_norm(nn.Conv1d(c_out, c_out, 3, dilation=dilation))
        self.skip = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x):
        h = F.relu(self.conv1(F.pad(x, (self.pad, 0))))
        h = F.relu(self.conv2(F.pad(h, (self.pad, 0))))
        return F.relu(h + self.skip(x))


class TCN(nn.Module):
    def __init__(self, width=64, levels=4):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(CHANNELS if i == 0 else width, width, 2 ** i) for i in range(levels)])
        self.head = nn.Linear(width, CHANNELS * HORIZON)

    def forward(self, x):
        return self.head(self.blocks(x)[:, :, -1])


if __name__ == "__main__":  # the forkserver's loader workers import this file: hvd.init() in them breaks the job
    hvd.init()
    torch.manual_seed(7)
    torch.set_num_threads(1)
    dataset = Series()
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=2, drop_last=True,
                        multiprocessing_context="forkserver", persistent_workers=True)
    model = TCN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), groups=args.groups,
                                         gradient_predivide_factor=2.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.huber_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total, count, step = total + loss.item(), count + 1, step + 1
            if step >= args.steps:
                break
        mean = hvd.allreduce(torch.tensor(total / max(count, 1)), name="epoch_loss").item()
        plateau.step(mean)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: {count} steps, loss {mean:.4f}", flush=True)
        epoch += 1
    hvd.join()
