"""``dagprof profile -o RUN [--steps 5:10] -- torchrun ... train.py``: profile an unmodified DDP job."""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess

from ..errors import DagprofError
from ..fsutil import check_output_folder
from ..traces.steps import iteration_us
from .common import steps_arg

HELP = "profile an unmodified PyTorch DDP job (torchrun or hand-started ranks) into a dagprof run folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="run folder to write (earlier dagprof files in it are replaced)")
    p.add_argument("--steps", type=steps_arg, default=range(5, 10), metavar="A:B",
                   help="optimizer steps to profile: A:B = steps A..B-1, A = step A alone (default 5:10)")
    p.add_argument("--no-kineto", action="store_true", help="hooks only: no torch.profiler trace (lowest overhead)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ...: the training command, e.g. torchrun ... train.py")


def run(args: argparse.Namespace) -> dict:
    from ..collect.autoprofile import ENV_KINETO, ENV_OUT, ENV_STEPS
    from ..traces.load import load
    from ..traces.run_schema import MANIFEST

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise DagprofError("no command to profile: put it after --, e.g. dagprof profile -o RUN -- torchrun --nproc-per-node 2 train.py")
    steps = args.steps
    out = os.path.abspath(args.out)
    check_output_folder(out)  # the ranks write into it as they go: checked, not staged
    os.makedirs(out, exist_ok=True)
    for old in _earlier_profile(out):
        shutil.rmtree(old) if os.path.isdir(old) else os.unlink(old)
    bootstrap = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "collect", "bootstrap")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([bootstrap] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_OUT] = out
    env[ENV_STEPS] = f"{steps.start}:{steps.stop}"
    env[ENV_KINETO] = "0" if args.no_kineto else "1"
    try:
        code = subprocess.call(cmd, env=env)
    except OSError as err:
        raise DagprofError(f"cannot start the command: {err.strerror or err}", cmd[0]) from None
    if not os.path.exists(os.path.join(out, MANIFEST)):
        raise DagprofError(
            f"the command exited with status {code} and no rank wrote a profile: the zero-code mode sees only models "
            "wrapped in torch.nn.parallel.DistributedDataParallel, fully_shard (FSDP2) or Horovod's DistributedOptimizer "
            "(else call dagprof.profile in the script)", out)
    if code != 0:
        try:
            load(out)
            kept = "every rank's profile is complete"
        except DagprofError as err:
            kept = err.problem  # which ranks and steps are missing
        raise DagprofError(f"the profiled command exited with status {code}; what its ranks wrote is in this folder: {kept}", out)
    run_ = load(out)  # a DDP, FSDP or Horovod run folder
    ranks = []
    for t in run_.ranks:
        # steps outside the window, for the profiler's overhead; steps 0 and 1 warm up (DDP rebuilds its buckets after step 0)
        base = [d for s, d in t.meta["unprofiled_step_times_us"].items() if s >= _WARMUP_STEPS]
        ranks.append({
            "rank": t.rank, "host": t.host, "steps": t.meta["steps_profiled"], "layers": len(t.layers),
            "buckets": len(t.buckets), "iteration_ms": iteration_us(t.step_spans()) / 1e3,
            "unprofiled_iteration_ms": iteration_us(base) / 1e3 if base else None,
        })
    return {"run": out, "exit_status": code, "world_size": run_.world_size, "ddp": run_.meta["ddp"],
            "fsdp": bool(run_.meta.get("fsdp")), "ranks": ranks, "warnings": run_.meta["warnings"]}


_WARMUP_STEPS = 2


def _earlier_profile(folder: str) -> list[str]:
    """dagprof's own files from an earlier run in ``folder`` (never anything else a user keeps there)."""
    from ..fsutil import open_input
    from ..traces.run_schema import MANIFEST, RANK_FORMAT, STEPS_HEAD

    ours = glob.glob(os.path.join(folder, MANIFEST)) + glob.glob(os.path.join(folder, "rank*.kineto.json.gz"))
    ours += [d for d in glob.glob(os.path.join(folder, "rank*.steps")) if os.path.exists(os.path.join(d, STEPS_HEAD))]
    for path in glob.glob(os.path.join(folder, "rank*.json")):
        with open_input(path) as f:  # a FIFO named rank0.json is refused, not waited on
            if f"\"{RANK_FORMAT}\"".encode() in f.read(64):
                ours.append(path)
    return ours


def to_text(result: dict) -> str:
    lines = [f"profiled run: {result['run']} (world size {result['world_size']}, command exit status {result['exit_status']})"]
    for r in result["ranks"]:
        base = f"{r['unprofiled_iteration_ms']:.1f} ms" if r["unprofiled_iteration_ms"] is not None else "-"
        lines.append(f"  rank {r['rank']} on {r['host']}: steps {r['steps'][0]}-{r['steps'][-1]}, {r['layers']} layers, "
                     f"{r['buckets']} buckets, iteration {r['iteration_ms']:.1f} ms (unprofiled steps from step {_WARMUP_STEPS} on: {base})")
    lines += [f"  warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)
