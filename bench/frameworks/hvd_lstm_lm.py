"""A user's Horovod script: a word-level LSTM language model (Embedding, 2-layer LSTM, a decoder tied to the embedding's
weight) on a synthetic token stream, truncated backpropagation through time, SGD.

Habits it exercises that the other Horovod scripts do not: gradient clipping as Horovod's docs write it
(``optimizer.synchronize()``, ``clip_grad_norm_``, then ``optimizer.step()`` under ``optimizer.skip_synchronize()``),
weights tied between the embedding and the decoder (one parameter, two modules), the LSTM's hidden state carried from
batch to batch and detached, and a ``StepLR`` schedule. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_lstm_lm.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod LSTM language model")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--bptt", type=int, default=24)
parser.add_argument("--vocab", type=int, default=6000)
parser.add_argument("--clip", type=float, default=0.25)
args = parser.parse_args()

hvd.init()
torch.manual_seed(1234)
torch.set_num_threads(1)


class LstmLM(nn.Module):
    def __init__(self, vocab, dim=128, layers=2, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, layers, dropout=dropout)
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.encoder.weight  # tied (Press & Wolf)

    def forward(self, tokens, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, batch):
        w = next(self.parameters())
        return tuple(w.new_zeros(self.rnn.num_layers, batch, self.rnn.hidden_size) for _ in range(2))


# each worker reads its own shard of the stream, laid out as (time, batch) columns as in PyTorch's word_language_model
g = torch.Generator().manual_seed(100 + hvd.rank())
stream = torch.randint(0, args.vocab, ((args.steps + 1) * args.bptt * args.batch_size + 1,), generator=g)
columns = stream[: (len(stream) // args.batch_size) * args.batch_size].view(args.batch_size, -1).t().contiguous()

model = LstmLM(args.vocab)
optimizer = torch.optim.SGD(model.parameters(), lr=1.0 * hvd.size(), momentum=0.0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

model.train()
hidden = model.init_hidden(args.batch_size)
for step in range(args.steps):
    i = (step * args.bptt) % (columns.size(0) - 1 - args.bptt)
    data, target = columns[i:i + args.bptt], columns[i + 1:i + 1 + args.bptt].reshape(-1)
    hidden = tuple(h.detach() for h in hidden)
    optimizer.zero_grad()
    logits, hidden = model(data, hidden)
    loss = F.cross_entropy(logits.view(-1, args.vocab), target)
    loss.backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    with optimizer.skip_synchronize():
        optimizer.step()
    scheduler.step()
    if step % 5 == 0 and hvd.rank() == 0:
        print(f"step {step} loss {loss.item():.3f} ppl {loss.exp().item():.0f}", flush=True)
