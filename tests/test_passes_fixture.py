"""A hand-built DDP-shaped graph (the shape of ``graph.build``) used by the pass tests.

Per rank a main lane: STEP, forward per layer, backward per layer in reverse with a
bucket all-reduce enqueued as soon as its bucket is full, DDP's finalize wait, the
optimizer, next STEP. Each bucket all-reduce is SYNC -> COMM (shared channel) -> wait.
Building it directly for configuration B is the ground truth for transforming A into B.
"""
import numpy as np
import pytest

from dagprof.analysis import iteration_times
from dagprof.costmodel.alphabeta import AlphaBeta
from dagprof.costmodel.collectives import allreduce_us
from dagprof.costmodel.topology import CollectiveSpec, Topology
from dagprof.graph.dag import DeviceKind, GraphBuilder
from dagprof.replay import replay
from dagprof.traces.events import Kind

LINK = AlphaBeta(alpha_us=50.0, beta_us_per_byte=4e-3)  # 250 MB/s
LAYER_BYTES = [4_000_000, 1_000_000, 2_000_000, 3_000_000, 500_000, 2_500_000]
FWD_US = [300.0, 100.0, 200.0, 300.0, 50.0, 250.0]
BWD_US = [600.0, 200.0, 400.0, 600.0, 100.0, 500.0]


def buckets_for(cap: float, first: float | None = None) -> list[list[int]]:
    """Layers (in ready order: last layer first) grouped as DDP does after its rebuild."""
    out, cur, acc = [], [], 0
    for layer in reversed(range(len(LAYER_BYTES))):
        cur.append(layer)
        acc += LAYER_BYTES[layer]
        if acc >= (cap if first is None or out else first):
            out.append(cur)
            cur, acc = [], 0
    if cur:
        out.append(cur)
    return out


def ddp_graph(ranks: int = 2, steps: int = 3, cap: float = 5e6, link: AlphaBeta = LINK, overlap: bool = True,
              capacity: int = 1, compute_scale: float = 1.0, layer_nbytes: bool = True, first: float | None = None,
              known_link: bool = True):
    b = GraphBuilder()
    topo = Topology.flat(ranks, link)
    buckets = buckets_for(cap, first)
    channel = b.device("group 0", DeviceKind.COMM, capacity=capacity)
    lanes = [b.device(f"rank{r}/thread 1 (main)", DeviceKind.HOST, rank=r) for r in range(ranks)]
    layers = [b.layer(f"layer{i}") for i in range(len(LAYER_BYTES))]
    chains: list[list[int]] = [[] for _ in range(ranks)]
    enq: dict[tuple[int, int], list[int]] = {}
    waits: dict[int, list[int]] = {}
    t = 0.0
    for step in range(steps):
        t0 = t
        for r in range(ranks):
            t = t0
            c = chains[r]

            def node(name, kind, dur, **kw):
                nonlocal t
                v = b.add_node(f"rank{r}.{name}", kind, rank=r, device=lanes[r], dur=dur, order=t, step=step, **kw)
                t += dur
                c.append(v)
                return v

            node(f"step{step}", Kind.STEP, 0.0)
            for i in range(len(LAYER_BYTES)):
                node(f"layer{i} forward", Kind.FORWARD, FWD_US[i] / compute_scale, layer=layers[i])
            done_layers: set[int] = set()
            pending = list(range(len(buckets)))
            for i in reversed(range(len(LAYER_BYTES))):
                node(f"layer{i} backward", Kind.BACKWARD, BWD_US[i] / compute_scale, layer=layers[i],
                     nbytes=LAYER_BYTES[i] if layer_nbytes else 0)
                done_layers.add(i)
                while overlap and pending and set(buckets[pending[0]]) <= done_layers:
                    k = pending.pop(0)
                    enq.setdefault((step, k), []).append(node(f"allreduce bucket {k}", Kind.COMM_ENQUEUE, 10.0, bucket=k))
            for k in pending:
                enq.setdefault((step, k), []).append(node(f"allreduce bucket {k}", Kind.COMM_ENQUEUE, 10.0, bucket=k))
            waits.setdefault(step, []).append(node("ddp finalize", Kind.COMM_WAIT, 0.0))
            node("optimizer.step", Kind.UPDATE, 400.0 / compute_scale)
    for r in range(ranks):
        chains[r].append(b.add_node(f"rank{r}.step{steps}", Kind.STEP, rank=r, device=lanes[r], order=t + 1e6, step=steps))
        b.chain(chains[r])
    for (step, k), ready in sorted(enq.items()):
        nbytes = sum(LAYER_BYTES[i] for i in buckets[k])
        sync = b.add_node(f"sync {step} {k}", Kind.SYNC, step=step, bucket=k)
        comm = b.add_node(f"allreduce {step} {k}", Kind.COMM, device=channel, dur=allreduce_us(nbytes, topo), order=float(step * 1e4 + k),
                          step=step, bucket=k, nbytes=nbytes)
        b.add_edges(ready, [sync] * len(ready))
        b.add_edge(sync, comm)
        b.add_edges([comm] * ranks, waits[step])
    b.meta.world_size, b.meta.steps, b.meta.backend = ranks, list(range(steps)), "gloo"
    if known_link:  # as after ``whatif --link-model``; without it passes fit the link to the COMM nodes
        b.meta.topology, b.meta.scheme = topo, CollectiveSpec()
    return b.build()


def iter_us(g) -> float:
    return max(iteration_times(g, replay(g)).values())


def test_fixture_replays_to_compute_plus_exposed_comm():
    g = ddp_graph(ranks=2, cap=1e12, overlap=False)
    compute = sum(FWD_US) + sum(BWD_US) + 10.0 + 400.0
    comm = allreduce_us(sum(LAYER_BYTES), Topology.flat(2, LINK))
    assert iter_us(g) == pytest.approx(compute + comm)


def test_overlap_hides_communication():
    assert iter_us(ddp_graph(cap=2e6)) < iter_us(ddp_graph(cap=2e6, overlap=False))


def test_bucket_layout_like_ddp():
    assert buckets_for(5e6) == [[5, 4, 3], [2, 1, 0]]
    assert buckets_for(5e6, first=2**20) == [[5], [4, 3, 2], [1, 0]]
    assert np.all(np.diff(ddp_graph().step[ddp_graph().kind == Kind.COMM]) >= 0)
