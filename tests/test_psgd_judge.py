"""``bench/psgd_judge.py``'s keep rule on two sides' rows (``bench_optimize.py --repredict --out``'s fields)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from psgd_judge import judge  # noqa: E402


def _row(errors: list[float], headline: float, speedup: float = 4.0) -> dict:
    s = sorted(errors)
    return {"error_per_round_pct": errors, "median_error_pct": s[len(s) // 2], "searched_error_pct": headline,
            "searched_predicted": speedup, "measured": 4.0}


def test_a_family_moved_toward_with_lossless_and_others_still_is_kept():
    a = {("emb", "a", "lossy"): _row([-9.0, -8.0, -7.0], -8.0), ("emb", "a", "lossless"): _row([1.0, 0.0, -1.0], 0.0, 1.0),
         ("conv", "a", "lossy"): _row([5.0, -5.0, 10.0], 6.0)}
    b = dict(a) | {("emb", "a", "lossy"): _row([-5.0, -4.0, -3.0], -4.0)}
    v = judge(a, b, {"emb"})
    assert v.lossless_move == 0.0 and v.family == {"emb:a": True} and v.others == (5.0, 5.0) and v.keep


def test_a_lossless_move_an_other_cell_worse_or_the_headline_further_is_not_kept():
    a = {("emb", "a", "lossy"): _row([-9.0, -8.0, -7.0], -8.0), ("emb", "a", "lossless"): _row([1.0, 0.0, -1.0], 0.0, 1.0),
         ("conv", "a", "lossy"): _row([5.0, -5.0, 10.0], 6.0)}
    moved = dict(a) | {("emb", "a", "lossy"): _row([-5.0, -4.0, -3.0], -4.0), ("emb", "a", "lossless"): _row([1.5, 0.0, -1.0], 0.0, 1.0)}
    assert judge(a, moved, {"emb"}).lossless_move == 0.5 and not judge(a, moved, {"emb"}).keep
    worse = dict(a) | {("emb", "a", "lossy"): _row([-5.0, -4.0, -3.0], -4.0), ("conv", "a", "lossy"): _row([8.0, -5.0, 12.0], 9.0)}
    assert judge(a, worse, {"emb"}).others == (5.0, 8.0) and not judge(a, worse, {"emb"}).keep
    further = dict(a) | {("emb", "a", "lossy"): _row([-5.0, -4.0, -3.0], -9.0)}  # per round toward, the headline away
    assert judge(a, further, {"emb:a"}).family == {"emb:a": False}
