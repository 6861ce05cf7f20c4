"""The notes ``dagprof whatif --profiled-bandwidth`` adds: how the link fitted to a profile's collectives reads against the
wire rate it was profiled at (``passes.comm.split_at_wire``; a parameter-server job's ``passes.comm.ps_bandwidth``)."""
from __future__ import annotations

import numpy as np

from ..costmodel.alphabeta import parse_bandwidth
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..passes.comm import LinkFit, priced_world_size, profiled_collectives
from .scenario import Cluster

FAR_BELOW_WIRE = 0.8  # a fit slower than this share of the profiled wire: most of its collectives' time is not the link's


def profiled_wire_notes(g: Graph, fit: LinkFit | None, c: Cluster, asked: list[str | None]) -> tuple[dict | None, list[str]]:
    """The fitted link against the wire rate the run was profiled at (``c.profiled_bandwidth``; None: not given): for
    --json, and a note saying how much of the collectives' per-byte time ``split_at_wire`` keeps fixed (the fit far below
    the wire: busy cores); for a Horovod job, also what the rows ``asked`` (their --bandwidth) faster than that wire cannot
    see (``_horovod_wire_note``)."""
    if c.profiled_wire is None or c.profiled_bandwidth is None:
        return None, []
    wire, written = c.profiled_wire, c.profiled_bandwidth
    if is_ps_graph(g):
        return None, _ps_wire_notes(g, wire, written)
    if fit is None:
        return None, []
    share = 1e6 / wire / fit.link.beta_us_per_byte if fit.link.beta_us_per_byte > 0 else None
    nbytes = float(profiled_collectives(g, overlapping=g.meta.comm_lanes > 1)[0].sum())
    out = {"bandwidth_bytes_per_s": wire, "fit_share": share, "collectives": fit.collectives, "bytes": nbytes,
           "far_below": share is not None and share < FAR_BELOW_WIRE}
    if fit.link.beta_us_per_byte == 0:
        return out, [f"--profiled-bandwidth {written}: the {fit.collectives} collectives' ({nbytes / 1e6:.3g} MB) durations "
                     "show no time per byte, so nothing of them is wire time to keep apart"]
    head = f"--profiled-bandwidth {written}: the link fitted to {fit.collectives} collectives ({nbytes / 1e6:.3g} MB) runs at {share:.0%} of it"
    if share >= 1.0:
        return out, [f"{head}, no slower than the wire (bytes crossed outside the timed transfers, or the rate is not the wire's): "
                     "its whole per-byte time scales by the rate ratio, --bandwidth over it"] + _horovod_wire_note(g, wire, written, asked)
    far = "far below the wire: " if share < FAR_BELOW_WIRE else ""
    if g.meta.horovod is not None:
        pipelined = (f"{far}{head}; Horovod's copies and reductions on the cores run beside the wire's transfer, so each collective "
                     "takes the longer of its profiled price and the wire's time at a slower --bandwidth, and at a faster one its profiled "
                     "price less the wire's time saved")
        return out, [pipelined] + _horovod_wire_note(g, wire, written, asked)
    return out, [f"{far}{head}; the other {1 - share:.0%} of its per-byte time is taken as work on the cores (busy cores, copies) "
                 "and kept at every bandwidth, only the wire's part scales"]


def _horovod_wire_note(g: Graph, wire: float, written: str, asked: list[str | None]) -> list[str]:
    """Rows faster than the profiled wire of a Horovod job: its collectives keep what the profile measured beyond the wire
    (``passes.comm.split_at_wire``), and work on the cores that the slower wire hid is not seen. Profiled at 200 Mbit/s
    (the fits at the wire, 98-100 %), hvd_transformer's and hvd_sparse_gru's kept jobs at 500 Mbit/s took 1.27-1.41 times
    the wire where 1.02-1.06 times it at 200 Mbit/s: predicted so, their collectives came out 9-24 % short. The profiled
    price bounds them (a faster wire does not slow the cores), and the note says both."""
    if g.meta.horovod is None:
        return []
    faster = sum(b is not None and parse_bandwidth(b) > wire for b in asked)
    if not faster:
        return []
    nbytes, dur = profiled_collectives(g)
    n = max(priced_world_size(g), 2)
    beyond = np.maximum(dur - 2 * (n - 1) / n * nbytes * 1e6 / wire, 0.0)
    return [f"{faster} row(s) faster than --profiled-bandwidth {written}: the {len(dur)} Horovod collectives took "
            f"{dur.sum() / 1e3:.1f} ms profiled, {beyond.sum() / 1e3:.1f} ms of it beyond the wire: work on the cores that the wire hid "
            "is not seen, so they may take up to their profiled time (the prediction's collectives are the least)"]


def _ps_wire_notes(g: Graph, wire: float, written: str) -> list[str]:
    """A parameter-server job's fitted link (``passes.comm.fit_ps_link``) against the wire it was profiled at: how each
    --bandwidth row reads it (``passes.comm.ps_bandwidth``)."""
    fit = g.meta.ps_link_fit
    share = fit.bandwidth_bytes_per_s / wire
    head = (f"--profiled-bandwidth {written}: the parameter-server exchanges ({fit.target_exchange_us / 1e3:.1f} ms on "
            f"average) fitted at {share:.0%} of it")
    how = ("no slower than the wire (a port's burst allowance): the fit scales by the rate ratio, --bandwidth over it" if share >= 1.0 else
           "; what held them back was not the wire (busy cores, lost segments) and is kept as a limit of its own: a row's messages move at "
           "the slower of --bandwidth and the fit")
    return [head + ("" if share < 1.0 else ", ") + how]
