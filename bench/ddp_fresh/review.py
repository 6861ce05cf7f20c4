"""Run the fresh DDP/FSDP2 user scripts of bench/ddp_fresh through dagprof as a reviewer would.

Each script is profiled twice with the zero-code command (``dagprof profile -- torchrun --standalone
--nproc-per-node 2 SCRIPT``), then goes through replay, replay --template, analyze, whatif (200 Mbit/s, 4 workers),
optimize, report and a diff of its two runs, each also with ``--json``. A line per command says ok, "refused: <the one
line>" (exit 2) or FAILED (a traceback, or ``--json`` that is not one JSON object); replay lines carry the replay error.

    python bench/ddp_fresh/review.py                          # every script (about 11 minutes on 2 cores)
    python bench/ddp_fresh/review.py --scripts gan,fp16_hook --keep /tmp/fresh
    python bench/ddp_fresh/review.py --keep /tmp/fresh --offline   # the runs kept there, not profiled again
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fsdp_chain", os.path.join(HERE, "..", "fsdp_fresh", "chain.py"))
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)

SCRIPTS = ("accum_amp", "unused_branch", "gan", "fp16_hook", "fsdp2_ckpt", "compiled_lm", "habits_loop")
COMMANDS = (("replay", []), ("replay --template", ["--template"]), ("analyze", []),
            ("whatif --bandwidth 200Mbit", ["--bandwidth", "200Mbit"]), ("whatif --workers 4", ["--workers", "4"]),
            ("optimize", ["--budget", "10"]), ("report", []))


def profile(script: str, run: str, steps: int) -> bool:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(HERE, f"{script}.py"), "--steps", str(steps)]
    done = chain.dagprof("profile", "-o", run, "--", *cmd)
    if done.returncode:
        last = done.stderr.strip().splitlines()[-1:] or [""]
        print(f"{'refused ' if done.returncode == 2 else 'FAILED  '} profile {script}: {last[0][:300]}")
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", default=",".join(SCRIPTS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--keep", help="folder for the runs (default: a temporary one)")
    p.add_argument("--offline", action="store_true", help="review the runs kept in --keep without profiling again")
    args = p.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="ddp_fresh_")
    for script in args.scripts.split(","):
        a, b = (os.path.join(root, f"{script}-{x}") for x in "ab")
        if not args.offline and not (profile(script, a, args.steps) and profile(script, b, args.steps)):
            continue
        print(f"== {script}")
        for label, extra in COMMANDS:
            chain.check(f"{script} {label}", [label.split()[0], a, *extra])
        chain.check(f"{script} diff", ["diff", a, b])
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
