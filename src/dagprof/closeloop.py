"""The optimisation loop on a real job: search a profile, write the strategy, measure it against the defaults.

Used by ``dagprof optimize``, ``dagprof demo`` and bench/bench_optimize.py, so all three search,
predict and judge the same way. Sits on top (like ``pipeline``): it opens runs and launches jobs.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Callable

from .collect.netns import Cluster
from .collect.strategy import Strategy, save_strategy
from .collect.verify import Verification, verify, verify_in_process
from .pipeline import Profiled, open_run
from .search.optimize import Options, SearchResult, predict_run, search_run

STRATEGY_FILE = "strategy.json"
CODEC_COSTS_FILE = "codec-costs.json"


@dataclass
class Found:
    profile: Profiled
    search: SearchResult
    strategy: Strategy
    path: str


def find_strategy(run: str, opts: Options, out_dir: str, steps: range | None = None, step_marker: str | None = None) -> Found:
    """Search ``run`` and write ``out_dir/strategy.json``."""
    os.makedirs(out_dir, exist_ok=True)
    prof = open_run(run, steps=steps, step_marker=step_marker)
    res = search_run(prof.run, prof.graph, opts, os.path.join(out_dir, CODEC_COSTS_FILE))
    strategy = res.strategy()
    return Found(prof, res, strategy, save_strategy(strategy, os.path.join(out_dir, STRATEGY_FILE)))


@dataclass
class Checked:
    verification: Verification
    predicted: float  # from the profile the strategy was found on
    predicted_per_round: list[float]  # from each round's own profile of the defaults

    @property
    def errors_pct(self) -> list[float]:
        """Per round: predicted speed-up (from that round's profile) against the measured one."""
        return [100.0 * (p - m) / m for p, m in zip(self.predicted_per_round, self.verification.speedups)]

    @property
    def confirmed(self) -> bool:
        return self.verification.confirms(self.predicted)

    def to_dict(self) -> dict:
        v = self.verification
        per = self.predicted_per_round
        return v.to_dict() | {
            "predicted_speedup": self.predicted,
            "prediction_error_pct": 100.0 * (self.predicted - v.speedup) / v.speedup,
            "predicted_speedup_per_round": per,
            "prediction_error_per_round_pct": self.errors_pct,
            "median_prediction_error_per_round_pct": statistics.median(self.errors_pct) if per else None,
            "confirmed": self.confirmed,
            # ``dagprof diff`` hook: each strategy run's profile beside the strategy's prediction says which categories departed
            "strategy_runs": v.strategy_runs,
            "baseline_runs": v.baseline_runs,
        }


def check_strategy(cmd: list[str], found: Found, out_dir: str, rounds: int = 3, ranks: int | None = None, cluster: Cluster | None = None,
                   say: Callable[[str], None] = lambda m: None, in_process: bool = False) -> Checked:
    """Run ``cmd`` with its defaults and with ``found``'s strategy in interleaved rounds, each run profiled
    (hooks only); every round's defaults profile predicts that round's speed-up too, so the model is judged
    against the load the machine had in that round. ``in_process``: ``cmd`` alternates the setups itself
    (``demo_train --alternate``)."""
    work = os.path.join(out_dir, "verify")
    if in_process:
        v = verify_in_process(cmd, found.path, work, rounds, ranks or 1, cluster, say)
    else:
        v = verify(cmd, found.path, work, rounds, ranks, cluster, say)
    per_round = []
    for run_dir in v.baseline_runs:
        p = open_run(run_dir)
        base, strat = predict_run(p.run, p.graph, found.strategy, os.path.join(out_dir, CODEC_COSTS_FILE), found.profile.run)
        per_round.append(base / strat)
    return Checked(v, found.search.speedup, per_round)
