"""A folder of Kineto rank traces -> ``Run``: ranks parsed in parallel processes, parses cached.

One process per uncached file (up to ``jobs``) because parsing is CPU-bound Python; cached
ranks load in the calling process (a memory copy, no parse). Files that are not Kineto
traces at all (e.g. dagprof's own replay.trace.json written beside them) are skipped and
listed in ``run.meta.skipped``; ranks of the job (``distributedInfo.world_size``) without
a file are ``run.meta.rank_gaps`` (``completeness``); every other problem is a one-line ``DagprofError``.
"""
from __future__ import annotations

import dataclasses
import glob
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from ..errors import DagprofError
from ..progress import progress
from . import cache
from .completeness import check_same_job
from .events import RankTrace, Run
from .kineto import read_kineto
from .meta import RankGap, RunMeta, RunWarning
from .ray_parse import parse_on_ray, ray_address

TRACE_PATTERNS = ("*.json", "*.json.gz")
_FOREIGN = "not a Kineto trace"


def trace_files(folder: str) -> list[str]:
    return sorted(f for pat in TRACE_PATTERNS for f in glob.glob(os.path.join(folder, pat)))


def read_cached(path: str, use_cache: bool = True) -> RankTrace:
    """``read_kineto`` through the parse cache (``cache.cache_dir()``)."""
    if use_cache:
        hit = cache.load_cached(path)
        if hit is not None:
            return hit
    trace = read_kineto(path)
    if use_cache:
        cache.store(path, trace)
    return trace


def parse_file(path: str, use_cache: bool) -> RankTrace | str:
    """One rank trace, or why the file is not one (a JSON file of something else is skipped, not an error)."""
    try:
        return read_cached(path, use_cache)
    except DagprofError as e:
        if _FOREIGN in e.problem:
            return e.problem
        raise


def _runs_below(folder: str) -> str:
    """Where ``folder`` holds runs one level down (a folder of experiments given for one of them): which, to pick one."""
    from .formats import sniff  # noqa: PLC0415  (formats dispatches to this module's reader)
    try:
        subs = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return ""
    runs = [s for s in subs if sniff(os.path.join(folder, s)) is not None or trace_files(os.path.join(folder, s))]
    if not runs:
        return ""
    return f", but {len(runs)} of its folders hold runs ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}): give dagprof one of them"


def read_trace_dir(path: str | os.PathLike[str], jobs: int | None = None, use_cache: bool = True) -> Run:
    """Every rank trace in ``path`` (not recursive), sorted by rank."""
    folder = os.fspath(path)
    files = trace_files(folder)
    if not files:
        raise DagprofError("no torch.profiler traces (*.json, *.json.gz) here" + _runs_below(folder), folder)
    results: dict[str, RankTrace | str] = {}
    todo = []
    for f in files:
        hit = cache.load_cached(f) if use_cache else None
        if hit is not None:
            results[f] = hit
        else:
            todo.append(f)
    workers = min(len(todo), jobs or os.cpu_count() or 1)
    if todo and ray_address():  # a cluster's workers parse (ray_parse.py)
        results.update(parse_on_ray(todo, ray_address(), parse_file, use_cache))
    elif workers > 1:
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            for f, r in zip(todo, progress(pool.map(parse_file, todo, [use_cache] * len(todo)), "parsing rank traces", len(todo), "rank")):
                results[f] = r
    else:
        for f in progress(todo, "parsing rank traces", unit="rank"):
            results[f] = parse_file(f, use_cache)
    ranks = [r for r in results.values() if isinstance(r, RankTrace)]
    skipped = {os.path.basename(f): r for f, r in results.items() if isinstance(r, str)}
    if not ranks:
        raise DagprofError(f"none of the {len(files)} JSON files is a Kineto trace", folder)
    ranks, meta = _rank_report(ranks, skipped, folder)
    return Run(sorted(ranks, key=lambda t: t.rank), source=folder, meta=meta)


def _world_from_folder(ranks: list[RankTrace]) -> list[RankTrace]:
    """Traces without ``distributedInfo`` (older torch) take their rank from the file name, and alone each can only
    say the job had at least rank + 1 ranks: the folder says how many."""
    guessed = [t.meta.rank_source == "file name" and t.world_size == t.rank + 1 for t in ranks]
    if not any(guessed) or len({t.world_size for t, g in zip(ranks, guessed) if not g}) > 1:
        return ranks
    world = max(t.world_size for t in ranks)
    out = []
    for t, g in zip(ranks, guessed):
        if g:  # the default group spans the job (``kineto._rank_trace`` gave it the guessed ranks)
            default = {"0": list(range(world))} if t.group_ranks.get("0") == list(range(t.world_size)) else {}
            t = dataclasses.replace(t, world_size=world, group_ranks={**t.group_ranks, **default})
        out.append(t)
    return out


def _rank_report(ranks: list[RankTrace], skipped: dict[str, str], folder: str) -> tuple[list[RankTrace], RunMeta]:
    ranks, warnings = _latest_run(ranks, folder)
    ranks = _world_from_folder(ranks)
    _refuse_other_worlds(ranks, folder)
    check_same_job(ranks, folder)
    said = ""
    if skipped:  # said, so that a rank's trace saved as something else (or damaged into one) is not missed unseen
        names = sorted(skipped)
        said = (f"{len(names)} JSON file(s) here are not Kineto traces, skipped: {', '.join(names[:3])}"
                + (f" and {len(names) - 3} more" if len(names) > 3 else "") + f" ({skipped[names[0]]})")
        warnings.append(said)
    world = ranks[0].world_size
    missing = sorted(set(range(world)) - {t.rank for t in ranks})
    gap = "no trace file here" + (f"; {said}" if said else "")
    return ranks, RunMeta(missing_ranks=missing, rank_gaps=[RankGap(r, gap) for r in missing],
                          skipped=skipped, warnings=[RunWarning(w) for w in warnings])


def _refuse_other_worlds(ranks: list[RankTrace], folder: str) -> None:
    """Ranks of one job agree on its size (a size guessed from a file name, ``rank + 1``, says nothing yet)."""
    by_size: dict[int, list[str]] = {}
    for t in ranks:
        if t.meta.rank_source != "file name":
            by_size.setdefault(t.world_size, []).append(os.path.basename(t.source))
    if len(by_size) > 1:  # the odd ones out first; one name per size keeps a folder of thousands one line
        sizes = ", ".join(f"{min(n)}: {w}" + (f" and {len(n) - 1} more" if len(n) > 1 else "")
                          for w, n in sorted(by_size.items(), key=lambda kv: (len(kv[1]), kv[0])))
        raise DagprofError(f"the traces disagree on the world size ({sizes}): they are not one job", folder)


def _latest_run(ranks: list[RankTrace], folder: str) -> tuple[list[RankTrace], list[str]]:
    """A folder may hold several runs of the same job (trace_handler names carry a timestamp): when a rank
    repeats and the files split into runs one after the other in time, the latest run is read."""
    if len({t.rank for t in ranks}) == len(ranks):
        return ranks, []
    _refuse_other_worlds(ranks, folder)  # another job's trace beside this one's is no earlier run of it
    span = {id(t): (t.base_ns, t.base_ns + int(float(t.events.end.max(initial=0.0)) * 1000)) for t in ranks}
    runs: list[list[RankTrace]] = []
    for t in sorted(ranks, key=lambda t: span[id(t)]):
        if not runs or t.rank in {u.rank for u in runs[-1]}:
            runs.append([t])
        else:
            runs[-1].append(t)
    for prev, nxt in zip(runs, runs[1:]):
        if max(span[id(t)][1] for t in prev) > min(span[id(t)][0] for t in nxt):  # overlapping in time: not runs
            seen: dict[int, str] = {}
            for t in sorted(ranks, key=lambda t: t.source):
                if t.rank in seen:
                    raise DagprofError(f"rank {t.rank} appears twice: {os.path.basename(seen[t.rank])} and {os.path.basename(t.source)}", folder)
                seen[t.rank] = t.source
    latest = runs[-1]
    names = ", ".join(sorted(os.path.basename(t.source) for t in latest))
    return latest, [f"this folder holds {len(runs)} runs of the same ranks, recorded one after the other: reading the latest "
                    f"({names}); pass one trace file or a folder per run to read another"]
