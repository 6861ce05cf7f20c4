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
from .netns import Cluster, Dropped

ROUNDS = 3  # interleaved rounds a verification runs unless told (``dagprof optimize --rounds``)


@dataclass
class Verification:
    baseline_ms: list[float] = field(default_factory=list)  # per round
    strategy_ms: list[float] = field(default_factory=list)
    baseline_runs: list[str] = field(default_factory=list)  # per round: the profile of that run (when profiled)
    strategy_runs: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)  # per job on an emulated cluster: the packets its shaped ports dropped
    aborted_at_exit: int = 0  # jobs kept although a rank aborted after writing its step times (``_finished``)

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
                "measured_baseline_ms": statistics.median(self.baseline_ms), "measured_strategy_ms": statistics.median(self.strategy_ms),
                "dropped_packets": [d.to_dict() for d in self.dropped], "dropped_summary": self.dropped_summary(),
                "aborted_at_exit": self.aborted_at_exit}

    def dropped_summary(self) -> str | None:
        """The emulated link's lost packets over the jobs, one line (None off the emulated cluster): a warning with the
        count where any were lost, since dagprof models a lossless link."""
        if not self.dropped:
            return None
        unread = sum(d.total is None for d in self.dropped)
        if unread:
            return f"WARNING: the emulated link's drop counters could not be read for {unread} of {len(self.dropped)} jobs"
        total, lossy = sum(d.total for d in self.dropped), sum(d.total > 0 for d in self.dropped)
        if not total:
            return f"emulated link: no packets dropped in {len(self.dropped)} job{'s' if len(self.dropped) > 1 else ''}"
        return (f"WARNING: the emulated link dropped {total:,} packets in {lossy} of {len(self.dropped)} jobs (TCP retransmits them: "
                "a lossy link, which dagprof does not model)")


def verify(cmd: list[str], strategy: str, work_dir: str, rounds: int = ROUNDS, ranks: int | None = None, cluster: Cluster | None = None,
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
            try:
                dropped = _run(cmd, boot, folder, ranks, cluster, timeout_s)
            except DagprofError as err:
                if not _finished(boot.times, ranks, err):
                    raise
                dropped, out.aborted_at_exit = None, out.aborted_at_exit + 1
                say(f"  warning: round {k + 1}/{rounds} {'defaults' if which == 'A' else 'strategy'}: a rank aborted after "
                    f"training, its step times complete, kept ({err})")
            ms = iteration_ms(read_times(boot.times))
            (out.baseline_ms if which == "A" else out.strategy_ms).append(ms)
            if run is not None:
                (out.baseline_runs if which == "A" else out.strategy_runs).append(run)
            out.dropped += [dropped] if dropped is not None else []
            say(f"  round {k + 1}/{rounds} {'defaults' if which == 'A' else 'strategy'}: {ms:.1f} ms per step{_drops(dropped)}")
    return out


def verify_in_process(cmd: list[str], strategy: str, work_dir: str, rounds: int, ranks: int, cluster: Cluster | None = None,
                      say: Callable[[str], None] = lambda m: None, timeout_s: float = 1800.0) -> Verification:
    """The same rounds inside one job whose script alternates the two setups itself (``demo_train
    --alternate``: a fresh DDP wrapper per phase): no start-up between phases, so A and B run seconds
    apart and their ratio is steadier still. ``cmd`` is one rank's command."""
    if rounds < 1:
        raise DagprofError(f"--rounds must be at least 1, got {rounds}")
    argv = cmd + ["--strategy", os.path.abspath(strategy), "--alternate", str(rounds), "--times", work_dir]
    seen = len(cluster.dropped) if cluster is not None else 0
    launch(argv, None, ranks=ranks, cluster=cluster, log_dir=os.path.join(work_dir, "logs"), timeout_s=timeout_s)
    out = Verification(dropped=cluster.dropped[seen:] if cluster is not None else [])  # the one job, all phases together
    for k in range(rounds):
        for which in ("A", "B"):
            folder = os.path.join(work_dir, f"round{k}-{which}")
            ms = iteration_ms(read_times(os.path.join(folder, "times")))
            (out.baseline_ms if which == "A" else out.strategy_ms).append(ms)
            (out.baseline_runs if which == "A" else out.strategy_runs).append(os.path.join(folder, "run"))
        say(f"  round {k + 1}/{rounds}: defaults {out.baseline_ms[-1]:.1f} ms, strategy {out.strategy_ms[-1]:.1f} ms per step")
    if out.dropped:
        say(f"  the emulated link over the {rounds} rounds (one job){_drops(out.dropped[0])}")
    return out


def _drops(d: Dropped | None) -> str:
    """``, N packets dropped`` for a say line (nothing off the emulated cluster)."""
    if d is None:
        return ""
    return ", drop counters unreadable" if d.total is None else f", {d.total:,} packets dropped{' (a lossy link)' if d.total else ''}"


# torch's aborts at exit after training, each as the parts of its message that ``last_error_line`` keeps: gloo's threads
# outliving the interpreter (``hooks.exit_gc``; 1 in some dozens of jobs on the 2-core testbed), and a std::system_error
# "Resource deadlock avoided" (at exit of finished PyTorch gloo jobs, 2 of ~30 runs, 2026-12-03)
EXIT_ABORTS = (("terminate called without an active exception",),
               ("terminate called after throwing an instance of 'std::system_error'", "Resource deadlock avoided"))


def _finished(times: str | None, ranks: int | None, err: DagprofError) -> bool:
    """Whether a failed job had finished training: it aborted with one of torch's known exit-time aborts (``EXIT_ABORTS``)
    and every rank had written its step times (at exit, after its last step). Such a job measured what it should;
    anything else fails."""
    said = str(err)
    if not any(all(part in said for part in parts) for parts in EXIT_ABORTS) or times is None or ranks is None or not os.path.isdir(times):
        return False
    return sum(f.startswith("rank") and f.endswith(".json") for f in os.listdir(times)) == ranks


def _run(cmd: list[str], boot: Bootstrap, folder: str, ranks: int | None, cluster: Cluster | None, timeout_s: float) -> Dropped | None:
    """The job once; on ``cluster`` (with ``ranks``), the packets its ports dropped."""
    n = len(cluster.dropped) if cluster is not None else 0
    code = launch(cmd, boot, ranks=ranks, cluster=cluster, log_dir=folder, timeout_s=timeout_s)
    if code != 0:
        log = os.path.join(folder, "job.log")
        with open(log) as f:
            raise DagprofError(f"the job exited with status {code}: {last_error_line(f.read())} (log {log})")
    return cluster.dropped[-1] if cluster is not None and len(cluster.dropped) > n else None
