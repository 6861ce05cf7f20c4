"""Folders of TensorFlow/JAX profiles -> ``Run``: a dagprof run folder, or the profilers' own log folders.

A run folder written by ``dagprof.collect.tf_profile`` / ``jax_profile`` holds ``manifest.json``
(job-wide: format ``dagprof-xplane-run``, framework, world size, requested steps) and, per rank,
``rank<R>.json`` (host, pid, steps profiled, their times and the unprofiled steps', gradient bytes, its log folder; since
2026-12-03 the cores the process could run on and the kernel's ``CONFIG_HZ`` where the host said it) and the
log folder ``rank<R>/plugins/profile/<session>/<host>.xplane.pb`` (one per worker: two workers on
one host would overwrite each other's ``<host>.xplane.pb`` in a shared folder).

Without a manifest, any folder holding ``*.xplane.pb`` files reads too: the rank comes from each
path (``worker1/...``, ``rank-1/...``), the newest session of each rank is used.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Annotated

import msgspec
import numpy as np

from ..errors import DagprofError
from ..fsutil import inside, read_versioned
from .completeness import check_same_job, describe, refuse_copies
from .events import Kind, RankTrace, Run
from .meta import Collectives, PaddedGather, RankGap, RunMeta, RunWarning, split_at_window, step_scheds, tx_bytes_per_step, warnings_of
from .run_schema import Count, CpuList, checked_cpu_set, refuse_ranks_beyond
from .tf_xplane import merge_rank_figures, rank_from_path, read_xplane
from .window_cpu import WindowCpu
from .xplane_layout import FORMAT, MANIFEST, RANK_FORMAT, RANK_KEYS, VERSION, CollectiveSizes, rank_file, rank_logdir


def xplane_files(folder: str) -> list[str]:
    """Every ``*.xplane.pb`` (or ``.xplane.pb.gz``) below ``folder``, sorted (session folders are
    timestamps, so newest last)."""
    out = []
    for root, _dirs, files in os.walk(folder):
        out += [os.path.join(root, f) for f in files if f.endswith((".xplane.pb", ".xplane.pb.gz"))]
    return sorted(out)


Micros = Annotated[float, msgspec.Meta(gt=0)]


class XplaneManifest(msgspec.Struct, kw_only=True):
    """``manifest.json`` of a TensorFlow/JAX run: the job's size and framework."""

    world_size: Annotated[int, msgspec.Meta(gt=0, le=1 << 20)]
    framework: str = ""


class XplaneRank(msgspec.Struct, kw_only=True):
    """``rank<R>.json`` of a TensorFlow/JAX run (``collect.hooks.xplane_window`` writes it): typed, so that a value of
    the wrong type or range is one line naming the file and field. Optional fields are absent from older files."""

    rank: int
    world_size: int
    host: str = ""
    pid: int | None = None
    logdir: str | None = None
    steps_profiled: list[int] = []
    step_times_us: dict[int, Micros] = {}  # the loop's time of each profiled step
    unprofiled_step_times_us: dict[int, Micros] | None = None  # rank files before dagprof timed the steps outside the window lack it
    grad_bytes: Count = 0
    embedding_grad_bytes: Count = 0  # TF: the Embedding tables' bytes, left out of grad_bytes (files before 2026-12-03 lack it)
    collective_bytes: dict[str, Count] = {}  # collective op -> bytes of its own input (Keras ``fit``; files before 2026-12-03 lack it)
    collective_row_bytes: dict[str, Count] = {}  # collective op of a dynamic first dimension -> bytes of one row (before 2026-12-05: none)
    collective_lookups: dict[str, list[str]] = {}  # a sparse gradient's all-gather -> the lookups whose ids it gathers (ditto)
    warnings: list[str] = []
    cpus: Count | None = None  # rank files before 2026-12-03 lack both
    cpu_set: CpuList = ""  # which cores (files before 2026-12-06 lack it)
    kernel_hz: Count | None = None
    window_tx_bytes: Count | None = None  # rank files before the count lack it
    window_cpu: WindowCpu | None = None  # the window's wall, its cores' busy and its process's CPU time (files before 2026-12-07 21:00 UTC lack it)
    # per step, profiled or not: the thread marking the steps' CPU and waits for a core, its process's CPU, the times it got a
    # core (``collect.hooks.thread_sched``, as a torch rank file's; files before 2026-12-06 lack them)
    thread_sched_ns: list[tuple[Count, Count, Count]] = []
    process_cpu_ns: list[tuple[Count, Count]] = []
    thread_runs: list[tuple[Count, Count]] = []
    other_threads_ns: list[tuple[Count, Count, Count, Count]] = []  # the process's other threads (files before 2026-12-06 lack it)
    # the same per thread name (``ThreadSched.named``; None: files before 2026-12-06 10:00 UTC lack it)
    named_threads_ns: dict[str, list[tuple[Count, Count, Count, Count]]] | None = None

    @property
    def sizes(self) -> CollectiveSizes:
        """The three ``collective_*`` fields as the reader takes them (``xplane_layout.RANK_KEYS`` names each)."""
        return CollectiveSizes(**{name: dict(getattr(self, key)) for name, key in RANK_KEYS})


def _json(path: str, fmt: str, what: str, kind: type):
    return read_versioned(path, kind, fmt, range(1, VERSION + 1), what, "profile the job again")


def read_xplane_file(path: str) -> Run:
    return Run([read_xplane(path)], source=path)


def read_xplane_run(path: str | os.PathLike[str]) -> Run:
    folder = os.fspath(path)
    mpath = os.path.join(folder, MANIFEST)
    if os.path.exists(mpath):
        return _from_manifest(folder, _json(mpath, FORMAT, f"TensorFlow/JAX run folder's {MANIFEST}", XplaneManifest))
    return _from_logdirs(folder)


# what every worker's collector records alike: one model's gradient bytes, each collective's row width and lookups
# (``_check_same_model``; a collective's traced whole sizes, ``collective_bytes``, may differ: one worker's trace may time an op the other's did not)
SAME_MODEL = ("grad_bytes", "embedding_grad_bytes", "collective_row_bytes", "collective_lookups")


def _check_same_model(info: XplaneRank, first: XplaneRank | None, rpath: str) -> None:
    """Refuse a rank file whose model figures (``SAME_MODEL``) differ from rank 0's: every worker runs the same graph, so
    such a file is another job's or a damaged one (each rank's collectives are sized from its own, and the matched
    collectives took the first rank's silently). A figure one of them lacks (a collector before it) is the reader's to
    warn of, where it sizes the collectives without it."""
    for key in SAME_MODEL if first is not None else ():
        mine, theirs = getattr(info, key), getattr(first, key)
        if mine and theirs and mine != theirs:
            if isinstance(mine, dict):  # name the first entry that differs, not two whole tables
                what = next(k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))
                key, mine, theirs = f"{key}[{what!r}]", mine.get(what), theirs.get(what)
            raise DagprofError(f"its {key} is {mine!r}, {rank_file(first.rank)}'s {theirs!r}: every worker runs the same model "
                               f"(another job's or a damaged file)", rpath)


def _from_manifest(folder: str, manifest: XplaneManifest) -> Run:
    world = manifest.world_size
    refuse_ranks_beyond(folder, world)
    ranks, gaps = [], []
    first: XplaneRank | None = None
    warnings: list[str | RunWarning] = []
    for r in range(world):
        rpath = os.path.join(folder, rank_file(r))
        if not os.path.exists(rpath):
            gaps.append(RankGap(r, f"no {rank_file(r)} (it crashed, was killed, or is still running)"))
            continue
        info: XplaneRank = _json(rpath, RANK_FORMAT, "TensorFlow/JAX rank file", XplaneRank)
        if info.rank != r or info.world_size != world:
            raise DagprofError(f"holds rank {info.rank} of {info.world_size}, not rank {r} of {world} "
                               f"(a copy of another rank's file?)", rpath)
        _check_same_model(info, first, rpath)
        first = first or info
        if info.warnings and not info.steps_profiled:
            raise DagprofError(f"rank {r} profiled no step ({info.warnings[-1]})", rpath)  # the latest: why it ended so
        untimed = sorted(set(info.steps_profiled) - set(info.step_times_us))
        if untimed:  # the loop's step times judge the profiler's own cost (``passes.profiler_cost``)
            raise DagprofError(f"{len(untimed)} profiled step(s) have no time in step_times_us (step {untimed[0]}): a damaged file", rpath)
        logdir = info.logdir or rank_logdir(r)
        files = xplane_files(inside(folder, logdir, rpath))
        if not files:
            raise DagprofError(f"rank {r}: no *.xplane.pb in {logdir}/ (the profiler never stopped?)", folder)
        if len(files) > 1:
            warnings.append(f"rank {r}: {len(files)} profiler sessions in its log folder; the newest is read")
        newest = inside(folder, os.path.relpath(files[-1], folder), rpath)  # a link in the log folder may not lead out
        trace = read_xplane(newest, rank=r, world_size=world, grad_bytes=info.grad_bytes, sizes=info.sizes,
                            embedding_grad_bytes=info.embedding_grad_bytes, window=info.steps_profiled)
        trace.meta.step_times_us = dict(info.step_times_us)
        trace.meta.unprofiled_step_times_us = info.unprofiled_step_times_us
        trace.meta.window_tx_bytes_per_step = tx_bytes_per_step(info.window_tx_bytes, info.steps_profiled)
        trace.meta.window_cpu = info.window_cpu
        trace.meta.pid = info.pid
        trace.host = trace.host or info.host  # the profile's own host name, else the rank file's
        trace.meta.cpus = info.cpus or 0
        trace.meta.cpu_set = checked_cpu_set(info.cpu_set, info.cpus, rpath)
        trace.meta.scheduler_tick_us = 1e6 / info.kernel_hz if info.kernel_hz else None
        trace.meta.train_thread, trace.meta.unprofiled_train_thread = split_at_window(
            step_scheds(info.thread_sched_ns, info.process_cpu_ns, info.thread_runs, info.other_threads_ns, info.named_threads_ns),
            info.step_times_us)
        warnings += info.warnings
        ranks.append(trace)
    if not ranks:
        raise DagprofError(f"no rank file here ({describe(gaps, world)})", folder)
    padded = size_padded_gathers(ranks, warnings)
    check_same_job(ranks, folder)
    refuse_copies(ranks, folder)
    ranks = _trim_cut_steps(ranks, warnings)
    merge_rank_figures(ranks)
    warnings += [w for t in ranks for w in t.meta.warnings]
    return Run(ranks, source=folder, meta=RunMeta(framework=manifest.framework, warnings=warnings_of(warnings),
                                                  rank_gaps=gaps, padded_gathers=padded))


def _from_logdirs(folder: str) -> Run:
    files = xplane_files(folder)
    if not files:
        raise DagprofError("no TensorFlow/JAX profiles (*.xplane.pb) in this folder", folder)
    by_rank: dict[int, list[str]] = {}
    unranked = []
    for f in files:
        r = rank_from_path(os.path.relpath(os.path.dirname(f), folder))
        (by_rank.setdefault(r, []) if r is not None else unranked).append(f)
    warnings: list[str | RunWarning] = []
    if unranked:
        if by_rank or len(unranked) > 1 and len({os.path.dirname(os.path.dirname(f)) for f in unranked}) == 1:
            raise DagprofError(f"cannot tell the rank of {os.path.relpath(unranked[0], folder)}: put each worker's log folder "
                               "in worker<R>/ (or record with dagprof.collect.tf_profile)", folder)
        by_rank = {r: [f] for r, f in enumerate(unranked)}
        warnings.append("no rank in the paths: ranks numbered in path order")
    world = max(by_rank) + 1
    ranks = []
    for r in sorted(by_rank):
        if len(by_rank[r]) > 1:
            warnings.append(f"rank {r}: {len(by_rank[r])} profiler sessions; the newest is read")
        ranks.append(read_xplane(by_rank[r][-1], rank=r, world_size=world))
    missing = sorted(set(range(world)) - set(by_rank))
    check_same_job(ranks, folder)
    refuse_copies(ranks, folder)
    ranks = _trim_cut_steps(ranks, warnings)
    merge_rank_figures(ranks)
    warnings += [w for t in ranks for w in t.meta.warnings]
    return Run(ranks, source=folder, meta=RunMeta(missing_ranks=missing, rank_gaps=[RankGap(r, "no profile in its log folder") for r in missing],
                                                  warnings=warnings_of(warnings)))


_BRANCH_CALL = re.compile(r"/(?:then|else)/(?:_\d+/)?")  # a lowered ``If`` branch and its call node (``cond_1/else/_18/``)
_PAD_BRANCH = re.compile(r"(?:^|/)cond(?:_\d+)?/else/")  # the branch that pads each worker's rows (``tf_xplane``'s rule)


def padded_key(name: str) -> str:
    """A sparse gradient's all-gather's name across steps, workers, retraces and TF's two branches (equal rows, padded):
    less its branch and call (``cond/else/_1/`` -> ``cond/``) and, for a graph node, its instance (``...V2.13``)."""
    return _BRANCH_CALL.sub("/", name.rsplit(".", 1)[0] if re.search(r"\.\d+$", name) else name)


def size_padded_gathers(ranks: list[RankTrace], warnings: list[str | RunWarning]) -> dict[str, PaddedGather]:
    """Size each all-gather of a sparse gradient in TF's branch that pads the workers' unequal row counts (in place): every
    worker sends the most rows any worker looked up in that step (``all_gather_with_padding``), which each worker's own
    profile alone does not tell (``RankMeta.padded_rows``: its own). Matched across workers by group, instance key and
    step; where a worker of the group has no count for it (not profiled, or its lookup's not traced) it stays unsized,
    counted in a warning; a size already set (the memory tracer's, or the branch of equal rows': the most is each one's)
    is kept. The counts are consumed (``padded_rows`` emptied: they index the events as read) and returned per gather of
    either branch (``padded_key``) where every worker had one: ``--workers`` prices the padding of more workers from
    them (``passes.padded_gathers``)."""
    rows: dict[tuple[str, int, int], list[tuple[RankTrace, int, int, int]]] = {}
    for t in ranks:
        ev = t.events
        for i, (own, per_row) in t.meta.padded_rows.items():
            key = (t.groups[int(ev.group[i])] if ev.group[i] >= 0 else "", int(ev.seq[i]), int(ev.step[i]))
            rows.setdefault(key, []).append((t, i, own, per_row))
        t.meta.padded_rows = {}
    unsized = 0
    counts: dict[str, PaddedGather] = {}
    for (group, _, step), held in rows.items():
        size = max((len(t.group_ranks.get(group, ())) for t, *_ in held), default=0) or held[0][0].world_size
        if len(held) < size or len({per_row for *_, per_row in held}) > 1:
            unsized += sum(int(t.events.nbytes[i]) == 0 and bool(_PAD_BRANCH.search(t.events.name_of(i))) for t, i, *_ in held)
            continue
        most = max(own for _, _, own, _ in held)
        for t, i, _, per_row in held:
            if not t.events.nbytes[i]:
                t.events.nbytes[i] = size * most * per_row
        t, i, _, per_row = held[0]
        rec = counts.setdefault(padded_key(t.events.name_of(i)), PaddedGather(per_row, {}))
        if rec.row_bytes == per_row and step >= 0:
            rec.rows[step] = [own for _, _, own, _ in sorted(held, key=lambda h: h[0].rank)]
    if unsized:
        warnings.append(f"{unsized} all-gathers of a sparse gradient padded to the workers' most rows have no size: a worker of "
                        "their group has no count of its rows in that step (its profile or its lookup's trace is missing), "
                        "so they are priced as 0 B and a bandwidth or worker-count what-if leaves their bytes out")
    return counts


def _trim_cut_steps(ranks: list[RankTrace], warnings: list[str | RunWarning]) -> list[RankTrace]:
    """Drop the first or last common step where a collective is missing on some rank.

    A profiler stopped right after the last step may lose that step's collective range on one
    worker (its thread records the range when the collective's callbacks return, which can be
    after the main thread stopped the profiler). That step is cut, not mismatched.
    """
    if len(ranks) < 2:
        return ranks
    holders: dict[tuple[str, int], set[int]] = {}
    step_of: dict[tuple[str, int], int] = {}
    for t in ranks:
        ev = t.events
        for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.group >= 0) & (ev.seq >= 0)).tolist():
            key = (t.groups[int(ev.group[i])], int(ev.seq[i]))
            holders.setdefault(key, set()).add(t.rank)
            step_of[key] = int(ev.step[i])
    common = set.intersection(*(set(t.step_spans()[:, 0].astype(int).tolist()) for t in ranks))
    if not common:
        return ranks
    edges = {min(common), max(common)}
    cut = {step_of[k] for k, who in holders.items() if len(who) < len(ranks)} & edges
    if not cut:
        return ranks
    warnings.append(f"step(s) {sorted(cut)} dropped: the profile window cut through their collectives on some rank")
    return [_without_steps(t, cut) for t in ranks]


def _without_steps(t: RankTrace, steps: set[int]) -> RankTrace:
    keep = ~np.isin(t.events.step, list(steps))
    new_index = np.cumsum(keep) - 1
    f = t.flows
    ok = keep[f[:, 0]] & keep[f[:, 1]] if len(f) else np.zeros(0, bool)
    flows = new_index[f[ok]] if len(f) else f
    return dataclasses.replace(t, events=t.events.take(keep), flows=flows.astype(np.int64).reshape(-1, 2),
                               meta=msgspec.structs.replace(t.meta, collectives=_remap_collectives(t.meta.collectives, keep, new_index)))


def _remap_collectives(info: Collectives | None, keep: np.ndarray, new_index: np.ndarray) -> Collectives | None:
    if info is None:
        return info
    rows = [k for k, e in enumerate(info.event) if keep[e]]
    return Collectives(event=[int(new_index[info.event[k]]) for k in rows], kind=[info.kind[k] for k in rows],
                       dtype=[info.dtype[k] for k in rows], program=[info.program[k] for k in rows if k < len(info.program)],
                       in_loop=[info.in_loop[k] for k in rows if k < len(info.in_loop)],
                       origin=[info.origin[k] for k in rows if k < len(info.origin)],
                       devices=[info.devices[k] for k in rows if k < len(info.devices)])
