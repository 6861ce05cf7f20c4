"""A user's Horovod script: a text classifier (Embedding + GRU + Linear), Adam, synthetic token data.

Written as in Horovod's PyTorch examples: ``hvd.init``, the learning rate scaled by ``hvd.size()``,
``DistributedOptimizer``, ``broadcast_parameters``/``broadcast_optimizer_state``, a loss averaged over
the workers with ``hvd.allreduce`` for the log every few steps. No dagprof line: profile it with
``dagprof profile -o RUN --steps 6:10 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_text.py``.
"""
import argparse
import time

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod text classifier")
parser.add_argument("--steps", type=int, default=14)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--vocab", type=int, default=8000)
parser.add_argument("--seq-len", type=int, default=48)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--log-interval", type=int, default=4)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)


class TextClassifier(nn.Module):
    def __init__(self, vocab, dim=64, hidden=96, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, tokens):
        out, h = self.gru(self.embed(tokens))
        return self.fc(self.drop(h[-1]))


g = torch.Generator().manual_seed(hvd.rank())
data = [(torch.randint(1, args.vocab, (args.batch_size, args.seq_len), generator=g), torch.randint(0, 4, (args.batch_size,), generator=g))
        for _ in range(8)]

model = TextClassifier(args.vocab)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def metric_average(val, name):
    return hvd.allreduce(torch.tensor(val), name=name).item()


model.train()
for step in range(args.steps):
    tokens, labels = data[step % len(data)]
    t0 = time.time()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(tokens), labels)
    loss.backward()
    optimizer.step()
    if step % args.log_interval == 0:
        avg = metric_average(loss.item(), "avg_loss")
        if hvd.rank() == 0:
            print(f"step {step} loss {avg:.4f} {time.time() - t0:.3f}s", flush=True)
