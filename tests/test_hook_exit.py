"""A script that frees its DDP model after ``destroy_process_group()`` exits under dagprof.

DDP's reducer is then the gloo group's last holder, and its destructor joins gloo's threads with the GIL held: a thread
that still needs the GIL to finish or free a comm hook's future callback (dagprof's hook chains one on every bucket)
deadlocks the process (pytorch/pytorch#56297; the suite hung so once; ``bench/ddp_fresh/hook_exit.py`` is the user's
script). dagprof holds every DDP model's group while the model lives (``collect.hooks.exit_gc``), and lets it go at the
end of the collection that frees the model, where the group's Python object lets the GIL go before it joins: the reducer
is never the group's last holder, and the group's threads and sockets last no longer than without dagprof.
"""
from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc, sys
import torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from dagprof import profile
from dagprof.collect.hooks import exit_gc

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=0, world_size=1)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
model.register_comm_hook(None, fp16_compress_hook)
group = id(model.process_group)
with profile(sys.argv[1] + "/run", steps=range(1, 3), model=model, kineto=False) as prof:
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        prof.step()
dist.destroy_process_group()
print("held" if [id(g) for _, g in exit_gc._held] == [group] else "not held", flush=True)
del model, prof
gc.collect()
print("let go" if not exit_gc._held else "still held", flush=True)
"""


def test_a_script_that_frees_ddp_after_destroying_its_group_exits_and_dagprof_held_the_group_until_the_model_went(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)  # a hang guard
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["held", "let go"] and (tmp_path / "run" / "rank0.json").exists()
