"""A fresh DDP user script for reviewing dagprof (stop 64): PPO on a batch of cart-poles simulated in torch, per rank.

Habits it exercises, as reinforcement-learning users write PPO from the tutorials (no other fresh script has this family):
- an actor-critic MLP (shared trunk, a policy head and a value head) in one DDP module, ``Categorical`` actions;
- each iteration a rollout of ``--horizon`` env steps on ``--envs`` vectorised cart-poles (the classic-control physics by
  hand) through ``model.module`` under ``torch.no_grad()`` (no DDP forward, no collective), GAE(lambda) advantages,
  normalised per rank; then ``--epochs`` epochs of shuffled minibatches, one optimizer step each: the clipped surrogate,
  a clipped value loss and an entropy bonus;
- ``Adam(eps=1e-5)``, the learning rate annealed linearly by hand (``param_group["lr"] = ...``) every iteration,
  ``clip_grad_norm_(0.5)``, ``zero_grad()`` (set_to_none's default);
- every iteration the mean episode return all-reduced for the log (a blocking c10d call between optimizer steps).
So one optimizer step in every ``epochs * minibatches`` (8 by default) carries the rollout before it. It prints the median
and the mean time between optimizer steps from step 8 on.

    dagprof profile -o runs/ppo -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/ppo_cartpole.py
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP


class CartPoles:
    """``n`` cart-poles (gym's CartPole-v1 dynamics, Euler steps), reset where they fall or after 500 steps."""

    def __init__(self, n: int, g: torch.Generator) -> None:
        self.n, self.g = n, g
        self.state = self._fresh(n)
        self.t = torch.zeros(n)
        self.ret = torch.zeros(n)
        self.finished: list[float] = []

    def _fresh(self, k: int) -> torch.Tensor:
        return (torch.rand(k, 4, generator=self.g) - 0.5) * 0.1

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, v, th, w = self.state.unbind(1)
        force = (action.float() * 2 - 1) * 10.0
        cos, sin = torch.cos(th), torch.sin(th)
        temp = (force + 0.05 * w * w * sin) / 1.1
        acc_th = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos * cos / 1.1))
        acc_x = temp - 0.05 * acc_th * cos / 1.1
        self.state = torch.stack([x + 0.02 * v, v + 0.02 * acc_x, th + 0.02 * w, w + 0.02 * acc_th], 1)
        self.t += 1
        self.ret += 1
        done = (self.state[:, 0].abs() > 2.4) | (self.state[:, 2].abs() > 12 * math.pi / 180) | (self.t >= 500)
        if done.any():
            self.finished += self.ret[done].tolist()
            self.state[done] = self._fresh(int(done.sum()))
            self.t[done], self.ret[done] = 0, 0
        return self.state.clone(), torch.ones(self.n), done.float()


class ActorCritic(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, 2)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def rollout(net: ActorCritic, envs: CartPoles, obs: torch.Tensor, horizon: int, gamma: float = 0.99, lam: float = 0.95):
    """``horizon`` steps of every env under the current policy; (obs, actions, log-probs, returns, advantages), flat."""
    keep = {k: [] for k in ("obs", "act", "logp", "val", "rew", "done")}
    with torch.no_grad():
        for _ in range(horizon):
            logits, value = net(obs)
            dist_ = Categorical(logits=logits)
            act = dist_.sample()
            nxt, rew, done = envs.step(act)
            for k, x in zip(keep, (obs, act, dist_.log_prob(act), value, rew, done)):
                keep[k].append(x)
            obs = nxt
        last = net(obs)[1]
    vals, rews, dones = torch.stack(keep["val"]), torch.stack(keep["rew"]), torch.stack(keep["done"])
    adv, gae = torch.zeros_like(rews), torch.zeros(envs.n)
    for t in reversed(range(horizon)):
        nxt_v = last if t == horizon - 1 else vals[t + 1]
        delta = rews[t] + gamma * nxt_v * (1 - dones[t]) - vals[t]
        gae = delta + gamma * lam * (1 - dones[t]) * gae
        adv[t] = gae
    flat = lambda k: torch.stack(keep[k]).flatten(0, 1)  # noqa: E731
    return obs, (flat("obs"), flat("act"), flat("logp"), (adv + vals).flatten(), adv.flatten())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--horizon", type=int, default=128)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=2.5e-4)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(ActorCritic(args.hidden))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-5)
    g = torch.Generator().manual_seed(7 + rank)
    envs = CartPoles(args.envs, g)
    obs = envs.state.clone()
    stamps: list[float] = []
    for it in range(args.iterations):
        for group in opt.param_groups:
            group["lr"] = args.lr * (1 - it / args.iterations)
        obs, (b_obs, b_act, b_logp, b_ret, b_adv) = rollout(model.module, envs, obs, args.horizon)
        b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
        n = b_obs.shape[0]
        for _ in range(args.epochs):
            order = torch.randperm(n, generator=g)
            for mb in order.chunk(args.minibatches):
                logits, value = model(b_obs[mb])
                d = Categorical(logits=logits)
                ratio = (d.log_prob(b_act[mb]) - b_logp[mb]).exp()
                surrogate = torch.min(ratio * b_adv[mb], ratio.clamp(0.8, 1.2) * b_adv[mb])
                loss = -surrogate.mean() + 0.5 * (value - b_ret[mb]).pow(2).mean() - 0.01 * d.entropy().mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                stamps.append(time.perf_counter())
        mean_return = torch.tensor([statistics.fmean(envs.finished[-20:]) if envs.finished else 0.0])
        dist.all_reduce(mean_return)
        if rank == 0:
            print(f"iteration {it} mean return {mean_return.item() / dist.get_world_size():.1f}", flush=True)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][7:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms, mean step {1000 * statistics.fmean(gaps):.1f} ms "
              f"over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
