"""``bench/psgd_opdiff.py`` on a vendored verification round of the held-out embedding: the strategy run's compute over
the defaults' by part, and the defaults' own same-shape ops timed with a collective in flight and with none."""
from __future__ import annotations

import os
import sys

from testdata import DATA

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from psgd_opdiff import ALONE, BESIDE, PARTS, cell_table, contention, ops, part_of, parts  # noqa: E402

from dagprof.traces.events import Kind  # noqa: E402

CELL = os.path.join(DATA, "overlap-control", "w0-2")
ROUND = os.path.join(CELL, "lossy", "verify", "round0")


def test_the_parts_split_every_compute_op_once_by_the_defaults_in_flight_share():
    assert part_of(int(Kind.FORWARD), "embed forward", 1.0) == "fwd"
    assert part_of(int(Kind.UPDATE), "optimizer.step", 0.0) == "opt"
    assert part_of(int(Kind.BACKWARD), "mlp.0 backward", BESIDE + 0.01) == "bwd beside"
    assert part_of(int(Kind.BACKWARD), "mlp.0 backward", ALONE - 0.01) == "bwd alone"
    assert part_of(int(Kind.BACKWARD), "mlp.0 backward", (BESIDE + ALONE) / 2) is None  # partly beside: in neither
    assert part_of(int(Kind.OTHER), "other:forward", 0.0) == "gaps"
    a, _, _ = ops(os.path.join(ROUND + "-A", "run"))
    b, _, _ = ops(os.path.join(ROUND + "-B", "run"))
    p = parts(a, b)
    assert set(p) == set(PARTS)
    common = a.keys() & b.keys()
    assert abs(p["all"][0] - sum(a[k][0] for k in common)) < 1e-6 and abs(p["all"][1] - sum(b[k][0] for k in common)) < 1e-6
    assert sum(p[q][0] for q in PARTS if q != "all") <= p["all"][0] + 1e-6
    assert all(x > 0 and y > 0 for q, (x, y) in p.items() if q != "bwd beside" or x)


def test_contention_pairs_the_same_op_in_flight_and_alone_in_the_defaults_profile():
    assert contention({"mlp.0 backward": [(200.0, 0.9), (100.0, 0.0), (300.0, 0.8), (110.0, 0.05)]}) == [250.0 / 105.0]
    assert contention({"mlp.0 backward": [(200.0, 0.9), (100.0, 0.3)]}) == []  # nothing wholly alone: no pair
    _, same, _ = ops(os.path.join(ROUND + "-A", "run"))
    pairs = contention(same)
    assert pairs and all(x > 0 for x in pairs)
    t = cell_table(CELL, None)
    assert t["contention_pairs"] == len(pairs) and t["searched_contention"] is None  # the fixture keeps no searched profile
    assert 0.5 < t["b_over_a"]["all"] < 1.0  # the recording's strategy run computed faster, as the family's do
