"""bench_optimize's pace per round: each run's compute over the searched profile's, and the speed-up read off the rounds at
the profile's pace (the line of log speed-up on log pace), what the optimizer's figure stands for."""
from __future__ import annotations

import os
import sys

import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from bench_optimize import Pace, at_profile_pace, compute_ms  # noqa: E402

from dagprof.pipeline import open_run  # noqa: E402


def test_the_line_through_the_rounds_at_the_profiles_pace():
    """Rounds on an exact power law (a step all compute slows the speed-up by the pace's -1 power, here -0.8) give its
    speed-up at pace 1 and its slope, whichever rounds ran slow or fast."""
    paces = [0.9, 1.0, 1.1, 1.25, 1.4]
    value, slope = at_profile_pace(paces, [5.0 * p ** -0.8 for p in paces])
    assert value == pytest.approx(5.0) and slope == pytest.approx(-0.8)
    value, _ = at_profile_pace([1.1, 1.2, 1.3, 1.4], [5.0 * p ** -1.0 for p in (1.1, 1.2, 1.3, 1.4)])
    assert value == pytest.approx(5.0)  # read off a line that never ran at the profile's pace


def test_no_line_from_too_few_rounds_or_one_pace():
    assert at_profile_pace([0.9, 1.0, 1.2], [5.0, 4.8, 4.2]) == (None, None)
    assert at_profile_pace([1.0, 1.01, 1.02, 1.0], [5.0, 4.0, 4.5, 4.2]) == (None, None)


def test_pace_of_a_recorded_round():
    """A recorded PowerSGD round (tests/data/powersgd-2bucket): the defaults' run against itself is pace 1; the strategy
    run's is its forward and optimizer over the defaults', positive; one round gives no line."""
    defaults, strategy = str(DATA / "powersgd-2bucket" / "defaults"), str(DATA / "powersgd-2bucket" / "strategy-run")
    ref = compute_ms(open_run(defaults).graph)
    pace = Pace.of(ref, [defaults], [strategy], [3.0])
    assert pace.defaults == [pytest.approx(1.0)]
    assert pace.strategy[0] == pytest.approx(compute_ms(open_run(strategy).graph) / ref) and pace.strategy[0] > 0
    assert pace.at_profile_pace is None and pace.slope is None
    assert "the searched profile's" in pace.line() and set(pace.to_dict()) == {"defaults_pace_per_round", "strategy_pace_per_round",
                                                                               "measured_at_profile_pace", "pace_slope"}
