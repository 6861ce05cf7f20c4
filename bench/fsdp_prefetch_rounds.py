"""Does FSDP2's prefetch depth change a step on CPU/gloo? Interleaved rounds on the namespace testbed (root).

A user-style FSDP2 script that takes ``--prefetch K`` (each block ``set_modules_to_forward_prefetch`` the next K blocks
and ``set_modules_to_backward_prefetch`` the K before; 0: FSDP2's implicit prefetch) and ``--times FILE`` (rank 0's step
times, s) runs unprofiled at every depth and link rate, each round in a shuffled order (as ``bench_fsdp.py --part 12``
runs its cells: ``collect.jobs.netns.Cluster``, one job per cell and round). The table: per link, each depth's median
over rounds of the job's median step after warm-up (rank 0), the rounds' spread (min-max), and its change against depth 0.

    sudo .venv/bin/python bench/fsdp_prefetch_rounds.py [--script bench/fsdp_fresh/conformer_prefetch.py] [--rounds 3] \
        [--depths 0,1,2] [--links 1Gbit,200Mbit] [--steps 16] --keep DIR     # rounds add to DIR's
    .venv/bin/python bench/fsdp_prefetch_rounds.py --offline DIR

Measured 2026-12-06 06:56-07:00 (one exclusive hold, 3 rounds, --steps 16, load 0.9-2.2 as rounds ended; docs/evidence.md,
branch fsdpprefetch): at 200 Mbit/s depth 0 / 1 / 2 1090.0 / 1092.5 / 1097.7 ms (+0.2 / +0.7 %, each cell's rounds spread
3.2-3.6 %); at 1 Gbit/s 304.3 / 363.3 / 309.7 ms (+19.4 / +1.8 %, spread 14-23 %; in the quietest round 304.3 / 297.8 /
309.7). No change beyond the rounds' spread: on CPU every prefetch all-gather blocks the thread that issues it.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fsdp import HERE, RATES, WARMUP  # noqa: E402

SCRIPT = os.path.join(HERE, "fsdp_fresh", "conformer_prefetch.py")


def cell_dir(link: str, depth: int) -> str:
    return f"{link}-prefetch{depth}"


def rounds(keep: str, n: int, script: str, depths: list[int], links: list[str], steps: int, extra: list[str]) -> None:
    """``n`` more rounds into ``keep``, each cell's job once per round in a shuffled order."""
    from dagprof.collect.jobs.netns import Cluster, available, run_ranks

    if why := available():
        raise SystemExit(f"the testbed is not available: {why}")
    os.makedirs(keep, exist_ok=True)
    first = sum(1 for e in os.listdir(keep) if e.startswith("round"))
    t0 = time.perf_counter()
    with Cluster(2) as cluster:
        print(f"rounds {first + 1}-{first + n} into {keep}, load {os.getloadavg()[0]:.2f}", flush=True)
        for k in range(first, first + n):
            order = [(link, d) for link in links for d in depths]
            random.Random(k).shuffle(order)
            for link, d in order:
                out = os.path.join(keep, f"round{k}", cell_dir(link, d))
                os.makedirs(out)
                cluster.set_rate(RATES[link])
                argv = [sys.executable, script, "--prefetch", str(d), "--steps", str(steps), "--times", os.path.join(out, "times.json"), *extra]
                run_ranks(argv, 2, out, cluster=cluster)
            print(f"  round {k + 1}: {len(order)} jobs ({time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.2f})", flush=True)


def median_step_ms(folder: str) -> float:
    """The job's median step after warm-up (rank 0's ``times.json``, s), ms; a file that is not its list of step times
    refused in one line naming it."""
    path = os.path.join(folder, "times.json")
    try:
        with open(path) as f:
            return statistics.median(json.load(f)[WARMUP:]) * 1e3
    except (OSError, ValueError, TypeError, KeyError, statistics.StatisticsError) as e:
        raise SystemExit(f"fsdp_prefetch_rounds: {path}: not a job's step times past {WARMUP} of warm-up ({type(e).__name__}: {e})") from None


def table(keep: str) -> dict[str, dict[int, list[float]]]:
    """{link: {depth: [each round's median step, ms]}} of every kept round, printed."""
    got: dict[str, dict[int, list[float]]] = {}
    for r in sorted(e for e in os.listdir(keep) if e.startswith("round")):
        for cell in sorted(os.listdir(os.path.join(keep, r))):
            link, _, depth = cell.partition("-prefetch")
            if os.path.exists(os.path.join(keep, r, cell, "times.json")):
                got.setdefault(link, {}).setdefault(int(depth), []).append(median_step_ms(os.path.join(keep, r, cell)))
    for link, by_depth in got.items():
        base = statistics.median(by_depth.get(0, [float("nan")]))
        print(f"{link}:")
        for d in sorted(by_depth):
            ms = by_depth[d]
            m = statistics.median(ms)
            print(f"  prefetch {d}: median {m:7.1f} ms over {len(ms)} rounds (rounds {min(ms):.1f}-{max(ms):.1f}, spread "
                  f"{(max(ms) - min(ms)) / m * 100:.1f} %), {(m / base - 1) * 100:+.1f} % against depth 0; "
                  f"rounds: {', '.join(f'{x:.1f}' for x in ms)}")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", default=SCRIPT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depths", default="0,1,2")
    ap.add_argument("--links", default="1Gbit,200Mbit", help=f"comma-separated, of {', '.join(RATES)}")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--keep", metavar="DIR", help="the rounds' folder (rounds add to it)")
    ap.add_argument("--offline", metavar="DIR", help="the table again from DIR's rounds")
    ap.add_argument("script_args", nargs="*", help="after --: more arguments for the script")
    args = ap.parse_args()
    if args.offline:
        if not os.path.isdir(args.offline):
            raise SystemExit(f"fsdp_prefetch_rounds: {args.offline}: no such folder of kept rounds")
        if not table(args.offline):
            raise SystemExit(f"fsdp_prefetch_rounds: {args.offline}: no kept rounds (roundK/LINK-prefetchD/times.json)")
        return
    if not args.keep:
        ap.error("--keep DIR is needed (the rounds stay there for --offline)")
    links = args.links.split(",")
    if bad := [x for x in links if x not in RATES]:
        ap.error(f"--links: unknown {bad[0]!r}, expected some of {', '.join(RATES)}")
    rounds(args.keep, args.rounds, args.script, [int(d) for d in args.depths.split(",")], links, args.steps, args.script_args)
    table(args.keep)


if __name__ == "__main__":
    main()
