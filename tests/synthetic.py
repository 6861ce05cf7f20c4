"""Hand-built rank traces with known timings, shaped like a CPU DDP profile.

Each step on rank r: forward layers, backward layers (each bucket's all-reduce enqueued after
its last layer), a wait for all buckets, an optimizer update. The transfer of bucket b starts
when the later rank enqueued it (or when the comm lane frees) and lasts ``comm_us``.
"""
from __future__ import annotations

import numpy as np

from dagprof.traces.buckets import Bucket
from dagprof.traces.events import EventTable, Kind, Lane, LaneKind, RankTrace, Run


def ddp_run(
    ranks: int = 2,
    steps: int = 3,
    layers: int = 4,
    fw_us: float = 10.0,
    bw_us: float = 20.0,
    comm_us: float = 15.0,
    update_us: float = 5.0,
    slow: dict[int, float] | None = None,
    buckets: tuple[tuple[int, ...], ...] = ((3, 2), (1, 0)),
    gap_us: float = 1.0,
) -> Run:
    """A run where rank r's compute is scaled by ``slow.get(r, 1)``."""
    slow = slow or {}
    rows: dict[int, list[tuple]] = {r: [] for r in range(ranks)}
    flows: dict[int, list[tuple[int, int]]] = {r: [] for r in range(ranks)}
    t = {r: 0.0 for r in range(ranks)}
    comm_free = 0.0
    for step in range(steps):
        enq: dict[int, dict[int, int]] = {r: {} for r in range(ranks)}
        enq_t: dict[int, dict[int, float]] = {r: {} for r in range(ranks)}
        starts = dict(t)
        for r in range(ranks):
            f = slow.get(r, 1.0)
            for layer in range(layers):
                rows[r].append((f"fw.l{layer}", Kind.FORWARD, 0, t[r], fw_us * f, step, layer, -1, 0))
                t[r] += fw_us * f + gap_us
            for layer in reversed(range(layers)):
                rows[r].append((f"bw.l{layer}", Kind.BACKWARD, 0, t[r], bw_us * f, step, layer, -1, 0))
                t[r] += bw_us * f + gap_us
                for b, members in enumerate(buckets):
                    if members[-1] == layer:
                        enq[r][b] = len(rows[r])
                        enq_t[r][b] = t[r]
                        rows[r].append(("c10d::allreduce_", Kind.COMM_ENQUEUE, 0, t[r], 1.0, step, -1, b, 0))
                        t[r] += 1.0 + gap_us
        comm_end = {}
        for b in range(len(buckets)):
            begin = max(max(enq_t[r][b] + 1.0 for r in range(ranks)), comm_free)
            comm_end[b] = begin + comm_us
            comm_free = comm_end[b]
            for r in range(ranks):
                s = enq_t[r][b] + 1.0 if ranks == 1 else enq_t[r][b] + 1.0
                k = len(rows[r])
                rows[r].append(("gloo:all_reduce", Kind.COMM, 1, s, comm_end[b] - s, step, -1, b, 4096))
                flows[r].append((enq[r][b], k))
        for r in range(ranks):
            done = max(comm_end.values())
            w = len(rows[r])
            wait_start = t[r]
            rows[r].append(("wait", Kind.COMM_WAIT, 0, wait_start, max(done, wait_start) - wait_start, step, -1, -1, 0))
            for b in range(len(buckets)):
                flows[r].append((next(i for i, row in enumerate(rows[r]) if row[1] == Kind.COMM and row[5] == step and row[7] == b), w))
            t[r] = max(done, wait_start) + gap_us
            rows[r].append(("Optimizer.step#SGD.step", Kind.UPDATE, 0, t[r], update_us, step, -1, -1, 0))
            t[r] += update_us + gap_us
        end = max(t.values())
        for r in range(ranks):
            rows[r].append((f"ProfilerStep#{step}", Kind.STEP, 0, starts[r], t[r] - starts[r], step, -1, -1, 0))
            t[r] = end  # next step starts together (data loading hides the skew)
    traces = []
    for r in range(ranks):
        names = sorted({row[0] for row in rows[r]})
        idx = {n: i for i, n in enumerate(names)}
        cols = list(zip(*rows[r]))
        is_comm = np.array(cols[1]) == Kind.COMM
        seq = np.where(is_comm, np.cumsum(is_comm) - 1, -1)
        table = EventTable.from_columns(
            names, name=[idx[n] for n in cols[0]], kind=cols[1], lane=cols[2], start=cols[3], dur=cols[4],
            step=cols[5], layer=cols[6], bucket=cols[7], nbytes=cols[8], group=np.where(is_comm, 0, -1), seq=seq,
        )
        traces.append(RankTrace(
            rank=r, world_size=ranks, source=f"synthetic/rank{r}", events=table,
            lanes=[Lane("main", LaneKind.CPU_THREAD, main=True), Lane("gloo", LaneKind.COMM_THREAD)],
            layers=[f"layer{i}" for i in range(layers)], groups=["0"], flows=np.array(flows[r], dtype=np.int64),
            buckets=tuple(Bucket(b, 4096, tuple(f"layer{i}.weight" for i in m)) for b, m in enumerate(buckets)), backend="gloo",
        ))
    return Run(traces, source="synthetic")
