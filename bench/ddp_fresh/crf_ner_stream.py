"""A fresh DDP user script for reviewing dagprof (stop 63): a BiLSTM-CRF named-entity tagger fed by a streaming dataset.

Habits it exercises, as sequence-labelling users write them (no other fresh script has this family or these habits):
- a BiLSTM over ``pack_padded_sequence`` (each batch's sentences of their own lengths), emission scores, and a linear-chain
  CRF whose log-partition is the forward algorithm by hand (a ``logsumexp`` per token position);
- an ``IterableDataset`` that streams each rank's own shard, the shards of different lengths (rank r holds
  ``--sentences + r * --extra``), no ``DistributedSampler``; every step each rank all-reduces a "still have a batch"
  flag with ``ReduceOp.MIN`` and all stop when the shortest shard ends (the usual guard against a DDP hang);
- ``DDP(broadcast_buffers=False, gradient_as_bucket_view=True)``, ``Adam``, ``OneCycleLR`` stepped per batch,
  ``clip_grad_norm_(5.0)``;
- ``torch.distributed.checkpoint.save`` of the model and optimizer state every ``--ckpt-every`` steps, inside the loop
  (its planning gathers and scatters objects over the default group).
Without a profiler it prints its median step from step 5 on.

    dagprof profile -o runs/crf -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/crf_ner_stream.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader, IterableDataset

VOCAB, TAGS, PAD = 5000, 9, 0


class Shard(IterableDataset):
    """This rank's stream of (token ids, tag ids) sentences, 6-40 tokens each."""

    def __init__(self, rank: int, count: int) -> None:
        self.rank, self.count = rank, count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(1000 + self.rank)
        for _ in range(self.count):
            n = int(torch.randint(6, 41, (1,), generator=g))
            words = torch.randint(1, VOCAB, (n,), generator=g)
            yield words, (words * 7 + torch.arange(n)) % TAGS


def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]):
    batch.sort(key=lambda wt: -len(wt[0]))
    lengths = torch.tensor([len(w) for w, _ in batch])
    words = nn.utils.rnn.pad_sequence([w for w, _ in batch], batch_first=True, padding_value=PAD)
    tags = nn.utils.rnn.pad_sequence([t for _, t in batch], batch_first=True, padding_value=0)
    return words, tags, lengths


class BiLstmCrf(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)
        self.emit = nn.Linear(2 * hidden, TAGS)
        self.trans = nn.Parameter(torch.randn(TAGS, TAGS) * 0.1)  # trans[i, j]: score of tag i followed by tag j
        self.start = nn.Parameter(torch.zeros(TAGS))
        self.end = nn.Parameter(torch.zeros(TAGS))

    def forward(self, words: torch.Tensor, tags: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(words), lengths, batch_first=True)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=words.shape[1])
        emissions = self.emit(out)
        mask = torch.arange(words.shape[1])[None, :] < lengths[:, None]
        return (self.log_partition(emissions, mask) - self.gold_score(emissions, tags, mask)).mean()

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        alpha = self.start + emissions[:, 0]
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha[:, :, None] + self.trans[None] + emissions[:, t, None, :], dim=1)
            alpha = torch.where(mask[:, t, None], step, alpha)
        return torch.logsumexp(alpha + self.end, dim=1)

    def gold_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.float()
        emit = emissions.gather(2, tags[:, :, None]).squeeze(2)
        trans = self.trans[tags[:, :-1], tags[:, 1:]] * m[:, 1:]
        last = tags.gather(1, (mask.sum(1) - 1)[:, None]).squeeze(1)
        return self.start[tags[:, 0]] + (emit * m).sum(1) + trans.sum(1) + self.end[last]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=480, help="sentences in rank 0's shard")
    p.add_argument("--extra", type=int, default=64, help="each further rank's shard is this much longer")
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--ckpt-dir", default=None, help="where dcp.save writes (default: a temporary folder)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(BiLstmCrf(args.dim, args.hidden), broadcast_buffers=False, gradient_as_bucket_view=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(Shard(rank, args.sentences + rank * args.extra), batch_size=args.batch, collate_fn=collate)
    total = args.sentences // args.batch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=total + 1)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    ckpt_root = args.ckpt_dir or os.path.join(tempfile.gettempdir(), f"crf-ckpt-{run_id}")
    times: list[float] = []
    batches = iter(loader)
    step = 0
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        more = torch.tensor([0 if batch is None else 1])
        dist.all_reduce(more, op=dist.ReduceOp.MIN)
        if not more.item():
            break
        words, tags, lengths = batch
        loss = model(words, tags, lengths)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        step += 1
        if step % args.ckpt_every == 0:
            dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                     checkpoint_id=os.path.join(ckpt_root, f"step{step}"))
        times.append(time.perf_counter() - t0)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    if rank == 0 and len(times) > 5:
        print(f"median step {1000 * statistics.median(times[5:]):.1f} ms over {len(times) - 5} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
