"""A user's Horovod script: a GRU encoder-decoder with additive (Bahdanau) attention that learns to sort sequences of
digits of different lengths ("3 9 1 1 7" -> "1 1 3 7 9"), the classic seq2seq toy task.

Habits it exercises that the other Horovod scripts do not: a bidirectional GRU encoder over ``pack_padded_sequence``
(batches sorted by length, ``enforce_sorted=True``) whose final states are joined by a linear bridge, a ``GRUCell``
decoder unrolled word by word with attention masked over the padding, teacher forcing with a scheduled-sampling
probability that falls over training (the decoder fed its own greedy words by ``torch.where``), cross entropy with
``ignore_index`` and ``label_smoothing``, two micro-batches a step through ``hvd.DistributedOptimizer(...,
compression=hvd.Compression.fp16, backward_passes_per_step=2)`` with the gradients clipped after
``optimizer.synchronize()``, Adam under ``OneCycleLR`` (its peak scaled by the ranks), and a sequence-exact accuracy
averaged by ``hvd.allreduce`` every 5 steps. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_seq2seq_sort.py``.
"""
import argparse

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

parser = argparse.ArgumentParser(description="Horovod seq2seq with attention: sorting digits")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=32, help="per rank and micro-batch")
parser.add_argument("--lr", type=float, default=2e-3)
args = parser.parse_args()

PAD, BOS, EOS, DIGITS, LONGEST, HIDDEN = 0, 1, 2, 10, 14, 192
VOCAB = 3 + DIGITS


def batch(n, rng):
    """Sources sorted by length (longest first) with their lengths, and targets ``BOS sorted EOS`` padded."""
    lengths = np.sort(rng.integers(4, LONGEST + 1, n))[::-1]
    src = np.full((n, LONGEST), PAD)
    tgt = np.full((n, LONGEST + 2), PAD)
    for i, k in enumerate(lengths):
        digits = rng.integers(0, DIGITS, k) + 3
        src[i, :k] = digits
        tgt[i, 0], tgt[i, 1:k + 1], tgt[i, k + 1] = BOS, np.sort(digits), EOS
    return torch.from_numpy(src), torch.from_numpy(lengths.copy()), torch.from_numpy(tgt)


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64, padding_idx=PAD)
        self.encoder = nn.GRU(64, HIDDEN // 2, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(HIDDEN, HIDDEN)
        self.cell = nn.GRUCell(64 + HIDDEN, HIDDEN)
        self.keys, self.query, self.energy = nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 1, bias=False)
        self.out = nn.Linear(2 * HIDDEN, VOCAB)

    def forward(self, src, lengths, tgt, teacher):
        packed = pack_padded_sequence(self.embed(src), lengths, batch_first=True, enforce_sorted=True)
        enc, last = self.encoder(packed)
        enc, _ = pad_packed_sequence(enc, batch_first=True, total_length=src.shape[1])
        state = torch.tanh(self.bridge(torch.cat([last[0], last[1]], dim=1)))
        keys, pad = self.keys(enc), (src == PAD)
        word, logits = tgt[:, 0], []
        for t in range(1, tgt.shape[1]):
            scores = self.energy(torch.tanh(keys + self.query(state)[:, None])).squeeze(2).masked_fill(pad, -1e9)
            context = torch.bmm(F.softmax(scores, dim=1)[:, None], enc).squeeze(1)
            state = self.cell(torch.cat([self.embed(word), context], dim=1), state)
            step = self.out(torch.cat([state, context], dim=1))
            logits.append(step)
            fed = torch.rand(len(word)) < teacher  # scheduled sampling: the truth with probability ``teacher``, else its own guess
            word = torch.where(fed, tgt[:, t], step.argmax(1).detach())
        return torch.stack(logits, dim=1)


hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = Seq2Seq()
opt = torch.optim.Adam(model.parameters(), lr=args.lr)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=hvd.Compression.fp16,
                               backward_passes_per_step=2)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr * hvd.size(), total_steps=args.steps, pct_start=0.3)
rng = np.random.default_rng(60 + hvd.rank())
torch.manual_seed(60 + hvd.rank())
model.train()
for step in range(args.steps):
    teacher = max(0.5, 1.0 - step / args.steps)
    opt.zero_grad()
    for _ in range(2):  # two micro-batches, one all-reduce of their summed gradients
        src, lengths, tgt = batch(args.batch, rng)
        logits = model(src, lengths, tgt, teacher)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD, label_smoothing=0.1) / 2
        loss.backward()
    opt.synchronize()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    sched.step()
    if step % 5 == 4:
        exact = (logits.argmax(2).eq(tgt[:, 1:]) | tgt[:, 1:].eq(PAD)).all(1).float().mean()
        exact = hvd.allreduce(exact, name="exact", op=hvd.Average)
        if hvd.rank() == 0:
            print(f"step {step}: loss {2 * loss.item():.3f} exact {exact.item():.2f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
