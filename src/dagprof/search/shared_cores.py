"""The ``shared_cores`` interval term (``analysis.interval``): collectives whose transfer is the ranks' own CPU work (gloo
copying and summing over one host's loopback), priced by a link timed alone, share the cores with the compute beside
them, each slower beside the other by an amount no profile measures. The point leaves it out (charged in the point,
fresh testbed rounds came out 7-28 % slow); the interval carries it as bounds. One computation for every caller:
``search.whatif`` and ``search.optimize``'s strategy intervals (where the profile records it: ``on_shared_cores``) and
``bench/testbed/run.py`` (its unshaped cells).
"""
from __future__ import annotations

from typing import NamedTuple

from ..analysis.interval import PredictionInterval, typical_iteration_us
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..passes.link_fit import one_host
from ..passes.overlap import comm_overlap, core_bound_slowdown, slowed_comm, slowed_nodes
from ..replay import ReplayResult, replay
from ..units import count
from .measured import overlap_of
from .scenario import Cluster, Scenario, undisturb

TERM = "shared_cores"
NOTED = "include the shared-cores bounds:"  # how ``shared_cores_note`` begins its reason (the demo picks the note out by it)


class CoreBounds(NamedTuple):
    """How far the ``shared_cores`` bounds reach from a scenario's median step, us (``shared_cores_bounds``)."""

    above_us: float  # the high end's reach above it
    below_us: float  # the low end's reach below it (0: no unslowed scenario given)


def shared_cores_bound_us(g: Graph, res: ReplayResult, comm_slowdown: float, compute_slowdown: float) -> float:
    """How much longer the median step of ``g`` (replayed as ``res``) takes where its collectives are priced alone (a
    sweep timed with nothing beside it) though their transfer is the ranks' own CPU work (a host's loopback), so they
    and the compute beside them share the cores: each collective (1 + ``comm_slowdown`` * f) as long, f the share of
    its span some rank computed (``passes.overlap.slowed_comm``), and the compute beside them (1 + ``compute_slowdown``
    * f') where the point priced none (0: priced). A bound for the interval's high end, not a point: on the namespace
    testbed's unshaped link the slowdown scattered 0-3 between repeats of one measurement, and charged in the point the
    fresh quiet rounds came out 7-28 % slow where the kept round it was found on came out 5-16 % (evidence, ``interval20``)."""
    dur = slowed_comm(g, res, comm_slowdown)
    if compute_slowdown > 0:
        nodes = slowed_nodes(g)
        dur[nodes] *= 1.0 + compute_slowdown * comm_overlap(g, res, nodes)
    slowed = g.replace(dur=dur)
    return max(0.0, typical_iteration_us(slowed, replay(slowed)) - typical_iteration_us(g, res))


def comm_slowdown_beside(g: Graph, link_model: str | None) -> float:
    """The collectives' slowdown beside compute: what ``link_model`` (``dagprof calibrate --overlap``) measured
    (``comm_slowdown``), else the cores' bound (``passes.overlap.core_bound_slowdown``: 2 ranks on 2 cores, 1)."""
    m = overlap_of(None, link_model) if link_model else None
    return m.comm_slowdown if m is not None and m.comm_slowdown > 0 else core_bound_slowdown(g)


def unslowed_profile(stepwise: Graph, model: Graph, g: Graph) -> Graph:
    """``stepwise`` (the profile's steps, ``model`` them on the link they ran on) with its compute run beside nothing:
    the slowdown its own collectives may have put on it, at the cores' bound of ``g``'s hosts, taken out. The caller
    builds its scenario from it; the low end reaches its step."""
    return undisturb(stepwise, model, Cluster(slowdown=core_bound_slowdown(g)))


def shared_cores_bounds(g: Graph, res: ReplayResult, comm_slowdown: float, compute_slowdown: float,
                        unslowed: Graph | None = None) -> CoreBounds:
    """The ``shared_cores`` bounds of the scenario ``g`` (replayed as ``res``), us: how far above its median step the high
    end reaches (``shared_cores_bound_us``) and, given ``unslowed`` (the same scenario built from ``unslowed_profile``,
    where no slowdown beside the profiled link was measured), how far below it the low end reaches (its median step)."""
    above = shared_cores_bound_us(g, res, comm_slowdown, compute_slowdown)
    below = 0.0 if unslowed is None else typical_iteration_us(g, res) - typical_iteration_us(unslowed, replay(unslowed))
    return CoreBounds(above, below)


def add_bounds(iv: PredictionInterval, bounds: CoreBounds) -> PredictionInterval:
    """``iv`` with ``bounds`` added, after every spread (``dagprof optimize`` adds them once the level has widened its
    intervals, as ``whatif`` does). Points unchanged."""
    return iv.above(bounds.above_us, TERM).below(bounds.below_us, TERM)


def with_shared_cores(iv: PredictionInterval, g: Graph, res: ReplayResult, comm_slowdown: float, compute_slowdown: float,
                      unslowed: Graph | None = None) -> PredictionInterval:
    """``iv`` (the scenario ``g``, replayed as ``res``) with the ``shared_cores`` bounds (``shared_cores_bounds``)."""
    return add_bounds(iv, shared_cores_bounds(g, res, comm_slowdown, compute_slowdown, unslowed))


def on_shared_cores(g0: Graph, s: Scenario, c: Cluster) -> bool:
    """Whether scenario ``s`` of the profile ``g0`` prices collectives whose transfer is the ranks' own CPU work, timed
    alone: every rank on one host (``one_host``: its loopback), and the row and the cluster keep that link (no
    ``--bandwidth``/``--latency``/``--link-to``/``--topology``, no ``--profiled-bandwidth`` or ``--half-duplex`` naming a
    wire; ``--link-model``'s sweep of it is timed alone too). A parameter server's messages are not collectives: not it."""
    wire = s.bandwidth is not None or s.latency_us is not None or s.link_to is not None
    return not (wire or c.topology or c.profiled_bandwidth or c.half_duplex or is_ps_graph(g0)) and one_host(g0) is not None


def shared_cores_note(g0: Graph, rows: int, total: int, c: Cluster) -> str:
    """Said where ``on_shared_cores`` put the term in ``rows`` of ``total`` rows' intervals."""
    host = one_host(g0)
    ranks, cores = g0.meta.host_cpus[host].ranks, g0.meta.host_cpus[host].cores
    measured = c.link_model is not None and comm_slowdown_beside(g0, c.link_model) != core_bound_slowdown(g0)
    by = f"as --link-model measured ({comm_slowdown_beside(g0, c.link_model):.2f} per unit of overlap)" if measured else \
        f"up to {1 + core_bound_slowdown(g0):g}x, the cores' bound"
    return (f"{count(rows, 'interval')} of {total} {NOTED} the {count(ranks, 'rank')} shared the {count(cores, 'core')} of one "
            f"host ({host}): their collectives are their own CPU work, priced by a link timed alone; "
            f"beside the compute both run slower ({by}: the high end), which the point leaves out"
            + ("" if c.slowdown else ", and the profile's compute may hold it already (the low end)"))
