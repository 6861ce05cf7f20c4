"""Reader of dagprof's own run folders (written by ``dagprof.collect``): which rank files make the run, and what is missing.

A run folder holds ``manifest.json`` (job-wide: world size, requested steps) and, per
rank, ``rank<R>.json`` (hook records, bucket layouts, step times, clock, host info) and
optionally ``rank<R>.kineto.json.gz`` (the torch.profiler trace of the same window).
Every file is written atomically, so a folder is readable while other ranks still write.
A rank killed inside its window left ``rank<R>.steps/`` instead (its completed steps, one
line each); it is read from there and what it lost is named (``completeness``).

Each rank file becomes a ``RankTrace`` in ``run_rank`` (its main lane cut into spans by ``run_partition``,
its collectives from ``run_comm``, or ``fsdp_run`` for an FSDP2 job). The file format (fields, record
codes, versions) is ``run_schema``.
"""
from __future__ import annotations

import os

from ..errors import DagprofError
from .completeness import Window, check_same_job, check_same_windows, describe
from .events import Kind, RankTrace, Run
from .fsdp_run import check_same_units
from .meta import RankGap, RunMeta, RunWarning, warnings_of
from .run_rank import corrupt_content, read_rank
from .run_schema import (
    MANIFEST,
    STEPS_ENDED,
    STEPS_HEAD,
    STEPS_LOG,
    Ended,
    Manifest,
    RankFile,
    ddp_label,
    rank_file,
    read_file,
    read_step_log,
    refuse_ranks_beyond,
    steps_dir,
)

_LISTED_STEPS = 1 << 16  # a window longer than this is open-ended: its missing steps are not listed one by one


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    folder = os.fspath(path)
    if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, MANIFEST)):
        raise DagprofError(f"not a dagprof run folder (no {MANIFEST})", folder)
    return read_file(os.path.join(folder, MANIFEST), Manifest)


def read_run(path: str | os.PathLike[str], require_ddp: bool = False) -> Run:
    """Read every rank of a run folder; corrupt, foreign or duplicated rank files are one-line errors.

    A rank without ``rank<R>.json`` is rebuilt from its step files when it completed steps of the
    window (it was killed inside it); what is lost, and ranks with nothing at all, are listed in
    ``meta.rank_gaps`` (``completeness``: ``load`` refuses such a run unless asked not to).
    A job that was not DDP-wrapped reads fine (compute only) with ``meta.ddp = False``
    and a warning; ``require_ddp=True`` turns that into an error.
    """
    folder = os.fspath(path)
    manifest = read_manifest(folder)
    world = manifest.world_size
    if not 0 < world <= 1 << 20:
        raise DagprofError(f"corrupt or foreign content (world_size {world})", os.path.join(folder, MANIFEST))
    refuse_ranks_beyond(folder, world)
    docs: list[tuple[str, RankFile]] = []
    gaps: list[RankGap] = []
    for r in range(world):
        rpath = os.path.join(folder, rank_file(r))
        f, gap = _rank_doc(folder, r, world)
        if gap is not None:
            gaps.append(gap)
        if f is not None:
            docs.append((rpath, f))
    _check_unique(docs, folder)
    # another run's rank file (of the same world) differs in its wrapper or its step count too: said as another run first
    check_same_windows([Window(min(s[1] for s in f.step_times_ns), max(s[2] for s in f.step_times_ns), f.host, rpath)
                        for rpath, f in docs if f.step_times_ns], folder)
    _check_same_wrapper(docs, folder)
    _check_even_windows(docs, folder)
    if not docs:
        raise DagprofError(f"no rank completed a profiled step ({describe(gaps, world)})", folder)
    warnings: list[str | RunWarning] = []
    kineto = all(f.kineto_file for _, f in docs)
    if not kineto and any(f.kineto_file for _, f in docs):
        warnings.append("some ranks have no Kineto trace (cut short): communication of every rank from the comm hooks")
    ranks = [read_rank(rpath, f, kineto) for rpath, f in docs]
    with corrupt_content(folder):
        check_same_job(ranks, folder)
    if all(t.meta.fsdp is not None for t in ranks):
        check_same_units(ranks, folder)
    warnings += [w for t in ranks for w in t.meta.warnings]
    ddp = any(t.buckets for t in ranks)
    fsdp = all(t.meta.fsdp is not None for t in ranks)
    if not ddp and not fsdp:
        own = _own_collectives(ranks)
        msg = "no DDP gradient buckets were seen: not a DDP job (compute only, no communication)"
        if require_ddp:
            raise DagprofError(msg, folder)
        warnings.append(msg if not own else f"no DDP or FSDP model: the {own:g} collectives a step per rank are the script's own "
                        "calls (its data-parallel all-reduces, and any inside the model's ops), read as such")
    meta = RunMeta(manifest=manifest, ddp=ddp, fsdp=fsdp, warnings=warnings_of(warnings), rank_gaps=gaps,
                   missing_ranks=[g.rank for g in gaps if g.missing_whole])
    return Run(ranks=ranks, source=folder, meta=meta)


def _own_collectives(ranks: list[RankTrace]) -> float:
    """Collectives a step per rank that a job with no DDP or FSDP model ran itself (Kineto's, outside and inside its ops):
    a ViT averaging its gradients by hand read as "compute only, no communication" beside 72 all-reduces a step."""
    # Kineto's transfers (a seq), not the pieces of ops that sized collectives inside them (counted in their groups)
    n = sum(int(((t.events.kind == Kind.COMM) & (t.events.seq >= 0)).sum()) + sum(g.count for g in t.meta.in_op_groups) for t in ranks)
    steps = sum(len(t.meta.steps_profiled) for t in ranks)
    return round(n / steps, 1) if steps else 0.0


def _rank_doc(folder: str, r: int, world: int) -> tuple[RankFile | None, RankGap | None]:
    """Rank ``r``'s file (checked to be rank ``r`` of this job), or its step files rebuilt; the gap, if any."""
    rpath = os.path.join(folder, rank_file(r))
    if os.path.lexists(rpath):  # a dangling link or a link loop is read, and refused as what it is
        f = read_file(rpath, RankFile)
        how = f.ended
    else:
        parts = os.path.join(folder, steps_dir(r))
        f = _from_step_files(parts) if os.path.exists(os.path.join(parts, STEPS_HEAD)) else None
        if f is None or not f.steps_profiled:
            return None, RankGap(r, f"nothing written (no {rank_file(r)}, no completed step): it crashed, was killed, or is still running")
        rpath = os.path.join(parts, STEPS_HEAD)
        how = (f.ended or f"killed (SIGKILL, out of memory), crashed or still running: its step files end at step {f.steps_profiled[-1]}"
               ) + f", no {rank_file(r)}"
    if f.rank != r:
        raise DagprofError(f"holds rank {f.rank}, not rank {r} (a copy of {rank_file(f.rank)}?)", rpath)
    if f.world_size != world:
        raise DagprofError(f"rank {r} of a {f.world_size}-rank job, but manifest.json says {world} ranks: not this run's file", rpath)
    if not how:
        return f, None
    first, stop = f.steps_requested
    profiled = set(f.steps_profiled)
    if stop - first > _LISTED_STEPS:  # an open-ended window (``steps=range(k, sys.maxsize)``): up to the step it died in
        stop = max(profiled, default=first - 1) + 2
    lost = tuple(s for s in range(first, stop) if s not in profiled)
    return (f, RankGap(r, how, lost)) if lost else (f, None)


def _from_step_files(folder: str) -> RankFile:
    """A rank's ``RankFile`` rebuilt from ``head.json`` and the committed lines of ``steps.jsonl`` (its completed steps)."""
    f: RankFile = read_file(os.path.join(folder, STEPS_HEAD), RankFile)
    parts, torn = read_step_log(os.path.join(folder, STEPS_LOG))
    layouts, saved = list(f.bucket_layouts), dict(f.layer_saved_bytes)
    for p in parts:
        if p.rank != f.rank:
            raise DagprofError(f"holds a step of rank {p.rank}, not of rank {f.rank}", os.path.join(folder, STEPS_LOG))
        f.layers += p.layers
        f.layer_grad_bytes.update(p.layer_grad_bytes)
        for k, nb in p.layer_saved_bytes.items():
            saved[k] = max(saved.get(k, 0), nb)
        if p.bucket_layout is not None:
            layouts.append(p.bucket_layout)
        f.warnings += p.warnings
        f.step_times_ns += p.step_times_ns
        f.records += p.records
        f.thread_sched_ns += p.thread_sched_ns
        f.process_cpu_ns += p.process_cpu_ns
        f.thread_runs += p.thread_runs
        f.other_threads_ns += p.other_threads_ns
        f.steps_profiled.append(p.step)
    if torn:
        f.warnings.append(f"rank {f.rank}: the record of the step after {f.steps_profiled[-1] if parts else 'none'} was cut off "
                          "while being written (the process was killed): dropped")
    f.layer_saved_bytes, f.bucket_layouts = saved, layouts
    f.steps_completed = len(f.step_times_ns)
    ended = os.path.join(folder, STEPS_ENDED)
    if os.path.exists(ended):
        f.ended = read_file(ended, Ended).how
    return f


def _check_even_windows(docs: list[tuple[str, RankFile]], folder: str) -> None:
    """Ranks that each ended normally after different numbers of steps trained on uneven inputs (DDP's ``Join``: a rank
    out of data shadows the others' collectives, outside any step of its own). A window past the shortest rank's last
    step holds steps some ranks ran alone: their collectives match nothing, and the job has no common step there."""
    done = {f.rank: f.steps_completed for _, f in docs if not f.ended}
    windows = {tuple(f.steps_profiled) for _, f in docs if not f.ended}
    if len(done) < 2 or len(set(done.values())) < 2 or len(windows) < 2:
        return
    short = min(done.values())
    counts = ", ".join(f"rank {r} {n}" for r, n in sorted(done.items()))
    raise DagprofError(f"ranks trained different numbers of steps ({counts}): uneven inputs (DDP's Join shadows the steps a "
                       f"rank runs alone), and the profiled window reaches past the shortest rank's last step {short - 1}: "
                       f"profile steps every rank trains (--steps {max(short - 5, 0)}:{short})", folder)


# how a DDP rank file says its model was wrapped: every rank of a job passes DDP the same (``_check_same_wrapper``)
WRAPPER_FIELDS = ("ddp_api", "comm_hook", "bucket_cap_mb", "find_unused")


def _check_same_wrapper(docs: list[tuple[str, RankFile]], folder: str) -> None:
    """Every DDP rank of a job wraps its model alike: a rank whose file says another API built its DDP, or another comm
    hook, bucket cap or ``find_unused_parameters`` (``WRAPPER_FIELDS``), is another job's file or a damaged one, which the
    graph would label, price and ``optimize`` would answer as rank 0's (the comm hook and bucket cap are read from rank 0
    alone)."""
    ddp = [(path, f) for path, f in docs if f.ddp]
    for path, f in ddp[1:]:
        first, f0 = ddp[0]
        for name in WRAPPER_FIELDS:
            mine, theirs = getattr(f, name), getattr(f0, name)
            if mine == theirs:
                continue
            said = (f"its gradients are reduced by {ddp_label(mine)}, {os.path.relpath(first, folder)}'s by {ddp_label(theirs)} "
                    f"(ddp_api)") if name == "ddp_api" else f"its {name} is {mine!r}, {os.path.relpath(first, folder)}'s {theirs!r}"
            raise DagprofError(f"{said}: every rank of a job wraps its model alike (another job's or a damaged file)", path)


def _check_unique(docs: list[tuple[str, RankFile]], folder: str) -> None:
    """Two rank files written by one process (same host and pid): one is a copy, whatever rank it now claims."""
    seen: dict[tuple[str, int], str] = {}
    for path, f in docs:
        if f.pid:
            other = seen.setdefault((f.host, f.pid), path)
            if other != path:
                raise DagprofError(f"{os.path.relpath(other, folder)} and {os.path.relpath(path, folder)} were written by the same "
                                   f"process ({f.host} pid {f.pid}): one is a copy, not another rank", folder)
