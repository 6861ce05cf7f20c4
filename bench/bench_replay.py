"""Replay speed at cluster scale (issue 6): dagprof's engines against networkx, side by side.

Sections (one run prints all):
1. full replay of random layered DAGs (the field guide's baseline shape: ~2 edges per node,
   16 devices) from 10k to 2M ops: numba engine, pure-Python reference, networkx build +
   topological sort + longest path (a weaker model -- no device contention -- timed as the
   usual baseline); time and peak memory, each in a fresh process;
2. incremental vs full replay after a late change: one op near the end of a 1M-op random
   DAG, and a late DDP bucket boundary moved on a ~1M-op 64-rank DDP graph;
3. rank folding: a 4,096-rank DDP graph replayed whole vs folded + expanded, and the
   "8 profiled ranks -> 4,096 ranks" what-if answered by folding first.

Times are CPU seconds of the measuring process (one core's work; the shared 2-core machine
makes wall-clock times swing 2-4x with other jobs), medians over repeats; the numba JIT is
compiled once and cached on disk, and each child process loads it before timing.

    python bench/bench_replay.py            # everything (several minutes)
    python bench/bench_replay.py --quick    # sizes up to 100k, smaller DDP graphs
"""
from __future__ import annotations

import argparse
import importlib
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc

import numpy as np

from dagprof.graph.dag import Graph, csr_graph
from dagprof.graph.random_graphs import ddp_graph, random_layered_dag
from dagprof.graph.symmetry import expand, fold_ranks
from dagprof.replay import IncrementalReplayer, replay
from dagprof.replay.numba_engine import load_kernels
from dagprof.traces.events import Kind

NX_MAX = 1_000_000  # networkx beyond this takes minutes and several GB
PY_MAX = 1_000_000  # pure Python beyond this: ~10 s per run


def timed(fn, reps: int) -> tuple[float, object]:
    """Median CPU seconds of ``fn`` over ``reps`` calls, and its last result."""
    ts, out = [], None
    for _ in range(reps):
        t = time.process_time()
        out = fn()
        ts.append(time.process_time() - t)
    return statistics.median(ts), out


def traced_peak_mb(fn) -> float:
    """Peak bytes allocated during ``fn`` (numpy buffers and Python objects)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def networkx_longest_path(g: Graph) -> tuple[float, float]:
    """Build + topological sort + longest path by node durations; (makespan, RSS MB while the graph is alive)."""
    import networkx as nx

    G = nx.DiGraph()
    G.add_nodes_from(range(len(g)))
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    G.add_edges_from(zip(src.tolist(), g.succ.tolist()))
    dur = g.dur.tolist()
    finish = [0.0] * len(g)
    for v in nx.topological_sort(G):
        finish[v] = dur[v] + max((finish[p] for p in G.pred[v]), default=0.0)
    return max(finish, default=0.0), rss_mb()


def child(method: str, n: int) -> dict:
    """One measurement in this (fresh) process."""
    g = random_layered_dag(n, seed=1)
    out: dict = {"n": len(g), "edges": g.num_edges}
    if method == "numba":
        load_kernels()  # cached JIT load + warm-up, excluded from the timing
        out["s"], r = timed(lambda: replay(g, "numba"), 5)
        out["peak_mb"] = traced_peak_mb(lambda: replay(g, "numba"))
        out["makespan"] = r.makespan
    elif method == "python":
        out["s"], r = timed(lambda: replay(g, "python"), 3 if n <= 100_000 else 1)
        out["peak_mb"] = traced_peak_mb(lambda: replay(g, "python")) if n <= 100_000 else None
        out["makespan"] = r.makespan
    else:
        importlib.import_module("networkx")  # its import is not part of the peak

        before = rss_mb()
        t = time.process_time()
        out["makespan"], after = networkx_longest_path(g)
        out["s"] = time.process_time() - t
        out["peak_mb"] = after - before  # growth of the resident set: networkx's objects
    return out


def run_child(method: str, n: int) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", method, str(n)], capture_output=True, text=True)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if unit == "s" else f"{x:.0f}"


def section_full(sizes: list[int]) -> None:
    print("== 1. full replay, random layered DAG (16 devices, fan-in 2), one core ==")
    print(f"{'ops':>9} {'edges':>9} | {'numba s':>8} {'MB':>5} | {'python s':>9} {'MB':>5} | {'networkx s':>10} {'MB':>6} |"
          f" {'py/numba':>8} {'nx/numba':>8}")
    for n in sizes:
        nb = run_child("numba", n)
        py = run_child("python", n) if n <= PY_MAX else None
        nx = run_child("networkx", n) if n <= NX_MAX else None
        for name, r in (("numba", nb), ("python", py), ("networkx", nx)):
            if r and "error" in r:
                print(f"  {name} at {n}: {r['error']}")
        ok = all(r is None or "error" in r or abs(r["makespan"] - nb["makespan"]) < 1e-6 * nb["makespan"]
                 for r in (py,)) if "error" not in nb else False
        ratio = lambda r: f"{r['s'] / nb['s']:.1f}x" if r and "s" in r and "s" in nb else "skipped"
        print(f"{nb.get('n', n):>9} {nb.get('edges', 0):>9} | {fmt(nb.get('s')):>8} {fmt(nb.get('peak_mb'), 'mb'):>5} |"
              f" {fmt(py and py.get('s')):>9} {fmt(py and py.get('peak_mb'), 'mb'):>5} |"
              f" {fmt(nx and nx.get('s')):>10} {fmt(nx and nx.get('peak_mb'), 'mb'):>6} |"
              f" {ratio(py):>8} {ratio(nx):>8}{'' if ok else '  MISMATCH python vs numba'}", flush=True)
    print(f"  (python skipped above {PY_MAX:,} ops, networkx above {NX_MAX:,}: minutes and GBs; python's peak only"
          " up to 100k: tracemalloc slows it; MB = peak traced allocations of the replay call, for networkx the"
          " resident-set growth; networkx ignores device contention, so its makespan differs; python and numba"
          " must agree exactly)\n")


def move_last_bucket_boundary(g: Graph) -> tuple[Graph, np.ndarray]:
    """In the last step, every rank's second-to-last bucket takes one more layer (its enqueue moves
    one backward op later); both buckets' all-reduces change size. Returns (new graph, changed nodes)."""
    step, buckets = int(g.step.max()), int(g.bucket.max()) + 1
    b = buckets - 2
    ip, pred = g.pred_csr
    enq = np.flatnonzero((g.kind == Kind.COMM_ENQUEUE) & (g.step == step) & (g.bucket == b))
    old = pred[ip[enq]]  # each enqueue's one predecessor: the bucket's last backward op
    nxt = np.array([[s for s in g.successors(v) if g.kind[s] == Kind.BACKWARD][0] for v in old])
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))
    dst = g.succ.astype(np.int64)
    drop = np.isin(src * len(g) + dst, old * len(g) + enq)
    src, dst = np.r_[src[~drop], nxt], np.r_[dst[~drop], enq]
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.step == step) & np.isin(g.bucket, [b, b + 1]))
    dur = g.dur.copy()
    dur[comm] *= np.array([1.1, 0.9])[g.bucket[comm] - b]
    cols = {c: getattr(g, c) for c in ("name", "kind", "rank", "device", "gap", "order", "step", "layer", "bucket",
                                       "nbytes")}
    new = csr_graph(len(g), src, dst, names=g.names, devices=g.devices, layers=g.layers, meta=g.meta.copy(), dur=dur, **cols)
    return new, np.unique(np.r_[enq, old, nxt, comm])


def section_incremental(n: int, ddp: tuple[int, int, int, int]) -> None:
    print("== 2. incremental vs full replay after a late change ==")
    print(f"{'case':<44} {'ops':>9} {'setup s':>7} {'full s':>7} {'incr s':>7} {'speed-up':>8} {'re-simulated':>12}"
          f" {'identical':>9}")

    def case(label: str, g: Graph, changes: list[tuple[Graph, np.ndarray | None]], copy: bool = True) -> None:
        setup, inc = timed(lambda: IncrementalReplayer(g), 1)  # one full replay + predecessor lists
        fulls, incs, same, resim = [], [], True, []
        for new, changed in changes:
            t = time.process_time()
            got = inc.update(new, changed, copy=copy)
            incs.append(time.process_time() - t)
            resim.append(inc.last_resimulated)
            t = time.process_time()
            ref = replay(new, "numba")
            fulls.append(time.process_time() - t)
            same &= all(np.array_equal(x, y) for x, y in ((got.start, ref.start), (got.end, ref.end), (got.gate, ref.gate)))
        f, i = statistics.median(fulls), statistics.median(incs)
        print(f"{label:<44} {len(g):>9} {setup:>7.3f} {f:>7.3f} {i:>7.3f} {f / i:>7.1f}x {int(statistics.median(resim)):>12} {str(same):>9}",
              flush=True)

    g = random_layered_dag(n, seed=1)
    done_order = IncrementalReplayer(g)._s.done_order  # completion order: pick ops that finish late
    for frac in (0.9, 0.97, 0.99):
        changes, cur = [], g
        for k in range(5):
            v = int(done_order[int(frac * n) + 37 * k])
            dur = cur.dur.copy()
            dur[v] *= 2.0
            cur = cur.replace(dur=dur)
            changes.append((cur, np.array([v])))
        case(f"random DAG, one op at {frac:.0%} of the run", g, changes)
    world, layers, buckets, steps = ddp
    g = ddp_graph(world, layers=layers, buckets=buckets, steps=steps)
    new, changed = move_last_bucket_boundary(g)
    case(f"DDP {world} ranks x {steps} steps, last bucket boundary", g, [(new, changed), (g, changed)] * 2)
    case("  same, update(copy=False): no result copies", g, [(new, changed), (g, changed)] * 2, copy=False)
    case("  same, changed nodes found by diff", g, [(new, None), (g, None)] * 2)
    print()


def section_fold(world: int, what_if: int) -> None:
    print("== 3. rank folding ==")
    g = ddp_graph(world, layers=50, buckets=5)
    tf, full = timed(lambda: replay(g, "numba"), 3)
    t0 = time.process_time()
    folded, info = fold_ranks(g)
    t1 = time.process_time()
    r = replay(folded, "numba")
    t2 = time.process_time()
    e = expand(r, info)
    t3 = time.process_time()
    same = all(np.array_equal(x, y) for x, y in ((full.start, e.start), (full.end, e.end), (full.gate, e.gate)))
    print(f"DDP {world} ranks, {len(g):,} ops: full replay {tf:.3f} s | fold {t1 - t0:.3f} s -> {len(folded)} ops,"
          f" replay {t2 - t1:.4f} s, expand {t3 - t2:.3f} s; total {t3 - t0:.3f} s; identical: {same}")
    tp, _ = timed(lambda: replay(folded, "python"), 3)
    tpf, _ = timed(lambda: replay(g, "python"), 1)
    print(f"  pure-Python engine: folded {tp:.4f} s vs full graph {tpf:.3f} s")
    try:
        from dagprof.passes.comm import current_topology, retime_collectives
        from dagprof.passes.workers import scale_workers
    except ImportError as err:
        print(f"  what-if skipped: {err}")
        return
    g8 = ddp_graph(8, layers=50, buckets=5, jitter=0.02)
    t0 = time.process_time()
    f8, info8 = fold_ranks(g8, average=True)
    scaled = retime_collectives(f8.replace(meta=f8.meta.replace(world_size=what_if)),
                                current_topology(g8).with_workers(what_if))
    r = replay(scaled)
    t1 = time.process_time()
    ref = scale_workers(g8, what_if)
    r_ref = replay(ref)
    t2 = time.process_time()
    print(f"what-if 8 profiled ranks -> {what_if:,} ranks: fold(average) + retime + replay {t1 - t0:.3f} s"
          f" (iteration {r.makespan / 1e3:.2f} ms); passes.workers.scale_workers + replay {t2 - t1:.3f} s"
          f" (iteration {r_ref.makespan / 1e3:.2f} ms, 8 distinct ranks kept); goal < 5 s")
    print()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("METHOD", "N"))
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    if load_kernels() is None:
        sys.exit("numba is not usable here: nothing to benchmark")
    if args.quick:
        section_full([10_000, 100_000])
        section_incremental(100_000, (8, 500, 10, 2))
        section_fold(512, 4096)
    else:
        section_full([10_000, 100_000, 1_000_000, 2_000_000])
        section_incremental(1_000_000, (64, 2000, 25, 4))
        section_fold(4096, 4096)


if __name__ == "__main__":
    main()
