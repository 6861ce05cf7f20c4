"""One rank of test_apply: real gloo DDP on the tiny demo model, each strategy applied and checked.

Started once per rank by ``netns.run_ranks`` (env:// rendezvous); writes ``<out>/rank<r>.json``.
"""
import gc
import json
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from dagprof import apply
from dagprof.collect.deploy.strategy import Bucket, Compression, Strategy
from dagprof.collect.jobs.demo_train import DemoConfig, build_model
from dagprof.errors import DagprofError

CFG = DemoConfig.small()


def fresh():
    torch.manual_seed(0)
    return build_model(CFG)


def batch(rank: int, i: int = 0):
    g = torch.Generator().manual_seed(100 * rank + i)
    return torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g)


def ready_order(model) -> list[str]:
    """Parameter names in the order their gradients are accumulated (what DDP's rebuild sees)."""
    seen = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: seen.append(n)) for n, p in model.named_parameters()]
    x, y = batch(0)
    F.cross_entropy(model(x), y).backward()
    for h in hooks:
        h.remove()
    model.zero_grad(set_to_none=True)
    return seen


def grads_after(ddp, rank: int, steps: int = 1) -> dict:
    for i in range(steps):
        ddp.zero_grad(set_to_none=True)
        x, y = batch(rank, i)
        F.cross_entropy(ddp(x), y).backward()
    return {n: p.grad.clone() for n, p in ddp.module.named_parameters()}


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    torch.set_num_threads(1)
    res: dict = {}
    model = fresh()
    fp = tuple((n, p.numel()) for n, p in model.named_parameters())
    order = ready_order(model)
    sizes = {n: p.numel() * 4 for n, p in model.named_parameters()}
    ref = grads_after(DDP(fresh()), rank)

    def close(got: dict, tol: float) -> float:
        return max(float((got[n] - ref[n]).abs().max() / (ref[n].abs().max() + 1e-12)) for n in ref)

    # custom bucket boundaries: three buckets at chosen places in ready order
    cut = [len(order) // 4, len(order) // 2, len(order) - 1]
    starts = [0] + [c + 1 for c in cut[:-1]]
    buckets = tuple(Bucket(tuple(order[a : z + 1]), sum(sizes[p] for p in order[a : z + 1])) for a, z in zip(starts, cut))
    ddp = DDP(fresh())
    plan = apply(ddp, Strategy(fp, 2, buckets=buckets))
    got = grads_after(ddp, rank, steps=3)  # DDP rebuilds its buckets after the first iteration
    res["layout_differences"] = plan.layout_differences()
    res["rebuilt"] = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes")
    res["want"] = [b.nbytes for b in buckets]
    ref3 = grads_after(DDP(fresh()), rank, steps=3)
    res["buckets_err"] = max(float((got[n] - ref3[n]).abs().max()) for n in ref3)

    # find_unused_parameters=True: DDP builds its buckets once, from the parameters in registration order; a layout of
    # runs against that order (what optimize searches there) is built as it stands, one of runs along it is refused
    against = [n for n, _ in fp][::-1]
    cut = [len(against) // 3, 2 * len(against) // 3, len(against) - 1]
    runs = tuple(Bucket(tuple(against[a : z + 1]), sum(sizes[p] for p in against[a : z + 1]))
                 for a, z in zip([0] + [c + 1 for c in cut[:-1]], cut))
    ddp = DDP(fresh(), find_unused_parameters=True)
    apply(ddp, Strategy(fp, 2, buckets=runs))
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    res["unused_built"] = [sorted(names[id(p)] for p in b.parameters()) for b in ddp.reducer._get_zeros_like_grad_buckets()]
    res["unused_want"] = [sorted(b.params) for b in runs]
    got = grads_after(ddp, rank, steps=3)
    res["unused_err"] = max(float((got[n] - ref3[n]).abs().max()) for n in ref3)
    try:
        apply(DDP(fresh(), find_unused_parameters=True), Strategy(fp, 2, buckets=runs[::-1]))
        res["unused_refused"] = None
    except DagprofError as err:
        res["unused_refused"] = str(err)

    for name, strategy in {
        "fp16": Strategy(fp, 2, compression=Compression("fp16")),
        "bf16": Strategy(fp, 2, compression=Compression("bf16")),
        "parts3": Strategy(fp, 2, partition=3),
        "fp16_parts2": Strategy(fp, 2, compression=Compression("fp16"), partition=2),
        "recompute": Strategy(fp, 2, recompute=("layers.0",)),
        "bucket_view": Strategy(fp, 2, grad_as_bucket_view=True),
    }.items():
        ddp = DDP(fresh(), bucket_cap_mb=0.01)
        apply(ddp, strategy)
        res[name] = close(grads_after(ddp, rank), 0)

    ddp = DDP(fresh(), bucket_cap_mb=0.01)
    apply(ddp, Strategy(fp, 2, compression=Compression("powersgd", rank=2)))
    g = grads_after(ddp, rank, steps=5)  # plain all-reduce for two iterations, then compressed
    res["powersgd_finite"] = all(bool(torch.isfinite(t).all()) for t in g.values())

    ddp = DDP(fresh())
    plan = apply(ddp, Strategy(fp, 2, accumulate=2))
    res["micro_batches"] = plan.micro_batches
    res["sync0_is_no_sync"] = type(plan.sync(0)).__name__ != "nullcontext"
    res["again_same_plan"] = apply(ddp, Strategy(fp, 2, accumulate=2)) is plan

    for label, bad in {"name": (("no.such.weight", 3),) + fp[1:], "size": ((fp[0][0], fp[0][1] + 1),) + fp[1:]}.items():
        try:
            apply(DDP(fresh()), Strategy(bad, 2))
            res[f"mismatch_{label}"] = None
        except DagprofError as err:
            res[f"mismatch_{label}"] = str(err)
    res["numel_ok"] = all(math.prod(p.shape) == k for (n, k), p in zip(fp, fresh().parameters()))
    del ddp, plan
    gc.collect()  # DDP wrappers with Python comm hooks go while Python is alive, not in gloo's threads at exit
    dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
