"""``dagprof profile -o RUN [--steps 5:10] -- torchrun ... train.py``: profile an unmodified DDP job."""
from __future__ import annotations

import argparse
import glob
import os
import subprocess

from ..errors import DagprofError

HELP = "profile an unmodified PyTorch DDP job (torchrun or hand-started ranks) into a dagprof run folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", required=True, help="run folder to write (earlier dagprof files in it are replaced)")
    p.add_argument("--steps", default="5:10", help="optimizer steps to profile, FIRST:STOP (default 5:10)")
    p.add_argument("--no-kineto", action="store_true", help="hooks only: no torch.profiler trace (lowest overhead)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ...: the training command, e.g. torchrun ... train.py")


def run(args: argparse.Namespace) -> dict:
    from ..collect.autoprofile import ENV_KINETO, ENV_OUT, ENV_STEPS
    from ..collect.profile import parse_steps
    from ..traces.dagprof_run import MANIFEST
    from ..traces.load import load

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise DagprofError("no command to profile: put it after --, e.g. dagprof profile -o RUN -- torchrun --nproc-per-node 2 train.py")
    try:
        steps = parse_steps(args.steps)
    except ValueError as err:
        raise DagprofError(str(err), "--steps") from None
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    for old in _earlier_profile(out):
        os.unlink(old)
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
            "wrapped in torch.nn.parallel.DistributedDataParallel or Horovod's DistributedOptimizer (else call dagprof.profile in the script)", out)
    if code != 0:
        raise DagprofError(f"the profiled command exited with status {code}; what its ranks wrote is in this folder", out)
    run_ = load(out)  # a DDP or a Horovod run folder
    ranks = []
    for t in run_.ranks:
        times = sorted(t.meta["step_times_us"].values())
        base = sorted(t.meta["unprofiled_step_times_us"].values())
        ranks.append({
            "rank": t.rank, "host": t.host, "steps": t.meta["steps_profiled"], "layers": len(t.layers),
            "buckets": len(t.buckets), "median_step_ms": times[len(times) // 2] / 1e3 if times else None,
            "median_unprofiled_step_ms": base[len(base) // 2] / 1e3 if base else None,
        })
    return {"run": out, "exit_status": code, "world_size": run_.world_size, "ddp": run_.meta["ddp"],
            "ranks": ranks, "warnings": run_.meta["warnings"]}


def _earlier_profile(folder: str) -> list[str]:
    """dagprof's own files from an earlier run in ``folder`` (never anything else a user keeps there)."""
    from ..traces.dagprof_run import MANIFEST, RANK_FORMAT

    ours = glob.glob(os.path.join(folder, MANIFEST)) + glob.glob(os.path.join(folder, "rank*.kineto.json.gz"))
    for path in glob.glob(os.path.join(folder, "rank*.json")):
        with open(path, "rb") as f:
            if f"\"{RANK_FORMAT}\"".encode() in f.read(64):
                ours.append(path)
    return ours


def to_text(result: dict) -> str:
    lines = [f"profiled run: {result['run']} (world size {result['world_size']}, command exit status {result['exit_status']})"]
    for r in result["ranks"]:
        med = f"{r['median_step_ms']:.1f} ms" if r["median_step_ms"] is not None else "-"
        base = f"{r['median_unprofiled_step_ms']:.1f} ms" if r["median_unprofiled_step_ms"] is not None else "-"
        lines.append(f"  rank {r['rank']} on {r['host']}: steps {r['steps'][0]}-{r['steps'][-1]}, {r['layers']} layers, "
                     f"{r['buckets']} buckets, median step {med} (unprofiled steps: {base})")
    lines += [f"  warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)
