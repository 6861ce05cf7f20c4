"""A JAX all-reduce's per-operand stall on gloo: measured, bounded, not predictable; it widens a link what-if's interval.

XLA's CPU client runs a combined all-reduce as one gloo call per operand (``traces.xla_hlo``). Measured on the
namespace testbed (2026-12-03, ``bench/bench_jax_operands.py``, packet capture and ``strace``): when an operand's
first message arrives before the local side has posted its receive, gloo's device loop thread polls the socket
(``epoll_wait`` returning at once, nothing read) until the thread that posts it runs; on contended cores that thread
waits for the scheduler's tick. Each operand so stalls 0 or about one tick (3.5-3.9 ms gaps between one side's message
and the other's reply, at 40 Mbit/s as on an unshaped loopback, the kernel's ``CONFIG_HZ=250``): 36 operands of 256 B
took 10-160 ms where one array of their bytes took 0.3-8 ms. Which operands stall is a race between the two processes
that moved with the load and the rate (more at a faster link, fewer where an operand's own transfer is long), so
a profile at one rate does not tell the stall at another: between two runs it differs by up to the operands a step
times the tick, either way.
"""
from __future__ import annotations

import math

import numpy as np

from ..graph.dag import Graph
from ..passes.comm import priced_comm, priced_world_size

# The scheduler tick the stalls came to (CONFIG_HZ=250 on the testbed's kernel, the common distribution default)
TICK_US = 4000.0


def stall_bound_us(g: Graph) -> float:
    """Most a step's collectives can stall on gloo's per-operand calls (us): the operands a step times the tick; 0 where
    the graph is not an XLA (JAX) job on gloo or its operands were not read."""
    n = g.meta.collective_operands_per_step
    return n * TICK_US if g.meta.framework == "jax" and g.meta.backend == "gloo" and n else 0.0


def held_us(g: Graph) -> float | None:
    """The most stall a prediction from ``g`` holds (us a step): its collectives' time beyond the wire they were profiled
    at (``meta.wire_bytes_per_s``; a ring of N moves 2 (N - 1) / N of each one's bytes per link), the median step's; what
    a step could lose if none of its arrays stalled at the other rate. None where the wire is not known."""
    wire = g.meta.wire_bytes_per_s
    comm = priced_comm(g) & (g.dur > 0) & (g.step >= 0)
    if not wire or not comm.any():
        return None
    n = priced_world_size(g)
    beyond = g.dur[comm] - 2 * (n - 1) / n * g.nbytes[comm] / wire * 1e6
    steps, inverse = np.unique(g.step[comm], return_inverse=True)
    return max(float(np.median(np.bincount(inverse, weights=beyond, minlength=len(steps)))), 0.0)


def stall_halfwidth_us(bound_us: float, level: float) -> float:
    """The ``level`` interval's half-width of the difference between two steps' stalls, each spread evenly over
    [0, ``bound_us``] (as measured): a triangular spread over +-bound, P(|d| > x) = (1 - x / bound)^2."""
    return bound_us * (1.0 - math.sqrt(1.0 - level))


def stall_note(g: Graph) -> str | None:
    """One line for a link what-if of such a job, None where it is not one."""
    bound = stall_bound_us(g)
    if not bound:
        return None
    n = g.meta.collective_operands_per_step
    return (f"JAX on gloo: {n:.0f} arrays a step, one gloo call each; each can stall 0 or about one scheduler tick "
            f"({TICK_US / 1e3:g} ms) on contended cores, 0-{bound / 1e3:.0f} ms a step, at random (a race between the processes): "
            f"not predictable from this profile, the interval of a link what-if holds it")
