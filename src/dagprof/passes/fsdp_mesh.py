"""The HSDP layout of an FSDP2 job (``whatif --mesh RxS``): R replicas of S shards, from a plain FSDP2 profile (1xN) or an
HSDP one, as FSDP2 runs it on the 2-D mesh ``init_device_mesh(.., (R, S), ("replicate", "shard"))`` (rank r in shard group
r // S, replicate group r % S).

Per step, micro-batch and unit, each rank's collectives are those of its layout (checked against real recordings of the
target layout, ``tests/test_fsdp_mesh.py``):
- every all-gather and reduce-scatter runs on the rank's shard group, with the unit's gathered (unsharded) bytes, priced
  on S ranks (``graph.build_fsdp.allreduce_equivalent_bytes``: a ring on S ranks moves (S-1)/S of them per link);
- after each reduce-scatter, HSDP all-reduces the reduce-scattered shard (1/S of those bytes) across the rank's
  replicate group, priced on R ranks; gloo on CPU blocks the training thread on both, so the all-reduce is an enqueue
  and a wait in the rank's program order after the reduce-scatter's wait. A new all-reduce's wait keeps the release
  overhead that rank's reduce-scatter wait measured, its join the reduce-scatter's wait for the late rank, and its
  transfer the reduce-scatter's gap and exit lag (the same blocking gloo call from the same hook); from R > 1 to R = 1
  the all-reduces go and program order bridges them. A 1xS profile on a 2-D mesh (replicate degree 1) already
  all-reduces each shard, on one rank: those are regrouped, none added;
- the waits follow the group, from the profile's measured times (``_Waits``). An averaged join waits for its late rank
  what the ranks' turns at arriving last cost (``passes.average_steps``: a mean of maxima exceeds the maximum of means),
  so a join of a new group adds what the measured steps say its ranks lose beyond what the profiled groups lost: of each
  rank's time from its last release to its arrival, the mean of the group's per-step maxima less the maximum of its
  means, averaged over the kind's calls (one call's few steps are noise; a per-step graph's joins, which wait for each
  step's own arrivals, get none). A rank's release (its wait's overhead behind the first rank out, which grows with the
  ring) is taken behind the first of its new group's ranks out of the same profiled transfer; where the new group holds
  the rank's whole profiled group (a ring merged from several) it stays as profiled: the profile does not measure that
  ring's spread. On the kept testbed runs (1 Gbit/s, load 1.4-8) 4-rank joins waited 2.2-2.6 ms and released 3.0-3.2 ms
  after the first rank out, 2-rank ones 1.3-1.5 and 0.9-2.2. Without measured times (a graph a pass changed) both stay
  as profiled, with a warning; ``merged_rings_note`` says in one line where a new ring holds whole profiled groups;
- a ring's transfer runs from its last rank's arrival, and while that rank was late the ring's other links moved their
  first segments (gloo's rendezvous and two messages in flight, ``costmodel.gloo_ring``): on the 200 Mbit/s testbed a
  6-rank all-gather took 1.17x a 3-rank one against 1.25x from the bytes per link, each within -0.1 to +3.3 ms of the ring
  replayed from its measured arrivals. So each new ring's wire time (its kind's time per byte in the profile's link)
  is scaled by what the ranks' measured arrivals hide of it over what they hid of the profiled groups' (which the
  fitted link carries), per kind;
- the optimizer steps the rank's 1/S shards (``step_scale``), and the memory model reads the new shards
  from ``meta.fsdp`` (``with_mesh``).
More ranks than profiled are copies of profiled ones (rank r copies r mod N0, as ``passes.workers``). FSDP pads each
tensor's dim 0 to a multiple of S (at most S-1 rows a tensor, shapes not recorded): the gathered bytes stay as profiled.
FSDP1 profiles are refused (its sharding strategy is fixed at wrap time).

``--workers`` (``scale_fsdp_workers``), the shard degree of plain FSDP; on an HSDP profile the replicate degree
(``set_mesh``): each collective still moves
its unit's whole parameters or gradients, priced for N ranks, and the optimizer step, which
updates this rank's shards only, takes what a step of a fixed cost per tensor and a cost per byte of the shards
(``costmodel.fsdp_costs.StepFit``) takes at the new shards over the profiled ones: with FSDP2's costs measured on the
machine (``dagprof calibrate --fsdp``) the measured step on DTensor shards, else the profile's own, split by its Kineto
ops (``graph.build_fsdp.profiled_step``: the ops DTensor's dispatch ran on the local shards per byte, the rest per
tensor), else (no Kineto, FSDP2 on a CPU) as torch's DTensor step measured for its version splits it
(``costmodel.fsdp_costs.DTENSOR_STEP``), else N0/N of its time; each with a note. That step has a fixed cost per tensor that sharding does not divide (about
125 us per tensor on the 2-core machine in twelve calibrations, against 0.75 ns per byte): the testbed job of 19
tensors and 5 MiB (``bench/bench_fsdp.py --part 2``) steps 0.76-0.78 of its 2-rank time on 4 ranks, not 0.5 (its own
2-rank Kineto profile, load 6, splits its step into 175 us a tensor, the profiler's cost in it, and 0.67 ns a byte:
0.83), and
in two 4-rank profiles beside two 2-rank ones (1 Gbit/s, load 3.4-5.4) its step took 10-17 ms per rank, on the
2 shared cores, against 6.7-7.0 on 2 ranks.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from ..costmodel.fsdp_costs import DTENSOR_STEP, FsdpCosts, StepFit
from ..costmodel.gloo_ring import head_start
from ..costmodel.topology import Topology
from ..errors import DagprofError
from ..graph.build_fsdp import check_post_forward_workers, fsdp_collectives, is_fsdp_graph, issuers, mesh_of, refuse_post_forward, step_size
from ..graph.dag import DeviceKind, Graph, GraphBuilder
from ..graph.meta import FsdpRecord
from ..graph.provenance import provenance
from ..traces.events import CommKind, CommRole, Kind
from ..traces.parallelism import Dim, GroupLabel
from ..traces.run_schema import FSDP2_API
from .comm import carried_own_time, current_topology, retime_collectives
from .fsdp_units import collective_nodes, enqueue_pieces, is_cut_piece, without_nodes
from .link_fit import graph_world_size, hybrid
from .workers import _copy_ranks, data_parallel_degree, scale_workers

_MESH = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)")
_OP = re.compile(r"(?:rank\d+\.)?fsdp (all_gather|reduce_scatter|all_reduce) (.+)")


@dataclass(frozen=True)
class _Call:
    """An FSDP call of a unit: its collective's kind (the transfer's ``comm_kind``) and the unit."""

    kind: CommKind
    unit: str

    @property
    def label(self) -> str:
        """Its nodes' name: ``all_gather blocks.0``."""
        return f"{self.kind.label} {self.unit}"


def parse_mesh(text: str) -> tuple[int, int]:
    """``RxS`` (replicate x shard), e.g. 2x2 or 1x4."""
    m = _MESH.fullmatch(text.strip())
    if not m:
        raise ValueError(f"expected RxS (replicate x shard ranks), e.g. 2x2 or 1x4, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _shard_groups(replicate: int, shard: int) -> list[list[int]]:
    return [[q * shard + i for i in range(shard)] for q in range(replicate)]


def _replicate_groups(replicate: int, shard: int) -> list[list[int]]:
    return [[q * shard + i for q in range(replicate)] for i in range(shard)]


def with_mesh(g: Graph, replicate: int, shard: int) -> Graph:
    """``g`` with ``meta.fsdp`` of the (``replicate``, ``shard``) layout only: each unit's mesh and shard, each rank's shards
    (a new rank's those of the rank it copies), what the memory model reads."""
    fs = g.meta.fsdp
    r0, s0 = mesh_of(g)
    world, w0 = replicate * shard, r0 * s0
    mesh, dims = ([replicate, shard], ["replicate", "shard"]) if replicate > 1 else ([shard], [])
    units = [dataclasses.replace(u, mesh=list(mesh), mesh_dims=list(dims), shard_bytes=round(u.shard_bytes * s0 / shard)) for u in fs.units]
    scale = s0 / shard
    memory = {r: dataclasses.replace(m, param_shard_bytes=round(m.param_shard_bytes * scale), grad_shard_bytes=round(m.grad_shard_bytes * scale),
                                     optim_state_bytes=round(m.optim_state_bytes * scale))
              for r in range(world) if (m := fs.memory.get(r % w0)) is not None}
    record: FsdpRecord = dataclasses.replace(fs, units=units, memory=memory, world_size=world)
    return g.replace(meta=g.meta.replace(fsdp=record))


def set_mesh(g: Graph, replicate: int, shard: int, costs: FsdpCosts | None = None, asked: str | None = None) -> Graph:
    """What if the FSDP2 job ran as ``replicate`` x ``shard`` (HSDP; 1 x N: plain FSDP), the same batch per rank?
    ``costs`` (``dagprof calibrate --fsdp``): the optimizer step by the measured DTensor step, else by the profile's own (``step_scale``).
    ``asked``: the flag as the user gave it, which a refusal names (``--workers 8`` reaches here too); else ``--mesh RxS``."""
    flag = asked or f"--mesh {replicate}x{shard}"
    if not is_fsdp_graph(g):
        raise DagprofError("--mesh is an FSDP what-if; this profile is not an FSDP job")
    if (replicate, shard) != mesh_of(g):
        refuse_post_forward(g, flag)
    if g.meta.fsdp.api != FSDP2_API:
        raise DagprofError("--mesh is modelled for FSDP2 (fully_shard) profiles; FSDP1 fixes its sharding strategy at wrap time")
    if len({tuple(u.mesh) for u in g.meta.fsdp.units}) > 1:
        raise DagprofError(f"{asked or '--mesh'}: this profile's units are on different meshes; not modelled")
    r0, s0 = mesh_of(g)
    if shard < 2 and replicate > 1:  # --data-parallel refuses an HSDP profile: sent there, its user met a second refusal
        hint = ("--data-parallel ddp answers replication" if r0 == 1 else
                "--data-parallel ddp answers replication from a plain FSDP profile (1xN), not from this HSDP one")
        raise DagprofError(f"{flag}: a shard dimension of one rank (replication only) is not modelled; {hint}")
    w0, world = graph_world_size(g), replicate * shard
    if hybrid(g) and g.world_size == w0 and r0 * s0 < w0:  # FSDP over the dp sub-mesh beside TP/PP (tp_fresh/mixer_dp_tp.py)
        raise DagprofError(f"{asked or '--mesh'}: this job shards over {r0 * s0} of its {w0} ranks beside another dimension (TP/PP/EP: "
                           f"{w0 // (r0 * s0)} ranks per data-parallel replica); the HSDP layout of a hybrid job is not modelled "
                           "(--workers scales its data-parallel degree)")
    if g.world_size != w0 or r0 * s0 != w0:
        raise DagprofError(f"{asked or '--mesh'}: the graph holds {g.world_size} of {w0} ranks (mesh {r0}x{s0}); give it the unfolded profile")
    if (replicate, shard) == (r0, s0):
        return g
    src = g if world == w0 else _copy_ranks(g, np.arange(world) % w0)
    own = carried_own_time(g)
    if src is not g:  # the shared collectives kept once, first, in their order (``_copy_ranks``)
        own = np.concatenate([own[g.rank < 0], np.zeros(len(src) - int((g.rank < 0).sum()))])
    if replicate == 1 and r0 > 1:  # no replicas: FSDP's all-reduces go (the job's own stay), program order bridged
        drop = np.zeros(len(src), dtype=bool)
        for v in np.flatnonzero((src.kind == Kind.COMM) & (src.rank < 0)).tolist():
            if src.comm_kind[v] == CommKind.ALL_REDUCE and src.role[v] != CommRole.JOB:
                drop[collective_nodes(src, v)] = True
        src, own = without_nodes(src, drop, src.nbytes, {}), own[~drop]
    waits = _Waits.of(g)  # a 1xS profile on a 2-D mesh has its all-reduces already (module docstring)
    add_all_reduce = replicate > 1 and r0 == 1 and not any(c.kind == CommKind.ALL_REDUCE for c in fsdp_collectives(g))
    out, rings, own = _regroup(src, replicate, shard, add_all_reduce=add_all_reduce, waits=waits, own=own)
    if waits is None and (shard != s0 or add_all_reduce):  # else copies of the profiled groups: they wait as those did
        out.meta.warnings.append(f"--mesh: no measured arrivals in this graph (a pass changed it since the profile): "
                                 f"{len(fsdp_collectives(out))} collectives keep their joins' waits and releases as profiled")
    out = with_mesh(out, replicate, shard)
    dur = out.dur.copy()
    dur[out.kind == Kind.UPDATE] *= step_scale(g, s0, shard, costs)
    par = out.meta.parallel
    if par is not None:  # the layout's groups, labelled data-parallel as the recorder labels FSDP's
        groups = _shard_groups(replicate, shard) + (_replicate_groups(replicate, shard) if replicate > 1 else [])
        comm = np.flatnonzero((out.kind == Kind.COMM) & (out.rank < 0))
        on = {name: out.device[comm] == i for i, d in enumerate(out.devices) if (name := d.name.removeprefix("group ")) != d.name}
        labels = [GroupLabel(name=name, desc="", ranks=tuple(grp), dims={Dim.DP.text: int(on[name].sum()) * len(grp)},
                             nbytes={Dim.DP.text: int(out.nbytes[comm[on[name]]].sum()) * len(grp)}, evidence=["the --mesh what-if's layout"])
                  for grp in groups if (name := ",".join(map(str, grp))) in on]
        par = dataclasses.replace(par, groups=labels, world_size=world, dp_groups=[tuple(grp) for grp in groups], dp_size=shard if replicate > 1 else world)
    out = out.replace(dur=dur, meta=out.meta.replace(world_size=world, ranks=list(range(world)), parallel=par))
    link = current_topology(g)  # the input's: a fit to the regrouped collectives would be no link
    priced = shard if replicate > 1 else world
    out = retime_collectives(out, link.with_workers(priced) if priced != link.world_size else link, lags_on=link, own_us=own)
    return out if waits is None else out.replace(dur=waits.skew_hidden(out, rings, link))


def merged_rings_note(g: Graph, replicate: int, shard: int) -> str | None:
    """One line where the layout's rings merge several profiled groups (2x2 -> 1x4: 4-rank shard rings of two 2-rank
    ones): their ranks' releases and the waits of the longer ring on shared cores are not measured in the profile."""
    if not is_fsdp_graph(g) or g.meta.fsdp.api != FSDP2_API:
        return None
    r0, s0 = mesh_of(g)
    w0 = r0 * s0
    merged = []
    for what, new, old in (("shard", _shard_groups(replicate, shard), _shard_groups(r0, s0)),
                           ("replicate", _replicate_groups(replicate, shard) if replicate > 1 else [], _replicate_groups(r0, s0) if r0 > 1 else [])):
        for grp in new:
            held = {r % w0 for r in grp}
            if len(grp) > max(map(len, old), default=1) and any(set(o) < held for o in old):
                merged.append((what, len(grp)))
    if not merged:
        return None
    kinds = sorted(set(merged))
    return (f"--mesh {replicate}x{shard}: {len(merged)} of its rings ({', '.join(f'{w} groups of {n}' for w, n in kinds)}) hold whole profiled "
            f"groups ({r0}x{s0}) and more ranks: how their ranks wait and leave in the longer ring is not in the profile; kept as the profiled groups'")


@dataclass(frozen=True)
class _Waits:
    """Per FSDP call and window step, each profiled rank's measured release from its wait (shared clock) and its time
    from its last release before the call to its arrival at the join ("since") or to its release ("since_released"):
    what the joins and releases of new groups follow (module docstring)."""

    times: dict[tuple[_Call, int, str], np.ndarray]  # (call, nth, what) -> steps x profiled ranks
    mesh: tuple[int, int]  # the profiled one

    @staticmethod
    def of(g: Graph) -> _Waits | None:
        """None where the graph holds no measured times (a pass changed its nodes)."""
        p = provenance(g)
        if p is None or not p.clock_us:
            return None
        clock = np.array([p.clock_us.get(r, np.nan) for r in range(g.world_size)])
        calls = _calls(g)[0]
        left = {r: np.sort([p.mend[ms[r][2]] + clock[r] for ms in calls.values() if r in ms]) for r in range(g.world_size)}
        per: dict[tuple[_Call, int, str], dict[int, np.ndarray]] = {}
        steps = {int(s): i for i, s in enumerate(g.meta.steps)}
        for (step, call, nth), members in calls.items():
            if step not in steps or len(members) != g.world_size:
                continue
            arrive = np.array([p.mend[members[r][0]] + clock[r] for r in range(g.world_size)])
            release = np.array([p.mend[members[r][2]] + clock[r] for r in range(g.world_size)])
            before = np.array([left[r][max(np.searchsorted(left[r], arrive[r]) - 1, 0)] for r in range(g.world_size)])
            for kind, at in (("release", release), ("since", arrive - before), ("since_released", release - before)):
                per.setdefault((call, nth, kind), {})[steps[step]] = at
        times: dict[tuple[_Call, int, str], np.ndarray] = {}
        for call, nth in {(k[0], k[1]) for k in per}:  # the steps whose arrivals and releases are all measured
            t = {kind: np.array(list(per[(call, nth, kind)].values())) for kind in ("release", "since", "since_released")}
            ok = np.logical_and.reduce([np.isfinite(x).all(axis=1) for x in t.values()])
            times.update({(call, nth, kind): x[ok] for kind, x in t.items()})
        return _Waits(times, mesh_of(g))

    def lost(self, call: _Call, nth: int, ranks: list[int], released: bool = False) -> float:
        """What a join of ``ranks`` (their profiled originals) loses to its late rank once averaged, us (0 where unmeasured):
        of each rank's time from its last release to its arrival (its release: ``released``, a new all-reduce's after the
        reduce-scatter), the mean of the per-step maxima less the maximum of the means."""
        t = self.times.get((call, nth, "since_released" if released else "since"))
        if t is None or not len(t):
            return 0.0
        x = t[:, sorted({r % t.shape[1] for r in ranks})]
        return float(x.max(axis=1).mean() - x.mean(axis=0).max())

    def more(self, call: _Call, ranks: list[int], released: bool = False) -> float:
        """How much more a join of ``ranks`` loses to its late rank than the profiled joins did, us: ``lost`` there less at
        the profiled groups, each averaged over the kind's calls (units and repeats: one call's few steps are noise)."""
        calls = [(k[0], k[1]) for k in self.times if k[2] == "since" and k[0].kind == call.kind]
        if not calls:
            return 0.0
        return float(np.mean([self.lost(*c, ranks, released) - np.mean([self.lost(*c, grp) for grp in self._groups(c[0])]) for c in calls]))

    def release(self, call: _Call, nth: int, rank: int, ranks: list[int]) -> float:
        """How much earlier ``rank`` leaves a call of ``ranks`` than it left the profiled call, us: its lag behind the
        first rank out of its profiled group, taken behind the first of those ranks out that are in ``ranks`` too (0 where
        ``ranks`` hold its whole profiled group: a ring merged from several is not measured)."""
        release = self.times.get((call, nth, "release"))
        if release is None or not len(release):
            return 0.0
        n = release.shape[1]
        own = next(grp for grp in self._groups(call) if rank % n in grp)
        kept = sorted(set(own) & {r % n for r in ranks})
        return float((release[:, kept].min(axis=1) - release[:, own].min(axis=1)).mean())

    def skew_hidden(self, out: Graph, rings: list[tuple[int, tuple[_Call, int, bool], tuple[int, ...]]], link: Topology) -> np.ndarray:
        """``out``'s durations with each new ring's wire time (its kind's time per byte in ``link``, the profile's; none
        where that is 0: no wire shows in the profile) scaled by what its ranks' measured skew hides of a ring's transfer
        (``costmodel.gloo_ring.head_start``, from the ranks' times since their last release) over what it hid of the
        profiled groups', the link fitted to the kind carrying the latter; both averaged over the kind's calls."""
        dur = out.dur.copy()
        by_kind: dict[CommKind, list[tuple[int, tuple[_Call, int, bool], tuple[int, ...]]]] = {}
        for ring in rings:
            by_kind.setdefault(CommKind.ALL_REDUCE if ring[1][2] else ring[1][0].kind, []).append(ring)
        for kind, mine in by_kind.items():
            per_byte = link.for_kind(kind.label).inter.beta_us_per_byte
            gather, nodes = kind == CommKind.ALL_GATHER, np.array([v for v, _, _ in mine])
            nbytes = float(np.mean(out.nbytes[nodes]))
            was = [head_start(gather, t[:, grp], nbytes, per_byte) for (call, _, what), t in self.times.items()
                   if what == "since" and call.kind == kind for grp in self._groups(call)] if per_byte > 0 else []
            if not was:  # no wire in the price, or priced by a link fitted to other kinds
                continue
            w0 = self.mesh[0] * self.mesh[1]  # a new rank replays the arrivals of the profiled rank it copies
            now = [head_start(gather, t[:, list(ranks)], nbytes, per_byte)
                   for at, ranks in {(at, tuple(r % w0 for r in ranks)) for _, at, ranks in mine}
                   if (t := self.times.get((at[0], at[1], "since_released" if at[2] else "since"))) is not None and len(t)]
            if now and np.mean(was) > 0:
                n = np.array([len(ranks) for _, _, ranks in mine], dtype=float)
                wire = (1 if gather else 2) * (n - 1) / n * out.nbytes[nodes] * per_byte
                dur[nodes] = np.maximum(dur[nodes] - wire * (1 - float(np.mean(now)) / float(np.mean(was))), 0.0)
        return dur

    def _groups(self, call: _Call) -> list[list[int]]:
        """The profiled groups of a call."""
        r0, s0 = self.mesh
        return _replicate_groups(r0, s0) if call.kind == CommKind.ALL_REDUCE else _shard_groups(r0, s0)


def _calls(g: Graph) -> tuple[dict[tuple, dict[int, tuple[int, int, int]]], dict[int, int], dict[int, list[int]]]:
    """Each FSDP call matched across ranks: (step, call, nth) -> rank -> (ready point, enqueue, wait), the enqueue the
    call's last piece (``enqueue_pieces``); each wait's collective; each collective's joins."""
    shared = (g.kind == Kind.COMM) & (g.rank < 0)
    comm_of_wait: dict[int, int] = {}
    sync_of: dict[int, list[int]] = {}
    calls: dict[tuple, dict[int, tuple[int, int, int]]] = {}
    seen: dict[tuple, int] = {}
    enq = np.flatnonzero((g.kind == Kind.COMM_ENQUEUE) & (g.rank >= 0))
    for e in enq[np.lexsort((g.order[enq], g.rank[enq]))].tolist():
        m = _OP.fullmatch(g.node_name(e))
        if not m or any(is_cut_piece(g, e, int(v)) for v in g.successors(e).tolist()):  # a call's earlier piece: its last one counts
            continue
        r = int(g.rank[e])
        w = next((int(v) for v in g.successors(e).tolist() if g.kind[v] == Kind.COMM_WAIT and int(g.rank[v]) == r), -1)
        c = next((int(p) for p in g.predecessors(w).tolist() if shared[p]), -1) if w >= 0 else -1
        if c < 0:
            raise DagprofError(f"--mesh: {g.node_name(e)} (rank {r}) has no collective behind its wait")
        syncs = [int(p) for p in g.predecessors(c).tolist() if g.kind[p] == Kind.SYNC]
        joins = [int(q) for s in syncs for q in g.predecessors(s).tolist() if int(g.rank[q]) == r] or [e]
        comm_of_wait[w] = c
        sync_of[c] = syncs
        key = (int(g.step[e]), _Call(CommKind(int(g.comm_kind[c])), m.group(2)))
        nth = seen.get((r,) + key, 0)
        seen[(r,) + key] = nth + 1
        calls.setdefault(key + (nth,), {})[r] = (joins[0], e, w)
    return calls, comm_of_wait, sync_of


def _regroup(g: Graph, replicate: int, shard: int, add_all_reduce: bool, waits: _Waits | None,
             own: np.ndarray) -> tuple[Graph, list[tuple[int, tuple[_Call, int, bool], tuple[int, ...]]], np.ndarray]:
    """Every FSDP collective rebuilt on the layout's groups from each rank's enqueue, ready point and wait; with
    ``add_all_reduce``, an all-reduce across replicas inserted after each reduce-scatter (module docstring). Also each
    new transfer's node, call (call, nth, after a release) and ranks; each new join and transfer of the kind and role of
    the call's profiled ones; and per node of the result, the time beside its price a transfer keeps: the mean of what its
    profiled ones kept (``own``, per node of ``g``: ``passes.comm.carried_own_time``), none for an inserted all-reduce."""
    calls, comm_of_wait, sync_of = _calls(g)
    drop = np.zeros(len(g), dtype=bool)  # every FSDP transfer and join, also those of ranks fewer ranks leave out
    for c in fsdp_collectives(g):
        drop[[c.node] + [int(p) for p in g.predecessors(c.node).tolist() if g.kind[p] == Kind.SYNC]] = True
    b, remap = GraphBuilder.from_graph(g, ~drop)
    if add_all_reduce:  # a reduce-scatter's enqueue precedes a new wait for it, not the wait that becomes the all-reduce's
        (src, dst), cut = b.edges(), {(int(remap[e]), int(remap[w])) for k, ms in calls.items() if k[1].kind == CommKind.REDUCE_SCATTER
                                      for _, e, w in ms.values()}
        b.set_edges(*(a[[(int(u), int(v)) not in cut for u, v in zip(src, dst)]] for a in (src, dst)))
    exit_lag, kept = list(g.exit_lag[~drop]), list(own[~drop])
    seq = 0
    rings: list[tuple[int, tuple[_Call, int, bool], tuple[int, ...]]] = []  # each new transfer: its node, its call, its ranks

    def collective(call: _Call, step: int, ends: dict[int, tuple[int, int]], old: list[int], nbytes: int, groups: list[list[int]],
                   at: tuple[_Call, int, bool]) -> None:
        """One join and transfer per group of the ranks in ``ends`` (rank -> (ready point, wait), builder ids); each join's
        wait for its late rank follows its group's measured arrivals at ``at`` (``_Waits``)."""
        nonlocal seq
        gap, lag = float(np.mean(g.gap[old])), float(np.mean(g.exit_lag[old]))
        joins = [v for c in old for v in sync_of[c]]
        join_gap = float(np.mean(g.gap[joins])) if joins else 0.0  # an averaged join's wait for its late rank
        for grp in groups:
            ranks = [r for r in grp if r in ends]
            if not ranks:
                continue
            dev = b.device(f"group {','.join(map(str, grp))}", DeviceKind.COMM)
            wait = join_gap if waits is None or join_gap <= 0 else max(join_gap + waits.more(at[0], ranks, at[2]), 0.0)
            typed = {"comm_kind": call.kind, "role": int(g.role[old[0]])}
            s = b.add_node(f"sync.{call.label}.{seq}", Kind.SYNC, gap=wait, step=step, **typed)
            c = b.add_node(f"{call.label}.{seq}", Kind.COMM, device=dev, gap=gap, step=step, nbytes=nbytes, **typed)
            exit_lag.extend([0.0, lag])
            kept.extend([0.0, 0.0 if at[2] else float(np.mean(own[old]))])
            seq += 1
            b.add_edges([ends[r][0] for r in ranks], [s] * len(ranks))
            b.add_edge(s, c)
            b.add_edges([c] * len(ranks), [ends[r][1] for r in ranks])
            rings.append((c, at, tuple(ranks)))
            for r in ranks if waits is not None else ():  # each rank's release behind the group's first rank out
                w = ends[r][1]
                b._cols["gap"][w] = max(b._cols["gap"][w] - waits.release(*at[:2], r, ranks), 0.0)
                exit_lag[w] = min(exit_lag[w], b._cols["gap"][w])

    reduced = {(k[0], k[1].unit, k[2]): int(g.nbytes[comm_of_wait[next(iter(ms.values()))[2]]])
               for k, ms in calls.items() if k[1].kind == CommKind.REDUCE_SCATTER}
    for (step, call, nth), members in calls.items():
        kind, unit = call.kind, call.unit
        old = sorted({comm_of_wait[w] for _, _, w in members.values()})
        nbytes = int(g.nbytes[old[0]])
        ends = {r: (int(remap[ready]), int(remap[w])) for r, (ready, _, w) in members.items()}
        if kind == CommKind.ALL_REDUCE:  # the reduce-scattered shard
            nbytes = round(reduced.get((step, unit, nth), nbytes * shard) / shard)
            for piece in (q for _, e, _ in members.values() for q in enqueue_pieces(g, e)):
                b._cols["nbytes"][int(remap[piece])] = nbytes
        if kind == CommKind.REDUCE_SCATTER and add_all_reduce:  # its wait, then the all-reduce's enqueue; the old wait waits for the all-reduce
            after: dict[int, tuple[int, int]] = {}
            for r, (ready, e, w) in members.items():
                at = {"rank": r, "device": int(g.device[w]), "step": step, "layer": int(g.layer[w])}
                o1 = np.nextafter(float(g.order[w]), np.inf)  # program order: between the reduce-scatter's enqueue and the old wait
                rs_wait = b.add_node(f"rank{r}.wait reduce_scatter {unit}", Kind.COMM_WAIT, gap=float(g.gap[w]), order=float(g.order[w]), **at)
                ar_enq = b.add_node(f"rank{r}.fsdp all_reduce {unit}", Kind.COMM_ENQUEUE, nbytes=round(nbytes / shard), order=float(o1),
                                    comm_kind=CommKind.ALL_REDUCE, role=int(g.role[e]), **at)
                b._cols["order"][int(remap[w])] = float(np.nextafter(o1, np.inf))
                exit_lag.extend([float(g.exit_lag[w]), 0.0])
                kept.extend([0.0, 0.0])
                b.add_edges([int(remap[e]), rs_wait, ar_enq], [rs_wait, ar_enq, int(remap[w])])
                b._cols["name"][int(remap[w])] = b.intern(f"rank{r}.wait all_reduce {unit}")
                ends[r], after[r] = (int(remap[ready]), rs_wait), (ar_enq, int(remap[w]))
            collective(call, step, ends, old, nbytes, _shard_groups(replicate, shard), (call, nth, False))
            collective(_Call(CommKind.ALL_REDUCE, unit), step, after, old, round(nbytes / shard), _replicate_groups(replicate, shard),
                       (call, nth, True))
            continue
        collective(call, step, ends, old, nbytes,
                   _replicate_groups(replicate, shard) if kind == CommKind.ALL_REDUCE else _shard_groups(replicate, shard), (call, nth, False))
    return b.build().replace(exit_lag=np.asarray(exit_lag, dtype=np.float64)), rings, np.asarray(kept, dtype=np.float64)


def workers_mesh(g: Graph, workers: int) -> tuple[int, int]:
    """The (replicate, shard) degrees ``--workers`` gives an FSDP profile: plain FSDP shards over every worker (one worker,
    the scaling-efficiency baseline, shards nothing), or in a DP x TP job over its data-parallel degree (``workers`` counts
    every rank: bench/tp_fresh/t5_dp_tp.py's 4 ranks, 2 x 2, were priced sharded over 4, its optimizer step and peak with
    them); HSDP grows its replicate dimension and keeps the shard degree."""
    replicate0, shard0 = mesh_of(g)
    hsdp = len(g.meta.fsdp.units[0].mesh) > 1 if g.meta.fsdp.units else False
    if workers == 1:
        return 1, 1
    if not hsdp:
        return 1, data_parallel_degree(g, workers)
    if workers % shard0:
        raise DagprofError(f"this profile is an HSDP job (mesh {replicate0}x{shard0}): --workers grows its replicate "
                           f"dimension, so it must be a multiple of the shard degree {shard0}, got {workers} (or give --mesh RxS)")
    return workers // shard0, shard0


def scale_fsdp_workers(g: Graph, workers: int, costs: FsdpCosts | None = None) -> Graph:
    """What if the FSDP job sharded over ``workers`` ranks (same per-rank batch)? The optimizer step scales by
    ``costs``' measured DTensor step, else by the profile's own split of it, else by the shard degrees' ratio
    (``step_scale``, module docstring)."""
    replicate0, shard0 = mesh_of(g)
    replicate, shard = workers_mesh(g, workers)
    if (replicate, shard) != (replicate0, shard0):
        check_post_forward_workers(g, shard)
    if replicate != replicate0 and shard == shard0:
        if g.meta.fsdp.api != FSDP2_API:  # said for the replicas this flag grows (set_mesh's says why FSDP1 is not modelled)
            raise DagprofError(f"--workers {workers}: this FSDP1 HYBRID_SHARD job (mesh {replicate0}x{shard0}) would grow its "
                               f"replicate dimension to {replicate}x{shard}, modelled for FSDP2 (fully_shard) profiles only")
        return set_mesh(g, replicate, shard, costs, asked=f"--workers {workers}")
    if shard != shard0 and not hybrid(g):  # plain FSDP: the units shard over the new degree, which prices each ring
        fs = g.meta.fsdp
        g = g.replace(meta=g.meta.replace(fsdp=dataclasses.replace(fs, units=[dataclasses.replace(u, mesh=[shard]) for u in fs.units])))
    out = _without_orphans(scale_workers(g, workers))
    dur = out.dur.copy()
    upd = np.flatnonzero(out.kind == Kind.UPDATE)
    dur[upd] *= step_scale(g, shard0, shard, costs)  # the optimizer steps this rank's shards: 1/shard degree of every parameter
    return out.replace(dur=dur)


def _without_orphans(g: Graph) -> Graph:
    """``g`` less the shared collectives no rank joins any more: fewer workers keep the first ranks, and a post-forward
    group of the others (``reshard_after_forward=N``: ranks 2,3 of 4) would be left replaying alone."""
    shared = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    drop = np.zeros(len(g), dtype=bool)
    for v in shared.tolist():
        if not issuers(g, v):
            drop[collective_nodes(g, v)] = True
    return without_nodes(g, drop, g.nbytes, {}) if drop.any() else g


def uncalibrated_step_note(g: Graph, shards: list[int]) -> str | None:
    """Without FSDP's costs measured here, what prices the optimizer step at a new shard degree (``step_scale``): the
    profile's Kineto ops, else its bytes alone, which leave out its fixed cost per tensor. On the review6 MoE job (51
    tensors, RAdam) 2x2 -> 1x4 by the bytes was predicted at 0.68-0.79 of the step and ran 0.92-1.12: its 1x4 profile's
    step rose 38.6 -> 71.0 ms, 650 DTensor dispatches (31 of a 55 ms step) a step."""
    shard0 = mesh_of(g)[1]
    new = sorted({s for s in shards if s != shard0})
    if not new:
        return None
    tensors, nbytes = step_size(g.meta.fsdp.units)
    degrees = f"a shard degree of {', '.join(map(str, new))} (profiled {shard0})"
    calibrate = "`dagprof calibrate --fsdp` measures both here, and --link-model FILE prices the step by them"
    fit = g.meta.fsdp.step_fit
    if fit is not None:
        fixed, per_byte = fit.us_per_tensor * tensors, fit.us_per_byte * nbytes / shard0
        return (f"{degrees} prices the optimizer step on {tensors} tensors from the profile's Kineto ops: "
                f"{100 * fixed / (fixed + per_byte):.0f} % of it (DTensor's dispatches and the Python around the ops) stays per "
                f"tensor, the ops on the local shards scale with their bytes; {calibrate}")
    host = _host_step_fit(g)
    if host is not None:
        fixed, per_byte = host.us_per_tensor * tensors, host.us_per_byte * nbytes / shard0
        return (f"{degrees} prices the optimizer step on {tensors} tensors by the DTensor step measured for torch "
                f"{g.meta.torch_minor} (no Kineto ops in the profile split its own): {100 * fixed / (fixed + per_byte):.0f} % of it "
                f"stays per tensor, the rest scales with the shards' bytes; {calibrate}")
    return (f"{degrees} scales the optimizer step on {tensors} tensors by "
            f"their shards' bytes (no Kineto ops of a CPU step in the profile split it): its fixed cost per tensor (DTensor dispatch, about "
            f"125 us a tensor on a 2-core machine) does not shrink with the shards, so the step is predicted short where "
            f"tensors are many and small; {calibrate}")


def _host_step_fit(g: Graph) -> StepFit | None:
    """``DTENSOR_STEP``'s DTensor step for the profile's torch version, where FSDP2's optimizer steps DTensors on the
    host (no GPU stream in the graph): what splits a hooks-only CPU profile's step into its part per tensor and per byte.
    None: FSDP1 (plain flat parameters), a GPU job (its step's bytes are kernels) or a version not measured."""
    if g.meta.fsdp.api != FSDP2_API or any(d.kind == DeviceKind.COMPUTE and d.rank >= 0 for d in g.devices):
        return None
    fits = DTENSOR_STEP.get(g.meta.torch_minor)
    return fits.dtensor if fits else None


def step_scale(g: Graph, shard0: int, shard: int, costs: FsdpCosts | None) -> float:
    """The optimizer step on 1/``shard`` of every parameter over the profiled one on 1/``shard0``: per tensor and per
    byte of the shards as FSDP's measured costs (``costs``) or, without them, the profile's own Kineto ops
    (``meta.fsdp.step_fit``) price it, else on a CPU the DTensor step measured for its torch version (``_host_step_fit``:
    part 12's tiedlm job, hooks only, AdamW on 76 tensors of 5.6 MiB, stepped 0.89-1.03x its 2-rank step on 4 ranks (over
    each rank's compute beside it, two testbed rounds) where the bytes' rule gave 0.5, this 0.96); by the bytes alone where
    none does."""
    fit = costs.dtensor_step if costs is not None else (g.meta.fsdp.step_fit or _host_step_fit(g))
    tensors, nbytes = step_size(g.meta.fsdp.units)
    was = fit.us(tensors, nbytes / shard0) if fit is not None and shard != shard0 else 0.0
    return fit.us(tensors, nbytes / shard) / was if was > 0 else shard0 / shard
