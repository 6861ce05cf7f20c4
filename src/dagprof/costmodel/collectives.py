"""Collective algorithms, each one object with both its closed form and its messages.

An ``Algorithm`` answers two questions about an all-reduce of M bytes on a ``Topology``:
``time_us``, the closed form that prices a whole collective so a coarse graph (one COMM node per
collective) can be retimed without expanding it, and ``steps``, every message it sends and what
each one waits for, which ``dagprof.graph.collectives`` turns into per-message graph nodes
(``--fine``). Both live here so they cannot drift: replaying the steps alone on their links gives
the closed form (tests/test_collectives_closed_form.py checks it over world sizes and byte counts).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import DagprofError
from ..traces.events import CommKind
from .alphabeta import AlphaBeta
from .topology import CollectiveSpec, Scheme, Topology, latency_steps


class Wait(NamedTuple):
    """What a rank's result waits for: its own contribution and/or earlier messages (a ``Message`` carries the same two fields)."""
    inputs: bool  # the rank's own contribution (the graph's ``ready`` nodes of that rank)
    after: tuple[int, ...] = ()  # indices of messages of the same ``Steps``


class Message(NamedTuple):
    src: int  # a rank, or ``world_size + k`` for parameter server k
    dst: int
    nbytes: float
    inputs: bool  # waits for the sender's own contribution (the two fields of a ``Wait``)
    after: tuple[int, ...]  # and for these earlier messages (indices)
    reduce: bool  # the receiver sums it into its own (pays the link's gamma per byte)
    phase: int  # its place in the collective's order on a shared link (a round of the ring, up or down a tree)


@dataclass(frozen=True)
class Steps:
    """An algorithm's messages in the order they are issued, and what each rank's result waits for."""
    messages: list[Message]
    results: list[Wait]  # per rank
    # False: a message queues on the link of its (src, dst) pair and costs ``message_us``. True: it crosses the
    # sender's port out and the receiver's port in, pipelined in ``ps_chunks`` chunks (``ParameterServer``).
    ports: bool = False


def message_us(topo: Topology, m: Message) -> float:
    """One message on its link alone: latency, bytes, and the receiver's sum when it reduces (link steps, not ``ports``)."""
    ab = topo.link(m.src, m.dst)
    return ab.message_us(m.nbytes) + (m.nbytes * ab.gamma_us_per_byte if m.reduce else 0.0)


class Algorithm(ABC):
    """An all-reduce algorithm over every rank of a topology (collective overhead not included)."""

    @abstractmethod
    def time_us(self, nbytes: float, topo: Topology) -> float:
        """Closed form: what replaying ``steps`` alone on otherwise idle links takes."""

    @abstractmethod
    def steps(self, nbytes: float, topo: Topology) -> Steps:
        """Every message, in issue order."""


class Ring(Algorithm):
    """Reduce-scatter then all-gather: 2(N-1) rounds of M/N per link; round c at rank i needs round c-1 from i-1."""

    def time_us(self, nbytes: float, topo: Topology) -> float:
        n, m = topo.world_size, nbytes
        link = _slowest_hop(topo, m / n)  # a ring is as slow as its slowest hop
        return 2 * (n - 1) * (link.alpha_us + m / n * link.beta_us_per_byte) + (n - 1) * m / n * link.gamma_us_per_byte

    def steps(self, nbytes: float, topo: Topology) -> Steps:
        msgs: list[Message] = []
        ranks = list(range(topo.world_size))
        return Steps(msgs, _ring(msgs, ranks, [Wait(True)] * len(ranks), nbytes))


class Tree(Algorithm):
    """Heap-ordered binary tree: children reduce into parents up to rank 0, then it broadcasts down."""

    def time_us(self, nbytes: float, topo: Topology) -> float:
        link = _slowest_hop(topo, nbytes)
        depth = math.floor(math.log2(topo.world_size))  # levels below the root
        return depth * (2 * link.message_us(nbytes) + nbytes * link.gamma_us_per_byte)

    def steps(self, nbytes: float, topo: Topology) -> Steps:
        n = topo.world_size
        msgs: list[Message] = []
        up = [-1] * n
        for i in range(n - 1, 0, -1):  # children before parents
            kids = tuple(up[c] for c in (2 * i + 1, 2 * i + 2) if c < n)
            up[i] = _send(msgs, Message(i, (i - 1) // 2, nbytes, True, kids, True, 0))
        have = [Wait(True, tuple(up[c] for c in (1, 2) if c < n))]
        for i in range(1, n):  # parents before children
            have.append(Wait(False, (_send(msgs, Message((i - 1) // 2, i, nbytes, *have[(i - 1) // 2], False, 1)),)))
        return Steps(msgs, have)


class Hierarchical(Algorithm):
    """Reduce to each host's first device, ring all-reduce among those leaders, broadcast back."""

    def time_us(self, nbytes: float, topo: Topology) -> float:
        g, h, m = topo.devices_per_host, topo.hosts, nbytes
        local = 0.0 if g == 1 else 2 * topo.intra.message_us(m) + m * topo.intra.gamma_us_per_byte
        cross = 0.0 if h == 1 else 2 * (h - 1) * (topo.inter.alpha_us + m / h * topo.inter.beta_us_per_byte) + (h - 1) * m / h * topo.inter.gamma_us_per_byte
        return local + cross

    def steps(self, nbytes: float, topo: Topology) -> Steps:
        g = topo.devices_per_host
        leaders = [h * g for h in range(topo.hosts)]
        msgs: list[Message] = []
        lead = [Wait(True, tuple(_send(msgs, Message(d, leader, nbytes, True, (), True, 0)) for d in range(leader + 1, leader + g)))
                for leader in leaders]
        results = [Wait(False)] * topo.world_size
        for leader, have in zip(leaders, _ring(msgs, leaders, lead, nbytes)):
            results[leader] = have
            for d in range(leader + 1, leader + g):
                results[d] = Wait(False, (_send(msgs, Message(leader, d, nbytes, *have, False, 2 * len(leaders))),))
        return Steps(msgs, results)


@dataclass(frozen=True)
class ParameterServer(Algorithm):
    """BytePS: the tensor is cut into K parts; every worker pushes part k to server k, which sums them, and pulls it back.

    Messages cross ports (``Steps.ports``): see ``ps_allreduce_us`` for the closed form, and
    ``graph.collectives.add_ps_part`` for the sub-graph one server's pushes and pulls become.
    """
    servers: int

    def time_us(self, nbytes: float, topo: Topology) -> float:
        return ps_allreduce_us(nbytes, topo.world_size, self.servers, topo.inter)

    def steps(self, nbytes: float, topo: Topology) -> Steps:
        n = topo.world_size
        part = nbytes / self.servers
        msgs: list[Message] = []
        pulls: list[list[int]] = [[] for _ in range(n)]
        for k in range(self.servers):
            pushed = tuple(_send(msgs, Message(w, n + k, part, True, (), True, 0)) for w in range(n))
            for w in range(n):
                pulls[w].append(_send(msgs, Message(n + k, w, part, False, pushed, False, 1)))
        return Steps(msgs, [Wait(False, tuple(p)) for p in pulls], ports=True)


def algorithm(spec: CollectiveSpec) -> Algorithm:
    """The algorithm a scheme names."""
    if spec.scheme is Scheme.PS:
        return ParameterServer(spec.servers)
    return {Scheme.RING: Ring, Scheme.TREE: Tree, Scheme.HIERARCHICAL: Hierarchical}[spec.scheme]()


def allreduce_us(nbytes: float, topo: Topology, spec: CollectiveSpec = CollectiveSpec()) -> float:
    """Closed-form all-reduce time of ``nbytes`` over all ranks of ``topo``, the collective's overhead included."""
    if topo.world_size == 1 and spec.scheme is not Scheme.PS:
        return 0.0
    return topo.overhead_us + algorithm(spec).time_us(float(nbytes), topo)


def latency_saved_us(kind: CommKind, topo: Topology, spec: CollectiveSpec = CollectiveSpec(), backend: str = "gloo") -> float:
    """What a ``kind`` collective priced as a ring all-reduce of its equivalent bytes (``allreduce_us``) pays in latency
    beyond its own schedule: the steps it does not wait through (``topology.latency_steps``) at the link's latency per
    step. 0 for an all-reduce, and under another scheme than the ring (its latency is not the ring's)."""
    if spec.scheme is not Scheme.RING or topo.world_size < 2:
        return 0.0
    n = topo.world_size
    return (2 * (n - 1) - latency_steps(kind, n, backend)) * _slowest_hop(topo, 0.0).alpha_us


def _send(msgs: list[Message], m: Message) -> int:
    msgs.append(m)
    return len(msgs) - 1


def _ring(msgs: list[Message], ranks: list[int], first: list[Wait], nbytes: float) -> list[Wait]:
    """A ring over ``ranks`` whose first round waits for ``first``; returns what each rank's result waits for."""
    n = len(ranks)
    if n == 1:
        return [first[0]]
    chunk = nbytes / n
    msgs += [Message(r, ranks[(i + 1) % n], chunk, *first[i], True, 0) for i, r in enumerate(ranks)]
    for c in range(1, 2 * (n - 1)):  # round c at rank i waits for round c-1 sent to it, n messages back
        base = len(msgs) - n
        msgs += [Message(r, ranks[(i + 1) % n], chunk, False, (base + (i - 1) % n,), c < n - 1, c) for i, r in enumerate(ranks)]
    return [Wait(False, (len(msgs) - n + (i - 1) % n,)) for i in range(n)]


def _slowest_hop(topo: Topology, nbytes: float) -> AlphaBeta:
    hops = ([topo.inter] if topo.hosts > 1 else []) + ([topo.intra] if topo.devices_per_host > 1 else [])
    return max(hops, key=lambda ab: ab.message_us(nbytes))


PS_CHUNK_BYTES = 64 * 1024  # a PS message crosses the sender's and the receiver's port in chunks of at least this size,
PS_PORT_CHUNKS = 128  # and a server port's N messages of an exchange in about this many chunks (fill error ~(K+1)/128)


def ps_chunks(nbytes: float, workers: int) -> int:
    """How many pipelined chunks a parameter-server message of ``nbytes`` among ``workers`` is modelled as:
    enough that the pipeline's fill is a few % of a port's time, few enough that 64 workers stay cheap."""
    return int(max(1, min(math.ceil(nbytes / PS_CHUNK_BYTES), max(4, math.ceil(PS_PORT_CHUNKS / max(workers, 1))))))


def ps_allreduce_us(nbytes: float, workers: int, servers: int, link: AlphaBeta) -> float:
    """Push M/K to each of K servers, sum, pull (``graph.collectives.add_ps_part``'s closed form).

    Every message crosses the sender's port and the receiver's port. A server's port carries N
    parts of M/K each way, a worker's port its K parts (M); the busier one sets the pace, twice
    (push, pull). The latency is paid once each way (messages pipeline, only bytes queue on a
    port); on top comes the pipeline's fill, a few chunks of M/K/c bytes (c = ``ps_chunks``): with N >= K,
    the K servers' first chunks leave a worker one after another and the last pull chunk crosses
    the worker's port after the server's."""
    if servers < 1:
        raise DagprofError(f"parameter server needs >= 1 server, got {servers}")
    n, k = workers, servers
    part = nbytes / k
    chunk = part / ps_chunks(part, n)
    busiest = max(n * part, nbytes)
    fill = (2 * min(n, k) - k + 1) * chunk  # more servers than workers: less (pulls overlap the pushes' tail)
    return 2 * link.alpha_us + 2 * busiest * link.beta_us_per_byte + fill * link.beta_us_per_byte + n * part * link.gamma_us_per_byte
