"""Run one fresh FSDP script (bench/fsdp_fresh) through every dagprof command a user would, and print one line each.

Profiles the script twice (zero-code: ``dagprof profile -- torchrun ...``), then on the first run: replay (and
``--template``), analyze, report, the FSDP what-ifs one by one, optimize, and diff of the two runs, each with ``--json``
too. A line says ok, "refused: <the one line>" (exit 2, as for what is not modelled) or FAILED (a traceback, or
``--json`` that is not one JSON object). ``--verify`` adds ``optimize --verify`` (two interleaved rounds: minutes).
``--changed=ARGS`` profiles a third run with those script arguments (one known change) and diffs it against the first;
``--offline`` reruns the commands on the runs kept in ``--keep``; ``--no-profile`` profiles nothing new.

    python bench/fsdp_fresh/chain.py gru_accum.py --ranks 2
    python bench/fsdp_fresh/chain.py hsdp_convnet.py --ranks 4
    python bench/fsdp_fresh/chain.py hsdp_transformer.py --ranks 4 --steps 12
    python bench/fsdp_fresh/chain.py fsdp1_encoder.py --ranks 2
    python bench/fsdp_fresh/chain.py intra_reshard.py --ranks 4 --steps 10
    python bench/fsdp_fresh/chain.py prefetch_offload.py --ranks 2 --steps 12
    python bench/fsdp_fresh/chain.py mae_pretrain.py --ranks 2 --changed "--encoder-reshard off"
    python bench/fsdp_fresh/chain.py hsdp_swin.py --ranks 4 --steps 16 --changed=--no-mp
    python bench/fsdp_fresh/chain.py fsdp1_perceiver.py --ranks 2 --changed "--min-params 1000000"
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WHATIFS = (["--bandwidth", "1Gbit,10Gbit"], ["--workers", "4"], ["--reshard-after-forward", "on,off"], ["--reduce-dtype", "bf16"],
           ["--units", "merge:2,merge:all"], ["--data-parallel", "ddp"], ["--compute-speed", "2"], ["--prefetch", "2"])


def dagprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dagprof.cli.main", *args], capture_output=True, text=True)


def check(label: str, args: list[str]) -> None:
    plain, js = dagprof(*args), dagprof(*args, "--json")
    try:
        json.loads(js.stdout)
        js_ok = True
    except ValueError:
        js_ok = False
    err = plain.stderr.strip().splitlines()
    if plain.returncode == 0 and js_ok:
        m = re.search(r"error ([+-][0-9.]+ %)", plain.stdout)
        print(f"ok       {label}" + (f"  (replay error {m.group(1)})" if m else ""))
    elif plain.returncode == 2 and len(err) == 1 and js_ok:
        print(f"refused  {label}: {err[0][:300]}")
    else:
        print(f"FAILED   {label}: exit {plain.returncode}, json {'ok' if js_ok else 'bad'}: {' | '.join(err[-3:])[:400]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("script", help="a script in bench/fsdp_fresh")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--keep", help="folder for the two runs (default: a temporary one)")
    p.add_argument("--changed", help="script arguments of a third run, diffed against the first (e.g. '--encoder-reshard off')")
    p.add_argument("--offline", action="store_true", help="the runs kept in --keep, not profiled again")
    args = p.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="fsdp_fresh_")
    cmd = ["torchrun", "--standalone", "--nproc-per-node", str(args.ranks), os.path.join(HERE, args.script), "--steps", str(args.steps)]
    runs = [os.path.join(root, name) for name in ("a", "b")]
    profiles = [(run, cmd) for run in runs] + ([(os.path.join(root, "changed"), cmd + args.changed.split())] if args.changed else [])
    for run, run_cmd in [] if args.offline else profiles:
        done = dagprof("profile", "-o", run, "--", *run_cmd)
        print(f"{'ok' if done.returncode == 0 else 'FAILED':8} profile {run}" + ("" if done.returncode == 0 else f": {done.stderr[-400:]}"))
    a = runs[0]
    check("replay", ["replay", a])
    check("replay --template", ["replay", a, "--template"])
    check("analyze", ["analyze", a])
    check("report", ["report", a])
    meshes = ",".join(f"{r}x{args.ranks // r}" for r in range(1, args.ranks) if args.ranks % r == 0)
    for w in (*WHATIFS, ["--mesh", meshes]):
        check("whatif " + " ".join(w), ["whatif", a, *w, "--allow-model-error"])
    check("optimize", ["optimize", a])
    check("diff", ["diff", a, runs[1]])
    if args.changed:
        check(f"diff (changed: {args.changed})", ["diff", a, os.path.join(root, "changed")])
    if args.verify:
        check("optimize --verify", ["optimize", a, "--rounds", "2", "--verify", "--", *cmd])
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
