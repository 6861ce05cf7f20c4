"""Synthetic graphs for replay tests and benchmarks (never for predictions).

``random_layered_dag``: the field guide's replay baseline (n nodes, about
``fanin * n`` edges, nodes spread over devices). ``ddp_graph``: the shape the graph
builder emits for data-parallel training -- per rank a compute lane
("rank{r}/compute") running forward, backward and the update, one shared COMM
node per gradient bucket (rank -1, on a group channel) joined by a SYNC node
whose predecessors are every rank's bucket-ready point.
"""
from __future__ import annotations

import numpy as np

from ..traces.events import Kind, intern
from .dag import NODE_COLUMNS, Device, DeviceKind, Graph, csr_graph
from .meta import GraphMeta


def _columns(n: int) -> dict[str, np.ndarray]:
    cols = {c: np.zeros(n, dtype=t) for c, t in NODE_COLUMNS.items()}
    for c in ("step", "layer", "bucket"):
        cols[c][:] = -1
    return cols


def random_layered_dag(
    n: int,
    *,
    fanin: int = 2,
    window: int = 64,
    devices: int = 16,
    capacity: int = 1,
    virtual_frac: float = 0.0,
    zero_frac: float = 0.0,
    gap: float = 0.0,
    integer_times: bool = False,
    seed: int = 0,
) -> Graph:
    """A random DAG: node v has up to ``fanin`` predecessors among the ``window`` nodes before it.

    ``virtual_frac`` of the nodes need no device (device -1), ``zero_frac`` have zero
    duration; ``integer_times`` draws small integer durations and orders, so that
    completion times and priorities tie often (what tests want).
    """
    rng = np.random.default_rng(seed)
    cols = _columns(n)
    if integer_times:
        cols["dur"] = rng.integers(0, 4, n).astype(np.float64)
        cols["order"] = rng.integers(0, max(n // 4, 1), n).astype(np.float64)
        cols["gap"] = rng.integers(0, 2, n) * gap
    else:
        cols["dur"] = rng.exponential(10.0, n)
        cols["order"] = np.arange(n, dtype=np.float64)
        cols["gap"] = np.full(n, gap)
    cols["dur"][rng.random(n) < zero_frac] = 0.0
    cols["device"] = rng.integers(0, devices, n).astype(np.int32)
    cols["device"][rng.random(n) < virtual_frac] = -1
    cols["kind"][:] = int(Kind.KERNEL)
    cols["rank"][:] = -1
    dst = np.repeat(np.arange(1, n, dtype=np.int64), fanin)
    src = dst - rng.integers(1, window + 1, len(dst))
    ok = src >= 0
    devs = [Device(f"dev{i}", DeviceKind.COMPUTE, capacity=capacity) for i in range(devices)]
    return csr_graph(n, src[ok], dst[ok], names=["op"], devices=devs, layers=[], **cols)


def ddp_graph(
    world_size: int,
    *,
    layers: int = 50,
    buckets: int = 5,
    steps: int = 1,
    comm_capacity: int = 1,
    jitter: float = 0.0,
    seed: int = 0,
) -> Graph:
    """A DDP-shaped multi-rank graph; ``jitter`` > 0 makes ranks' durations differ (relative std).

    Per rank and step: forward F_1..F_L, backward B_L..B_1 chained on "rank{r}/compute";
    after the last gradient of bucket b (buckets cover the layers from the last one
    down), an enqueue node; SYNC_b joins every rank's enqueue; COMM_b (rank -1, on
    "group0/channel") follows it; each rank's WAIT_b follows COMM_b; UPDATE follows the
    rank's waits and its last backward; the next step's F_1 follows the update.
    """
    rng = np.random.default_rng(seed)
    per_rank = steps * (2 * layers + 2 * buckets + 1)
    n = world_size * per_rank + steps * 2 * buckets
    cols = _columns(n)
    names: list[str] = []
    name_ids: dict[str, int] = {}
    devices = [Device(f"rank{r}/compute", DeviceKind.COMPUTE, rank=r) for r in range(world_size)]
    devices.append(Device("group0/channel", DeviceKind.COMM, capacity=comm_capacity))
    chan = world_size
    fwd = rng.uniform(50, 500, layers)
    bwd = 2 * fwd
    bucket_of = np.minimum((layers - 1 - np.arange(layers)) * buckets // layers, buckets - 1)  # backward order
    src: list[int] = []
    dst: list[int] = []
    nxt = 0

    def node(name: str, kind: Kind, rank: int, device: int, dur: float, order: float, step: int, **extra: int) -> int:
        nonlocal nxt
        v = nxt
        nxt += 1
        cols["name"][v] = intern(name_ids, names, name)
        cols["kind"][v] = int(kind)
        cols["rank"][v] = rank
        cols["device"][v] = device
        cols["dur"][v] = dur
        cols["order"][v] = order
        cols["step"][v] = step
        for c, x in extra.items():
            cols[c][v] = x
        return v

    def edge(u: int, v: int) -> None:
        src.append(u)
        dst.append(v)

    prev_update = [-1] * world_size
    for s in range(steps):
        enq = np.zeros((world_size, buckets), dtype=np.int64)
        wait_nodes = np.zeros((world_size, buckets), dtype=np.int64)
        last_bwd = [0] * world_size
        for r in range(world_size):
            scale = 1.0 + jitter * rng.standard_normal(2 * layers) if jitter else np.ones(2 * layers)
            t = s * 1e6
            prev = prev_update[r]
            for i in range(layers):
                v = node(f"rank{r}.fwd.{i}", Kind.FORWARD, r, r, fwd[i] * scale[i], t, s, layer=i)
                t += 1
                if prev >= 0:
                    edge(prev, v)
                prev = v
            for i in reversed(range(layers)):
                v = node(f"rank{r}.bwd.{i}", Kind.BACKWARD, r, r, bwd[i] * scale[layers + i], t, s, layer=i)
                t += 1
                edge(prev, v)
                prev = v
                b = int(bucket_of[i])
                if i == 0 or bucket_of[i - 1] != b:
                    e = node(f"rank{r}.allreduce_enqueue.{b}", Kind.COMM_ENQUEUE, r, r, 5.0, t, s, bucket=b)
                    t += 1
                    edge(v, e)
                    enq[r, b] = e
            last_bwd[r] = prev
        for b in range(buckets):
            sync = node(f"sync.bucket{b}", Kind.SYNC, -1, -1, 0.0, 0.0, s, bucket=b)
            for r in range(world_size):
                edge(int(enq[r, b]), sync)
            comm = node(f"allreduce.bucket{b}", Kind.COMM, -1, chan, 2000.0 / buckets, s * 1e6 + b, s,
                        bucket=b, nbytes=4 << 20)
            edge(sync, comm)
            for r in range(world_size):
                w = node(f"rank{r}.wait.{b}", Kind.COMM_WAIT, r, r, 2.0, s * 1e6 + 1e5 + b, s, bucket=b)
                edge(comm, w)
                wait_nodes[r, b] = w
        for r in range(world_size):
            u = node(f"rank{r}.optimizer.step", Kind.UPDATE, r, r, 300.0, s * 1e6 + 2e5, s)
            edge(last_bwd[r], u)
            for b in range(buckets):
                edge(int(wait_nodes[r, b]), u)
            prev_update[r] = u
    assert nxt == n
    return csr_graph(n, np.asarray(src, np.int64), np.asarray(dst, np.int64), names=names, devices=devices,
                     layers=[f"layer{i}" for i in range(layers)], meta=GraphMeta(world_size=world_size), **cols)
