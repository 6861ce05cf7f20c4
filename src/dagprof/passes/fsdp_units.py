"""Unit granularity of an FSDP job (``whatif --units``): which modules are units, coarser than profiled.

A merged unit is one ``fully_shard`` over adjacent profiled units: it gathers all their parameters at once and
reduce-scatters all their gradients at once. On the graph, per step, micro-batch (gradient accumulation) and pass:
- its forward all-gather is the first member's (where the first member's was issued), carrying every member's bytes;
- its backward all-gather (a resharded unit's) is the one of the member whose backward runs first (the last in
  forward order), carrying every member's bytes;
- its reduce-scatter (and HSDP's all-reduce across replicas) is the one after the member whose backward runs last
  (the first in forward order): FSDP reduces a unit's gradients after its whole backward;
- the other members' collectives, with their enqueue and wait on every rank, are removed (program order bridges them);
- members merged into a root that keeps its parameters after forward (FSDP1's root) keep theirs too: their backward
  all-gathers go, and their reshards and backward copy-outs cost nothing (``passes.fsdp.set_reshard``).
Copy-outs and reshards keep their measured times (the same bytes are copied and freed) and take the merged unit's
name. The link model prices the merged collectives again (``passes.comm.retime_collectives``): one message's latency
instead of several is what makes fewer, larger units cheaper. The memory model (``search.fsdp_memory.fsdp_peak``) reads
the merged units from ``meta.fsdp``: a merged unit gathers more at once, so the peak rises.

Grammar (``parse_units``): ``merge:N`` groups every N adjacent inner units (the root's stay its own), ``merge:all``
makes the whole model one unit (``fully_shard`` on the root only), ``A+B/C+D`` names the groups (units not named
stay alone; each group adjacent in forward order; the root may join any group). Units finer than profiled
(``split:...``) are refused: the profile has no collectives per layer to place.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..errors import DagprofError
from ..graph.build_fsdp import Passes, fsdp_collectives, is_fsdp_graph, issuers, refuse_post_forward, refuse_untimed_roots
from ..graph.dag import Graph, GraphBuilder
from ..graph.meta import FsdpGraphUnit
from ..traces.events import CommKind, Kind
from .comm import current_topology, retime_collectives

_MERGE = re.compile(r"merge:(all|[1-9][0-9]*)")


def parse_units(text: str) -> str:
    """Check the grammar of a ``--units`` value (the units it names are checked against the profile)."""
    if _MERGE.fullmatch(text):
        return text
    if text.startswith("split"):
        raise ValueError("units finer than profiled are not modelled (the profile has no per-layer collectives to place); "
                         "merge:N, merge:all or A+B/C+D")
    groups = [grp.split("+") for grp in text.split("/")]
    if not text or text.startswith("merge:") or any(not name for grp in groups for name in grp):
        raise ValueError(f"expected merge:N, merge:all or groups of unit names like blocks.0+blocks.1/blocks.2+blocks.3, got {text!r}")
    return text


def unit_groups(g: Graph, spec: str) -> list[list[str]]:
    """The profiled units in groups (each in forward order; singletons stay), in the order of ``meta.fsdp.units``. On a
    job of several ``fully_shard`` roots each root's units are grouped within it (``merge:all``: one unit a root); a
    named group across roots is refused: one ``fully_shard`` call cannot take modules of two models."""
    if not is_fsdp_graph(g):
        raise DagprofError("--units is an FSDP what-if; this profile is not an FSDP job")
    refuse_untimed_roots(g, f"--units {spec}")
    units = g.meta.fsdp.units
    names = [u.name for u in units]
    root_of = {u.name: u.root for u in units}
    inner = {r: [u.name for u in units if u.root == r and not u.is_root] for r in sorted(set(root_of.values()))}
    m = _MERGE.fullmatch(spec)
    if m and m.group(1) == "all":
        groups = [[n for n in names if root_of[n] == r] for r in inner]
    elif m:
        k = int(m.group(1))
        groups = [[u.name] for u in units if u.is_root] + [ns[i:i + k] for ns in inner.values() for i in range(0, len(ns), k)]
    else:
        asked = [grp.split("+") for grp in spec.split("/")]
        flat = [n for grp in asked for n in grp]
        unknown = [n for n in flat if n not in names]
        if unknown:
            raise DagprofError(f"--units {spec}: no unit {unknown[0]!r} in this profile (units: {', '.join(names)})")
        if len(set(flat)) != len(flat):
            raise DagprofError(f"--units {spec}: a unit is named twice")
        for grp in asked:
            if len({root_of[n] for n in grp}) > 1:
                raise DagprofError(f"--units {spec}: {'+'.join(grp)} joins units of two fully_shard roots (two models); "
                                   "units merge within their own root only")
            ns = inner[root_of[grp[0]]]
            pos = sorted(ns.index(n) for n in grp if n in ns)
            if pos and pos != list(range(pos[0], pos[0] + len(pos))):
                raise DagprofError(f"--units {spec}: {'+'.join(grp)} are not adjacent in forward order ({', '.join(ns)})")
        groups = [sorted(grp, key=names.index) for grp in asked] + [[n] for n in names if n not in flat]
    return sorted(groups, key=lambda grp: names.index(grp[0]))


def group_name(members: list[FsdpGraphUnit]) -> str:
    """A merged unit's name: its root unit's where one is a member (the memory model treats a root apart), else the
    members' joined by ", ", as FSDP names a unit of several modules (``fully_shard([a, b])``) and the profile records it."""
    return next((u.name for u in members if u.is_root), ", ".join(u.name for u in members))


def merged_units(g: Graph, groups: list[list[str]]) -> list[FsdpGraphUnit]:
    """``meta.fsdp.units`` after merging ``groups``; refused where members reshard after forward differently."""
    by = {u.name: u for u in g.meta.fsdp.units}
    out = []
    for grp in groups:
        us = [by[n] for n in grp]
        root = next((u for u in us if u.is_root), None)
        if len({u.resharded_after_forward for u in us}) > 1 and not (root is not None and not root.resharded_after_forward):
            kept = [u.name for u in us if not u.resharded_after_forward]
            raise DagprofError(f"--units: {'+'.join(grp)} mixes units that reshard after forward and units that keep their "
                               f"parameters ({', '.join(kept)}); merging those is not modelled")
        if len({(u.param_dtype, u.reduce_dtype, tuple(u.mesh)) for u in us}) > 1:
            raise DagprofError(f"--units: {'+'.join(grp)} mixes units of other dtypes or meshes; merging those is not modelled")
        first = root if root is not None else us[0]
        layers = [name for u in us for name in u.layers]
        out.append(dataclasses.replace(first, name=group_name(us), numel=sum(u.numel for u in us),
                                       shard_bytes=sum(u.shard_bytes for u in us), layers=layers, tensors=sum(u.tensors for u in us),
                                       frozen_numel=sum(u.frozen_numel for u in us), frozen_tensors=sum(u.frozen_tensors for u in us)))
    return out


def with_units(g: Graph, spec: str) -> Graph:
    """``g`` with the merged units in ``meta.fsdp`` only (what the memory model reads)."""
    fs = g.meta.fsdp
    return g.replace(meta=g.meta.replace(fsdp=dataclasses.replace(fs, units=merged_units(g, unit_groups(g, spec)))))


def merge_units(g: Graph, spec: str) -> Graph:
    """What if the units of ``spec`` (``parse_units``) were merged: one all-gather per pass and one reduce-scatter each."""
    groups = unit_groups(g, spec)
    if all(len(grp) == 1 for grp in groups):
        return g
    refuse_post_forward(g, f"--units {spec}", [n for grp in groups if len(grp) > 1 for n in grp])
    units = merged_units(g, groups)
    by = {u.name: u for u in g.meta.fsdp.units}
    group_of = {n: group_name([by[m] for m in grp]) for grp in groups for n in grp}
    merged = {n for grp in groups if len(grp) > 1 for n in grp}
    # members that resharded, merged into a root that kept its parameters after forward, keep them too: no backward all-gather
    now_kept = {u.name for u in g.meta.fsdp.units if u.name in merged and u.resharded_after_forward
                and not next(m for m in units if m.name == group_of[u.name]).resharded_after_forward}
    nbytes, dur = g.nbytes.copy(), g.dur.copy()
    drop = np.zeros(len(g), dtype=bool)
    rename: dict[int, str] = {}
    buckets: dict[tuple, list] = {}
    in_pass = Passes(g)
    for c in fsdp_collectives(g):
        if c.unit not in merged:
            if c.prefetched_by in merged:  # prefetched by a member: by the merged unit's hook now
                rename[c.node] = f"{c.kind.label} {c.unit} (prefetched by {group_of[c.prefetched_by]}).{g.node_name(c.node).rpartition('.')[2]}"
            continue
        by_rank = issuers(g, c.node)
        micro, forward = in_pass.of_collective(c.node, min(by_rank))  # per micro-batch under gradient accumulation
        phase = forward if c.kind == CommKind.ALL_GATHER else None
        if phase is False and c.unit in now_kept:
            drop[collective_nodes(g, c.node)] = True
            continue
        key = (int(g.step[c.node]), micro, c.kind, phase, frozenset(by_rank), group_of[c.unit])
        buckets.setdefault(key, []).append((float(g.order[by_rank[min(by_rank)]]), c))
    for (_, _, kind, _, _, name), members in buckets.items():
        members.sort(key=lambda m: m[0])
        keep = members[0][1] if kind == CommKind.ALL_GATHER else members[-1][1]  # gathered before the first, reduced after the last
        nbytes[keep.node] = sum(int(g.nbytes[c.node]) for _, c in members)
        by = group_of.get(keep.prefetched_by, keep.prefetched_by)
        seq = g.node_name(keep.node).rpartition(".")[2]
        rename[keep.node] = f"{kind.label} {name}" + (f" (prefetched by {by})" if keep.prefetched and by != name else "") + f".{seq}"
        for _, c in members:
            if c is not keep:
                drop[collective_nodes(g, c.node)] = True
    names = [g.node_name(v) for v in range(len(g))]
    for v in np.flatnonzero(g.rank >= 0).tolist():  # enqueues, waits, copy-outs and reshards of the members: the merged unit's
        head, unit, tail = _rank_op_unit(names[v])
        if unit in merged and not drop[v]:
            rename[v] = f"{head}{group_of[unit]}{tail}"
            if unit in now_kept and (head.endswith("fsdp copy-out ") and tail == " (backward)" or head.endswith("fsdp reshard ") and tail == " (forward)"):
                dur[v] = 0.0  # as passes.fsdp.set_reshard does for a unit that keeps its parameters
    out = without_nodes(g.replace(dur=dur), drop, nbytes, rename)
    out = out.replace(meta=out.meta.replace(fsdp=dataclasses.replace(out.meta.fsdp, units=units)))
    link = current_topology(g)  # the input's: a fit to the merged collectives would be no link
    return retime_collectives(out, link, lags_on=link)


_RANK_OP = re.compile(r"(rank\d+\.(?:fsdp (?:all_gather|reduce_scatter|all_reduce|copy-out|reshard)|wait (?:all_gather|reduce_scatter|all_reduce)) )"
                      r"(.+?)((?: \(prefetched by .+\))?(?: \((?:forward|backward)\))?)")


def _rank_op_unit(name: str) -> tuple[str, str, str]:
    m = _RANK_OP.fullmatch(name)
    return m.groups() if m else ("", "", "")


def collective_nodes(g: Graph, node: int) -> list[int]:
    """A shared collective, its join and, on each rank, its enqueue and its wait."""
    out = [node] + [int(p) for p in g.predecessors(node).tolist() if g.kind[p] == Kind.SYNC]
    for w in g.successors(node).tolist():
        if int(g.rank[w]) >= 0:
            out.append(int(w))
            out += [q for p in g.predecessors(w).tolist() if int(g.rank[p]) == int(g.rank[w]) and g.kind[p] == Kind.COMM_ENQUEUE
                    for q in enqueue_pieces(g, int(p))]
    return out


def enqueue_pieces(g: Graph, e: int) -> list[int]:
    """A rank's enqueue ``e`` (the piece its wait follows) and the earlier pieces of the same call, latest first: the build
    cuts a call where a flow leaves it inside (``graph.pieces``: a join at the transfer's start, where the transfer starts
    before the call returns)."""
    out = [e]
    while (p := next((int(p) for p in g.predecessors(out[-1]).tolist() if is_cut_piece(g, int(p), out[-1])), -1)) >= 0:
        out.append(p)
    return out


def is_cut_piece(g: Graph, p: int, e: int) -> bool:
    """Whether enqueue piece ``p`` is cut from the same call as ``e`` after it: same rank and name, no wait of its own."""
    r = int(g.rank[p])
    return (g.kind[p] == g.kind[e] == Kind.COMM_ENQUEUE and r == int(g.rank[e]) and g.name[p] == g.name[e]
            and not any(g.kind[v] == Kind.COMM_WAIT and int(g.rank[v]) == r for v in g.successors(p).tolist()))


def without_nodes(g: Graph, drop: np.ndarray, nbytes: np.ndarray, rename: dict[int, str]) -> Graph:
    """``g`` less the ``drop`` nodes, each rank's program order bridged across its removed ops."""
    src, dst = [], []
    for v in np.flatnonzero(drop & (g.rank >= 0)).tolist():
        r = int(g.rank[v])
        if any(drop[p] and int(g.rank[p]) == r for p in g.predecessors(v).tolist()):
            continue  # bridged from the first removed op of its run
        run, frontier, after = {v}, [v], set()
        while frontier:
            for w in g.successors(frontier.pop()).tolist():
                if int(g.rank[w]) != r or w in run:
                    continue
                if drop[w]:
                    run.add(w)
                    frontier.append(w)
                else:
                    after.add(w)
        before = {int(p) for u in run for p in g.predecessors(u).tolist() if int(g.rank[p]) == r and not drop[p]}
        src += [p for p in before for _ in after]
        dst += [w for _ in before for w in after]
    b, remap = GraphBuilder.from_graph(g.replace(nbytes=nbytes), ~drop)
    b.add_edges(remap[np.asarray(src, dtype=np.int64)], remap[np.asarray(dst, dtype=np.int64)])
    for v, new in rename.items():
        b._cols["name"][int(remap[v])] = b.intern(new)
    return b.build()
