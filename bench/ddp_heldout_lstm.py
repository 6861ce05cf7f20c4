"""A held-out DDP job, written as a user would: an AWD-LSTM-style word language model (recurrent gradients).

A token embedding, three single-layer LSTMs of different widths stacked with dropout between them (the
AWD-LSTM layout: the last one narrows back to the embedding width), an untied decoder to the vocabulary,
trained with truncated back-propagation through time (hidden state carried and detached across steps),
gradient clipping, plain DDP, gloo on CPU, one thread per rank. Its 15 gradients (6.3 MB) run from 2 KB to 1 MB
and become ready layer by layer, each LSTM's four at once (the fused recurrent kernel), so where the buckets
end decides what the backward overlaps. The script knows nothing of dagprof, and no dagprof prediction
was developed on it:

    sudo .venv/bin/python bench/bench_optimize.py --workloads "cmd:python bench/ddp_heldout_lstm.py --steps 16" --ranks 2
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, emb: int, hidden: int, dropout: float = 0.2):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        sizes = [emb, hidden, hidden, emb]
        self.rnns = nn.ModuleList(nn.LSTM(a, b, batch_first=True) for a, b in zip(sizes, sizes[1:]))
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(emb, vocab)

    def forward(self, tokens: torch.Tensor, state: list | None) -> tuple[torch.Tensor, list]:
        x = self.drop(self.embed(tokens))
        new = []
        for k, rnn in enumerate(self.rnns):
            x, h = rnn(x, None if state is None else state[k])
            new.append(tuple(t.detach() for t in h))  # truncated BPTT: carry the state, not its graph
            x = self.drop(x)
        return self.decoder(x), new


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--emb", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(LanguageModel(args.vocab, args.emb, args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    g = torch.Generator().manual_seed(dist.get_rank())
    corpus = torch.randint(0, args.vocab, (args.batch, args.bptt * args.steps + 1), generator=g)  # this rank's shard of a token stream
    state = None
    for k in range(args.steps):
        chunk = corpus[:, k * args.bptt:(k + 1) * args.bptt + 1]
        logits, state = model(chunk[:, :-1], state)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), chunk[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
