"""``bench/bench_pause_pace.py`` on a vendored verification round of the held-out embedding: each rank's wait for the wire
and the compute on either side of it, read from the profile's own steps."""
from __future__ import annotations

import os
import sys

from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from bench_pause_pace import between_runs, kept_runs, pause_points, within_runs  # noqa: E402

KEPT = os.path.join(DATA, "overlap-control")
ROUND = os.path.join(KEPT, "w0-2", "lossy", "verify", "round0")


def test_each_ranks_step_has_its_wait_and_the_compute_after_it_at_the_runs_own_pace():
    a, b = pause_points(os.path.join(ROUND + "-A", "run")), pause_points(os.path.join(ROUND + "-B", "run"))
    for pts in (a, b):
        assert {q.rank for q in pts} == {0, 1}
        assert all(q.update_ms > 0 and q.next_forward_ms > 0 and q.after > 0 and q.before > 0 for q in pts)
        # each op over its own median in the run: the paces straddle 1
        assert min(q.after for q in pts) <= 1.0 <= max(q.after for q in pts)
        assert min(q.before for q in pts) <= 1.0 <= max(q.before for q in pts)
    # the defaults wait for the whole gradient at 200 Mbit/s, PowerSGD for its small factors: every wait longer
    assert min(q.pause_ms for q in a) > 5 * max(q.pause_ms for q in b)


def test_the_tables_read_the_kept_folder_the_recordings_optimizer_ran_slower_after_the_long_wait():
    runs = kept_runs(KEPT)
    assert {r["side"] for r in runs} == {"lossy-A", "lossy-B"}  # the vendored cell has no searched profile
    assert {r["script"] for r in runs} == {"ddp_heldout_embed.py"}
    w = within_runs([r["points"] for r in runs if r["side"] == "lossy-A"])
    assert w is not None and w["runs"] == 1 and w["pause_p5_ms"] <= w["pause_p95_ms"]
    (a,) = (r["points"] for r in runs if r["side"] == "lossy-A")
    (b,) = (r["points"] for r in runs if r["side"] == "lossy-B")
    ab = between_runs([(a, b)])
    assert ab["rank_rounds"] == 2 and ab["pause_a_ms"] > ab["pause_b_ms"]
    # the recording's figures (docs/evidence.md, branch psgdpace): the defaults' Adam x1.14 the strategy's
    assert 1.05 < ab["update_a_over_b"] < 1.25
    assert within_runs([b[:3]]) is None  # too few points to fit
