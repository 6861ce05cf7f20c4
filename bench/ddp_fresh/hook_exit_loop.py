"""A fresh DDP user script for reviewing dagprof: a learning-rate sweep that trains one trial after another in one
process, each trial a process group of its own, destroyed at the trial's end before its model goes.

Habits it exercises, as users write them:
- ``train(lr)`` sets up the group (a file store per trial), DDP, the hook and SGD, trains, calls
  ``dist.destroy_process_group()`` and returns: the model is freed at the return, DDP's reducer then the group's last
  holder (pytorch/pytorch#56297 where a gloo thread still needs the GIL as it goes; torch's hazard, without dagprof too);
- ``--hook fp16`` (``fp16_compress_hook``), ``--hook own`` (an all-reduce whose future a lambda unpacks) or none;
- ``--dagprof`` profiles steps 1-2 of every trial with ``dagprof.profile`` (the in-loop API, hooks only).
It prints each finished trial's number: a hang shows as the count stopping (``py-spy dump --native`` shows where).

    python bench/ddp_fresh/hook_exit_loop.py --hook fp16 --trials 150 --dagprof
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def own_hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def train(lr: float, hook: str, folder: str, profiled: bool) -> float:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    if hook != "none":
        model.register_comm_hook(None, fp16_compress_hook if hook == "fp16" else own_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if profiled:
        import dagprof

        profiling = dagprof.profile(f"{folder}/run", steps=(1, 3), model=model, kineto=False)
    else:
        profiling = contextlib.nullcontext()
    with profiling as prof:
        for _ in range(4):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            if prof is not None:
                prof.step()
    dist.destroy_process_group()
    return loss.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hook", choices=("none", "fp16", "own"), default="none")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--dagprof", action="store_true")
    args = ap.parse_args()
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as folder:
            train(0.1 / (1 + trial % 5), args.hook, folder, args.dagprof)
        print(trial + 1, flush=True)


if __name__ == "__main__":
    main()
