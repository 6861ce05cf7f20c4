"""PowerSGD deployed with glibc keeping the hook's per-step buffers mapped (``apply.keep_freed_memory``) against another
dagprof checkout's deploy (``--against SRC``: the code before it), in interleaved rounds on the emulated cluster.

A kept strategy (``bench_optimize.py --keep``'s ``w*/lossy/strategy.json``) is applied to the job, one run with this
dagprof and one with ``SRC``'s, in alternating order per round; each run's step time is its ranks' median step
(``iteration_ms``, as ``--verify`` measures it). Prints both per round and their ratio (against / this: above 1, the
faults the kept buffers avoid were on the step's path):

    sudo PYTHONPATH=src .venv/bin/python bench/bench_powersgd_keep.py KEPT/w0-2 --against /work/main/src \\
        --cmd "/work/main/.venv/bin/python bench/ddp_heldout_embed.py --steps 16" [--rounds 4] [--link 200Mbit]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from dagprof.closeloop import hosts
from dagprof.collect.hooks.steptimes import iteration_ms, read_times
from dagprof.collect.jobs.launch import Bootstrap, launch
from dagprof.errors import DagprofError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cell", help="a kept cell (bench_optimize --keep's w*-N folder) with lossy/strategy.json")
    ap.add_argument("--against", required=True, help="another dagprof checkout's src folder, whose deploy the rounds compare with")
    ap.add_argument("--cmd", required=True, help="one rank's training command, as the cell ran it")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--link", default="200Mbit")
    ap.add_argument("--out", default=None, help="keep the runs here (default a temporary folder)")
    args = ap.parse_args()
    strategy = os.path.join(args.cell, "lossy", "strategy.json")
    if not os.path.exists(strategy):
        raise SystemExit(f"bench_powersgd_keep: {strategy}: no lossy strategy in this cell")
    ours = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["dagprof"].__file__)))
    work = args.out or tempfile.mkdtemp(prefix="psgdkeep")
    ms: dict[str, list[float]] = {"this": [], "against": []}
    with hosts(args.ranks, args.link, tag=f"dpk{os.getpid() % 10000}") as on:
        if on.refused:
            raise SystemExit(f"bench_powersgd_keep: {on.refused}")
        for k in range(args.rounds):
            for which in ("this", "against") if k % 2 == 0 else ("against", "this"):
                os.environ["PYTHONPATH"] = ours if which == "this" else args.against  # the job's bootstrap imports dagprof from here
                folder = os.path.join(work, f"round{k}-{which}")
                boot = Bootstrap(times=os.path.join(folder, "times"), strategy=strategy)
                try:
                    code = launch(args.cmd.split(), boot, ranks=args.ranks, cluster=on.cluster, log_dir=folder, timeout_s=600)
                except DagprofError as err:  # an abort at exit after every rank wrote its step times still measured the job
                    if len(os.listdir(boot.times)) != args.ranks if os.path.isdir(boot.times) else True:
                        raise
                    code = 0
                    print(f"round {k + 1} {which}: kept, a rank aborted after writing its step times ({err})", flush=True)
                if code:
                    raise SystemExit(f"bench_powersgd_keep: the job exited with status {code} (log {folder})")
                ms[which].append(iteration_ms(read_times(boot.times)))
            print(f"round {k + 1}: this {ms['this'][-1]:.1f} ms, against {ms['against'][-1]:.1f} ms per step, "
                  f"ratio {ms['against'][-1] / ms['this'][-1]:.3f} (load {os.getloadavg()[0]:.1f})", flush=True)
    ratios = [a / t for a, t in zip(ms["against"], ms["this"])]
    print(f"{args.cell}: strategy step with the kept buffers {statistics.median(ms['this']):.1f} ms, against "
          f"{statistics.median(ms['against']):.1f} ms; ratio per round {' '.join(f'{r:.3f}' for r in ratios)}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
