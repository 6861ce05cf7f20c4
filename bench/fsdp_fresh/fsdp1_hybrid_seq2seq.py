"""A fresh FSDP1 user script for reviewing dagprof (stop 60): an encoder-decoder ``nn.Transformer`` under HYBRID_SHARD, 4 ranks.

Habits it exercises, as users write them (no other fresh script has them together):
- torch's stock ``nn.Transformer`` (batch-first, 2 encoder and 2 decoder layers) learning to reverse token sequences,
  with teacher forcing, a causal target mask, padding masks and ``CrossEntropyLoss(ignore_index=PAD,
  label_smoothing=0.1)``;
- FSDP1 ``sharding_strategy=ShardingStrategy.HYBRID_SHARD`` over ``init_device_mesh("cpu", (2, 2))`` (sharded within
  pairs, replicated across them), ``auto_wrap_policy=ModuleWrapPolicy({TransformerEncoderLayer,
  TransformerDecoderLayer})``, ``forward_prefetch=True``, ``backward_prefetch=BackwardPrefetch.BACKWARD_POST``,
  ``use_orig_params=True``;
- ``AdamW`` with weight decay on matrices only (two parameter groups, by ``ndim``), a linear warm-up ``LambdaLR``,
  ``model.clip_grad_norm_(1.0)`` (FSDP1's own, an all-reduce of the norm);
- variable-length batches: each step's source lengths drawn at random, padded to the step's longest;
- ``--strategy`` FULL_SHARD (one 4-rank shard group) or ``_HYBRID_SHARD_ZERO2`` (hybrid, kept gathered after forward:
  what ``optimize`` advises for this job); rank 0 prints its median step from the fourth on (``median step N ms``).

    dagprof profile -o runs/s2s -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/fsdp1_hybrid_seq2seq.py --steps 12
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

PAD, BOS, VOCAB, DIM = 0, 1, 512, 128


class Seq2Seq(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.pos = nn.Embedding(64, DIM)
        self.tf = nn.Transformer(DIM, nhead=4, num_encoder_layers=layers, num_decoder_layers=layers,
                                 dim_feedforward=4 * DIM, dropout=0.1, batch_first=True)
        self.out = nn.Linear(DIM, VOCAB)

    def emb(self, t: torch.Tensor) -> torch.Tensor:
        return self.embed(t) + self.pos(torch.arange(t.shape[1]))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.tf(self.emb(src), self.emb(tgt_in), tgt_mask=mask, tgt_is_causal=True,
                    src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt_in == PAD, memory_key_padding_mask=src == PAD)
        return self.out(h)


def batch(g: torch.Generator, n: int, longest: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = torch.randint(longest // 2, longest + 1, (n,), generator=g)
    width = int(lengths.max())
    src = torch.full((n, width), PAD)
    tgt = torch.full((n, width + 1), PAD)
    for i, length in enumerate(lengths.tolist()):
        seq = torch.randint(2, VOCAB, (length,), generator=g)
        src[i, :length] = seq
        tgt[i, 0], tgt[i, 1:length + 1] = BOS, seq.flip(0)
    return src, tgt[:, :-1], tgt[:, 1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--longest", type=int, default=40)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--strategy", default="HYBRID_SHARD", choices=["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "FULL_SHARD"])
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    hybrid = "HYBRID" in args.strategy
    mesh = init_device_mesh("cpu", (2, world // 2)) if hybrid else None
    wrap = ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
    model = FSDP(Seq2Seq(args.layers), sharding_strategy=ShardingStrategy[args.strategy], device_mesh=mesh,
                 auto_wrap_policy=wrap, forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_POST,
                 use_orig_params=True, device_id=torch.device("cpu"))
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    crit = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        src, tgt_in, tgt_out = batch(g, args.batch, args.longest)
        logits = model(src, tgt_in)
        loss = crit(logits.reshape(-1, VOCAB), tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        model.clip_grad_norm_(1.0)
        opt.step()
        sched.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
        times.append(time.perf_counter() - t0)
    if rank == 0 and len(times) > 4:
        print(f"median step {statistics.median(times[3:]) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
