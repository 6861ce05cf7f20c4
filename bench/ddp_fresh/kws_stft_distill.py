"""A fresh DDP user script for reviewing dagprof (stop 60): a keyword spotter distilled from a frozen teacher, on STFT features.

Habits it exercises, as speech users write them (no other fresh DDP script has them together):
- log-mel features computed in the loop from raw 1 s waveforms: ``torch.stft`` (Hann window, 512/160), a triangular
  mel filterbank built by hand (no torchaudio), SpecAugment's time and frequency masks by ``masked_fill``;
- knowledge distillation: a wider teacher CNN kept outside DDP in ``eval()`` under ``torch.no_grad()``, the student's
  loss the CE plus the KL to the teacher's softened logits (T = 4);
- ``DDP(student, static_graph=True, broadcast_buffers=False, bucket_cap_mb=2)`` and a bf16 compression hook the user
  wrote (torch's ``bf16_compress_hook`` refuses gloo: it wants NCCL), its decompression in the future's ``then``;
- gradient accumulation with ``no_sync()`` over ``--accum`` micro-batches (one in the first step, which ``static_graph``
  must see synced);
- ``SGD(nesterov=True)``, ``OneCycleLR``, ``clip_grad_norm_(5.0)``.

    dagprof profile -o runs/kws -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/kws_stft_distill.py --steps 12
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

RATE, N_FFT, HOP, MELS, WORDS = 16000, 512, 160, 40, 12


def mel_filterbank() -> torch.Tensor:
    def mel(f: torch.Tensor) -> torch.Tensor:
        return 2595 * torch.log10(1 + f / 700)
    edges = 700 * (10 ** (torch.linspace(0, float(mel(torch.tensor(RATE / 2))), MELS + 2) / 2595) - 1)
    freqs = torch.linspace(0, RATE / 2, N_FFT // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return torch.clamp(torch.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), min=0)


def log_mel(wave: torch.Tensor, bank: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    spec = torch.stft(wave, N_FFT, HOP, window=window, return_complex=True).abs().pow(2)
    return torch.log(bank @ spec + 1e-6).unsqueeze(1)


def spec_augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    b, _, f, t = x.shape
    f0, t0 = torch.randint(0, f - 8, (b, 1, 1, 1), generator=g), torch.randint(0, t - 20, (b, 1, 1, 1), generator=g)
    fi, ti = torch.arange(f).view(1, 1, f, 1), torch.arange(t).view(1, 1, 1, t)
    return x.masked_fill(((fi >= f0) & (fi < f0 + 8)) | ((ti >= t0) & (ti < t0 + 20)), 0.0)


def cnn(width: int) -> nn.Sequential:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False), nn.Conv2d(cin, cout, 1, bias=False),
                nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), *block(width, 2 * width), *block(2 * width, 4 * width),
                         *block(4 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, WORDS))


def bf16_hook(group, bucket):  # no annotations: DDP checks them, and this module's are strings (__future__)
    buf = bucket.buffer()
    half = buf.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(half, group=group, async_op=True).get_future()
    return fut.then(lambda f: buf.copy_(f.value()[0]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--no-hook", action="store_true", help="fp32 gradients on the wire")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    teacher = cnn(64).eval().requires_grad_(False)
    model = DDP(cnn(24), static_graph=True, broadcast_buffers=False, bucket_cap_mb=2)
    if not args.no_hook:
        model.register_comm_hook(None, bf16_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.steps)
    bank, window = mel_filterbank(), torch.hann_window(N_FFT)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        accum = 1 if step == 0 else args.accum     # static_graph learns the graph from a synced first step
        for i in range(accum):
            wave = torch.randn(args.micro, RATE, generator=g) * 0.1
            label = torch.randint(0, WORDS, (args.micro,), generator=g)
            feats = log_mel(wave, bank, window)
            with torch.no_grad():
                soft = F.softmax(teacher(feats) / 4, dim=1)
            with contextlib.nullcontext() if i == accum - 1 else model.no_sync():
                logits = model(spec_augment(feats, g))
                kd = F.kl_div(F.log_softmax(logits / 4, dim=1), soft, reduction="batchmean") * 16
                loss = (0.5 * F.cross_entropy(logits, label) + 0.5 * kd) / accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * args.accum:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
