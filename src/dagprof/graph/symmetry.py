"""Rank symmetry: data-parallel ranks that behave alike are simulated once.

Ranks run the same program, so their sub-graphs are isomorphic by construction:
rank r's nodes, taken in id order, have the same names once the "rank{r}" prefix
is dropped, the same kinds, the same (rank-private) devices, the same priority
order on each device and the same edges (among themselves and to the shared,
rank -1, collective nodes). ``fold_ranks`` keeps one representative per class of
such ranks whose durations agree within ``tol`` (or all of a structural class,
durations averaged, with ``average=True``) plus every shared node. A join (SYNC)
then waits for the representatives only -- exact, because the folded ranks would
have arrived at the same time. Collective costs stay those of the full group:
``meta.world_size`` keeps the original size, which is what prices collectives.

``expand(result, info)`` maps a replay of the folded graph back to every node of
the original graph. For symmetric ranks (``tol=0``) start/end equal a full replay
exactly; a join's gate names the last rank of the winning class (what the full
replay picks when tied ranks complete in id order).
Ranks joined by direct edges, or sharing a device with another rank, are never folded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from .dag import NODE_COLUMNS, Graph, csr_graph

_RANK_PREFIX = re.compile(r"^rank\d+(?!\d)", re.MULTILINE)


def _rank_free_ids(names: list[str]) -> np.ndarray:
    """Per name, an id shared by names equal once the "rank{r}" prefix is dropped ("rank12.fwd" ~ "rank3.fwd")."""
    if not names:
        return np.empty(0, dtype=np.int64)
    canon = _RANK_PREFIX.sub("rank", "\n".join(names)).split("\n")
    if len(canon) != len(names):  # a name holds a newline: join safely
        canon = _RANK_PREFIX.sub("rank", "\n".join(s.replace("\n", " ") for s in names)).split("\n")
    ids = {s: i for i, s in enumerate(dict.fromkeys(canon))}
    return np.fromiter(map(ids.__getitem__, canon), dtype=np.int64, count=len(canon))


@dataclass
class FoldInfo:
    """Which original ranks each representative stands for, and how nodes map."""

    n_original: int  # nodes of the original graph
    classes: dict[int, list[int]]  # representative rank -> member ranks (itself included), ascending
    node_map: np.ndarray  # original node -> folded node carrying its times
    # per representative: (members x nodes-per-rank) original node ids, row i = classes[rep][i]
    rank_nodes: dict[int, np.ndarray] = field(repr=False)
    folded_orig: np.ndarray = field(repr=False)  # folded node -> original node (the representative's or shared)
    world_size: int = 0  # the original group size, still in the folded graph's meta

    @property
    def folded(self) -> bool:
        return any(len(ms) > 1 for ms in self.classes.values())


def fold_ranks(g: Graph, tol: float = 0.0, average: bool = False) -> tuple[Graph, FoldInfo]:
    """Fold alike ranks into one representative each; see the module docstring.

    ``tol``: relative difference allowed between a member's and its representative's
    dur and gap, node by node (0: identical). ``average``: fold every structurally
    identical rank regardless of durations; the representative gets the members' means.
    """
    per_rank = _nodes_by_rank(g)
    world = int(g.meta.world_size or (max(per_rank) + 1 if per_rank else 0))
    keys = _structure_keys(g, per_rank)
    structural: dict[bytes, list[int]] = {}
    for r in per_rank:
        structural.setdefault(keys[r], []).append(r)
    classes: dict[int, list[int]] = {}
    dur, gap = g.dur.copy(), g.gap.copy()
    for key, members in structural.items():
        if not key:  # unfoldable rank
            classes.update({r: [r] for r in members})
            continue
        nodes = np.stack([per_rank[r] for r in members])
        if average:
            classes[members[0]] = members
            dur[nodes[0]] = g.dur[nodes].mean(axis=0)
            gap[nodes[0]] = g.gap[nodes].mean(axis=0)
            continue
        todo = np.arange(len(members))
        while len(todo):  # the lowest remaining rank represents every remaining rank close to it
            rep = todo[0]
            close = _close(g.dur[nodes[todo]], g.dur[nodes[rep]], tol) & _close(g.gap[nodes[todo]], g.gap[nodes[rep]], tol)
            classes[members[rep]] = [members[i] for i in todo[close]]
            todo = todo[~close]
    classes = dict(sorted(classes.items()))
    keep = g.rank < 0
    for rep in classes:
        keep[per_rank[rep]] = True
    folded = _subgraph(g.replace(dur=dur, gap=gap), keep)
    folded.meta = g.meta.replace(world_size=world, folded_ranks={str(k): v for k, v in classes.items()})
    remap = np.full(len(g), -1, dtype=np.int64)
    remap[keep] = np.arange(int(keep.sum()))
    node_map = remap.copy()
    rank_nodes = {}
    for rep, members in classes.items():
        mat = np.stack([per_rank[m] for m in members])
        node_map[mat] = remap[per_rank[rep]][None, :]
        rank_nodes[rep] = mat
    info = FoldInfo(len(g), classes, node_map, rank_nodes, np.flatnonzero(keep), world)
    return folded, info


def expand(result, info: FoldInfo):
    """A replay result (``ReplayResult``) of the folded graph mapped onto every original node."""
    node_map = info.node_map
    # a folded gate means: a shared node -> itself; a representative's node at position j -> for a
    # member's own node, the member's node at j; for a shared node, the last member's (latest id:
    # the one a join of tied ranks sees last)
    target = info.folded_orig.copy()
    pos = np.full(info.n_original, -1, dtype=np.int64)  # position in its rank, for rank nodes of a class
    row = np.full(info.n_original, -1, dtype=np.int64)  # member row in its class
    for mat in info.rank_nodes.values():
        pos[mat] = np.arange(mat.shape[1])[None, :]
        row[mat] = np.arange(mat.shape[0])[:, None]
        target[node_map[mat[0]]] = mat.max(axis=0)
    fg = result.gate[node_map]
    gate = np.where(fg >= 0, target[np.maximum(fg, 0)], -1)
    g_rep = info.folded_orig[np.maximum(fg, 0)]  # the representative's node that gated
    for mat in info.rank_nodes.values():
        members = mat.ravel()
        mine = members[(fg[members] >= 0) & np.isin(g_rep[members], mat[0])]
        gate[mine] = mat[row[mine], pos[g_rep[mine]]]
    return replace(result, start=result.start[node_map], end=result.end[node_map], gate=gate)


def _nodes_by_rank(g: Graph) -> dict[int, np.ndarray]:
    """Rank -> its node ids, ascending."""
    idx = np.flatnonzero(g.rank >= 0)
    idx = idx[np.argsort(g.rank[idx], kind="stable")]
    ranks, first = np.unique(g.rank[idx], return_index=True)
    return {int(r): part for r, part in zip(ranks, np.split(idx, first[1:]))}


def _close(rows: np.ndarray, ref: np.ndarray, tol: float) -> np.ndarray:
    """Per row: every value within ``tol`` (relative) of ``ref``."""
    return np.all(np.abs(rows - ref) <= tol * np.maximum(np.abs(rows), np.abs(ref)), axis=1)


def _structure_keys(g: Graph, per_rank: dict[int, np.ndarray]) -> dict[int, bytes]:
    """Per rank, bytes equal for ranks with isomorphic sub-graphs (b"" for a rank that must not fold)."""
    n = len(g)
    name_key = _rank_free_ids(g.names)
    dev_key = np.r_[_rank_free_ids([d.name for d in g.devices]), -1]  # index -1: no device
    local = np.full(n, -1, dtype=np.int64)
    for nodes in per_rank.values():
        local[nodes] = np.arange(len(nodes))
    # priority position of each node among its rank's nodes on its device
    idx = np.flatnonzero(g.rank >= 0)
    srt = idx[np.lexsort((idx, g.order[idx], g.device[idx], g.rank[idx]))]
    grp = g.rank[srt].astype(np.int64) * (len(g.devices) + 1) + g.device[srt]
    first = np.r_[0, np.flatnonzero(np.diff(grp)) + 1]
    prio = np.empty(n, dtype=np.int64)
    prio[srt] = np.arange(len(srt)) - np.repeat(first, np.diff(np.r_[first, len(srt)]))
    # ranks that must stay: direct cross-rank edges, devices shared with other ranks or shared nodes
    src = np.repeat(np.arange(n), np.diff(g.indptr))
    dst = g.succ.astype(np.int64)
    rs, rd = g.rank[src], g.rank[dst]
    bad = set(np.unique(np.r_[rs[(rs >= 0) & (rd >= 0) & (rs != rd)], rd[(rs >= 0) & (rd >= 0) & (rs != rd)]]).tolist())
    on_dev = g.device >= 0
    pairs = np.unique(g.device[on_dev].astype(np.int64) * (n + 1) + g.rank[on_dev] + 1)  # (device, rank) in use
    dev_of = pairs // (n + 1)
    mixed = np.bincount(dev_of, minlength=len(g.devices)) > 1
    bad |= set((pairs[mixed[dev_of]] % (n + 1) - 1).tolist()) - {-1}
    # edges touching a rank, endpoints encoded rank-independently
    enc = np.where(g.rank >= 0, local, -(np.arange(n) + 1))
    owner = np.where(rs >= 0, rs, rd)
    m = owner >= 0
    e_owner, e_src, e_dst = owner[m], enc[src[m]], enc[dst[m]]
    o = np.lexsort((e_dst, e_src, e_owner))
    e_owner, e_src, e_dst = e_owner[o], e_src[o], e_dst[o]
    bounds = np.searchsorted(e_owner, np.array(sorted(per_rank) + [np.iinfo(np.int64).max]))
    keys = {}
    for i, r in enumerate(sorted(per_rank)):
        if r in bad:
            keys[r] = b""
            continue
        v = per_rank[r]
        a, b = bounds[i], bounds[i + 1]
        keys[r] = b"".join(x.tobytes() for x in (
            np.int64(len(v)), name_key[g.name[v]], g.kind[v].astype(np.int64), dev_key[g.device[v]], prio[v],
            e_src[a:b], e_dst[a:b]))
    return keys


def _subgraph(g: Graph, keep: np.ndarray) -> Graph:
    """The nodes in ``keep`` (ids in the same relative order) and the edges among them."""
    remap = np.full(len(g), -1, dtype=np.int64)
    remap[keep] = np.arange(int(keep.sum()))
    src = remap[np.repeat(np.arange(len(g)), np.diff(g.indptr))]
    dst = remap[g.succ]
    ok = (src >= 0) & (dst >= 0)
    return csr_graph(int(keep.sum()), src[ok], dst[ok], names=g.names, devices=g.devices, layers=g.layers,
                     meta=g.meta.copy(), ready_spread=g.ready_spread.renumbered(remap), **{c: getattr(g, c)[keep] for c in NODE_COLUMNS})
