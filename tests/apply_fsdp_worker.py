"""One rank of test_fsdp_optimize's apply test: real gloo FSDP2 (``fully_shard``) on a small block stack, an FSDP
strategy applied after wrapping and checked against what FSDP then does; writes ``<out>/rank<r>.json``.

Started once per rank by ``netns.run_ranks`` (env:// rendezvous).
"""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from dagprof import apply
from dagprof.collect.deploy.apply_fsdp import fully_shard_kwargs
from dagprof.collect.deploy.strategy import Bucket, FsdpPlan, FsdpUnitPlan, Strategy
from dagprof.errors import DagprofError

WIDTH, BLOCKS = 32, 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.ReLU(), nn.Linear(2 * WIDTH, WIDTH)) for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


BLOCK_NUMEL = 2 * WIDTH * WIDTH + 2 * WIDTH + 2 * WIDTH * WIDTH + WIDTH
ROOT_NUMEL = WIDTH * WIDTH + WIDTH + 4 * WIDTH + 4
KEEP = {"<root>": False, "blocks.0": False, "blocks.1": True, "blocks.2": False}  # False: kept gathered after forward


def plan(reduce_dtype=None, **numel) -> Strategy:
    units = tuple(FsdpUnitPlan(n, numel.get(n.replace(".", "_"), ROOT_NUMEL if n == "<root>" else BLOCK_NUMEL), r) for n, r in KEEP.items())
    return Strategy((), 2, fsdp=FsdpPlan(units, reduce_dtype))


def wrapped(kwargs_of=None) -> nn.Module:
    torch.manual_seed(0)
    model = Net()
    for i, b in enumerate(model.blocks):
        fully_shard(b, **(kwargs_of(f"blocks.{i}") if kwargs_of else {}))
    fully_shard(model, **(kwargs_of("<root>") if kwargs_of else {}))
    return model


def groups(model) -> dict:
    return {name or "<root>": m._get_fsdp_state()._fsdp_param_groups[0] for name, m in model.named_modules() if hasattr(m, "_get_fsdp_state")}


def step(model, rank: int) -> tuple[dict, dict]:
    """One forward and backward; which units were still gathered between them, and the gradients (full)."""
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, WIDTH, generator=g), torch.randint(0, 4, (8,), generator=g)
    out = model(x)
    gathered = {n: grp.is_unsharded for n, grp in groups(model).items()}
    F.cross_entropy(out, y).backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return gathered, grads


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    torch.set_num_threads(1)
    res: dict = {}
    default_gathered, ref = step(wrapped(), rank)
    res["default_gathered"] = default_gathered

    model = wrapped()
    applied = apply(model, plan())
    res["again_same_plan"] = apply(model, plan()) is applied
    res["gathered"], grads = step(model, rank)
    res["reshard_grad_diff"] = max_diff(grads, ref)
    res["reshard_reduce_dtype"] = str(groups(model)["blocks.1"]._reduce_dtype)

    model = wrapped()
    apply(model, plan("bfloat16"))
    res["bf16_gathered"], grads = step(model, rank)
    res["bf16_reduce_dtype"] = {n: str(grp._reduce_dtype) for n, grp in groups(model).items()}
    res["bf16_grad_diff"] = max_diff(grads, ref)

    documented = wrapped(lambda name: fully_shard_kwargs(plan("bfloat16"), name))  # the same plan set at wrap time
    res["kwargs_gathered"], grads = step(documented, rank)
    res["kwargs_reduce_dtype"] = {n: str(grp._reduce_dtype) for n, grp in groups(documented).items()}
    res["kwargs_grad_diff"] = max_diff(grads, ref)

    for key, bad in (("mismatch_name", Strategy((), 2, fsdp=FsdpPlan((FsdpUnitPlan("blocks.9", 1, True),)))),
                     ("mismatch_size", plan(blocks_1=7)),
                     ("ddp_strategy", Strategy((("inp.weight", WIDTH * WIDTH),), 2, buckets=(Bucket(("inp.weight",), 4),)))):
        try:
            apply(wrapped(), bad)
            res[key] = ""
        except DagprofError as err:
            res[key] = str(err)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
