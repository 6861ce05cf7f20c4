"""A fresh user-style job (issue 16): ConvE link prediction on a synthetic knowledge graph, its big entity table sharded
on its own, as HSDP on a 2-D DeviceMesh or (``--layout mixed``) beside a ``replicate()``d scorer.

Habits, as users write them (no other fresh script has this family or these habits together):
- ConvE (Dettmers et al. 2018): head and relation embeddings reshaped to 2-D "images", stacked, a 3x3 ``Conv2d`` with
  BatchNorm and dropout, a dense projection back to the embedding width, scored by a dot product against the tail and
  ``--negatives`` sampled corrupt tails (one lookup of all of them through the entity table);
- the entity table (``--entities`` x ``--dim``, most of the parameters) a ``fully_shard`` unit of its own. The user first
  wrote ``--layout mixed``: the table under ``fully_shard``, then ``replicate(model, ignored_modules=[model.entities])``
  for everything else (as torch's composable APIs allow: the table reduce-scattered, the scorer all-reduced in DDP
  buckets); ``dagprof profile`` refuses that in one line and names HSDP, so the default ``--layout hsdp`` puts the
  table and the root on ``init_device_mesh("cpu", (R, S), mesh_dim_names=("dp_replicate", "dp_shard"))`` (``--shard``
  S, default every rank);
- two optimizers, as the mixed layout needed them (one fused optimizer refuses to mix the table's DTensors with the
  scorer's plain tensors): ``Adagrad`` on the table, ``Adam`` on the scorer; label smoothing on the 1-vs-negatives
  targets;
- triples drawn from a hidden relational structure (tail = a relation's permutation of the head, 10 % noise), a
  filtered-free hits@10 on a held-out batch logged every ``--log-every`` steps (all-reduced).
Without a profiler it prints its median step from step 4 on.

    dagprof profile -o runs/conve -- torchrun --standalone --nproc-per-node 2 bench/replicate_fresh/conve_sharded_entities.py
    dagprof profile -o runs/conve4 -- torchrun --standalone --nproc-per-node 4 bench/replicate_fresh/conve_sharded_entities.py --shard 2
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._composable import replicate
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

log = logging.getLogger("conve")


class ConvE(nn.Module):
    def __init__(self, entities: int, relations: int, dim: int, rows: int, channels: int) -> None:
        super().__init__()
        self.rows = rows
        self.entities = nn.Embedding(entities, dim)
        self.relations = nn.Embedding(relations, dim)
        self.bn0 = nn.BatchNorm2d(1)
        self.conv = nn.Conv2d(1, channels, 3)
        self.bn1 = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels * (2 * rows - 2) * (dim // rows - 2), dim)
        self.bn2 = nn.BatchNorm1d(dim)
        self.drop = nn.Dropout(0.2)
        nn.init.xavier_normal_(self.entities.weight)

    def forward(self, head: torch.Tensor, rel: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        """Scores of each (head, rel) against its row of ``tails`` (batch x 1+negatives)."""
        e = self.entities(torch.cat([head, tails.reshape(-1)]))
        h, t = e[:head.shape[0]], e[head.shape[0]:].reshape(*tails.shape, -1)
        img = torch.cat([h.view(-1, 1, self.rows, h.shape[1] // self.rows),
                         self.relations(rel).view(-1, 1, self.rows, h.shape[1] // self.rows)], 2)
        x = self.drop(F.relu(self.bn1(self.conv(self.bn0(img)))))
        x = F.relu(self.bn2(self.drop(self.fc(x.flatten(1)))))
        return torch.einsum("bd,bkd->bk", x, t)


def triples(g: torch.Generator, n: int, perms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    head = torch.randint(perms.shape[1], (n,), generator=g)
    rel = torch.randint(perms.shape[0], (n,), generator=g)
    tail = perms[rel, head]
    noise = torch.rand(n, generator=g) < 0.1
    tail[noise] = torch.randint(perms.shape[1], (int(noise.sum()),), generator=g)
    return head, rel, tail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=128, help="triples per rank")
    p.add_argument("--entities", type=int, default=12_000)
    p.add_argument("--relations", type=int, default=24)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--negatives", type=int, default=31)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--layout", choices=("hsdp", "mixed"), default="hsdp")
    p.add_argument("--shard", type=int, default=0, help="hsdp: the mesh's shard degree (default: every rank)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    perms = torch.stack([torch.randperm(args.entities, generator=torch.Generator().manual_seed(r)) for r in range(args.relations)])
    model = ConvE(args.entities, args.relations, args.dim, rows=10, channels=16)
    if args.layout == "mixed":
        fully_shard(model.entities)
        replicate(model, ignored_modules=[model.entities])
    else:
        shard = args.shard or world
        mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("dp_replicate", "dp_shard"))
        fully_shard(model.entities, mesh=mesh)
        fully_shard(model, mesh=mesh)
    table = list(model.entities.parameters())
    opt_table = torch.optim.Adagrad(table, lr=0.05)
    opt_dense = torch.optim.Adam([q for q in model.parameters() if all(q is not t for t in table)], lr=1e-3)
    g = torch.Generator().manual_seed(7 + rank)
    held = triples(torch.Generator().manual_seed(999), 64, perms)
    times: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        head, rel, tail = triples(g, args.batch, perms)
        cands = torch.cat([tail[:, None], torch.randint(args.entities, (args.batch, args.negatives), generator=g)], 1)
        target = torch.zeros_like(cands, dtype=torch.float32)
        target[:, 0] = 1.0
        target = target * 0.9 + 0.1 / cands.shape[1]  # label smoothing
        loss = F.binary_cross_entropy_with_logits(model(head, rel, cands), target)
        loss.backward()
        opt_table.step()
        opt_dense.step()
        opt_table.zero_grad(set_to_none=True)
        opt_dense.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        if (step + 1) % args.log_every == 0:
            model.eval()
            with torch.no_grad():
                h, r, t = held
                pool = torch.cat([t[:, None], torch.randint(args.entities, (64, 99), generator=g)], 1)
                hits = (model(h, r, pool).argsort(1, descending=True)[:, :10] == 0).any(1).float().mean()
            model.train()
            dist.all_reduce(hits)
            if rank == 0:
                log.info("step %d loss %.4f hits@10 (of 100) %.3f", step + 1, loss.item(), hits.item() / world)
    if rank == 0 and len(times) > 4:
        print(f"median step {1000 * statistics.median(times[4:]):.1f} ms over {len(times) - 4} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
