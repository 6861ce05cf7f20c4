"""FSDP2 peak memory per rank with the autograd graph's host memory (issue 16): predicted from one profile, against each
step's peak measured by the script's own ``--memory`` (``bench/heap_peak.py``), on fresh user scripts (needs torch).

    python bench/bench_host_memory.py [--jobs ssm,t5,vit] [--steps 8] [--keep DIR]

Per job: ``dagprof profile --no-kineto`` once, then the same command with ``--memory``; the prediction is
``search.fsdp_memory.fsdp_peak``'s fullest rank, printed with and without the autograd graph's host memory (the nodes the
profile counted per layer at ``search.memory.AUTOGRAD_NODE_BYTES``, measured by ``bench/autograd_host_memory.py``). The
reference counts the tensors alive as a step starts plus the heap's rise within it, so where a script keeps its loss into
the next step (a loop variable: the SSM), the previous step's graph shells are in the level it starts from and freed
within the step: it cannot see them, and ``without shells`` is what it can. Scripts whose loss goes with the step (T5's
``train_step`` returns ``loss.detach()``; the ViT's returns ``loss.item()``) show the whole of it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOBS = {  # name -> (ranks, script and arguments, keeps its loss into the next step)
    "ssm": (4, ["bench/fsdp_fresh/ssm_reshard.py"], True),
    "t5": (4, ["bench/tp_fresh/t5_dp_tp.py", "--layers", "2"], False),
    "vit": (2, ["bench/fsdp_fresh/vit_patches.py"], False),
}
WARMUP = 3


def torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--keep", metavar="DIR", help="keep the profiles and peaks here")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    from dagprof.pipeline import open_run
    from dagprof.search.fsdp_memory import fsdp_peak

    tmp = args.keep or tempfile.mkdtemp(prefix="dagprof-hostmem-")
    print(f"{'job':5s} {'nodes':>6s} {'measured MiB':>13s} {'predicted':>10s} {'error':>8s} {'without shells':>15s} {'error':>8s} "
          f"{'no host memory':>15s} {'error':>8s}  predicted at")
    for name in args.jobs.split(","):
        ranks, script, keeps_loss = JOBS[name]
        script = [*script, "--steps", str(args.steps)]
        run, mem = os.path.join(tmp, name), os.path.join(tmp, f"{name}-mem")
        subprocess.run([sys.executable, "-m", "dagprof.cli.main", "profile", "-o", run, "--no-kineto", "--steps", f"{WARMUP}:{args.steps - 1}",
                        "--", *torchrun(ranks), *script], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*torchrun(ranks), *script, "--memory", mem], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        measured = max(p for r in range(ranks) for p in json.load(open(f"{mem}.{r}"))["step_peak_bytes"][WARMUP:])
        g = open_run(run).graph
        worst = max(fsdp_peak(g).values(), key=lambda m: m.total)
        nodes = sum(g.meta.layer_autograd_nodes.values())
        bare = dict(g.meta.layer_autograd_nodes)
        g.meta.layer_autograd_nodes = {}
        none = max(fsdp_peak(g).values(), key=lambda m: m.total).total
        g.meta.layer_autograd_nodes = bare
        cells = [(worst.total, "")]
        cells.append((worst.total - worst.autograd, "*" if keeps_loss else ""))
        cells.append((none, ""))
        row = " ".join(f"{v / 2**20:{w}.2f}{m} {100 * (v - measured) / measured:+7.1f}%" for (v, m), w in zip(cells, (10, 14, 15)))
        print(f"{name:5s} {nodes:6d} {measured / 2**20:13.2f} {row}  {worst.at}", flush=True)
    print("* the reference's own view: its level at the step's start holds the previous step's shells (module docstring)")


if __name__ == "__main__":
    main()
