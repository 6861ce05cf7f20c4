"""The Python API's path load -> build_graph -> replay aligns clocks like open_run does, and only once."""
from __future__ import annotations

import msgspec
import numpy as np
import pytest

import dagprof
from dagprof.align import one_clock
from dagprof.analysis import job_iteration_us
from dagprof.collect.jobs.demo_train import DemoConfig, run_demo_training
from dagprof.traces import run_schema as rs
from dagprof.traces.events import Kind, Run

SKEW_NS = 37_000_000


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> tuple[str, float]:
    """A real 2-rank gloo DDP run (hooks only, one host: one true clock) with rank 1's clock then set 37 ms ahead,
    as if it ran on another host (a skew like this only exists between hosts, and on one host the matching rightly
    trusts the shared clock over step numbers); and how much later rank 1 really started its first step than rank 0."""
    small = {k: v for k, v in vars(DemoConfig.small()).items() if k in ("width", "blocks", "image_size", "batch_size")}
    out = run_demo_training(tmp_path_factory.mktemp("skewed") / "run", world_size=2, steps=6, profile_steps=(2, 5), bucket_cap_mb=0.01,
                            kineto=False, **small)
    truth = _first_step_skew_us(dagprof.build_graph(_as_aligned(dagprof.load(out))))
    path = f"{out}/{rs.rank_file(1)}"
    f = rs.read_file(path, rs.RankFile)
    f.records = [(c, a, b, t + SKEW_NS, x) for c, a, b, t, x in f.records]
    f.step_times_ns = [(s, t0 + SKEW_NS, t1 + SKEW_NS) for s, t0, t1 in f.step_times_ns]
    f.host = f"{f.host}-other"
    with open(path, "wb") as fh:
        fh.write(rs.encode(f))
    return str(out), truth


def _as_aligned(run: Run) -> Run:
    """``run`` marked as aligned already, so build_graph takes its clocks as they are."""
    return Run(run.ranks, run.source, msgspec.structs.replace(run.meta, clocks_done=True, clock_alignment=None))


def test_public_path_is_aligned_like_open_run(skewed):
    path, truth = skewed
    run = dagprof.load(path)
    assert not run.meta.clocks_done  # readers report clocks as recorded
    g = dagprof.build_graph(run)
    assert job_iteration_us(g) == pytest.approx(dagprof.open_run(path).analysis.predicted_us, rel=1e-9)
    assert abs(_first_step_skew_us(g) - truth) < 2000  # the replay starts the ranks as they really started
    assert abs(_first_step_skew_us(dagprof.build_graph(_as_aligned(run))) - truth - SKEW_NS / 1e3) < 2000  # not 37 ms apart


def _first_step_skew_us(g) -> float:
    """How much later rank 1 starts its first step than rank 0, as the replay will start them (``gap``)."""
    offsets = []
    for r in (0, 1):
        steps = np.flatnonzero((g.kind == Kind.STEP) & (g.rank == r))
        offsets.append(g.gap[steps[np.argmin(g.order[steps])]])
    return offsets[1] - offsets[0]


def test_open_run_matches_and_aligns_once(skewed, monkeypatch):
    calls = {"match": 0, "align": 0}
    match, align = one_clock.match_collectives, one_clock.align_clocks

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(one_clock, "match_collectives", counted("match", match))
    monkeypatch.setattr(one_clock, "align_clocks", counted("align", align))
    prof = dagprof.open_run(skewed[0])
    assert calls == {"match": 1, "align": 1}
    assert prof.alignment is not None and abs(prof.alignment.offset_us[1] + SKEW_NS / 1e3) < 2000  # hook spans: ~1 ms residual
    again, _ = one_clock.on_one_clock(prof.run, None)
    assert again is prof.run and calls["align"] == 1
