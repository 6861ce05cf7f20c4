"""Close the loop: run the real job with its defaults and with a strategy, in interleaved rounds.

Each round runs both configurations back to back (A B, then B A in the next round, so neither
always goes first), and compares them inside the round only: the machine's load drifts over
minutes, so a ratio of two runs seconds apart is far steadier than either time. The speed-up is
the median of the per-round ratios; the spread is their range.

The job runs under dagprof's bootstrap (``launch``; ``deploy.autoapply``): the strategy is applied to
every DDP model it builds, and each rank writes its step times. ``cmd`` is either a launcher command
(``torchrun ...``) run as it is, or, with ``ranks``, one rank's command that is started once per rank
(on loopback or in an emulated cluster).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Callable

from ...errors import DagprofError
from ..hooks.steptimes import iteration_ms, read_times
from .launch import Bootstrap, last_error_line, launch
from .netns import Cluster


@dataclass
class Verification:
    baseline_ms: list[float] = field(default_factory=list)  # per round
    strategy_ms: list[float] = field(default_factory=list)
    baseline_runs: list[str] = field(default_factory=list)  # per round: the profile of that run (when profiled)
    strategy_runs: list[str] = field(default_factory=list)

    @property
    def speedups(self) -> list[float]:
        return [b / s for b, s in zip(self.baseline_ms, self.strategy_ms)]

    @property
    def speedup(self) -> float:
        return statistics.median(self.speedups)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.speedups), max(self.speedups)

    def confirms(self, predicted_speedup: float) -> bool:
        """Every round measured a gain, and the median reaches half the predicted one."""
        return self.spread[0] > 1.0 and self.speedup - 1.0 >= (predicted_speedup - 1.0) / 2

    def to_dict(self) -> dict:
        return {"rounds": len(self.speedups), "baseline_ms": self.baseline_ms, "strategy_ms": self.strategy_ms,
                "speedup_per_round": self.speedups, "measured_speedup": self.speedup, "spread": list(self.spread),
                "measured_baseline_ms": statistics.median(self.baseline_ms), "measured_strategy_ms": statistics.median(self.strategy_ms)}


def verify(cmd: list[str], strategy: str, work_dir: str, rounds: int = 3, ranks: int | None = None, cluster: Cluster | None = None,
           say: Callable[[str], None] = lambda m: None, timeout_s: float = 1800.0, profile_from: int | None = 3) -> Verification:
    """Measure ``cmd`` with its defaults (A) and with ``strategy`` (B) in ``rounds`` interleaved rounds.

    ``profile_from``: both runs of every round are also profiled (hooks only, no Kineto: no measurable
    overhead, and the same for both) from this step on, so each round's prediction can start from its own
    profile of the defaults, and the strategy run's profile can be compared with its prediction.
    """
    if rounds < 1:
        raise DagprofError(f"--rounds must be at least 1, got {rounds}")
    if not cmd:
        raise DagprofError("--verify needs the training command after --, e.g. -- torchrun --nproc-per-node 2 train.py")
    out = Verification()
    for k in range(rounds):
        for which in (("A", "B") if k % 2 == 0 else ("B", "A")):
            folder = os.path.join(work_dir, f"round{k}-{which}")
            run = os.path.join(folder, "run") if profile_from is not None else None
            boot = Bootstrap(profile=run, steps=range(profile_from, 10**9) if run else None, kineto=False, times=os.path.join(folder, "times"),
                             strategy=strategy if which == "B" else None)
            _run(cmd, boot, folder, ranks, cluster, timeout_s)
            ms = iteration_ms(read_times(boot.times))
            (out.baseline_ms if which == "A" else out.strategy_ms).append(ms)
            if run is not None:
                (out.baseline_runs if which == "A" else out.strategy_runs).append(run)
            say(f"  round {k + 1}/{rounds} {'defaults' if which == 'A' else 'strategy'}: {ms:.1f} ms per step")
    return out


def verify_in_process(cmd: list[str], strategy: str, work_dir: str, rounds: int, ranks: int, cluster: Cluster | None = None,
                      say: Callable[[str], None] = lambda m: None, timeout_s: float = 1800.0) -> Verification:
    """The same rounds inside one job whose script alternates the two setups itself (``demo_train
    --alternate``: a fresh DDP wrapper per phase): no start-up between phases, so A and B run seconds
    apart and their ratio is steadier still. ``cmd`` is one rank's command."""
    if rounds < 1:
        raise DagprofError(f"--rounds must be at least 1, got {rounds}")
    argv = cmd + ["--strategy", os.path.abspath(strategy), "--alternate", str(rounds), "--times", work_dir]
    launch(argv, None, ranks=ranks, cluster=cluster, log_dir=os.path.join(work_dir, "logs"), timeout_s=timeout_s)
    out = Verification()
    for k in range(rounds):
        for which in ("A", "B"):
            folder = os.path.join(work_dir, f"round{k}-{which}")
            ms = iteration_ms(read_times(os.path.join(folder, "times")))
            (out.baseline_ms if which == "A" else out.strategy_ms).append(ms)
            (out.baseline_runs if which == "A" else out.strategy_runs).append(os.path.join(folder, "run"))
        say(f"  round {k + 1}/{rounds}: defaults {out.baseline_ms[-1]:.1f} ms, strategy {out.strategy_ms[-1]:.1f} ms per step")
    return out


def _run(cmd: list[str], boot: Bootstrap, folder: str, ranks: int | None, cluster: Cluster | None, timeout_s: float) -> None:
    code = launch(cmd, boot, ranks=ranks, cluster=cluster, log_dir=folder, timeout_s=timeout_s)
    if code != 0:
        log = os.path.join(folder, "job.log")
        with open(log) as f:
            raise DagprofError(f"the job exited with status {code}: {last_error_line(f.read())} (log {log})")
