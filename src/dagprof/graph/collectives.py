"""Fine-grained collective sub-graphs: one node per message on a per-link queue.

A coarse graph prices a whole all-reduce as one COMM node; here every message of the
algorithm is a node on the device of the link it crosses ("link a->b", capacity 1),
so collectives that share a link queue behind each other and a slow hop delays just
the steps that cross it (dPRO's SEND/RECV sub-ops). Message costs come from the
``Topology`` link models; replaying one collective alone gives exactly
``costmodel.topology.allreduce_us`` (the unit tests check this).

Every builder takes, per participating rank, the nodes that must finish before the
rank contributes (``ready``) and the node that consumes the result (``done``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..costmodel.alphabeta import AlphaBeta
from ..costmodel.topology import CollectiveSpec, Scheme, Topology, ps_chunks
from ..errors import DagprofError
from ..traces.events import Kind
from .dag import DeviceKind, GraphBuilder

_STEP_EPS = 1e-6  # keeps a collective's own steps in order on a link without overtaking the next collective


@dataclass
class _Ctx:
    b: GraphBuilder
    topo: Topology
    tag: str
    order: float
    step: int
    bucket: int

    def send(self, src: int, dst: int, nbytes: float, preds: Sequence[int], *, reduce: bool, k: int, link: AlphaBeta | None = None,
             device: str | None = None, rank: int | None = None) -> int:
        ab = link or self.topo.link(src, dst)
        dur = ab.message_us(nbytes) + (nbytes * ab.gamma_us_per_byte if reduce else 0.0)
        dev = self.b.device(device or f"link {src}->{dst}", DeviceKind.COMM)
        v = self.b.add_node(f"{self.tag} {k} {src}->{dst}", Kind.COMM, rank=src if rank is None else rank, device=dev, dur=dur,
                            order=self.order + k * _STEP_EPS, step=self.step, bucket=self.bucket, nbytes=int(nbytes))
        for p in preds:
            self.b.add_edge(p, v)
        return v


def add_allreduce(
    b: GraphBuilder,
    ready: Sequence[Sequence[int]],
    done: Sequence[int],
    nbytes: float,
    topo: Topology,
    spec: CollectiveSpec = CollectiveSpec(),
    *,
    order: float = 0.0,
    step: int = -1,
    bucket: int = -1,
    tag: str = "allreduce",
) -> None:
    """Add an all-reduce of ``nbytes`` over ranks 0..len(ready)-1 with the given scheme."""
    n = len(ready)
    if n != topo.world_size or len(done) != n:
        raise DagprofError(f"collective over {n} ranks does not fit a topology of {topo.world_size} ranks")
    ctx = _Ctx(b, topo, tag, order, step, bucket)
    if topo.overhead_us > 0 and (n > 1 or spec.scheme is Scheme.PS):
        ready = [[_delay(b, f"{tag} overhead {r}", r, topo.overhead_us, preds, step, bucket)] for r, preds in enumerate(ready)]
    if spec.scheme is Scheme.PS:
        _ps(ctx, ready, done, nbytes, spec.servers)
        return
    if n == 1:
        for p in ready[0]:
            b.add_edge(p, done[0])
        return
    if spec.scheme is Scheme.RING:
        ends = _ring(ctx, list(range(n)), ready, nbytes)
    elif spec.scheme is Scheme.TREE:
        ends = _tree(ctx, ready, nbytes)
    else:
        ends = _hierarchical(ctx, ready, nbytes)
    for r in range(n):
        for p in ends[r]:
            b.add_edge(p, done[r])


def _delay(b: GraphBuilder, name: str, rank: int, us: float, preds: Sequence[int], step: int, bucket: int) -> int:
    """The collective's fixed software cost, paid by every rank before its first message."""
    v = b.add_node(name, Kind.COMM, rank=rank, dur=us, step=step, bucket=bucket)
    for p in preds:
        b.add_edge(p, v)
    return v


def _ring(ctx: _Ctx, ranks: list[int], ready: Sequence[Sequence[int]], nbytes: float) -> list[list[int]]:
    """Reduce-scatter then all-gather: 2(N-1) steps of M/N per link; step c at rank i needs step c-1 from i-1."""
    n = len(ranks)
    if n == 1:
        return [list(ready[0])]
    chunk = nbytes / n
    prev: list[int] = []
    for c in range(2 * (n - 1)):
        cur = []
        for i, r in enumerate(ranks):
            preds = list(ready[i]) if c == 0 else [prev[(i - 1) % n]]
            cur.append(ctx.send(r, ranks[(i + 1) % n], chunk, preds, reduce=c < n - 1, k=c))
        prev = cur
    return [[prev[(i - 1) % n]] for i in range(n)]


def _tree(ctx: _Ctx, ready: Sequence[Sequence[int]], nbytes: float) -> list[list[int]]:
    """Heap-ordered binary tree: children reduce into parents up to rank 0, then broadcast down."""
    n = len(ready)
    up: list[int] = [-1] * n
    for i in range(n - 1, 0, -1):  # children before parents
        kids = [up[c] for c in (2 * i + 1, 2 * i + 2) if c < n]
        up[i] = ctx.send(i, (i - 1) // 2, nbytes, list(ready[i]) + kids, reduce=True, k=0)
    root = list(ready[0]) + [up[c] for c in (1, 2) if c < n]
    have: list[list[int]] = [root] + [[] for _ in range(1, n)]
    for i in range(1, n):  # parents before children
        have[i] = [ctx.send((i - 1) // 2, i, nbytes, have[(i - 1) // 2], reduce=False, k=1)]
    return have


def _hierarchical(ctx: _Ctx, ready: Sequence[Sequence[int]], nbytes: float) -> list[list[int]]:
    """Reduce to each host's first device, ring all-reduce among those leaders, broadcast back."""
    topo = ctx.topo
    g = topo.devices_per_host
    leaders = [h * g for h in range(topo.hosts)]
    lead_ready = []
    for leader in leaders:
        local = [ctx.send(d, leader, nbytes, ready[d], reduce=True, k=0) for d in range(leader + 1, leader + g)]
        lead_ready.append(list(ready[leader]) + local)
    ring_ends = _ring(ctx, leaders, lead_ready, nbytes)
    ends: list[list[int]] = [[] for _ in range(topo.world_size)]
    for leader, have in zip(leaders, ring_ends):
        ends[leader] = have
        for d in range(leader + 1, leader + g):
            ends[d] = [ctx.send(leader, d, nbytes, have, reduce=False, k=2 * len(leaders))]
    return ends


def _ps(ctx: _Ctx, ready: Sequence[Sequence[int]], done: Sequence[int], nbytes: float, servers: int) -> None:
    """BytePS: the tensor is cut into K parts; part k is pushed to server k by every worker,
    summed there, and pulled back (``add_ps_part``)."""
    n = len(ready)
    part = nbytes / servers
    link = ctx.topo.inter
    pulls: list[list[int]] = [[] for _ in range(n)]
    for k in range(servers):
        ends = add_ps_part(ctx.b, ready, k, part, link, part * n * link.gamma_us_per_byte, tag=ctx.tag, order=ctx.order, step=ctx.step,
                           bucket=ctx.bucket)
        for w in range(n):
            pulls[w].append(ends[w])
    for w in range(n):
        ctx.b.add_edges(pulls[w], [done[w]] * len(pulls[w]))


def ps_devices(server: int) -> tuple[str, str, str]:
    """Names of a parameter server's devices: its network port in, its CPU, its port out."""
    return f"port ps{server} in", f"ps{server} cpu", f"port ps{server} out"


def worker_ports(worker: int) -> tuple[str, str]:
    """Names of a worker's network port: out (its pushes leave here), in (its pulls arrive here)."""
    return f"port w{worker} out", f"port w{worker} in"


def add_ps_part(b: GraphBuilder, ready: Sequence[Sequence[int]], server: int, nbytes: float, link: AlphaBeta, server_us: float, *,
                tag: str = "ps", order: float = 0.0, step: int = -1, bucket: int = -1) -> list[int]:
    """One part of a tensor (or one key) through server ``server``; returns each worker's pull node.

    The parameter-server model every PS graph shares (BytePS what-ifs and measured MXNet/ps-lite
    jobs). A message crosses two network ports, the sender's out and the receiver's in, each a
    capacity-1 device at the link's rate: a worker's push leaves through its own port and enters
    the server's, the pull the other way. So N workers' pushes queue on a server's port in, and a
    worker's parts for K servers queue on its own port out; whichever carries more bytes sets the
    pace. A message is cut into ``ps_chunks`` chunks that cross the two ports as a pipeline (chunk
    i is on the receiver's port while chunk i+1 leaves the sender), and chunks of messages issued
    together interleave on a port as concurrent TCP streams share it. The latency alpha is paid
    once per message (no device: messages pipeline); the server sums and updates once every push
    is in (``server_us`` on its CPU). ``costmodel.topology.ps_allreduce_us`` is this sub-graph's
    closed form.
    """
    port_in, cpu, port_out = ps_devices(server)
    dev_in, dev_cpu, dev_out = b.device(port_in, DeviceKind.COMM), b.device(cpu, DeviceKind.COMPUTE), b.device(port_out, DeviceKind.COMM)
    k = ps_chunks(nbytes, len(ready))
    chunk = nbytes / k
    eps = max(_STEP_EPS, 4 * float(np.spacing(order)))  # chunk i of every message issued at ``order`` shares one priority
    kw = dict(order=order, step=step, bucket=bucket)
    pushed = []
    for w, preds in enumerate(ready):
        up = b.device(worker_ports(w)[0], DeviceKind.COMM, rank=w)
        lat = b.add_node(f"{tag} push latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, **kw)
        b.add_edges(list(preds), [lat] * len(preds))
        pushed.append(_message(b, lat, up, dev_in, k, chunk, link, eps, f"{tag} push ps{server} w{w}", w, **kw))
    s = b.add_node(f"{tag} ps{server} sum", Kind.COMM, rank=-1, device=dev_cpu, dur=server_us, nbytes=int(nbytes * len(ready)), **kw)
    b.add_edges(pushed, [s] * len(pushed))
    pulls = []
    for w in range(len(ready)):
        down = b.device(worker_ports(w)[1], DeviceKind.COMM, rank=w)
        v = _message(b, s, dev_out, down, k, chunk, link, eps, f"{tag} pull ps{server} w{w}", w, **kw)
        lat = b.add_node(f"{tag} pull latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, **kw)
        b.add_edge(v, lat)
        pulls.append(lat)
    return pulls


def _message(b: GraphBuilder, pred: int, src: int, dst: int, k: int, chunk: float, link: AlphaBeta, eps: float, name: str, rank: int, *,
             order: float, step: int, bucket: int) -> int:
    """``k`` chunks from port ``src`` to port ``dst``, pipelined; returns the last chunk's arrival."""
    wire = chunk * link.beta_us_per_byte
    sent = got = pred
    for i in range(k):
        kw = dict(rank=rank, dur=wire, order=order + i * eps, step=step, bucket=bucket, nbytes=round(chunk * (i + 1)) - round(chunk * i))
        v = b.add_node(f"{name} send", Kind.COMM, device=src, **kw)
        b.add_edge(sent, v)
        r = b.add_node(f"{name} recv", Kind.COMM, device=dst, **kw)
        b.add_edges([v, got], [r, r])
        sent, got = v, r
    return got
