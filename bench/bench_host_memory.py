"""FSDP2 peak memory per rank with the autograd graph's host memory (issue 16): predicted from one profile, against each
step's peak measured by the script's own ``--memory`` (``bench/heap_peak.py``), on fresh user scripts (needs torch).

    python bench/bench_host_memory.py [--jobs ssm,t5,vit] [--steps 8] [--keep DIR | --offline DIR]

Per job: ``dagprof profile --no-kineto`` once, then the same command with ``--memory``; the prediction is
``search.fsdp_memory.fsdp_peak``'s fullest rank with the autograd graph's host memory (the nodes the profile counted per
layer at ``search.memory.AUTOGRAD_NODE_BYTES``, measured by ``bench/autograd_host_memory.py``), and without it (before).
The reference counts the tensors alive as a step starts plus the heap's rise within it, so where a script keeps its loss
into the next step (a loop variable: the SSM), the step before's graph shells are in the level it starts from: it
measures every moment less them (``AutogradHost.previous``), and the error is taken against the prediction less them.
Scripts whose loss goes with the step (T5's ``train_step`` returns ``loss.detach()``, the ViT's ``loss.item()``) have none.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOBS = {  # name -> (ranks, script and arguments)
    "ssm": (4, ["bench/fsdp_fresh/ssm_reshard.py"]),
    "t5": (4, ["bench/tp_fresh/t5_dp_tp.py", "--layers", "2"]),
    "vit": (2, ["bench/fsdp_fresh/vit_patches.py"]),
    "tower": (4, ["bench/fsdp_fresh/intra_reshard.py", "--reshard", "false"]),
    "unet": (2, ["bench/fsdp_fresh/unet_dcp.py"]),
}
WARMUP = 3


def torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--keep", metavar="DIR", help="keep the profiles and peaks here")
    ap.add_argument("--offline", metavar="DIR", help="predict again from what --keep kept in DIR; runs no job")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    from dagprof.pipeline import open_run
    from dagprof.search.fsdp_memory import fsdp_peak
    from dagprof.search.memory import autograd_host
    from dagprof.traces.run_schema import PREVIOUS_GRAPH

    tmp = args.offline or args.keep or tempfile.mkdtemp(prefix="dagprof-hostmem-")
    print(f"{'job':5s} {'nodes':>6s} {'kept':>6s} {'measured MiB':>13s} {'predicted':>10s} {'less kept':>10s} {'error':>8s} "
          f"{'before':>8s} {'error':>8s}  predicted at")
    for name in args.jobs.split(","):
        ranks, script = JOBS[name]
        script = [*script, "--steps", str(args.steps)]
        run, mem = os.path.join(tmp, name), os.path.join(tmp, f"{name}-mem")
        profile = [sys.executable, "-m", "dagprof.cli.main", "profile", "-o", run, "--no-kineto", "--steps", f"{WARMUP}:{args.steps - 1}", "--"]
        for cmd in [] if args.offline else [[*profile, *torchrun(ranks), *script], [*torchrun(ranks), *script, "--memory", mem]]:
            subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        measured = max(p for r in range(ranks) for p in json.load(open(f"{mem}.{r}"))["step_peak_bytes"][WARMUP:])
        g = open_run(run).graph
        worst, kept = max(fsdp_peak(g).values(), key=lambda m: m.total), autograd_host(g).previous
        nodes = g.meta.layer_autograd_nodes
        g.meta = replace(g.meta, layer_autograd_nodes={})
        before = max(m.total for m in fsdp_peak(g).values())
        seen = worst.total - kept
        mib = lambda b: b / 2**20  # noqa: E731
        print(f"{name:5s} {sum(n for k, n in nodes.items() if k != PREVIOUS_GRAPH):6d} {nodes.get(PREVIOUS_GRAPH, 0):6d} "
              f"{mib(measured):13.2f} {mib(worst.total):10.2f} {mib(seen):10.2f} {100 * (seen - measured) / measured:+7.1f}% "
              f"{mib(before):8.2f} {100 * (before - measured) / measured:+7.1f}%  {worst.at}", flush=True)


if __name__ == "__main__":
    main()
