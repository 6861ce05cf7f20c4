"""A user's Horovod script: a next-token language model (``nn.Embedding(sparse=True)``, 2-layer GRU, tied-size
Linear decoder) on synthetic tokens, plain SGD (which takes sparse gradients), gradient clipping.

Habits it exercises that ``hvd_text``/``hvd_resnet`` do not: a SPARSE embedding gradient (Horovod all-gathers its
indices and values instead of all-reducing it, ``sparse_as_dense`` left off), ``DistributedOptimizer`` with
``named_parameters`` and ``op=hvd.Average``, ``broadcast_parameters`` of ``model.state_dict()``, a perplexity
``hvd.allreduce``-d every step, a ``StepLR`` scheduler. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_sparse_gru.py``.
"""
import argparse
import math

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod GRU language model, sparse embedding")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--vocab", type=int, default=10000)
parser.add_argument("--bptt", type=int, default=24)
args = parser.parse_args()

hvd.init()
torch.manual_seed(7)
torch.set_num_threads(1)


class GRULM(nn.Module):
    def __init__(self, vocab, dim=64, hidden=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, sparse=True)
        self.rnn = nn.GRU(dim, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.decoder(out)


g = torch.Generator().manual_seed(hvd.rank())
stream = torch.randint(0, args.vocab, (args.batch_size, 8 * args.bptt + 1), generator=g)

model = GRULM(args.vocab)
opt = torch.optim.SGD(model.parameters(), lr=0.5 * hvd.size())
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)

model.train()
for step in range(args.steps):
    i = (step % 8) * args.bptt
    x, y = stream[:, i:i + args.bptt], stream[:, i + 1:i + 1 + args.bptt]
    opt.zero_grad()
    loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
    loss.backward()
    opt.synchronize()
    nn.utils.clip_grad_norm_([p for n, p in model.named_parameters() if not n.startswith("embed")], 0.5)
    with opt.skip_synchronize():
        opt.step()
    sched.step()
    ppl = math.exp(hvd.allreduce(loss.detach(), name="loss").item())
    if hvd.rank() == 0 and step % 5 == 0:
        print(f"step {step} ppl {ppl:.1f}", flush=True)
