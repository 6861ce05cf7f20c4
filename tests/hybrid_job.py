"""A real 2-D data-parallel x tensor-parallel job on 4 CPU ranks (gloo), traced by stock torch.profiler.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: ranks {0,1} and {2,3} are tensor-parallel
groups, {0,2} and {1,3} data-parallel ones. A transformer-like MLP block (Linear -> GELU -> Linear, twice)
is split by DTensor (``ColwiseParallel`` / ``RowwiseParallel``), so each block all-reduces its activations
in the forward pass and their gradients in the backward pass over the TP group; DDP over the DP sub-mesh
all-reduces the gradients. With gloo the trace holds no ``record_param_comms`` group records, so what
tells the dimensions apart is where each collective sits and its size (``dagprof.traces.parallelism``).

``--tp-only``: the same model on 2 ranks, tensor parallel only (a 1-D mesh over the default group, no DDP),
as an old Megatron TP trace is: one group spanning the job, nothing but position and size to tell.

Re-record the fixtures in tests/data (3 profiled steps, one trace per rank, gzipped)::

    python tests/hybrid_job.py --fixtures tests/data/hybrid-dp-tp
    python tests/hybrid_job.py --fixtures tests/data/hybrid-tp-only --tp-only

Or profiled by dagprof (DDP hooks over the DP sub-mesh; the TP collectives stay inside the ops that issue them)::

    dagprof profile -o RUN --steps 2:5 -- torchrun --standalone --nproc-per-node 4 tests/hybrid_job.py --torchrun
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile

from gloo_kineto import gzip_traces  # beside this script

WORLD = 4
WIDTH = 64
ITERATIONS = 6  # profiler: wait 1, warmup 1, active 3


def _train(rank: int, world: int, out: str | None, port: int | None, tp_only: bool) -> None:
    """``out`` None: no torch.profiler (``dagprof profile`` profiles it); ``port`` None: started by torchrun."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (1 if tp_only else 2, world if tp_only else world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)) for _ in range(2)],
                          nn.Linear(WIDTH, 8))
    plan = {}
    for b in range(2):
        plan[f"{b}.0"] = ColwiseParallel()
        plan[f"{b}.2"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    ddp = model if tp_only else DDP(model, device_mesh=mesh["dp"])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(1 + mesh["dp"].get_local_rank())  # each DP replica its own batch; the TP pair the same
    x, y = torch.randn(32, WIDTH), torch.randint(0, 8, (32,))
    prof = None if out is None else torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(out, worker_name=f"rank-{rank}"))
    if prof is not None:
        prof.start()
    for _ in range(ITERATIONS):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(folder: str, tp_only: bool = False) -> None:
    """One real run into ``folder`` (rank-N...json); a second try on a fresh port when the first fails."""
    for _attempt in range(2):
        for f in glob.glob(os.path.join(folder, "*.json")):
            os.remove(f)
        cmd = [sys.executable, __file__, folder, str(_free_port())] + (["--tp-only"] if tp_only else [])
        done = subprocess.run(cmd, timeout=600, capture_output=True, text=True)
        if done.returncode == 0:
            return
    raise RuntimeError(f"recording the DP x TP job failed twice; last output:\n{(done.stdout + done.stderr)[-3000:]}")


def write_fixtures(out: str, tp_only: bool = False) -> None:
    """The traces, gzipped, into ``out`` (replacing what was there)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    with tempfile.TemporaryDirectory() as tmp:
        record(tmp, tp_only)
        gzip_traces(tmp, out)


if __name__ == "__main__":
    tp_only = "--tp-only" in sys.argv
    if sys.argv[1] == "--torchrun":  # dagprof profile -o RUN -- torchrun --nproc-per-node 4 tests/hybrid_job.py --torchrun
        _train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, None, tp_only)
    elif sys.argv[1] == "--fixtures":
        write_fixtures(sys.argv[2], tp_only)
    else:
        import torch.multiprocessing as mp

        world = 2 if tp_only else WORLD
        mp.spawn(_train, args=(world, sys.argv[1], int(sys.argv[2]), tp_only), nprocs=world)
