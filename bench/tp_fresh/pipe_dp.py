"""A fresh pipeline x data-parallel job with ``torch.distributed.pipelining``, for reviewing dagprof's mesh labels (issue 16).

4 ranks, ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))``: pipeline pairs {0,1},{2,3} (stage =
rank % 2), data-parallel groups {0,2},{1,3}. The model (4 Linear+ReLU blocks and a head) is cut in two by hand, each
half a ``PipelineStage`` (shapes inferred by an exchange in the first step) sharded over its ``dp`` group by FSDP2
(``fully_shard(..., reshard_after_forward=False)``, as torchtitan does under PP: DDP's reducer asserts under a
schedule on torch 2.13); the schedule (``--schedule 1f1b`` or ``gpipe``, ``--micro`` micro-batches) sends activations
and gradients with ``batch_isend_irecv`` and turns gradient sync off on all but the last micro-batch, so the stage's
reduce-scatter follows its last backward.

    dagprof profile -o runs/pipe -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/pipe_dp.py
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/pipe_dp.py --schedule gpipe --trace traces/pipe_dp
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

WIDTH, BATCH, CLASSES = 128, 32, 10


def half(first: bool) -> nn.Sequential:
    """Stage 0: two blocks; stage 1: two blocks and the head (both halves of one model, seeded alike)."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(4)]
    head = nn.Linear(WIDTH, CLASSES)
    return nn.Sequential(*blocks[:2]) if first else nn.Sequential(*blocks[2:], head)


def main() -> None:
    args = parse(__doc__, micro=(int, 4), schedule=(str, "1f1b"))
    init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    stage_index = mesh["pp"].get_local_rank()
    module = fully_shard(half(stage_index == 0), mesh=mesh["dp"], reshard_after_forward=False)
    stage = PipelineStage(module, stage_index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    loss_fn = lambda out, target: F.cross_entropy(out, target)  # noqa: E731 - the schedule takes a callable
    schedule = (Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe)(stage, n_microbatches=args.micro, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(10 + mesh["dp"].get_local_rank())
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, CLASSES, (BATCH,))

    def step() -> None:
        opt.zero_grad()
        if stage_index == 0:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
        opt.step()

    loop(args, step)


if __name__ == "__main__":
    main()
