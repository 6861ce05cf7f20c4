"""The notes ``dagprof whatif --profiled-bandwidth`` adds: how the link fitted to a profile's collectives reads against the
wire rate it was profiled at (``passes.link_fit.split_at_wire``; a parameter-server job's ``passes.comm.ps_bandwidth``); without
that rate, how the fit reads against the rate its own largest collectives moved (``moved_rate``)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..costmodel.alphabeta import parse_bandwidth
from ..errors import DagprofError
from ..graph.build_fsdp import is_fsdp_graph
from ..graph.build_ps import is_ps_graph
from ..graph.dag import Graph
from ..passes.comm import NOT_WIRE_FIT, WIRE_FIT_SCATTER
from ..passes.link_fit import LinkFit, floored_kinds, graph_world_size, pipelined, priced_comm, priced_world_size, profiled_collectives, unhidden_note
from ..units import count
from .scenario import Cluster, Scenario

FAR_BELOW_WIRE = 0.8  # a fit slower than this share of the profiled wire: most of its collectives' time is not the link's
# a fit faster than this many times the profiled wire: not the wire it ran on. Fits reach twice it (TF's 109-200 %, JAX's
# 188-189 % in docs/evidence.md: a shaper's burst, bytes crossed outside the timed transfers); four times is none's
OUTRUNS_WIRE = 4.0


def profiled_wire_notes(g: Graph, fit: LinkFit | None, c: Cluster, asked: list[Scenario]) -> tuple[dict | None, list[str]]:
    """The fitted link against the wire rate the run was profiled at (``c.profiled_bandwidth``; None: not given): for
    --json, and a note saying how much of the collectives' per-byte time ``split_at_wire`` keeps fixed (the fit far below
    the wire: busy cores); for a Horovod job, also the bound at which the rows ``asked`` away from that wire price its
    collectives (``_horovod_wire_note``)."""
    if c.profiled_wire is None or c.profiled_bandwidth is None:
        return None, []
    wire, written = c.profiled_wire, c.profiled_bandwidth
    if is_ps_graph(g):
        return None, _ps_wire_notes(g, wire, written)
    if fit is None:
        return None, []
    share = 1e6 / wire / fit.link.beta_us_per_byte if fit.link.beta_us_per_byte > 0 else None
    sizes, us = profiled_collectives(g, overlapping=g.meta.comm_lanes > 1)
    nbytes = float(sizes.sum())
    out = {"bandwidth_bytes_per_s": wire, "fit_share": share, "collectives": fit.collectives, "bytes": nbytes,
           "far_below": share is not None and share < FAR_BELOW_WIRE}
    # without a per-byte fit, their bytes over their whole time: the least rate they ran at (a 10 Mbit/s given for a
    # 414 ms HSDP step that moved 17.7 MB was answered)
    least = 1e6 * nbytes / float(us.sum()) / wire if fit.link.beta_us_per_byte == 0 and us.sum() > 0 else 0.0
    if (share or least) > OUTRUNS_WIRE:
        raise DagprofError(f"--profiled-bandwidth {written}: the {'link fitted to ' if share else ''}{fit.collectives} collectives "
                           f"({nbytes / 1e6:.3g} MB) moved their bytes at {'' if share else 'least '}{share or least:.1f} times that "
                           "rate, which no wire allows (fits run up to about twice the wire they were profiled on): give the rate "
                           "this run was profiled at")
    if fit.link.beta_us_per_byte == 0:
        return out, [f"--profiled-bandwidth {written}: the {fit.collectives} collectives' ({nbytes / 1e6:.3g} MB) durations "
                     "show no time per byte, so nothing of them is wire time to keep apart"]
    head = f"--profiled-bandwidth {written}: the link fitted to {fit.collectives} collectives ({nbytes / 1e6:.3g} MB) runs at {share:.0%} of it"
    floored = floored_kinds(g, fit)
    if floored:  # an FSDP or JAX job's kinds that beat the wire are priced at it (``passes.link_fit.wire_floor``), not scaled
        out["floored_kinds"] = list(floored)
        return out, [f"{head}; its {' and '.join(k.replace('_', '-') + 's' for k in floored)} ran faster than the wire (the first rank in "
                     "sends before the last joins, a shaped port passes a burst after an idle spell): priced at the wire, each collective "
                     "keeping the time it measured beside that price at every --bandwidth and --workers (a head start is time, not bytes)"]
    if share >= 1.0:
        return out, [f"{head}, no slower than the wire (bytes crossed outside the timed transfers, or the rate is not the wire's): "
                     "its whole per-byte time scales by the rate ratio, --bandwidth over it"] + _horovod_wire_note(g, wire, written, asked)
    far = "far below the wire: " if share < FAR_BELOW_WIRE else ""
    if pipelined(g):
        beside = (f"{far}{head}; Horovod's copies and reductions on the cores run beside the wire's transfer, so each collective "
                  "takes the longer of its profiled price and the wire's time at a slower --bandwidth, and at a faster one its profiled "
                  "price less the wire's time saved")
        return out, [beside] + unhidden_note(g) + _horovod_wire_note(g, wire, written, asked)
    return out, [f"{far}{head}; the other {1 - share:.0%} of its per-byte time is taken as work on the cores (busy cores, copies) "
                 "and kept at every bandwidth, only the wire's part scales"]


def _horovod_wire_note(g: Graph, wire: float, written: str, asked: list[Scenario]) -> list[str]:
    """Rows away from the profiled wire of a Horovod job, and the bound the prediction's collectives sit at
    (``passes.link_fit.split_at_wire``): what the profile measured beyond the wire is work and waits on the cores.

    Faster rows keep it, and work on the cores that the slower wire hid is not seen: profiled at 200 Mbit/s (the fits at
    the wire, 98-100 %), hvd_transformer's and hvd_sparse_gru's kept jobs at 500 Mbit/s took 1.27-1.41 times the wire
    where 1.02-1.06 times it at 200 Mbit/s: predicted so, their collectives came out 9-24 % short. The profiled price
    bounds them (a faster wire does not slow the cores). Slower rows take it as hidden by the longer transfer, the least
    they can take; kept after the wire it is the most. Of what 22 kept 500 Mbit/s profiles measured beyond the wire
    (each collective's time less the wire's), the same rounds' jobs at 200 Mbit/s kept 8-64 % (hvd_transformer, load
    1.5-3.5), 32-74 % (hvd_sparse_gru, load 1.5-3.5) and 35-59 % (hvd_autoencoder, load 7-22): waits on busy cores more than
    copies (its fp16 sums take about 2 ms of a core a step), and how much of them a slower wire hides is not in the
    profile. The note says the amount per step, measured at the profiled size: rows that also change --workers are
    left out of it and counted apart (how the time beyond the wire grows with the ranks is not in the profile)."""
    if not pipelined(g):
        return []
    n0 = graph_world_size(g)
    away = [(parse_bandwidth(s.bandwidth), s.workers in (None, n0)) for s in asked if s.bandwidth is not None]
    away = [(r, same) for r, same in away if r != wire]
    faster, slower = sum(r > wire for r, same in away if same), sum(r < wire for r, same in away if same)
    resized = [f"{count(sum(not same for _, same in away), 'row')} away from --profiled-bandwidth {written} with other --workers than the "
               f"profiled {n0}: left out of the time beyond the wire said here, measured at {n0} ranks (how it grows with the ranks "
               "is not in the profile)"] if any(not same for _, same in away) else []
    if not (faster or slower):
        return resized
    nbytes, dur = profiled_collectives(g)
    n = max(priced_world_size(g), 2)
    beyond = np.maximum(dur - 2 * (n - 1) / n * nbytes * 1e6 / wire, 0.0)
    comm = priced_comm(g) & (g.dur > 0)
    steps = max(len(np.unique(g.step[comm])), 1)
    took = (f"the {len(dur)} Horovod collectives took {dur.sum() / 1e3 / steps:.1f} ms a step profiled, "
            f"{beyond.sum() / 1e3 / steps:.1f} ms of it beyond the wire (work and waits on the cores)")
    out = []
    if faster:
        out.append(f"{count(faster, 'row')} faster than --profiled-bandwidth {written}: {took}: work on the cores that the wire hid is not "
                   "seen, so they may take up to their profiled time (the prediction's collectives are the least)")
    if slower and beyond.sum() > 0:
        out.append(f"{count(slower, 'row')} slower than --profiled-bandwidth {written}: {took}, taken as hidden by the longer transfer (the "
                   f"prediction's collectives are the least); where the cores stay as busy, up to {beyond.sum() / 1e3 / steps:.1f} ms a "
                   "step more (the testbed's jobs at 200 Mbit/s, profiled at 500, kept 8-74 % of it)")
    return out + resized


def _ps_wire_notes(g: Graph, wire: float, written: str) -> list[str]:
    """A parameter-server job's fitted link (``passes.comm.fit_ps_link``) against the wire it was profiled at: how each
    --bandwidth row reads it (``passes.comm.ps_bandwidth``)."""
    fit = g.meta.ps_link_fit
    share = fit.bandwidth_bytes_per_s / wire
    head = (f"--profiled-bandwidth {written}: the parameter-server exchanges ({fit.target_exchange_us / 1e3:.1f} ms on "
            f"average) fitted at {share:.0%} of it")
    if share >= 1.0:
        how = (", no slower than the wire (a port's burst allowance): the fit scales by the rate ratio, --bandwidth over it, and with more "
               "workers per server the burst's bytes are a smaller share of a port's")
    elif share >= WIRE_FIT_SCATTER:
        how = ", within the scatter of the wire's own fits: the fit scales by the rate ratio, --bandwidth over it"
    elif share <= NOT_WIRE_FIT:
        how = ("; what held them back was not the wire (busy cores, lost segments) and is kept as a limit of its own: a row's messages move "
               "at the slower of --bandwidth and the fit")
    else:
        how = (f"; between the wire's fits (from {WIRE_FIT_SCATTER:.0%}) and a limit of its own (to {NOT_WIRE_FIT:.0%}), which it is "
               "the profile does not tell: a row's time per byte mixes the two, the rate ratio's and the slower of --bandwidth and the fit's, "
               "in proportion to where the fit lies")
    return [head + how]


def moved_rate(g: Graph) -> float | None:
    """Bytes/s the profile's link sustained at least: the fastest of its largest collectives (at least half the largest's
    bytes), their ring share (2(N-1)/N) over its time, since none crossed faster than the link. Small ones can beat the
    sustained rate (a shaper's burst allowance: Horovod's 40 kB all-reduces at 58 MB/s on a 30 MB/s testbed link). None
    where collectives overlap on several lanes (a pair's time is split between them at random, ``passes.link_fit.fit_link``),
    for an FSDP job (each kind has its own link, ``passes.link_fit.profiled_kinds``, and a collective that completed behind
    another on the channel keeps a sliver: an HSDP fixture's 'moved' 32 GB/s), or where none has bytes and a duration."""
    if g.meta.comm_lanes > 1 or is_ps_graph(g) or is_fsdp_graph(g):
        return None
    nbytes, dur = profiled_collectives(g)
    ok = (dur > 0) & (nbytes > 0)
    if not ok.any():
        return None
    large = ok & (nbytes >= nbytes[ok].max() / 2)
    n = max(priced_world_size(g), 2)
    return float((2 * (n - 1) / n * nbytes[large] / dur[large]).max() * 1e6)


def _mbit(rate: float) -> str:
    bits = rate * 8
    return f"{bits / 1e9:.3g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.3g} Mbit/s"


REMEDY = ("give --profiled-bandwidth RATE (the link it ran on), or measure the links with `dagprof calibrate` and pass "
          "--link-from/--link-to")


def _link_rows_faster(rows: list[tuple[Scenario, float]], n0: int, model_us: float) -> list[tuple[Scenario, float]]:
    """Rows that only set the link (and add workers, if any: on a ring each then moves more bytes, no shorter a step
    either) yet predict a step faster than the model of the profiled run (``model_us``)."""
    return [(s, it) for s, it in rows if s.bandwidth is not None and replace(s, bandwidth=None, workers=None) == Scenario()
            and (s.workers or n0) >= n0 and it < model_us]


def _faster_than_loopback(g: Graph, c: Cluster, rows: list[tuple[Scenario, float]], model_us: float) -> list[str]:
    """Ranks that all ran on one host exchanged over its loopback unless an emulated link stood between them (the namespace
    testbed: then --profiled-bandwidth says its rate), and no named link outruns a loopback: a row that only sets the link
    (and adds workers, if any) and predicts a step faster than the model of the profiled run then read the collectives'
    waits as wire time (jax_vit_optax.py on loopback: its 23-array all-reduce waited out gloo's stalls, 79 ms fitted at
    57.5 Mbit/s, and 100 Mbit/s came out 35 % faster than the run). Said in a note with the count, not refused: one profile
    does not tell a loopback from an emulated link on the same host."""
    hosts = g.meta.host_cpus
    n0 = graph_world_size(g)
    if c.profiled_wire is not None or len(hosts) != 1 or next(iter(hosts.values())).ranks != n0:
        return []
    faster = _link_rows_faster(rows, n0, model_us)
    if not faster:
        return []
    s, it = faster[0]
    return [f"{len(faster)} of {count(len(rows), 'row')} set a link and predict a step faster than the profiled run (--bandwidth "
            f"{s.bandwidth}: {model_us / 1e3:.2f} -> {it / 1e3:.2f} ms/iter), but its {n0} ranks shared one host "
            f"({next(iter(hosts))}): over its loopback no such link is faster, and those rows read waits as wire time; "
            f"if an emulated link stood between them, {REMEDY}"]


def waiting_notes(g: Graph, fit: LinkFit | None, c: Cluster, rows: list[tuple[Scenario, float]], model_us: float,
                  refuse: bool) -> list[str]:
    """The link fitted to a profile's own collectives against the rate they moved (``moved_rate``), where no
    --profiled-bandwidth says the wire's: a fit far below it holds time that was not the link's (jax_gnn_jit's 140 kB
    all-reduces took 8-190 ms on loopback, fitted at 21-117 Mbit/s; its ranks entered each a median 2 ms apart and the
    excess was gloo's per-array stall on busy cores, ``analysis.operand_stall``), which every row that
    changes the link scales as wire time. A row that only slows the link below that rate (and adds workers, if any) and still
    predicts a step faster than the model of the profiled run (``model_us``) is absurd: refused (``refuse``), else counted in a note. ``rows``:
    each scenario with its predicted iteration, us."""
    moved = None if fit is None or fit.link.beta_us_per_byte == 0 else moved_rate(g)
    if moved is None:
        return _faster_than_loopback(g, c, rows, model_us)
    rate = fit.link.bandwidth_bytes_per_s
    head = (f"the link fitted to {fit.collectives} collectives runs at {_mbit(rate)}, {rate / moved:.0%} of the {_mbit(moved)} "
            "the largest of them moved")
    n0 = graph_world_size(g)
    absurd = [(s, it) for s, it in _link_rows_faster(rows, n0, model_us) if parse_bandwidth(s.bandwidth) < moved]
    # the example in the framework's own terms (a Horovod user was told of JAX's stall, 2026-12-06 hvd_bert_mlm_join)
    such = "JAX's per-array stall on gloo" if g.meta.framework == "jax" else "a wait for a core or for a slower rank"
    why = f"so at least {1 - rate / moved:.0%} of their time per byte is not the link's (time on busy cores, such as {such})"
    if absurd:
        s, it = absurd[0]
        row = f"--bandwidth {s.bandwidth}" + (f" --workers {s.workers}" if s.workers else "")
        what = (f"{len(absurd)} of {count(len(rows), 'row')} slow the link below the {_mbit(moved)} the profile's largest collectives moved "
                f"and predict a faster step ({row}: {100 * (1 - it / model_us):.0f} % faster than the profiled run, "
                f"{model_us / 1e3:.2f} -> {it / 1e3:.2f} ms/iter): {head}, {why}; {REMEDY}")
        if refuse:
            raise DagprofError(f"not predicting: {what}; --allow-model-error predicts anyway")
        return [what]
    loopback = _faster_than_loopback(g, c, rows, model_us)
    relinked = sum(s.bandwidth is not None or s.latency_us is not None or s.workers is not None for s, _ in rows)
    if c.profiled_wire is not None or rate >= FAR_BELOW_WIRE * moved or not relinked:
        return loopback
    return [f"{head}, {why}, and {relinked} of {count(len(rows), 'row')} scale it all as wire time; {REMEDY}", *loopback]
