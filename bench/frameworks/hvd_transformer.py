"""A user's Horovod script: a small transformer encoder (dense Embedding, 2 ``nn.TransformerEncoderLayer``, mean pool,
Linear) on synthetic tokens, AdamW, gradient accumulation.

Habits it exercises that ``hvd_text``/``hvd_resnet`` do not: ``DistributedOptimizer(..., backward_passes_per_step=2)``
with two micro-batches per ``optimizer.step()`` (Horovod all-reduces after the second backward only), fp16
compression of every all-reduce (``compression=hvd.Compression.fp16``), ``broadcast_parameters`` and
``broadcast_optimizer_state``, and an accuracy ``hvd.allreduce``-d EVERY step (not every few). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_transformer.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod transformer, gradient accumulation")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--vocab", type=int, default=6000)
parser.add_argument("--seq-len", type=int, default=32)
args = parser.parse_args()

hvd.init()
torch.manual_seed(1234)
torch.set_num_threads(1)


class Encoder(nn.Module):
    def __init__(self, vocab, dim=96, heads=4, layers=2, classes=5):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, args.seq_len, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.encoder(self.tok(tokens) + self.pos)
        return self.head(self.norm(h.mean(dim=1)))


g = torch.Generator().manual_seed(100 + hvd.rank())
data = [(torch.randint(0, args.vocab, (args.micro_batch, args.seq_len), generator=g),
         torch.randint(0, 5, (args.micro_batch,), generator=g)) for _ in range(6)]

model = Encoder(args.vocab)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4 * hvd.size(), weight_decay=0.01)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=hvd.Compression.fp16,
                               backward_passes_per_step=args.accum)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)

model.train()
k = 0
for step in range(args.steps):
    opt.zero_grad()
    correct = 0
    for _ in range(args.accum):
        tokens, labels = data[k % len(data)]
        k += 1
        logits = model(tokens)
        loss = F.cross_entropy(logits, labels) / args.accum
        loss.backward()
        correct += (logits.argmax(1) == labels).sum().item()
    opt.step()
    acc = hvd.allreduce(torch.tensor(correct / (args.accum * args.micro_batch)), name="train_acc").item()
    if hvd.rank() == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item() * args.accum:.4f} acc {acc:.3f}", flush=True)
