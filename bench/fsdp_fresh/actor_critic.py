"""A fresh FSDP2 user script (stop 62): an advantage actor-critic (A2C) on a synthetic control task, the actor and the
critic each ``fully_shard`` per block and at the root, two optimizers. Habits no other fresh script has: the actor run
forward twice a step (once under ``torch.no_grad()`` to act, once to learn), the critic's value targets bootstrapped
from a second no-grad critic forward on the next observations, the critic stepped before the actor, and an entropy
bonus. ``--ddp`` runs the same loop with each model in its own ``DistributedDataParallel``. Run as::

    dagprof profile -o runs/a2c -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/actor_critic.py --steps 10
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


class Tower(nn.Module):
    def __init__(self, obs: int, width: int, depth: int, out: int) -> None:
        super().__init__()
        self.embed = nn.Linear(obs, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh()) for _ in range(depth))
        self.out = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def shard(model: Tower, reshard: bool | None) -> Tower:
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--envs", type=int, default=256, help="parallel environments a rank steps")
    ap.add_argument("--obs", type=int, default=48)
    ap.add_argument("--actions", type=int, default=12)
    ap.add_argument("--reshard", choices=("on", "off"), default=None, help="every unit's reshard_after_forward (default: fully_shard's)")
    ap.add_argument("--ddp", action="store_true", help="wrap each model in its own DistributedDataParallel instead (the held-out run of "
                    "whatif --data-parallel ddp)")
    ap.add_argument("--strategy", metavar="FILE", help="a strategy of dagprof optimize, applied to both towers (dagprof.apply)")
    ap.add_argument("--memory", metavar="FILE", help="measure each step's peak tensor memory (bench/heap_peak.py) into FILE.<rank>")
    args = ap.parse_args()
    reshard = None if args.reshard is None else args.reshard == "on"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    wrap = DistributedDataParallel if args.ddp else (lambda m: shard(m, reshard))
    actor = wrap(Tower(args.obs, 192, 3, args.actions))
    critic = wrap(Tower(args.obs, 256, 2, 1))
    if args.strategy:
        import dagprof

        dagprof.apply([actor, critic], args.strategy)
    opt_a = torch.optim.Adam(actor.parameters(), lr=3e-4)
    opt_c = torch.optim.RMSprop(critic.parameters(), lr=1e-3)
    dynamics = torch.randn(args.obs + args.actions, args.obs, generator=torch.Generator().manual_seed(3)) / args.obs ** 0.5
    g = torch.Generator().manual_seed(11 + rank)
    obs = torch.randn(args.envs, args.obs, generator=g)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from heap_peak import Optimizers, StepPeaks
    peaks = StepPeaks(args.memory, nn.ModuleList([actor, critic]), Optimizers(opt_a, opt_c))
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        with peaks.step():
            with torch.no_grad():  # act
                action = torch.multinomial(F.softmax(actor(obs), -1), 1, generator=g).squeeze(1)
                nxt = torch.tanh(torch.cat([obs, F.one_hot(action, args.actions).float()], 1) @ dynamics)
                reward = -(nxt ** 2).mean(1)
                target = reward + 0.99 * critic(nxt).squeeze(1)
            value = critic(obs).squeeze(1)
            critic_loss = F.smooth_l1_loss(value, target)
            opt_c.zero_grad(set_to_none=True)
            critic_loss.backward()
            opt_c.step()
            advantage = (target - value.detach())
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-6)
            logp = F.log_softmax(actor(obs), -1)
            entropy = -(logp.exp() * logp).sum(1).mean()
            actor_loss = -(logp.gather(1, action[:, None]).squeeze(1) * advantage).mean() - 0.01 * entropy
            opt_a.zero_grad(set_to_none=True)
            actor_loss.backward()
            torch.nn.utils.clip_grad_norm_(actor.parameters(), 0.5)
            opt_a.step()
            obs = nxt
        times.append(time.perf_counter() - t0)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} critic {critic_loss.item():.4f} actor {actor_loss.item():.4f}", flush=True)
    peaks.save(rank)
    if rank == 0 and len(times) > 4:
        print(f"median step {statistics.median(times[3:]) * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
