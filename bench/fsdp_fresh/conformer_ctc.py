"""A fresh user script for judging dagprof's DDP -> FSDP conversion on a speech family none of the kept pairs has: a
small Conformer acoustic model trained with CTC, as a user writes one.

Habits it exercises (not the mixer, ResNet, LoRA, recommender, transformer LM, GRU, depthwise convnet or conv VAE the
conversion was judged on):
- log-mel-like input features with SpecAugment-style time and frequency masks, a strided 2-D conv subsampling stem (4x in
  time), then ``--depth`` Conformer blocks in ``model.blocks`` (half-step feed-forward, self-attention, a convolution
  module with a GLU, a depthwise conv and ``BatchNorm1d``, half-step feed-forward, ``LayerNorm``): one numbered container;
- ``--wrap fsdp``: ``fully_shard`` on every block, then the root; ``--wrap ddp``: ``DistributedDataParallel``;
- CTC loss over padded variable-length targets, ``AdamW`` with a Noam warm-up (``LambdaLR``), ``clip_grad_norm_``.

    dagprof profile -o runs/conformer-ddp -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/conformer_ctc.py --wrap ddp
    dagprof whatif runs/conformer-ddp --data-parallel fsdp     # against: the same with --wrap fsdp
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class FeedForward(nn.Module):
    def __init__(self, d: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d * mult), nn.SiLU(), nn.Linear(d * mult, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvModule(nn.Module):
    def __init__(self, d: int, kernel: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pointwise_in = nn.Conv1d(d, 2 * d, 1)
        self.depthwise = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pointwise_out = nn.Conv1d(d, d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).transpose(1, 2)
        h = F.glu(self.pointwise_in(h), dim=1)
        h = F.silu(self.bn(self.depthwise(h)))
        return self.pointwise_out(h).transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, kernel: int) -> None:
        super().__init__()
        self.ff1, self.ff2 = FeedForward(d), FeedForward(d)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.conv = ConvModule(d, kernel)
        self.out_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.out_norm(x)


class Conformer(nn.Module):
    def __init__(self, mels: int, d: int, depth: int, heads: int, kernel: int, vocab: int) -> None:
        super().__init__()
        self.subsample = nn.Sequential(nn.Conv2d(1, 32, 3, stride=2, padding=1), nn.ReLU(),
                                       nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU())
        self.proj = nn.Linear(32 * ((mels + 3) // 4), d)
        self.blocks = nn.ModuleList(ConformerBlock(d, heads, kernel) for _ in range(depth))
        self.head = nn.Linear(d, vocab)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        h = self.subsample(feats.unsqueeze(1))  # (batch, 32, time / 4, mels / 4)
        h = self.proj(h.permute(0, 2, 1, 3).flatten(2))
        for blk in self.blocks:
            h = blk(h)
        return self.head(h).log_softmax(-1)


def spec_augment(feats: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One time mask and one frequency mask per utterance (zeros), as SpecAugment's simplest policy."""
    b, t, f = feats.shape
    feats = feats.clone()
    for i in range(b):
        t0, tw = int(torch.randint(0, t - 20, (1,), generator=gen)), int(torch.randint(0, 20, (1,), generator=gen))
        f0, fw = int(torch.randint(0, f - 10, (1,), generator=gen)), int(torch.randint(0, 10, (1,), generator=gen))
        feats[i, t0:t0 + tw] = 0
        feats[i, :, f0:f0 + fw] = 0
    return feats


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--mels", type=int, default=80)
    p.add_argument("--frames", type=int, default=128)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kernel", type=int, default=15)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--batch", type=int, default=6)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Conformer(args.mels, args.dim, args.depth, args.heads, args.kernel, args.vocab)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=1e-2)
    warmup = 25
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, (warmup / (s + 1)) ** 0.5))  # Noam
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    gen = torch.Generator().manual_seed(dist.get_rank())
    out_frames = (args.frames + 3) // 4
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        feats = spec_augment(torch.randn(args.batch, args.frames, args.mels, generator=gen), gen)
        target_lens = torch.randint(out_frames // 4, out_frames // 2, (args.batch,), generator=gen)
        targets = torch.randint(1, args.vocab, (args.batch, int(target_lens.max())), generator=gen)
        log_probs = model(feats)  # (batch, time, vocab)
        loss = ctc(log_probs.transpose(0, 1), targets, torch.full((args.batch,), out_frames), target_lens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        tail = sorted(times[len(times) // 2:])
        print(f"{args.wrap} median step {1e3 * tail[len(tail) // 2]:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
