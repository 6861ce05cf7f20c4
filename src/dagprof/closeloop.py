"""The optimisation loop on a real job: search a profile, write the strategy, measure it against the defaults.

Used by ``dagprof optimize``, ``dagprof demo`` and bench/bench_optimize.py, so all three search,
predict and judge the same way. Sits on top (like ``pipeline``): it opens runs and launches jobs.
"""
from __future__ import annotations

import os
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .analysis import job_iteration_us
from .analysis.diff import ExpectationCheck, categories_vs_expected
from .analysis.findings import remedy_for
from .analysis.interval import PredictionInterval, StepStatistic, measured_step_us, run_level
from .collect.deploy.strategy import Strategy, save_strategy
from .collect.jobs.netns import BUFFER_BYTES, Cluster, available
from .collect.jobs.verify import ROUNDS, Verification, verify, verify_in_process
from .costmodel import parse_bandwidth
from .errors import DagprofError
from .passes.buckets import refuse_own_ddp_setup
from .passes.comm import current_topology, set_topology
from .passes.profiler_cost import correct_profiler_cost, measure_profiler_cost
from .pipeline import Profiled, open_run
from .search import scenario
from .search.fsdp_optimize import FsdpSearchResult, plan_change, predict_fsdp, search_fsdp
from .search.measured import rank_load_note
from .search.optimize import WORTH_APPLYING_PCT, Options, SearchResult, predict_run, search_run
from .search.shared_cores import add_bounds
from .search.whatif import MODEL_TOLERANCE_PCT

STRATEGY_FILE = "strategy.json"
CODEC_COSTS_FILE = "codec-costs.json"
DEPARTS_PCT = 5.0  # a speed-up prediction further off than this is explained category by category (issue 10's accuracy goal)


@dataclass
class Found:
    profile: Profiled
    search: SearchResult | FsdpSearchResult
    strategy: Strategy
    path: str | None  # None: nothing is predicted to gain enough to apply (``defaults_stand`` says so)
    link_model: str | None = None  # the calibrate file the search priced the compute slowdown by, where the run measured none
    profiled_bandwidth: str | None = None  # the wire the searched profile ran on, where named: each verification round's too


def find_strategy(run: str, opts: Options, out_dir: str, steps: range | None = None, step_marker: str | None = None,
                  allow_missing_ranks: bool = False, raw: bool = False, kept_dir: str | None = None) -> Found:
    """Search ``run``; write ``out_dir/strategy.json`` only when the search says it is worth applying.

    ``kept_dir``: the folder an earlier run left its outputs in (``dagprof optimize``'s ``-o``, where ``out_dir`` stages this
    run's): its ``codec-costs.json`` is read where it fits this machine and model (``search.measured.codec_costs``).

    Unless ``raw``, the search starts from op times with the profiler's own cost removed (``passes.profiler_cost``),
    as the strategy will run unprofiled; a note says what was done, or why nothing was. Where the wall steps cannot show
    it (a wire-bound DDP step), the compute is brought to the training threads' CPU pace after the window where that fell
    (``passes.profiler_cost.correct_profiler_cost``'s ``pace_after_window``, which ``whatif`` leaves off, saying so): a
    strategy that takes the wire away runs at that pace. The intervals are widened
    by the level the search's model stands on (``analysis.interval.run_level``), then, on a one-host loopback profile, take
    the ``shared_cores`` bounds the search found (``SearchResult.shared_cores``). ``opts.profiled_bandwidth`` names the wire it ran
    on (a tc-shaped link, as ``whatif --profiled-bandwidth``): the link is read against it, the correction's model's too, and
    no bounds are taken.
    """
    prof = open_run(run, steps=steps, step_marker=step_marker, allow_missing_ranks=allow_missing_ranks)
    if prof.graph.meta.framework is not None:  # its knobs are not DDP's buckets or FSDP's resharding
        raise DagprofError(f"dagprof optimize searches PyTorch DDP and FSDP jobs (what dagprof.apply changes); this is a "
                           f"{prof.graph.meta.framework} run: "
                           f"{remedy_for(prof.graph)}", run)
    # search.scenario's Cluster (the settings a replay prices), not the netns testbed's Cluster imported above
    g = scenario.profiled_at(prof.graph, scenario.Cluster(profiled_bandwidth=opts.profiled_bandwidth))
    cost = measure_profiler_cost(prof.graph)
    share, said = 0.0, "op times as profiled (--raw)"
    if not raw:  # the one correction whatif and the testbed bench make too; only the search takes the pace after the window
        fix = correct_profiler_cost(g, cost, job_iteration_us, model=set_topology(g, current_topology(g)), pace_after_window=True)
        g, share, said = fix.graph, fix.share, fix.describe(prof.graph, cost)
    if g.meta.fsdp is not None:
        if opts.accumulate > 1:
            raise DagprofError("this profile is an FSDP job; --accumulate is not searched for FSDP (it changes the effective batch)", run)
        res = search_fsdp(g, opts.budget_s, opts.allow_lossy, opts.memory_budget, run)
    else:
        refuse_own_ddp_setup(g, "the search")
        res = search_run(prof.run, g, opts, os.path.join(out_dir, CODEC_COSTS_FILE), kept_dir and os.path.join(kept_dir, CODEC_COSTS_FILE))
    res.notes.append(said)
    if note := rank_load_note(prof.run):
        res.notes.append(note)
    measured, statistic = measured_step_us(prof.graph, res.step_statistic)
    check_baseline(res, measured, share, statistic)
    level = run_level(prof.graph, cost, not raw and cost.usable, res.baseline.iter_us, measured and measured * (1.0 - share))
    # the search's own model, checked above; each interval's level by its graph's compute (``RunLevel.for_compute``)
    profiled_share = res.intervals["baseline"].compute_share if res.intervals else 0.0
    res.intervals = res.intervals and {name: iv.widened(level.for_compute(iv.compute_share, profiled_share)) for name, iv in res.intervals.items()}
    if isinstance(res, SearchResult) and res.intervals:  # bounds, added after the level's spreads (as whatif adds them)
        res.intervals = {name: add_bounds(iv, res.shared_cores[name]) if name in res.shared_cores else iv for name, iv in res.intervals.items()}
    strategy = res.strategy()
    path = save_strategy(strategy, os.path.join(out_dir, STRATEGY_FILE)) if res.worth_applying else None
    return Found(prof, res, strategy, path, opts.link_model, opts.profiled_bandwidth)


BASELINE_WARNING = "the search's model gives the profiled setup"  # how check_baseline's warning begins (the demo says it in its own line)


def check_baseline(res: SearchResult | FsdpSearchResult, measured_us: float | None, share: float, statistic: StepStatistic) -> None:
    """Set the search model's error on the profiled setup, and warn when it is beyond what ``whatif`` accepts.

    The search prices candidates on its own template of a step (``search.evaluate``), not on the graph the
    what-ifs replay, so it can miss the profiled run where ``whatif``'s model does not. A gain is a ratio of
    two prices from the same template and keeps part of its meaning, so this warns rather than refuses.
    ``measured_us`` is the profiled run's ``statistic`` step, the one the search sums its replayed
    steps by (``res.step_statistic``; ``analysis.interval.measured_step_us``): a median step held against the mean one
    read a neighbour's stalled steps as model error (-19.8 % on ``tests/data/hybrid-dp-tp-dagprof``, +1.2 % alike).
    """
    if not measured_us:
        return
    ref = measured_us * (1.0 - share)  # the job without the profiler, as the search's op times are (unless --raw)
    res.model_error_pct = err = 100.0 * (res.baseline.iter_us - ref) / ref
    if abs(err) > MODEL_TOLERANCE_PCT:
        res.warnings.append(f"{BASELINE_WARNING} {res.baseline.iter_us / 1e3:.1f} ms/step, measured "
                            f"{ref / 1e3:.1f} ms{' less the profiler' if share else ''} ({statistic.value} step both; {err:+.1f} %, "
                            f"more than {MODEL_TOLERANCE_PCT:g} %): the predicted times inherit that error; measure the strategy before "
                            "trusting its gain (--verify)")


def defaults_stand(res: SearchResult | FsdpSearchResult, ddp: str = "DDP") -> str:
    """The one line said instead of writing a strategy that is not predicted to gain beyond noise; ``ddp``: how the job's
    DDP is named (``GraphMeta.ddp_label``)."""
    what = ("the job's FSDP settings stand" if isinstance(res, FsdpSearchResult) else "DDP's defaults stand" if ddp == "DDP"
            else f"the defaults of {ddp} stand")
    line = (f"{what}: no strategy is predicted to gain the {WORTH_APPLYING_PCT:g} % that run-to-run noise can explain "
            f"(best found {res.best.iter_us / 1e3:.2f} ms per step against {res.baseline.iter_us / 1e3:.2f} ms profiled); no strategy file written")
    # a unit grouping is wrap time, never in a strategy file: said beside, or "settings stand" under a -6.4 % grouping line
    # read as contradicting it (bench/fsdp_fresh/hsdp_pointnet2.py's --units merge:3)
    gr = res.grouping if isinstance(res, FsdpSearchResult) else None
    if gr is not None:
        gain = 100.0 * (res.baseline.iter_us - gr.iter_us) / res.baseline.iter_us
        line = line.replace(f"{what}: no strategy", "no setting a strategy file holds") + (
            f"; the unit grouping is predicted to (--units {gr.spec}, {-gain:+.1f} %), made where the model is wrapped: {gr.wrap(res.api)}")
    return line


@dataclass
class Hosts:
    """Where a job's ranks run: an emulated cluster, or this host's loopback (``refused`` says why)."""

    cluster: Cluster | None
    refused: str | None  # why the ranks are not on an emulated cluster (None: they are)
    where: str  # in words, for reports


@contextmanager
def hosts(ranks: int, link: str | None, tag: str | None = None, buffer_bytes: int = BUFFER_BYTES) -> Iterator[Hosts]:
    """As root, ``ranks`` hosts in network namespaces joined by a ``link`` (e.g. "200Mbit": each rank's egress
    shaped by ``tc tbf``, a queue of ``buffer_bytes``: ``Cluster.buffer_bytes``), removed on exit; without a link, or where
    namespaces cannot be made, the ranks on this host's loopback, with the reason. ``tag`` names the namespaces."""
    why = available() if link else "no link asked for"
    if why is not None:
        yield Hosts(None, why, "loopback")
        return
    rate = parse_bandwidth(link) * 8
    with Cluster(ranks, buffer_bytes=buffer_bytes) if tag is None else Cluster(ranks, tag=tag, buffer_bytes=buffer_bytes) as cluster:
        cluster.set_rate(rate)
        yield Hosts(cluster, None, f"an emulated {ranks}-host cluster, {link} link (network namespaces, tc tbf)")


@dataclass
class Checked:
    verification: Verification
    predicted: float  # from the profile the strategy was found on
    predicted_per_round: list[float]  # from each round's own profile of the defaults
    # per round: the strategy run's profile against the graph predicted for it (None where it could not be compared)
    expectations: list[ExpectationCheck | None] = field(default_factory=list)
    expectation_errors: list[str] = field(default_factory=list)  # why a round could not be compared
    interval: PredictionInterval | None = None  # the strategy's step time predicted from the searched profile
    change: str | None = None  # an FSDP plan: what it changes in the searched profile's graph (``plan_change``)
    rank_load: str | None = None  # the searched profile's ranks waited for a core far apart (``measured.rank_load_note``)

    @property
    def errors_pct(self) -> list[float]:
        """Per round: predicted speed-up (from that round's profile) against the measured one."""
        return [100.0 * (p - m) / m for p, m in zip(self.predicted_per_round, self.verification.speedups)]

    @property
    def confirmed(self) -> bool:
        return self.verification.confirms(self.predicted)

    @property
    def departs(self) -> bool:
        """The median round's prediction missed the measured speed-up by more than ``DEPARTS_PCT``."""
        return bool(self.errors_pct) and abs(statistics.median(self.errors_pct)) > DEPARTS_PCT

    def where_it_departs(self) -> list[str]:
        """Plain lines: which categories of the strategy run differed from the model's expectation, in the
        round whose prediction error is the median one (the typical round, not the luckiest or the worst)."""
        rounds = [k for k, e in enumerate(self.expectations) if e is not None]
        if not rounds:
            return [f"no round's strategy profile could be compared with its prediction: {'; '.join(self.expectation_errors)}"]
        k = sorted(rounds, key=lambda i: self.errors_pct[i])[len(rounds) // 2]
        return [f"round {k + 1}, strategy run: " + self.expectations[k].lines()[0], *self.expectations[k].lines()[1:]]

    def _interval(self) -> dict:
        """The strategy's predicted step time with its interval, and whether the measured median step fell inside it."""
        if self.interval is None:
            return {}
        measured_us = statistics.median(self.verification.strategy_ms) * 1e3
        return {"predicted_strategy": self.interval.to_dict(), "strategy_inside_interval": self.interval.contains(measured_us)}

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
            "prediction_departs": self.departs,
            **self._interval(),
            "categories_vs_expected_per_round": [_brief(e) for e in self.expectations],
            "predicted_change": self.change,
            "searched_profile_rank_load": self.rank_load,
            "where_it_departs": self.where_it_departs() if self.departs else [],
            # ``dagprof diff`` hook: each strategy run's profile beside the strategy's prediction says which categories departed
            "strategy_runs": v.strategy_runs,
            "baseline_runs": v.baseline_runs,
        }


def check_strategy(cmd: list[str], found: Found, out_dir: str, rounds: int = ROUNDS, ranks: int | None = None, cluster: Cluster | None = None,
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
    out = Checked(v, found.search.speedup, [], interval=(found.search.intervals or {}).get("best"), rank_load=rank_load_note(found.profile.run))
    if found.strategy.fsdp is not None:
        res = found.search
        out.change = (f"{plan_change(found.profile.graph, found.strategy)}; predicted {res.baseline.iter_us / 1e3:.1f} -> "
                      f"{res.best.iter_us / 1e3:.1f} ms per step")
    for base_dir, strat_dir in zip(v.baseline_runs, v.strategy_runs):
        p = open_run(base_dir)
        if found.strategy.fsdp is not None:
            prediction, predicted = predict_fsdp(p.graph, found.strategy)
        else:
            pred = predict_run(p.run, p.graph, found.strategy, os.path.join(out_dir, CODEC_COSTS_FILE), found.profile.run, found.link_model,
                               found.profiled_bandwidth)
            prediction, predicted = pred.prediction, pred.graph
        out.predicted_per_round.append(prediction.speedup)
        try:
            out.expectations.append(categories_vs_expected(predicted, open_run(strat_dir)))
        except DagprofError as err:
            out.expectations.append(None)
            out.expectation_errors.append(str(err))
    return out


def _brief(e: ExpectationCheck | None) -> dict | None:
    """The check without its full diff (``dagprof diff`` of the two folders gives that)."""
    return None if e is None else {k: v for k, v in e.to_dict().items() if k != "diff"}
