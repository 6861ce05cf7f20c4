"""A fresh data-parallel job with no DDP (stop 61): a GRU language model whose optimizer the user shards by hand (ZeRO-2).

Habits it exercises, as users write them:
- a word-level GRU language model (tied input and output embeddings, 2-layer ``nn.GRU`` with dropout, a LayerNorm);
- all gradients packed into one flat buffer padded to a multiple of the world size, reduce-scattered with
  ``dist.reduce_scatter_tensor(shard, flat, async_op=True)`` (the deprecated name, as older code has it), waited for,
  then Adam steps on this rank's shard of a flat fp32 master copy, and the updated shard is all-gathered back with
  ``dist.all_gather_into_tensor(flat_params, shard, async_op=True)``, waited for just before the next forward;
- gradient clipping by the global norm computed on the shards (one blocking ``dist.all_reduce`` of a scalar);
- profiled by the Python API (``--dagprof DIR``, ``--record-shapes``).

    torchrun --standalone --nproc-per-node 2 bench/hand_dp/gru_sharded_adam.py --steps 8 --dagprof runs/gru
"""
from __future__ import annotations

import argparse
import contextlib
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class GruLM(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=2, dropout=0.1, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(tokens))
        return self.out(self.norm(h))


class ShardedAdam:
    """Adam on this rank's slice of one flat copy of the parameters; gradients reduce-scattered, parameters all-gathered."""

    def __init__(self, model: nn.Module, lr: float) -> None:
        self.params = list(model.parameters())
        self.world, rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.shard_len = -(-numel // self.world)
        self.flat_params = torch.zeros(self.shard_len * self.world)
        torch.cat([p.detach().flatten() for p in self.params], out=self.flat_params[:numel])
        self.master = self.flat_params[rank * self.shard_len:(rank + 1) * self.shard_len].clone().requires_grad_()
        self.opt = torch.optim.Adam([self.master], lr=lr)
        self.gather = None

    def step(self, max_norm: float) -> None:
        flat = torch.zeros(self.shard_len * self.world)
        torch.cat([p.grad.flatten() for p in self.params], out=flat[:sum(p.numel() for p in self.params)])
        shard = torch.empty(self.shard_len)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.reduce_scatter_tensor(shard, flat, async_op=True).wait()
        shard.div_(self.world)
        sq = shard.pow(2).sum()
        dist.all_reduce(sq)  # the global norm from the shards
        shard.mul_(min(1.0, max_norm / (sq.sqrt().item() + 1e-6)))
        self.master.grad = shard
        self.opt.step()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.gather = dist.all_gather_into_tensor(self.flat_params, self.master.detach(), async_op=True)

    def sync_params(self) -> None:
        """Wait for the last all-gather and copy the gathered parameters into the model's."""
        if self.gather is None:
            return
        self.gather.wait()
        self.gather, at = None, 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(self.flat_params[at:at + p.numel()].view_as(p))
                at += p.numel()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dagprof", metavar="DIR", help="profile steps 3 to the second last with dagprof.profile(DIR)")
    p.add_argument("--record-shapes", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GruLM(args.vocab, args.dim)
    opt = ShardedAdam(model, 1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    prof = contextlib.nullcontext()
    if args.dagprof:
        import dagprof
        prof = dagprof.profile(args.dagprof, steps=range(3, args.steps - 1), model=model, record_shapes=args.record_shapes)
    with prof:
        for step in range(args.steps):
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
            opt.sync_params()
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            model.zero_grad(set_to_none=True)
            loss.backward()
            opt.step(max_norm=1.0)
            if args.dagprof:
                prof.step()
            if dist.get_rank() == 0 and step % 4 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
    opt.sync_params()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
