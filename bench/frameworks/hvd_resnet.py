"""A user's Horovod script: a small ResNet (basic blocks, BatchNorm) on synthetic images, SGD + momentum.

Horovod's ImageNet example habits: a ``DataLoader`` with a ``DistributedSampler``, the learning rate
scaled by ``hvd.size()`` with a step scheduler, optional fp16 compression of the all-reduces
(``--fp16-allreduce``), gradient norm clipping after ``synchronize()`` (``optimizer.skip_synchronize``).
No dagprof line: ``dagprof profile -o RUN --steps 6:10 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_resnet.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.utils.data as tud

parser = argparse.ArgumentParser(description="Horovod ResNet")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--samples", type=int, default=224, help="per worker")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--clip", type=float, default=1.0)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers.append(Block(cin, w, 1 if i == 0 else 2))
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


g = torch.Generator().manual_seed(7)
dataset = tud.TensorDataset(torch.randn(args.samples * hvd.size(), 3, 16, 16, generator=g),
                            torch.randint(0, 10, (args.samples * hvd.size(),), generator=g))
sampler = tud.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = tud.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = ResNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.0125 * hvd.size(), momentum=0.9, weight_decay=5e-5)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
criterion = nn.CrossEntropyLoss()

for epoch in range(args.epochs):
    model.train()
    sampler.set_epoch(epoch)
    correct = 0
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with optimizer.skip_synchronize():
            optimizer.step()
        correct += (output.argmax(1) == target).sum().item()
        if batch_idx % 10 == 0 and hvd.rank() == 0:
            print(f"epoch {epoch} [{batch_idx * len(data)}/{len(sampler)}] loss {loss.item():.4f}", flush=True)
    scheduler.step()
    acc = hvd.allreduce(torch.tensor(correct / len(sampler)), name="train_acc")
    if hvd.rank() == 0:
        print(f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.4f} acc {acc.item():.3f}", flush=True)
