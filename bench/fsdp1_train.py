"""An FSDP1 (``FullyShardedDataParallel``) training script: gloo, CPU, started by torchrun.

``bench/fsdp_train.py``'s models (an embedding, a stack of MLP or attention blocks, a head), wrapped by
FSDP1 with ``auto_wrap_policy=ModuleWrapPolicy({Block})``: every block and the root are units. On CPU
FSDP1 needs ``device_id=torch.device("cpu")`` and no ``sync_module_states`` (it broadcasts from a GPU),
so every rank seeds its model alike instead. ``--dagprof DIR`` profiles with the API; without it the script
runs untouched (``dagprof profile -o DIR -- torchrun ... bench/fsdp1_train.py``).

    torchrun --standalone --nproc-per-node 2 bench/fsdp1_train.py --strategy FULL_SHARD --steps 12
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_train import AttnBlock, MLPBlock, Net  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--strategy", choices=[s.name for s in ShardingStrategy if not s.name.startswith("_")], default="FULL_SHARD")
    p.add_argument("--backward-prefetch", choices=("BACKWARD_PRE", "BACKWARD_POST", "none"), default="BACKWARD_PRE")
    p.add_argument("--forward-prefetch", action="store_true")
    p.add_argument("--bf16", action="store_true", help="MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)")
    p.add_argument("--use-orig-params", action="store_true")
    p.add_argument("--comm-hook", action="store_true", help="register FSDP1's reduce_scatter_hook (dagprof refuses to profile it)")
    p.add_argument("--hybrid", type=int, default=0, metavar="R", help="HYBRID_SHARD over a (R, WORLD/R) replicate x shard device mesh")
    p.add_argument("--dagprof", metavar="DIR", help="profile with dagprof.profile into DIR")
    p.add_argument("--profile-steps", default="4:8")
    p.add_argument("--kineto", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--times", metavar="FILE", help="write rank 0's step times (s) as JSON")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = Net(args.model, args.blocks, args.width, args.vocab)
    mesh = None
    if args.hybrid:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (args.hybrid, dist.get_world_size() // args.hybrid), mesh_dim_names=("replicate", "shard"))
    model = FSDP(
        net, auto_wrap_policy=ModuleWrapPolicy({MLPBlock if args.model == "mlp" else AttnBlock}),
        sharding_strategy=ShardingStrategy["HYBRID_SHARD" if args.hybrid else args.strategy], device_id=torch.device("cpu"), device_mesh=mesh,
        backward_prefetch=None if args.backward_prefetch == "none" else BackwardPrefetch[args.backward_prefetch],
        forward_prefetch=args.forward_prefetch, use_orig_params=args.use_orig_params,
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else None,
    )
    if args.comm_hook:
        from torch.distributed.algorithms._comm_hooks import default_hooks

        model.register_comm_hook(default_hooks.DefaultState(dist.group.WORLD), default_hooks.reduce_scatter_hook)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer, prof=None) -> list[float]:
    g = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return times


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model, opt = build(args)
    if args.dagprof:
        import dagprof

        with dagprof.profile(args.dagprof, steps=args.profile_steps, model=model, kineto=args.kineto) as prof:
            times = train(args, model, opt, prof)
    else:
        times = train(args, model, opt)
    if args.times and dist.get_rank() == 0:
        with open(args.times, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
