"""Attribution figures of ``dagprof diff`` on recorded pairs of real 2-rank gloo DDP runs (issue 13).

Pairs, each a baseline and the same job with one known change, recorded in interleaved rounds
(every round records every run once, so drifting machine load hits all of them):
- demo: the full demo model with DDP's default 25 MB buckets against the (lossless) strategy
  ``dagprof optimize`` finds on the first round's profile, applied with ``dagprof.apply``;
- slow layer: the tiny model, one layer's forward sleeping ``--slow-ms`` per step on every rank;
- straggler: the same sleep on rank 1 only;
- buckets: the tiny model with one 25 MB bucket instead of several;
- null: the baseline against itself recorded again (the noise floor of every figure).
Per pair and round: measured and replayed change, the parts, interaction, structure, what the replays
do not reproduce, and whether the largest part is where the change was made.

    python bench/bench_diff.py [--rounds 2] [--slow-ms 50] [--keep DIR] [--no-demo]
    python bench/bench_diff.py --from DIR      # the figures again, from runs recorded with --keep DIR
    python bench/bench_diff.py --fsdp          # offline: the FSDP and DDP-vs-FSDP pairs recorded under tests/data

``--fsdp``: pairs of real FSDP2 runs kept in ``tests/data`` (README there: how each was recorded), each differing in
known settings; a pair is right when ``diff`` names every one of them (and nothing else) in its notes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diff_workload import Variant, record  # noqa: E402

from dagprof.analysis.diff import ProfileDiff, diff_profiles  # noqa: E402
from dagprof.closeloop import defaults_stand, find_strategy  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.optimize import Options  # noqa: E402

LAYER = "layers.1.conv2"
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")
# (A, B, the settings changed between them: words each must appear in diff's notes)
FSDP_PAIRS = [
    ("fsdp/reshard", "fsdp/keep-bf16-prefetch", ("kept gathered after forward", "all-gather dtype", "prefetched")),
    ("fsdp/reshard4", "fsdp/keep4", ("kept gathered after forward", "prefetched")),
    ("fsdp/reshard4", "fsdp/pairs4", ("FSDP units differ", "prefetched")),
    ("fsdp/hsdp-2x3", "fsdp/hsdp-3x2", ("FSDP mesh differs",)),
    ("fsdp/hsdp", "fsdp/fsdp4", ("FSDP mesh differs",)),
    ("lora/fsdp-0", "lora/ddp-0", ("data parallelism differs",)),
    ("fsdp/reshard", "fsdp/ddp", ("data parallelism differs",)),
]
DEMO = dict(small=False, steps=16, profile_steps=(6, 14))


def where(d: ProfileDiff, pair: str) -> str:
    """Where the attribution puts the change, and whether that is where it was made."""
    att = d.attribution
    if not att.parts:
        return "no change"
    top = att.parts[0]
    layer = top.breakdown[0].label if top.breakdown else "-"
    rank = top.by_rank[0].label if top.by_rank else "-"
    found = f"{top.label} / {layer} / {rank}"
    if pair == "slow layer":
        return found + ("  OK" if top.label == "forward" and layer == LAYER else "  MISSED")
    if pair == "straggler":
        return found + ("  OK" if top.label == "forward" and layer == LAYER and rank == "rank 1" else "  MISSED")
    if pair in ("buckets", "demo"):
        ok = any("gradient buckets differ" in n for n in d.notes)
        return f"structure {att.structure_us / 1e3:+.2f} ms; largest timing part {found}" + ("  OK (buckets seen)" if ok else "  MISSED")
    return found


def fsdp_pairs() -> None:
    """Every recorded FSDP pair: the settings ``diff`` names against those the recordings changed."""
    print(f"{'A':<22}{'B':<26}{'meas ms':>9}{'repl ms':>9}{'unexpl%':>8}  settings named  (OK: every known change, nothing else)")
    right = 0
    for a, b, known in FSDP_PAIRS:
        d = diff_profiles(open_run(os.path.join(DATA, a)), open_run(os.path.join(DATA, b)))
        named = [n for n in d.notes if not n.startswith(("ops without a counterpart", "ranks differ"))]
        ok = all(any(k in n for n in named) for k in known) and len(named) == len(known)
        right += ok
        print(f"{a:<22}{b:<26}{d.measured_delta_us / 1e3:>+9.2f}{d.replayed_delta_us / 1e3:>+9.2f}{d.unexplained_pct:>8.1f}  "
              f"{'OK' if ok else 'MISSED'}")
        for n in named:
            print(f"{'':<4}{n}")
    print(f"{right} of {len(FSDP_PAIRS)} pairs: every known change named, nothing else")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--slow-ms", type=float, default=50.0)
    p.add_argument("--budget", type=float, default=10.0, help="seconds for the demo pair's strategy search (default 10)")
    p.add_argument("--keep", help="record the runs here (default: a temporary folder)")
    p.add_argument("--from", dest="recorded", help="re-analyse the runs an earlier --keep recorded there (no training)")
    p.add_argument("--no-demo", action="store_true", help="skip the full-size demo pair (about a minute per round)")
    p.add_argument("--fsdp", action="store_true", help="only the FSDP pairs recorded under tests/data (offline, no training)")
    args = p.parse_args()
    if args.fsdp:
        return fsdp_pairs()
    root = args.recorded or args.keep or tempfile.mkdtemp(prefix="dagprof-bench-diff-")
    if args.recorded:
        args.rounds = len([d for d in os.listdir(root) if d.startswith("r")])
        args.no_demo = not os.path.isdir(os.path.join(root, "r0", "demo_25_MB"))
    variants = {
        "base": Variant(), "slow": Variant(slow_layer=LAYER, slow_ms=args.slow_ms),
        "straggler": Variant(slow_layer=LAYER, slow_ms=args.slow_ms, slow_rank=1), "buckets": Variant(bucket_cap_mb=25.0),
        "base again": Variant(),
    }
    if not args.no_demo:
        variants = {"demo 25 MB": Variant(bucket_cap_mb=25.0, **DEMO), "demo searched": None, **variants}
    pairs = {"demo": ("demo 25 MB", "demo searched"), "slow layer": ("base", "slow"), "straggler": ("base", "straggler"),
             "buckets": ("base", "buckets"), "null": ("base", "base again")}
    if args.no_demo:
        pairs.pop("demo")
    print(f"runs in {root}; machine shared with other jobs: figures are one recording each, compare across rounds")
    head = (f"{'pair':<11}{'rnd':>4}{'meas ms':>9}{'repl ms':>9}{'parts ms':>9}{'inter':>8}{'struct':>8}{'resid':>8}{'unexpl%':>8}"
            "  where (top part / layer or bucket / rank)")
    rows: dict[str, list[ProfileDiff]] = {k: [] for k in pairs}
    demo_strategy = None
    for rnd in range(args.rounds):
        runs = {}
        for name, v in variants.items():
            folder = os.path.join(root, f"r{rnd}", name.replace(" ", "_"))
            if args.recorded:
                runs[name] = open_run(folder)
                continue
            if v is None:  # the searched strategy (lossless), from the first round's 25 MB profile
                if demo_strategy is None:
                    found = find_strategy(runs["demo 25 MB"].run.source, Options(budget_s=args.budget), os.path.join(root, "strategy"))
                    if found.path is None:
                        raise SystemExit(f"demo: {defaults_stand(found.search)}: no searched layout to compare")
                    demo_strategy = found.path
                    print(f"demo: the search picks {found.search.strategy().summary()}; B applies it")
                v = Variant(strategy=demo_strategy, **DEMO)
            runs[name] = open_run(record(v, folder))
        if rnd == 0:
            print(head)
        for pair, (a, b) in pairs.items():
            d = diff_profiles(runs[a], runs[b])
            rows[pair].append(d)
            att = d.attribution
            print(f"{pair:<11}{rnd:>4}{d.measured_delta_us / 1e3:>+9.2f}{att.delta_us / 1e3:>+9.2f}"
                  f"{sum(x.delta_us for x in att.parts) / 1e3:>+9.2f}{att.interaction_us / 1e3:>+8.2f}{att.structure_us / 1e3:>+8.2f}"
                  f"{d.replay_residual_us / 1e3:>+8.2f}{d.unexplained_pct:>8.1f}  {where(d, pair)}")
            for part in att.parts[:3]:
                print(f"{'':<15}{part.label:<20}{part.delta_us / 1e3:>+9.2f} ms"
                      + (f"   {part.breakdown[0].label} {part.breakdown[0].delta_us / 1e3:+.2f}" if part.breakdown else ""))
    print("\nmedians over rounds (ms per iteration; unexplained = |interaction| + |replay residual| in % of the longer iteration)")
    for pair, ds in rows.items():
        med = lambda f: statistics.median(f(d) for d in ds)  # noqa: E731
        print(f"{pair:<11} measured {med(lambda d: d.measured_delta_us) / 1e3:+8.2f}  replayed {med(lambda d: d.replayed_delta_us) / 1e3:+8.2f}  "
              f"top part {med(lambda d: d.attribution.parts[0].delta_us if d.attribution.parts else 0.0) / 1e3:+8.2f}  "
              f"structure {med(lambda d: d.attribution.structure_us) / 1e3:+7.2f}  unexplained {med(lambda d: d.unexplained_pct):5.1f} %  "
              f"(spread of measured change {min(d.measured_delta_us for d in ds) / 1e3:+.2f} .. {max(d.measured_delta_us for d in ds) / 1e3:+.2f})")


if __name__ == "__main__":
    main()
