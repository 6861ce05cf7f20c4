"""A fresh user script for judging dagprof's DDP -> FSDP conversion on an encoder-decoder family none of the kept pairs has:
a small Transformer translation model trained with teacher forcing, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender, transformer LM, GRU, depthwise convnet, conv VAE or
Conformer the conversion was judged on):
- one embedding table shared by source, target and the output projection (tied weights, in the root unit), sinusoidal
  positions, ``--enc`` encoder layers in ``model.encoder`` and ``--dec`` decoder layers in ``model.decoder`` (two numbered
  containers; ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``, pre-norm, GELU), cross-attention;
- ``--wrap fsdp``: ``fully_shard`` on every encoder and decoder layer, then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- padded variable-length batches with key-padding masks and a causal mask, label-smoothed cross-entropy ignoring the
  padding, ``Adam`` with an inverse-square-root warm-up, ``clip_grad_norm_``.

    dagprof profile -o runs/s2s-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/seq2seq_translate.py --wrap ddp
    dagprof whatif runs/s2s-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn

PAD, BOS = 0, 1


class Translator(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, enc: int, dec: int, max_len: int) -> None:
        super().__init__()
        self.d = d
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
        pos = torch.arange(max_len).unsqueeze(1) * torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        self.register_buffer("pos", torch.cat([pos.sin(), pos.cos()], dim=1), persistent=False)
        self.encoder = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, 0.1, "gelu", batch_first=True, norm_first=True)
                                     for _ in range(enc))
        self.decoder = nn.ModuleList(nn.TransformerDecoderLayer(d, heads, 4 * d, 0.1, "gelu", batch_first=True, norm_first=True)
                                     for _ in range(dec))
        self.enc_norm, self.dec_norm = nn.LayerNorm(d), nn.LayerNorm(d)

    def embedded(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens) * math.sqrt(self.d) + self.pos[: tokens.shape[1]]

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        src_pad, tgt_pad = src == PAD, tgt_in == PAD
        causal = torch.ones(tgt_in.shape[1], tgt_in.shape[1], dtype=torch.bool).triu(1)  # True: not attended
        memory = self.embedded(src)
        for layer in self.encoder:
            memory = layer(memory, src_key_padding_mask=src_pad)
        memory = self.enc_norm(memory)
        h = self.embedded(tgt_in)
        for layer in self.decoder:
            h = layer(h, memory, tgt_mask=causal, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return self.dec_norm(h) @ self.embed.weight.t()  # tied output projection


def batch(n: int, max_len: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded source and target token batches of random lengths (the target ``BOS``-prefixed)."""
    src = torch.full((n, max_len), PAD)
    tgt = torch.full((n, max_len + 1), PAD)
    for i in range(n):
        ls, lt = (int(x) for x in torch.randint(max_len // 2, max_len + 1, (2,), generator=gen))
        src[i, :ls] = torch.randint(2, vocab, (ls,), generator=gen)
        tgt[i, 0] = BOS
        tgt[i, 1:lt + 1] = torch.randint(2, vocab, (lt,), generator=gen)
    return src, tgt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--enc", type=int, default=3)
    p.add_argument("--dec", type=int, default=3)
    p.add_argument("--len", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Translator(args.vocab, args.dim, args.heads, args.enc, args.dec, args.len + 1)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in [*model.encoder, *model.decoder]:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9)
    warmup = 40
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, (warmup / (s + 1)) ** 0.5))
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        src, tgt = batch(args.batch, args.len, args.vocab, gen)
        logits = model(src, tgt[:, :-1])
        loss = loss_fn(logits.reshape(-1, args.vocab), tgt[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
