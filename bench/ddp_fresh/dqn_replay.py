"""A fresh DDP user script for reviewing dagprof (stop 65): a Double DQN with a replay buffer on a vectorised gridworld.

Habits it exercises, as value-based RL users write them (no other fresh script has this family or these together):
- an environment stepped in numpy beside the learner (16 gridworlds per rank, a goal and walls), acting
  epsilon-greedily through ``model.module`` under ``torch.no_grad`` each step, transitions into a numpy ring buffer;
- a target network (``copy.deepcopy`` of the module, ``load_state_dict`` every ``--sync-every`` steps), Double-DQN
  targets, ``smooth_l1_loss``; ``clip_grad_value_(1.0)``;
- ``AdamW(fused=True)`` (the fused CPU kernel) and ``opt.zero_grad(set_to_none=False)`` (gradients zeroed in place);
- every ``--log-every`` steps the ranks' finished-episode returns gathered with ``dist.all_gather_object`` (pickled).
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/dqn -- torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/dqn_replay.py
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


class Grids:
    """``n`` ``size`` x ``size`` gridworlds: reach the goal (+1), walls block, -0.01 a move, 60 moves at most."""

    def __init__(self, n: int, size: int, rng: np.random.Generator) -> None:
        self.n, self.size, self.rng = n, size, rng
        self.walls = rng.random((n, size, size)) < 0.15
        self.pos = np.zeros((n, 2), int)
        self.goal = np.full((n, 2), size - 1)
        self.t = np.zeros(n, int)
        self.ret = np.zeros(n)
        self.walls[:, 0, 0] = self.walls[:, -1, -1] = False

    def obs(self) -> np.ndarray:
        o = np.zeros((self.n, 3, self.size, self.size), np.float32)
        o[:, 0] = self.walls
        o[np.arange(self.n), 1, self.pos[:, 0], self.pos[:, 1]] = 1
        o[np.arange(self.n), 2, self.goal[:, 0], self.goal[:, 1]] = 1
        return o.reshape(self.n, -1)

    def step(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[float]]:
        nxt = np.clip(self.pos + MOVES[a], 0, self.size - 1)
        free = ~self.walls[np.arange(self.n), nxt[:, 0], nxt[:, 1]]
        self.pos[free] = nxt[free]
        done = (self.pos == self.goal).all(1)
        r = np.where(done, 1.0, -0.01)
        self.t += 1
        self.ret += r
        end = done | (self.t >= 60)
        finished = self.ret[end].tolist()
        self.pos[end], self.t[end], self.ret[end] = 0, 0, 0.0
        return r.astype(np.float32), done.astype(np.float32), finished


class QNet(nn.Module):
    def __init__(self, din: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(din, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.value, self.adv = nn.Linear(hidden, 1), nn.Linear(hidden, 4)  # duelling heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        a = self.adv(h)
        return self.value(h) + a - a.mean(-1, keepdim=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--size", type=int, default=10)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--sync-every", type=int, default=10)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    rng = np.random.default_rng(rank)
    env = Grids(args.envs, args.size, rng)
    din = 3 * args.size * args.size
    model = DDP(QNet(din, args.hidden))
    target = copy.deepcopy(model.module)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, fused=True)
    cap = 20_000
    buf_o, buf_o2 = np.zeros((cap, din), np.float32), np.zeros((cap, din), np.float32)
    buf_a, buf_r, buf_d = np.zeros(cap, np.int64), np.zeros(cap, np.float32), np.zeros(cap, np.float32)
    filled, head = 0, 0
    obs = env.obs()
    returns: list[float] = []
    stamps: list[float] = []
    for step in range(1, args.steps + 1):
        eps = max(0.05, 1.0 - step / args.steps)
        for _ in range(4):  # four env steps per update
            with torch.no_grad():
                greedy = model.module(torch.from_numpy(obs)).argmax(-1).numpy()
            act = np.where(rng.random(args.envs) < eps, rng.integers(4, size=args.envs), greedy)
            r, done, finished = env.step(act)
            returns += finished
            nxt = env.obs()
            idx = (head + np.arange(args.envs)) % cap
            buf_o[idx], buf_a[idx], buf_r[idx], buf_o2[idx], buf_d[idx] = obs, act, r, nxt, done
            head, filled, obs = (head + args.envs) % cap, min(cap, filled + args.envs), nxt
        pick = rng.integers(filled, size=args.batch)
        o, a = torch.from_numpy(buf_o[pick]), torch.from_numpy(buf_a[pick])
        o2, r, d = torch.from_numpy(buf_o2[pick]), torch.from_numpy(buf_r[pick]), torch.from_numpy(buf_d[pick])
        with torch.no_grad():
            best = model.module(o2).argmax(-1, keepdim=True)  # Double DQN: the online net picks, the target prices
            y = r + 0.97 * (1 - d) * target(o2).gather(1, best).squeeze(1)
        loss = F.smooth_l1_loss(model(o).gather(1, a[:, None]).squeeze(1), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        nn.utils.clip_grad_value_(model.parameters(), 1.0)
        opt.step()
        if step % args.sync_every == 0:
            target.load_state_dict(model.module.state_dict())
        if step % args.log_every == 0:
            gathered: list[list[float] | None] = [None] * world
            dist.all_gather_object(gathered, returns)
            returns = []
            if rank == 0:
                every = [x for part in gathered for x in (part or [])]
                mean = sum(every) / len(every) if every else float("nan")
                print(f"step {step} loss {loss.item():.4f} episodes {len(every)} mean return {mean:.3f}", flush=True)
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][3:]
    if rank == 0 and gaps:
        print(f"median step {1000 * statistics.median(gaps):.1f} ms over {len(gaps)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
