"""``bench/psgd_handoff.py`` on a vendored profile of DDP's defaults (``tests/data/powersgd-2bucket/defaults``: the cnn's
round, 2 ranks, 5 profiled steps): the wake of DDP's finalize after its last bucket's completion, one per rank and step."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from psgd_handoff import gloo_waits, handoffs_us  # noqa: E402

RUN = os.path.join(DATA, "powersgd-2bucket", "defaults")


def test_one_handoff_a_rank_and_step_where_the_finalize_waited():
    got = handoffs_us(RUN)
    assert len(got) == 10 and min(got) > 0
    # the fixed recording's figures: 1.62-4.61 ms, mean 2.39 (DDP's copy of the bucket into the gradients included)
    assert np.mean(got) == pytest.approx(2390.9, abs=0.5) and max(got) < 4700


def test_a_profile_without_thread_records_says_nan():
    assert all(np.isnan(x) for x in gloo_waits(RUN))
