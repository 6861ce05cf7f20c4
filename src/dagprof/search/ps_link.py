"""Fit a parameter-server profile's link model by replaying it.

mx.profiler does not say which push carries which key, so message times cannot be fitted one by
one. What is known: the per-message latency (the shortest push/pull round trip, in the builder's
first guess) and the server work per byte (the servers' busy time). The bandwidth is what makes
the replayed iteration equal the measured one: the replay is monotone in it, so bisection finds it.
This is a calibration of one number on the profiled configuration, so the profile's own replay
matches by construction; predictions for other server counts and links are what test the model.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..analysis import job_iteration_us
from ..costmodel.topology import Topology
from ..graph.build_ps import rebuild_ps
from ..graph.dag import Graph


def fit_ps_link(g: Graph, iterations: int = 30) -> Graph:
    """``g`` (from ``build_ps_graph``) with the bandwidth that replays to the measured iteration."""
    link = Topology.from_dict(g.meta["topology"]).inter
    servers = int(str(g.meta["scheme"]).split(":")[1])
    target = max(g.meta["measured_iter_us"].values())

    def at(beta: float) -> Graph:
        return rebuild_ps(g, servers, replace(link, beta_us_per_byte=beta))

    lo, hi = 0.0, max(link.beta_us_per_byte, 1e-6)
    while job_iteration_us(at(hi)) < target and hi < 1e3:
        hi *= 4
    if job_iteration_us(at(lo)) >= target:  # even an infinitely fast link replays too slow
        hi = lo
    for _ in range(iterations if hi > lo else 0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if job_iteration_us(at(mid)) < target else (lo, mid)
    out = at(hi)
    out.meta["ps_link_fit"] = {"bandwidth_bytes_per_s": float(1e6 / hi) if hi > 0 else float(np.inf), "alpha_us": link.alpha_us,
                               "server_us_per_byte": link.gamma_us_per_byte, "target_iter_us": target}
    return out
