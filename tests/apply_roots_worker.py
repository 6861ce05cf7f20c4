"""One rank of test_fsdp_roots_optimize's apply test: real gloo FSDP2 on two ``fully_shard`` roots (a GAN-like pair of
block stacks, the first with no parameters of its own, the second with its own head), a two-root strategy applied
and checked against what FSDP then keeps gathered after forward; writes ``<out>/rank<r>.json``.

Started once per rank by ``netns.run_ranks`` (env:// rendezvous).
"""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from dagprof import apply
from dagprof.collect.deploy.apply import apply_root
from dagprof.collect.deploy.strategy import FsdpPlan, FsdpUnitPlan, Strategy
from dagprof.errors import DagprofError

W = 16


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(W, W) for _ in range(2))
        self.head = nn.Linear(W, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x)


def models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    gen, critic = nn.Sequential(*(nn.Linear(W, W) for _ in range(3))), Critic()
    for b in gen:
        fully_shard(b)
    fully_shard(gen)  # no parameters of its own: no unit
    for b in critic.blocks:
        fully_shard(b)
    fully_shard(critic)
    return gen, critic


LIN, HEAD = W * W + W, W + 1
# root 1's units are named as the profile names them: its class (FSDPCritic) and its index before each path
KEEP = [("0", 0, False), ("1", 0, True), ("2", 0, False), ("FSDPCritic1", 1, False), ("FSDPCritic1.blocks.0", 1, True),
        ("FSDPCritic1.blocks.1", 1, False)]


def plan(keep=KEEP) -> Strategy:
    units = tuple(FsdpUnitPlan(n, HEAD if n == "FSDPCritic1" else LIN, r, k) for n, k, r in keep)
    return Strategy((), 2, fsdp=FsdpPlan(units))


def gathered(*roots) -> dict:
    """Which units are still unsharded after one forward of both (before backward)."""
    gen, critic = roots
    x = torch.randn(4, W, generator=torch.Generator().manual_seed(dist.get_rank()))
    out = critic(gen(x)).sum()
    res = {}
    for k, root in enumerate(roots):
        for name, m in root.named_modules():
            state = getattr(m, "_get_fsdp_state", None)
            if state is not None and (grps := state()._fsdp_param_groups):
                res[f"{k}:{name}"] = grps[0].is_unsharded
    out.backward()
    return res


def refused(fn) -> str:
    try:
        fn()
        return ""
    except DagprofError as err:
        return str(err)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    res: dict = {"default": gathered(*models())}
    gen, critic = models()
    applied = apply([gen, critic], plan())
    res["again_same_plan"] = apply([gen, critic], plan()) is applied
    res["applied"] = gathered(gen, critic)
    gen, critic = models()  # as optimize --verify reaches each root (deploy.autoapply)
    res["by_root"] = [apply_root(gen, plan(), 0) is not None, apply_root(critic, plan(), 1) is not None]
    res["by_root_gathered"] = gathered(gen, critic)
    one_root = Strategy((), 2, fsdp=FsdpPlan(tuple(FsdpUnitPlan(n, LIN, False) for n in ("0", "1", "2"))))
    res["one_root_leaves_the_second"] = apply_root(models()[1], one_root, 1) is None
    res["one_module"] = refused(lambda: apply(models()[0], plan()))
    res["swapped"] = refused(lambda: apply(list(reversed(models())), plan()))
    res["ddp_list"] = refused(lambda: apply(list(models()), Strategy((("w", 1),), 2)))
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
