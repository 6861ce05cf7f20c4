"""TF's padded all-gathers of a sparse gradient on another worker count: N workers each send the most rows any of them has.

Where the workers' row counts differ in a step, ``MultiWorkerMirroredStrategy`` pads every worker's rows (and indices) to
the most any worker has and all-gathers them (``cond/else/``): N workers x the most over N. That maximum grows with N
faster than the mean, so scaling the profiled gather's bytes by N / N0 (the rule for a gather of each worker's own rows)
under-prices it. The profile holds each worker's own count per step (``GraphMeta.padded_gathers``), so:

- N >= N0: the step's N0 profiled workers keep their counts (the copies run their steps), the N - N0 new ones are fresh
  draws from the counts profiled on any worker in any step (the empirical distribution, draws independent: a worker's
  batch is a sample of the same data as every profiled worker-step's), and the gather carries
  N x E[max(the step's most, the most of N - N0 draws)] rows. That expectation is exact for the empirical distribution
  (``expected_most``), nothing fitted; it cannot exceed the largest count profiled, so for N far above the profiled
  worker-steps it is a floor of the tail;
- N < N0: the kept ranks' (0..N-1) own most in that step;
- workers that had equal rows in every profiled step (their counts move together: one padded batch split between them)
  keep the step's count: nothing shows them drawing apart;
- a node of no profiled step (an averaged step): the mean over the profiled steps of the above.
"""
from __future__ import annotations

import numpy as np

from ..traces.meta import PaddedGather
from ..traces.xplane_run import padded_key


def expected_most(own: list[int], pool: np.ndarray, workers: int) -> float:
    """E[the most rows over ``workers`` workers]: ``own`` are the step's profiled workers' counts, the rest draw
    independently from ``pool`` (every profiled worker-step's count). With F the pool's empirical CDF over its distinct
    values u and k draws, P(max <= u) = [u >= most(own)] F(u)^k, so E = sum_u max(u, most(own)) (F(u)^k - F(u-)^k)."""
    if workers <= len(own):
        return float(max(own[:workers]))
    values, counts = np.unique(pool, return_counts=True)
    cdf = np.cumsum(counts) / counts.sum()
    mass = np.diff(np.r_[0.0, cdf ** (workers - len(own))])
    return float(np.sum(np.maximum(values, max(own)) * mass))


def padded_rows_at(rec: PaddedGather, step: int, workers: int) -> float:
    """Rows each worker sends in a padded gather on ``workers`` workers in profiled ``step`` (module docstring). Where the
    profiled workers had equal rows in every step, their counts move together (one padded batch split between them):
    no draw is independent, so each worker keeps the step's count."""
    if all(len(set(v)) == 1 for v in rec.rows.values()):
        return float(rec.rows[step][0]) if step in rec.rows else float(np.mean([v[0] for v in rec.rows.values()]))
    pool = np.concatenate([np.asarray(v, dtype=np.float64) for v in rec.rows.values()])
    if step in rec.rows:
        return expected_most(rec.rows[step], pool, workers)
    return float(np.mean([expected_most(v, pool, workers) for v in rec.rows.values()]))


def padded_gather_bytes(names: list[str], name: np.ndarray, step: np.ndarray, nodes: np.ndarray,
                        records: dict[str, PaddedGather], workers: int) -> dict[int, int]:
    """Node -> its bytes on ``workers`` workers, for the ``nodes`` that are a recorded padded gather."""
    out = {}
    for v in nodes.tolist():
        rec = records.get(padded_key(names[int(name[v])]))
        if rec is not None and rec.rows:
            out[v] = int(round(workers * padded_rows_at(rec, int(step[v]), workers) * rec.row_bytes))
    return out
