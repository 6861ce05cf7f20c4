"""Where the FSDP collector's CPU goes: thread CPU inside each kind of dagprof hook, per profiled step and rank.

Runs part 12's held-out tied-embedding LM (``fsdp_train.py`` with ``fsdp_whatif_table.FRESH``; ``--fsdp-args`` for
another) on 2 ranks over loopback with ``--dagprof`` and no Kineto, a window of ``--window`` steps, each rank with the
collector's hook bodies wrapped: ``time.thread_time_ns`` around each, exclusive of the hooks nested in it (a timed hook
that calls another counts only its own part). The wrapped FSDP methods' own work (FSDP's, the collectives) is outside
every timer. Each timer costs about two 1 us clock reads, about half of them inside what it times: a figure reads about
1 us a call high. Not a timing to compare across runs (the machine's load moves thread CPU), but where the hooks' CPU
goes, and before/after a change in one ``dp-shared`` session; ``PYTHONPATH`` picks the tree measured.

    PYTHONPATH=src .venv/bin/python bench/fsdp_hook_cpu.py [--window 4:34] [--steps 40] [--fsdp-args "..."] [--keep DIR]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
HOOKS = {  # module (in dagprof.collect.hooks) -> class -> methods timed
    "collector": {"Collector": ("_fwd_pre", "_fwd_post", "_on_grad", "_grad_arrived", "_grad_ready", "_backward_done", "_finalize_done",
                                "_mark", "_begin_step", "_end_step", "_write_step_part", "update_begin", "update_end",
                                "_begin_window", "_end_window", "close", "attach")},
    "saved_activations": {"SavedActivations": ("_pack", "enter", "leave", "_count_nodes", "gathered", "unit_enter", "unit_leave",
                                                "forward_begins", "forward_ends", "backward_starting", "pause", "resume")},
    "fsdp": {"FsdpRecorder": ("_guarded", "_before_step", "_record", "_unit", "_unshard", "_span")},
}
ONCE = ("Collector._begin_window", "Collector._end_window", "Collector.close", "Collector.attach")  # once a window, not a step


def _instrument(ns: collections.Counter, calls: collections.Counter) -> None:
    """Wrap every method of ``HOOKS`` with an exclusive thread-CPU timer adding into ``ns`` and ``calls``."""
    import importlib

    stack: list[str] = []

    def timed(cls: type, name: str) -> None:
        fn, label = cls.__dict__[name], f"{cls.__name__}.{name}"

        def run(*args, **kwargs):
            t = time.thread_time_ns()
            if stack:
                ns[stack[-1]] += t
            stack.append(label)
            ns[label] -= t
            try:
                return fn(*args, **kwargs)
            finally:
                t = time.thread_time_ns()
                ns[label] += t
                calls[label] += 1
                stack.pop()
                if stack:
                    ns[stack[-1]] -= t
        setattr(cls, name, run)

    for module, classes in HOOKS.items():
        mod = importlib.import_module(f"dagprof.collect.hooks.{module}")
        for cls, names in classes.items():
            for name in names:
                timed(getattr(mod, cls), name)


def rank_main(out: str, argv: list[str]) -> None:
    """One rank: the training script ``argv`` with the hooks timed; ``out``.rank<R>.json gets the sums."""
    import atexit

    ns: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    _instrument(ns, calls)

    def dump() -> None:
        with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
            json.dump({"ns": ns, "calls": calls}, f)

    atexit.register(dump)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", default="4:34", help="profiled steps START:STOP")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fsdp-args", help="fsdp_train.py's model arguments (default: part 12's tied LM)")
    p.add_argument("--keep", metavar="DIR", help="keep the profile and the sums in DIR")
    p.add_argument("--rank-run", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_run:
        rank_main(args.rank_run[0], args.rank_run[1:])
        return
    sys.path.insert(0, BENCH)
    from fsdp_whatif_table import FRESH

    from dagprof.collect.jobs.netns import run_ranks

    out = args.keep or tempfile.mkdtemp(prefix="dagprof-hookcpu-")
    os.makedirs(out, exist_ok=True)
    start, stop = (int(x) for x in args.window.split(":"))
    model = args.fsdp_args.split() if args.fsdp_args else list(FRESH)
    argv = [sys.executable, os.path.abspath(__file__), "--rank-run", os.path.join(out, "hooks"), os.path.join(BENCH, "fsdp_train.py"),
            *model, "--steps", str(args.steps), "--no-kineto", "--dagprof", os.path.join(out, "run"), "--profile-steps", args.window]
    run_ranks(argv, 2, os.path.join(out, "log"), env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    steps = stop - start
    print(f"fsdp_train.py {' '.join(model)}: thread CPU inside dagprof's hooks, {steps} profiled steps (ms a step; once: ms a window)")
    for r in (0, 1):
        with open(os.path.join(out, f"hooks.rank{r}.json")) as f:
            d = json.load(f)
        per_step = {k: v for k, v in d["ns"].items() if k not in ONCE}
        print(f"rank {r}: {sum(per_step.values()) / steps / 1e6:.2f} ms a step in {sum(d['calls'][k] for k in per_step) / steps:.0f} "
              f"calls; the window's begin, end, close and attach {sum(d['ns'].get(k, 0) for k in ONCE) / 1e6:.1f} ms once")
        for k, v in sorted(d["ns"].items(), key=lambda kv: -kv[1]):
            n = d["calls"][k]
            each = "once" if k in ONCE else f"{v / steps / 1e6:7.3f} ms {n / steps:6.1f} calls"
            print(f"   {each:>26s} {v / max(n, 1) / 1e3:9.2f} us/call  {k}")


if __name__ == "__main__":
    main()
