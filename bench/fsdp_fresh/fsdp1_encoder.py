"""A fresh FSDP1 user script for reviewing dagprof (issue 16): torch's own ``nn.TransformerEncoder`` under FSDP1.

Habits it exercises, as users write them (not dagprof's own fsdp1_train.py):
- ``auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer})`` on a model built from torch's stock layers;
- ``use_orig_params=True``, ``device_id=torch.device("cpu")`` (FSDP1 on CPU), ``BackwardPrefetch.BACKWARD_PRE``;
- gradient accumulation with FSDP1's ``model.no_sync()`` context on the first micro-batch;
- ``model.clip_grad_norm_`` (FSDP1's own), ``AdamW(fused=False, foreach=True)``, a warm-up ``LambdaLR``.

    dagprof profile -o runs/fsdp1 -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/fsdp1_encoder.py --steps 20
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Encoder(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.cls = nn.Linear(width, 2)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        return self.cls(self.encoder(self.embed(tok)).mean(dim=1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead (its no_sync alike): what whatif --data-parallel ddp predicts")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # every rank alike: no sync_module_states on CPU
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(Encoder(2000, args.width, 3))
        model.clip_grad_norm_ = lambda norm: nn.utils.clip_grad_norm_(model.parameters(), norm)
    else:
        model = FSDP(Encoder(2000, args.width, 3), auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer}),
                     use_orig_params=True, device_id=torch.device("cpu"), backward_prefetch=BackwardPrefetch.BACKWARD_PRE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        for micro in range(args.accum):
            ctx = model.no_sync() if micro < args.accum - 1 else contextlib.nullcontext()
            with ctx:
                tok = torch.randint(0, 2000, (8, 32), generator=g)
                loss = F.cross_entropy(model(tok), (tok[:, 0] % 2)) / args.accum
                loss.backward()
        model.clip_grad_norm_(1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
