"""The link rate of a parameter-server profile, from its push/pull exchanges.

mx.profiler does not say which push carries which key, so single messages cannot be timed. What
is measured per worker and step is the exchange: from its first push issued to its last pull in
(``meta.ps["exchange_us"]``). The rate is the one at which the replayed exchanges last as
long as the measured ones, on average (replayed exchanges shorten monotonically with the rate,
so bisection finds it). Only communication is matched: compute, framework gaps and the ops that
wait for the pulls replay as measured, so the profiled iteration's replay is a check of the
model, not a fit. The per-message latency (the shortest push/pull round trip) and the server
work per byte come from the builder's first guess (``graph.build_ps.initial_link``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph.build_ps import DONE, ISSUE, rebuild_ps
from ..graph.dag import Graph
from ..replay import replay


def exchange_us(g: Graph, start: np.ndarray) -> dict[tuple[int, int], float]:
    """Per (step, worker): replayed first issue -> exchange done, given replayed ``start`` times."""
    names = np.array(g.names)[g.name]
    first: dict[tuple[int, int], float] = {}
    for v in np.flatnonzero(names == ISSUE):
        key = (int(g.step[v]), int(g.rank[v]))
        first[key] = min(first.get(key, np.inf), float(start[v]))
    return {key: float(start[v]) - first[key] for v in np.flatnonzero(names == DONE) if (key := (int(g.step[v]), int(g.rank[v]))) in first}


def fit_ps_link(g: Graph, iterations: int = 30) -> Graph:
    """``g`` (from ``build_ps_graph``) with the bandwidth at which its exchanges replay as measured."""
    link, servers = g.meta.topology.inter, g.meta.scheme.servers
    target = float(np.mean([span for _, _, span in g.meta.ps["exchange_us"]]))

    def at(beta: float) -> Graph:
        return rebuild_ps(g, servers, replace(link, beta_us_per_byte=beta))

    def mean_exchange(beta: float) -> float:
        h = at(beta)
        return float(np.mean(list(exchange_us(h, replay(h).start).values())))

    lo, hi = 0.0, max(link.beta_us_per_byte, 1e-6)
    while mean_exchange(hi) < target and hi < 1e3:
        hi *= 4
    if mean_exchange(lo) >= target:  # even an infinitely fast link exchanges too slowly
        hi = lo
    for _ in range(iterations if hi > lo else 0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_exchange(mid) < target else (lo, mid)
    out = at(hi)
    out.meta.ps_link_fit = {"bandwidth_bytes_per_s": float(1e6 / hi) if hi > 0 else float(np.inf), "alpha_us": link.alpha_us,
                               "server_us_per_byte": link.gamma_us_per_byte, "target_exchange_us": target}
    return out
