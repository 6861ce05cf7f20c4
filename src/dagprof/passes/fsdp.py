"""What-ifs of an FSDP2 job (``graph.build_fsdp``), and the ones its graph cannot answer yet.

Link bandwidth and latency reprice every collective by its kind (``graph.build_fsdp.allreduce_equivalent_bytes``,
used by ``passes.comm``). Workers and the HSDP layout: ``passes.fsdp_mesh``. DDP's knobs (buckets, overlap off,
tensor partition, parameter-server or tree schemes, Horovod's fusion) have no FSDP meaning: those are refused in one
line, never answered as DDP.

``reshard_after_forward`` (``set_reshard``): ``True`` or ``False`` is what ``fully_shard(unit, reshard_after_forward=...)``
passed explicitly to every unit, the root included (torch 2.13 reshards a root given ``True``); ``fully_shard``'s default
(``None``) is ``default_reshard``: lazy init keeps the root gathered after forward (its backward needs it at once),
every other unit reshards. FSDP1's root is never resharded after forward (its strategies are FULL_SHARD and
SHARD_GRAD_OP, on and off for the other units), so ``on`` leaves it kept there. Off removes the backward all-gather of every unit that was
resharded from the graph, as a profile of the kept setup has none: its transfer and joins, and on every rank all the
host time the call took (``gather_host_nodes``: the enqueue, the wait and the exit lag it carries, the copy-out, and
the unsharding path that issued it), and the forward reshard; the ranks no longer meet there. The units' flags in
``meta.fsdp`` say what the graph now is (``reshard_change`` words the difference). On adds one to every backward
pass of every unit that kept its parameters (under gradient accumulation one per micro-batch, though a kept unit was
gathered once, in the first forward): each rank's
first backward op of the unit in that pass waits as long as that unit's forward all-gather took on it
(enqueue, transfer, exit lag, copy-out; gloo blocks the thread for the transfer), an approximation that
keeps the ranks' own skew rather than joining them again. Off also drops a kept unit's forward all-gather where FSDP2
would find it still gathered (``still_gathered``: a model run forward twice before its backward, a forward-only root).
On a job of several ``fully_shard`` roots every unit is its own root's, so both directions apply root by root.

The reduce dtype (``set_reduce_dtype``): each reduce-scatter (and HSDP all-reduce) moves its gradients in it.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

from ..errors import DagprofError
from ..graph.build_fsdp import Passes, fsdp_collectives, is_fsdp_graph, issuers, refuse_post_forward, refuse_untimed_roots
from ..graph.dag import Graph
from ..graph.meta import FsdpGraphUnit
from ..traces.events import CommKind, Kind
from ..traces.kineto_schema import dtype_bytes
from ..traces.run_schema import FSDP1_API, FSDP2_API, FSDP_ROOT
from ..units import KB, count
from .comm import current_topology, retime_collectives
from .fsdp_units import collective_nodes, without_nodes

UNMODELLED = {
    "bucket_mb": "--bucket-mb (FSDP has no gradient buckets: each unit is reduce-scattered after its backward)",
    "no_overlap": "--no-overlap",
    "scheme": "--scheme (FSDP's all-gathers and reduce-scatters are ring collectives here)",
    "partition": "--partition",
    "horovod": "--fusion-mb / --cycle-ms",
    "fine": "--fine",
}
# FSDP2's prefetch depth on CPU/gloo, as measured (``bench/fsdp_prefetch_rounds.py``, docs/evidence.md): what ``whatif
# --prefetch`` answers in its one line and why ``optimize`` does not search it. Every prefetch all-gather blocks the thread
# that issues it (``unshard_async_op`` is False unless set by FSDP2's private ``_set_unshard_async_op``), so a deeper
# prefetch only moves calls earlier on that thread: one all-gather is in flight at any depth and none overlaps compute.
PREFETCH_ON_GLOO = ("FSDP2's prefetch depth does not change a step on CPU/gloo: each all-gather blocks the thread that issues "
                    "it, one in flight at any depth (a depth-2 profile: 0.00 ms of its collectives overlap compute, as at depth 0); "
                    "measured on a 2-rank Conformer in 3 interleaved rounds, depth 1 / 2 against depth 0: +0.2 / +0.7 % of 1090 ms "
                    "at 200 Mbit/s (rounds' spread 3.2-3.6 %), +19 / +2 % of 304 ms at 1 Gbit/s (spread 14-23 %)")


def refuse_prefetch(g: Graph) -> None:
    """One line for ``whatif --prefetch`` on an FSDP graph: on gloo the profiled step is the answer (``PREFETCH_ON_GLOO``);
    on another backend (NCCL's all-gathers run on their own stream, beside compute) it is not modelled."""
    if not is_fsdp_graph(g):
        return
    backend = g.meta.fsdp.backend or "gloo"
    if backend == "gloo" and g.meta.fsdp.api == FSDP1_API:  # its knobs are others, its all-gathers block as FSDP2's
        raise DagprofError(f"FSDP1's forward_prefetch / backward_prefetch issue their all-gathers as FSDP2's prefetch does; "
                           f"{PREFETCH_ON_GLOO}: the profiled step is the answer, not replayed", "--prefetch")
    if backend == "gloo":
        raise DagprofError(f"{PREFETCH_ON_GLOO}: the profiled step is the answer, not replayed", "--prefetch")
    raise DagprofError(f"is not modelled for FSDP on {backend} yet (its all-gathers may run beside compute there; prefetch "
                       "was measured on gloo/CPU only, where the depth changes nothing)", "--prefetch")


def refuse_unmodelled(g: Graph, asked: list[str]) -> None:
    """One line naming the first what-if an FSDP graph cannot answer (``asked``: keys of ``UNMODELLED``)."""
    if is_fsdp_graph(g) and asked:
        raise DagprofError(f"this profile is an FSDP job; {UNMODELLED[asked[0]]} is not modelled for FSDP yet "
                           "(modelled: --bandwidth, --latency, --workers, --compute-speed, --reshard-after-forward, --reduce-dtype, --units)")


Reshard = bool | Mapping[str, bool]  # every unit's reshard_after_forward, or some units' by name (the others as profiled)


def default_reshard(unit: str) -> bool:
    """Whether ``unit`` reshards after forward under ``fully_shard``'s default (``reshard_after_forward=None``): torch
    2.13's lazy init keeps the root's parameters gathered (``FSDPState._lazy_init``: the root's backward would gather
    them again at once), every other unit reshards."""
    return unit != FSDP_ROOT


def resharded(u: FsdpGraphUnit, reshard: Reshard | None) -> bool:
    """Whether unit ``u`` reshards after forward under ``reshard`` (None: as it ran; a bool: every unit, the root too)."""
    if reshard is None:
        return u.resharded_after_forward
    return reshard if isinstance(reshard, bool) else reshard.get(u.name, u.resharded_after_forward)


_FORWARD_RESHARD = re.compile(r"^rank\d+\.fsdp reshard (.+) \(forward\)$")
_BACKWARD_RESHARD = re.compile(r"^rank\d+\.fsdp reshard (.+) \(backward\)$")  # after a backward, or the user's own reshard()
_COPY_OR_RESHARD = re.compile(r"fsdp (?:copy-out|reshard) .+ \((?:forward|backward)\)$")


def set_reshard(g: Graph, on: Reshard) -> Graph:
    """What if every unit's ``reshard_after_forward`` were ``on``, passed explicitly (the root's too: on gathers it again
    at backward's start where it was kept), or, given a mapping, each unit it names
    (``FSDPModule.set_reshard_after_forward(.., recurse=False)``)?"""
    refuse_untimed_roots(g, "--reshard-after-forward")  # several timed roots: each unit's as it ran (``still_gathered``)
    units = {u.name: u for u in g.meta.fsdp.units}
    if g.meta.fsdp.api == FSDP1_API:  # FSDP1 never frees its root after forward (``_post_forward_reshard``), FULL_SHARD or not
        on = {n: False if n == FSDP_ROOT else (on if isinstance(on, bool) else on.get(n, units[n].resharded_after_forward))
              for n in units}
    # True on a unit given reshard_after_forward=N: its backward all-gathers would move to its whole shard group
    refuse_post_forward(g, "--reshard-after-forward on", [n for n in units if on is True or (not isinstance(on, bool) and on.get(n) is True)])
    dur, gap = g.dur.copy(), g.gap.copy()
    drop = np.zeros(len(g), dtype=bool)
    in_pass = Passes(g)
    # indexed once, so each collective looks at its own unit's nodes and not the whole graph
    backward: dict[tuple[int, int], list[int]] = {}  # (step, layer) -> the ranks' backward ops
    by_name: dict[tuple[int, str], list[int]] = {}  # (step, "fsdp copy-out <unit> (<phase>)" or a reshard) -> nodes
    for v in np.flatnonzero((g.rank >= 0) & (g.kind == Kind.BACKWARD)).tolist():
        backward.setdefault((int(g.step[v]), int(g.layer[v])), []).append(v)
    suffix = {i: m.group(0) for i, name in enumerate(g.names) if (m := _COPY_OR_RESHARD.search(name))}
    for v in np.flatnonzero((g.rank >= 0) & np.isin(g.name, list(suffix))).tolist():
        by_name.setdefault((int(g.step[v]), suffix[int(g.name[v])]), []).append(v)

    def micro(v: int) -> int:
        return in_pass.at(int(g.rank[v]), int(g.step[v]), float(g.order[v]), after=True)[0]

    # (step, unit) -> micro-batches whose forward gathered it: a kept unit stays gathered until the step's last backward
    # (FSDP2 reshards after backward; ``set_reshard_after_backward(False)`` keeps it into the next micro-batch too), so
    # a forward all-gather serves every backward up to the next one's micro-batch
    gathered: dict[tuple[int, str], list[int]] = {}
    for c in fsdp_collectives(g):
        if c.kind == CommKind.ALL_GATHER and (at := in_pass.of_collective(c.node, min(issuers(g, c.node))))[1]:
            gathered.setdefault((int(g.step[c.node]), c.unit), []).append(at[0])
    now_kept = {n for n, u in units.items() if u.resharded_after_forward and not resharded(u, on)}
    again = still_gathered(g, now_kept)
    for c in fsdp_collectives(g):
        u = units.get(c.unit)
        if c.kind != CommKind.ALL_GATHER or u is None or u.resharded_after_forward == resharded(u, on):
            continue
        on_here = resharded(u, on)
        batch, forward = in_pass.of_collective(c.node, min(issuers(g, c.node)))
        step = int(g.step[c.node])
        if not on_here and not forward and (c.unit not in again.judged or c.node in again.backward):
            # the backward all-gather of a resharded unit: gone, with its joins and host ops
            drop[collective_nodes(g, c.node)] = True
            for r in issuers(g, c.node):
                drop[gather_host_nodes(g, c.node, r)[0]] = True
            drop[by_name.get((step, f"fsdp copy-out {c.unit} (backward)"), []) + by_name.get((step, f"fsdp reshard {c.unit} (forward)"), [])] = True
        elif on_here and forward:  # a kept unit gathered again before each backward it served: that backward starts later on every rank
            unit_layers = set(_unit_layers(g, c.unit))
            layers = {k for k, name in enumerate(g.layers) if name in unit_layers}
            on_step = np.array(sorted(v for k in layers for v in backward.get((step, k), [])), dtype=np.int64)
            copies = by_name.get((step, f"fsdp copy-out {c.unit} (forward)"), [])
            until = min((b for b in gathered[(step, c.unit)] if b > batch), default=np.inf)
            for r in np.unique(g.rank[on_step]).tolist():
                copy = [v for v in copies if int(g.rank[v]) == r and micro(v) == batch]
                issue, lagged = gather_host_nodes(g, c.node, r, path=False)
                cost = float(g.dur[c.node]) + sum(float(g.dur[v]) for v in copy + issue) + sum(float(g.gap[v]) for v in lagged)
                passes: dict[int, int] = {}  # micro-batch -> the unit's first backward op in it
                for v in on_step[g.rank[on_step] == r].tolist():
                    b = micro(v)
                    if batch <= b < until and (b not in passes or g.order[v] < g.order[passes[b]]):
                        passes[b] = v
                for first in passes.values():
                    dur[first] += cost
    for node, unit in again.forward:  # a forward's all-gather of a unit no backward resharded since: none
        drop[collective_nodes(g, node)] = True
        for r, issue in issuers(g, node).items():
            drop[gather_host_nodes(g, node, r, path=False)[0]] = True
            copy = [v for v in by_name.get((int(g.step[node]), f"fsdp copy-out {unit} (forward)"), [])
                    if int(g.rank[v]) == r and g.order[v] > g.order[issue]]
            drop[min(copy, key=lambda v: float(g.order[v]), default=[])] = True
    for (_, name), vs in by_name.items():  # a kept unit's reshard after forward returns at once (``FSDPParamGroup.reshard``)
        if name.startswith("fsdp reshard ") and name.endswith(" (forward)") and name[13:-10] in now_kept:
            drop[vs] = True
    fs = g.meta.fsdp
    meta = g.meta.replace(fsdp=dataclasses.replace(fs, units=[dataclasses.replace(u, resharded_after_forward=resharded(u, on)) for u in fs.units]))
    return without_nodes(g.replace(dur=dur, gap=gap, meta=meta), drop, g.nbytes, {})


@dataclasses.dataclass(frozen=True)
class Regathers:
    """``still_gathered``'s answer: the all-gathers that would find their kept unit gathered (forward: (node, unit);
    backward: nodes), among the units whose reshards the profile records (``judged``)."""

    forward: list[tuple[int, str]]
    backward: set[int]
    judged: set[str]


def still_gathered(g: Graph, kept: set[str]) -> Regathers:
    """The all-gathers (shared nodes) of the units ``kept`` gathered after forward that would find their unit still
    gathered: FSDP2 skips the all-gather of a unit already unsharded (``FSDPParamGroup.unshard``), and a kept unit is
    sharded again only by a post-backward or the user's own ``reshard()`` ("fsdp reshard U (backward)"). So a model run
    forward twice before its backward (a GAN's discriminator on real and fake samples, DINO's student per crop size)
    gathers once in forward and again in backward after its first branch's post-backward, and a forward-only root (an
    EMA teacher under ``no_grad``) never again. Read on the lowest rank in program order over the window, started from
    the state its end leaves (the steps repeat). FSDP1, or a unit whose reshards the profile does not record: not judged.
    Judged on jobs of several roots only: on 14 vendored single-root FSDP2 profiles it moves ``off`` (+2 to +12 %), which
    no measured job has judged yet (``roots62`` in docs/evidence.md)."""
    none = Regathers([], set(), set())
    if not kept or g.meta.fsdp.api != FSDP2_API or len({u.root for u in g.meta.fsdp.units}) < 2:
        return none
    events = []  # (order, unit, node): node >= 0 an all-gather, -1 the unit resharded after a backward
    for c in fsdp_collectives(g):
        if c.kind == CommKind.ALL_GATHER and c.unit in kept and (by_rank := issuers(g, c.node)):
            r, issue = min(by_rank.items())
            events.append((r, float(g.order[issue]), c.unit, c.node))
    if not events:
        return none
    r0 = min(e[0] for e in events)
    events = [e[1:] for e in events if e[0] == r0]
    for v in np.flatnonzero(g.rank == r0).tolist():
        if (m := _BACKWARD_RESHARD.search(g.node_name(v))) and m.group(1) in kept:
            events.append((float(g.order[v]), m.group(1), -1))
    judged = {unit for _, unit, node in events if node < 0} | {m.group(1) for name in g.names if (m := _FORWARD_RESHARD.search(name))}
    events = sorted(e for e in events if e[1] in judged)
    in_pass = Passes(g)
    gathered = {u: False for u in kept}
    out = Regathers([], set(), judged & kept)
    for lap in range(2):
        for _, unit, node in events:
            if node < 0:
                gathered[unit] = False
            elif not gathered[unit]:
                gathered[unit] = True
            elif lap and in_pass.of_collective(node, r0)[1]:
                out.forward.append((node, unit))
            elif lap:
                out.backward.add(node)
    return out


def gather_host_nodes(g: Graph, node: int, rank: int, path: bool = True) -> tuple[list[int], list[int]]:
    """``rank``'s host nodes that exist only because it called all-gather ``node``: (nodes whose time is the call's,
    nodes whose gap is): its enqueue(s), and its wait, whose gap is the exit lag from the transfer's first completion
    to the call's return. With ``path``, also the ``other:`` host time right before the enqueue in program order:
    in a backward, FSDP's unsharding path that issues it (the prefetching hook, the copy-in and its dtype cast;
    Kineto's ``FSDP::backward_prefetch`` and ``FSDP::all_gather`` spans hold it). A profile of the same job with
    ``reshard_after_forward=False`` (bench/review6/convnext_accum.py ``--keep-gathered``) has none of it: its units'
    backward ops touch, so no host time is left between them. Not used for a forward all-gather: there the
    ``other:`` time before it also holds the module's own code between units."""
    issue = [q for p in g.predecessors(node).tolist() for q in ([p] if g.kind[p] != Kind.SYNC else g.predecessors(p).tolist())
             if int(g.rank[q]) == rank and g.kind[q] == Kind.COMM_ENQUEUE]
    lagged = [v for v in g.successors(node).tolist() if int(g.rank[v]) == rank and g.kind[v] == Kind.COMM_WAIT]
    if path and issue:
        v = min(issue, key=lambda q: float(g.order[q]))
        other = f"rank{rank}.other:"
        while prev := [q for q in g.predecessors(v).tolist() if g.device[q] == g.device[v] and g.kind[q] == Kind.OTHER
                       and g.node_name(q).startswith(other)]:
            v = prev[0]
            issue.append(v)
    return issue, lagged


def set_reduce_dtype(g: Graph, dtype: str) -> Graph:
    """What if every unit reduced its gradients in ``dtype`` (``MixedPrecisionPolicy(reduce_dtype=...)``)?

    Each reduce-scatter (and HSDP's all-reduce across replicas) moves its unit's gradients in the reduce
    dtype, so its bytes scale by the ratio of element sizes to the profiled reduce dtype and the link prices
    it again. The casts around it (into the reduce dtype before, the shard back to the parameters' dtype
    after) keep their measured times: from an fp32 profile of fp32 parameters there are none, so their cost
    and gloo's summing in bf16 are not predicted. On the namespace testbed (``bench/bench_fsdp.py --part 5``,
    a loaded 2-core machine) a bf16 run's reduce-scatters took 0.47-0.68 of the fp32 run's in the same round.
    """
    size = dtype_bytes(dtype)
    was = {u.name: dtype_bytes(u.reduce_dtype or u.orig_dtype) for u in g.meta.fsdp.units}
    nbytes = g.nbytes.copy()
    for c in fsdp_collectives(g):
        if c.kind != CommKind.ALL_GATHER and was.get(c.unit):
            nbytes[c.node] = round(nbytes[c.node] * size / was[c.unit])
    fs = g.meta.fsdp
    meta = g.meta.replace(fsdp=dataclasses.replace(fs, units=[dataclasses.replace(u, reduce_dtype=dtype) for u in fs.units]))
    link = current_topology(g)  # the input's: a fit to the changed bytes would be no link
    return retime_collectives(g.replace(nbytes=nbytes, meta=meta), link, lags_on=link)


def _unit_layers(g: Graph, unit: str) -> list[str]:
    return next((u.layers for u in g.meta.fsdp.units if u.name == unit), [])


def reshard_change(before: Graph, after: Graph) -> str | None:
    """What ``set_reshard`` changed from ``before`` to ``after``, in words (None: nothing): the units now kept gathered
    after forward and the backward all-gathers removed with them (a step's count, gathered bytes and measured transfer
    time), the units now resharded and the all-gathers priced before their backward passes. So an explanation of a
    prediction names the change, not only the step time it gave."""
    was = {u.name: u.resharded_after_forward for u in before.meta.fsdp.units}
    now = {u.name: u.resharded_after_forward for u in after.meta.fsdp.units}
    kept = [n for n in now if was.get(n) and not now[n]]
    split = [n for n in now if now[n] and was.get(n) is False]
    steps = max(len(before.meta.steps), 1)
    left = {after.node_name(c.node) for c in fsdp_collectives(after)}
    gone = [c.node for c in fsdp_collectives(before) if c.kind == CommKind.ALL_GATHER and before.node_name(c.node) not in left]
    out = []
    if kept:
        out.append(f"keeps {', '.join(kept)} gathered after forward: {count(len(gone) / steps, 'backward all-gather')} a step removed "
                   f"({before.nbytes[gone].sum() / steps / KB:.1f} KB gathered, {before.dur[gone].sum() / steps / 1e3:.2f} ms of "
                   "transfer as profiled), with their copy-outs and the forward reshards")
    if split:
        ahead = [c.node for c in fsdp_collectives(before) if c.kind == CommKind.ALL_GATHER and c.unit in split]
        out.append(f"reshards {', '.join(split)} after forward: each backward pass gathers them again, priced as their forward "
                   f"all-gathers ({len(ahead) / steps:g} a step, {before.nbytes[ahead].sum() / steps / KB:.1f} KB gathered)")
    return "; ".join(out) or None
