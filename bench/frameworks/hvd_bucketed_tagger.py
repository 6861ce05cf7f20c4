"""A user's Horovod script: a small Transformer-encoder part-of-speech tagger on synthetic sentences of 8-160 tokens,
batched by length buckets, so each step's work changes with the bucket drawn (several times from the shortest to the
longest).

Habits it exercises: a ``batch_sampler`` of the user's own (sentences grouped by length, shuffled buckets, each rank its
share of them) with padding to the batch's longest and a ``src_key_padding_mask``; a loss over the real tokens only
(``ignore_index``); gradient clipping the Horovod way (``optimizer.synchronize()``, ``clip_grad_norm_``, then ``step``
inside ``optimizer.skip_synchronize()``); AdamW with a linear warm-up by ``LambdaLR``; ``hvd.broadcast_parameters``.
No dagprof line: ``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python
hvd_bucketed_tagger.py``.
"""
import argparse
import random

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

parser = argparse.ArgumentParser(description="Horovod Transformer tagger on length-bucketed sentences")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--sentences", type=int, default=4096)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--dim", type=int, default=96)
parser.add_argument("--lr", type=float, default=5e-4)
args = parser.parse_args()

VOCAB, TAGS, PAD = 3000, 17, 0


class Sentences(Dataset):
    def __init__(self, n):
        rng = random.Random(3)
        self.lengths = [rng.randint(8, 160) for _ in range(n)]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        words = torch.randint(1, VOCAB, (self.lengths[i],), generator=g)
        return words, words % TAGS


class Buckets(Sampler):
    """Sentences sorted by length, cut into batches, the batches shuffled per epoch and dealt out to the ranks."""

    def __init__(self, lengths, batch, rank, size):
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        self.batches = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
        self.rank, self.size, self.epoch = rank, size, 0

    def __iter__(self):
        batches = list(self.batches)
        random.Random(self.epoch).shuffle(batches)
        return iter(batches[self.rank::self.size])

    def __len__(self):
        return len(self.batches) // self.size


def pad(batch):
    words = nn.utils.rnn.pad_sequence([w for w, _ in batch], batch_first=True, padding_value=PAD)
    tags = nn.utils.rnn.pad_sequence([t for _, t in batch], batch_first=True, padding_value=-100)
    return words, tags


class Tagger(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.pos = nn.Embedding(256, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(dim, TAGS)

    def forward(self, words):
        x = self.embed(words) + self.pos(torch.arange(words.shape[1]))[None]
        return self.out(self.encoder(x, src_key_padding_mask=words == PAD))


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = Sentences(args.sentences)
    sampler = Buckets(data.lengths, args.batch_size, hvd.rank(), hvd.size())
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=pad)
    model = Tagger(args.dim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))

    step = 0
    while step < args.steps:
        for words, tags in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(words).reshape(-1, TAGS), tags.reshape(-1), ignore_index=-100)
            loss.backward()
            optimizer.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
            warmup.step()
            step += 1
            if hvd.rank() == 0 and step % 5 == 0:
                print(f"step {step}: loss {loss.item():.3f} (length {words.shape[1]})", flush=True)
            if step >= args.steps:
                break
        sampler.epoch += 1
