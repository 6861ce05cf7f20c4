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

from ..graph.dag import Graph

# The scheduler tick the stalls came to (CONFIG_HZ=250 on the testbed's kernel, the common distribution default)
TICK_US = 4000.0


def stall_bound_us(g: Graph) -> float:
    """Most a step's collectives can stall on gloo's per-operand calls (us): the operands a step times the tick; 0 where
    the graph is not an XLA (JAX) job on gloo or its operands were not read."""
    n = g.meta.collective_operands_per_step
    return n * TICK_US if g.meta.framework == "jax" and g.meta.backend == "gloo" and n else 0.0


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
