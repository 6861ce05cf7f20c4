"""``dagprof profile -o RUN [--steps 5:10] -- torchrun ... train.py``: profile an unmodified DDP, FSDP or Horovod job.

``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN -- python train.py``: an MXNet ``dist_sync`` job
whose script calls ``dagprof.collect.mxnet_ps.profile`` (scheduler, servers and workers started here)."""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess

from ..errors import DagprofError
from ..fsutil import check_output_folder
from ..graph.meta import WARMUP_STEPS
from ..traces.horovod import OWN_CALLS, own_calls
from ..traces.profiling_mark import INCOMPLETE, marked
from ..traces.rank_warnings import merge_rank_warnings
from ..traces.run_schema import REPLICATE_API
from ..traces.steps import DEFAULT_STEPS, iteration_us
from ..units import count
from .common import steps_arg

HELP = ("profile a training command into a dagprof run folder: PyTorch DDP, FSDP or HSDP (torchrun or hand-started ranks) "
        "and horovodrun unmodified; an MXNet dist_sync script that calls mxnet_ps.profile, with --mxnet-ps")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="run folder to write (earlier dagprof files in it are replaced)")
    p.add_argument("--steps", type=steps_arg, default=DEFAULT_STEPS, metavar="A:B",
                   help="optimizer steps to profile: A:B = steps A..B-1, A = step A alone "
                        f"(default {DEFAULT_STEPS.start}:{DEFAULT_STEPS.stop})")
    p.add_argument("--no-kineto", action="store_true", help="hooks only: no torch.profiler trace (lowest overhead)")
    p.add_argument("--mxnet-ps", type=_mxnet_ps_arg, metavar="servers=S,workers=W", default=None,
                   help="an MXNet dist_sync job: start the scheduler, S servers and W workers (each runs the command) on this host")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ...: the training command, e.g. torchrun ... train.py")


def run(args: argparse.Namespace) -> dict:
    from ..collect.jobs.launch import Bootstrap
    from ..traces.load import load
    from ..traces.run_schema import MANIFEST

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise DagprofError("no command to profile: put it after --, e.g. dagprof profile -o RUN -- torchrun --nproc-per-node 2 train.py",
                           args.out)
    steps = args.steps
    if args.mxnet_ps is not None:
        return _run_mxnet_ps(args, cmd)
    out = os.path.abspath(args.out)
    check_output_folder(out)  # the ranks write into it as they go: checked, not staged
    created = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    for old in _earlier_profile(out):
        shutil.rmtree(old) if os.path.isdir(old) else os.unlink(old)
    code = _launch_marked(out, created, cmd, Bootstrap(profile=out, steps=steps, kineto=not args.no_kineto))
    if not os.path.exists(os.path.join(out, MANIFEST)) and code != 0:  # a usage error, a crash: not a model dagprof missed
        raise DagprofError(f"the command exited with status {code} before any rank wrote a profile; its own output above says why", out)
    own = sorted(glob.glob(os.path.join(out, OWN_CALLS.format(rank="*"))))
    if not os.path.exists(os.path.join(out, MANIFEST)) and own:
        calls = own_calls(own[0])
        named = ", ".join(f"hvd.{n} {c} times" for n, c in sorted(calls.items(), key=lambda nc: -nc[1]))
        raise DagprofError(f"nothing was profiled: the script exchanges its gradients by its own Horovod calls ({named}, on "
                           f"{os.path.basename(own[0]).split('.')[1]}), and dagprof models Horovod's hvd.DistributedOptimizer only", out)
    if not os.path.exists(os.path.join(out, MANIFEST)):
        raise DagprofError(
            "the command ran and no rank wrote a profile: the zero-code mode sees only models wrapped in "
            "torch.nn.parallel.DistributedDataParallel, the composable replicate(), fully_shard (FSDP2), FullyShardedDataParallel "
            "(FSDP1) or Horovod's DistributedOptimizer (else call dagprof.profile in the script)", out)
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
        # steps outside the window, for the profiler's overhead, past the warm-up (as passes.profiler_cost counts them)
        base = [d for s, d in (t.meta.unprofiled_step_times_us or {}).items() if s >= WARMUP_STEPS]
        ranks.append({
            "rank": t.rank, "host": t.host, "steps": t.meta.steps_profiled, "layers": len(t.layers),
            "buckets": len(t.buckets), "iteration_ms": iteration_us(t.step_spans()) / 1e3,
            "unprofiled_iteration_ms": iteration_us(base) / 1e3 if base else None,
        })
    warnings, per_rank = merge_rank_warnings(run_.meta.warning_texts())
    return {"run": out, "exit_status": code, "world_size": run_.world_size, "ddp": run_.meta.ddp, "ddp_api": run_.ranks[0].meta.ddp_api,
            "fsdp": run_.meta.fsdp,
            "horovod": run_.meta.horovod is not None, "ranks": ranks, "warnings": warnings, "warnings_per_rank": per_rank}


def _launch_marked(out: str, created: bool, cmd: list[str], bootstrap) -> int:
    """``launch`` with ``profiling_mark``'s mark in ``out`` while the job runs (``marked``: left where a signal stopped
    it before the ranks wrote the manifest, or this process died without a word: SIGKILL, the out-of-memory killer). A
    folder this run created that holds nothing else is removed, as a failed command creates no empty folder."""
    from ..collect.jobs.launch import launch

    try:
        with marked(out, cmd):
            return launch(cmd, bootstrap)
    finally:
        if created and set(os.listdir(out)) <= {INCOMPLETE}:
            shutil.rmtree(out)


def _mxnet_ps_arg(text: str) -> dict[str, int]:
    try:
        got = {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected servers=S,workers=W, got {text!r}") from None
    if set(got) != {"servers", "workers"} or min(got.values()) < 1:
        raise argparse.ArgumentTypeError(f"expected servers=S,workers=W (both >= 1), got {text!r}")
    return got


def _run_mxnet_ps(args: argparse.Namespace, cmd: list[str]) -> dict:
    """Steps A:B are profiled as in a DDP run: the profiler starts before step A-1 (its start-up step)."""
    from ..collect.hooks.mxnet_ps import launch_command

    steps, job = args.steps, args.mxnet_ps
    if steps.start < 3:
        raise DagprofError(f"--steps {steps.start}:{steps.stop}: an MXNet job profiles from step 3 on (step 1 starts the kvstore, "
                           "the step before the window pays the profiler's start-up)")
    try:
        m = launch_command(args.out, cmd, servers=job["servers"], workers=job["workers"], warmup=steps.start - 2, profile_steps=len(steps))
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        raise DagprofError(str(err), args.out) from None
    except OSError as err:
        raise DagprofError(f"cannot start the command: {err.strerror or err}", cmd[0]) from None
    ranks = [{"rank": int(r), "steps": [a for a, _, _ in v if steps.start <= a < steps.stop],
              "iteration_ms": sorted((b - a) / 1e6 for s, a, b in v if steps.start <= s < steps.stop)[len(steps) // 2]}
             for r, v in m["steps"].items()]
    return {"run": os.path.abspath(args.out), "framework": "mxnet", "servers": m["num_servers"], "world_size": m["num_workers"],
            "keys": len(m["keys"]), "ranks": ranks}


def _earlier_profile(folder: str) -> list[str]:
    """dagprof's own files from an earlier run in ``folder`` (never anything else a user keeps there)."""
    from ..fsutil import open_input
    from ..traces.run_schema import MANIFEST, RANK_FORMAT, STEPS_HEAD

    ours = glob.glob(os.path.join(folder, MANIFEST)) + glob.glob(os.path.join(folder, "rank*.kineto.json.gz"))
    ours += glob.glob(os.path.join(folder, INCOMPLETE))  # a stopped profile's mark
    ours += glob.glob(os.path.join(folder, OWN_CALLS.format(rank="*")))
    ours += [d for d in glob.glob(os.path.join(folder, "rank*.steps")) if os.path.exists(os.path.join(d, STEPS_HEAD))]
    for path in glob.glob(os.path.join(folder, "rank*.json")):
        with open_input(path) as f:  # a FIFO named rank0.json is refused, not waited on
            if f"\"{RANK_FORMAT}\"".encode() in f.read(64):
                ours.append(path)
    return ours


def to_text(result: dict) -> str:
    if result.get("framework") == "mxnet":
        head = (f"profiled MXNet dist_sync run: {result['run']} ({count(result['servers'], 'server')}, "
                f"{count(result['world_size'], 'worker')}, {count(result['keys'], 'key')})")
        return "\n".join([head] + [f"  worker {r['rank']}: steps {r['steps'][0]}-{r['steps'][-1]}, median step {r['iteration_ms']:.1f} ms"
                                    for r in result["ranks"]])
    api = ", gradients by the composable replicate() (DDP's reducer)" if result.get("ddp_api") == REPLICATE_API else ""
    lines = [f"profiled run: {result['run']} (world size {result['world_size']}{api}, command exit status {result['exit_status']})"]
    # what a rank's gradient collectives are: DDP's buckets, Horovod's fused responses; FSDP's units are counted apart
    groups = "" if result.get("fsdp") else "fused all-reduce" if result.get("horovod") else "bucket"
    for r in result["ranks"]:
        base = f"{r['unprofiled_iteration_ms']:.1f} ms" if r["unprofiled_iteration_ms"] is not None else "-"
        grads = f"{count(r['buckets'], groups)}, " if groups else ""
        lines.append(f"  rank {r['rank']} on {r['host']}: steps {r['steps'][0]}-{r['steps'][-1]}, {count(r['layers'], 'layer')}, "
                     f"{grads}iteration {r['iteration_ms']:.1f} ms (unprofiled steps from step {WARMUP_STEPS} on: {base})")
    lines += [f"  warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)
