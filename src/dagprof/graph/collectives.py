"""Fine-grained collective sub-graphs: one node per message on a per-link queue.

A coarse graph prices a whole all-reduce as one COMM node; here every message of the
algorithm is a node on the device of the link it crosses ("link a->b", capacity 1),
so collectives that share a link queue behind each other and a slow hop delays just
the steps that cross it (dPRO's SEND/RECV sub-ops). The messages, what each waits for and
their costs are the algorithm's (``costmodel.collectives``); this module only makes them nodes,
so replaying one collective alone gives exactly its closed form ``allreduce_us``.

Every builder takes, per participating rank, the nodes that must finish before the
rank contributes (``ready``) and the node that consumes the result (``done``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..costmodel.alphabeta import AlphaBeta
from ..costmodel.collectives import Steps, algorithm, message_us, ps_chunks
from ..costmodel.topology import CollectiveSpec, Scheme, Topology
from ..errors import DagprofError
from ..traces.events import CommKind, Kind
from .dag import DeviceKind, GraphBuilder

_STEP_EPS = 1e-6  # keeps a collective's own steps in order on a link without overtaking the next collective


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
    """Add an all-reduce of ``nbytes`` over ranks 0..len(ready)-1: one node per message of the scheme's ``steps``."""
    n = len(ready)
    if n != topo.world_size or len(done) != n:
        raise DagprofError(f"collective over {n} ranks does not fit a topology of {topo.world_size} ranks")
    if topo.overhead_us > 0 and (n > 1 or spec.scheme is Scheme.PS):
        ready = [[_delay(b, f"{tag} overhead {r}", r, topo.overhead_us, preds, step, bucket)] for r, preds in enumerate(ready)]
    steps = algorithm(spec).steps(nbytes, topo)
    node = [-1] * len(steps.messages)
    if steps.ports:
        _ports(b, steps, ready, node, topo.inter, tag=tag, order=order, step=step, bucket=bucket)
    else:
        for i, m in enumerate(steps.messages):
            dev = b.device(f"link {m.src}->{m.dst}", DeviceKind.COMM)
            v = node[i] = b.add_node(f"{tag} {m.phase} {m.src}->{m.dst}", Kind.COMM, rank=m.src, device=dev, dur=message_us(topo, m),
                                     order=order + m.phase * _STEP_EPS, step=step, bucket=bucket, nbytes=int(m.nbytes),
                                     comm_kind=CommKind.ALL_REDUCE)
            _wait(b, v, ready[m.src] if m.inputs else (), m.after, node)
    for r, w in enumerate(steps.results):
        _wait(b, done[r], ready[r] if w.inputs else (), w.after, node)


def _wait(b: GraphBuilder, v: int, inputs: Sequence[int], after: Sequence[int], node: list[int]) -> None:
    """Edges into ``v``: from the rank's inputs, then from the messages ``after`` names (by index into ``node``)."""
    for p in inputs:
        b.add_edge(p, v)
    for j in after:
        b.add_edge(node[j], v)


def _delay(b: GraphBuilder, name: str, rank: int, us: float, preds: Sequence[int], step: int, bucket: int) -> int:
    """The collective's fixed software cost, paid by every rank before its first message."""
    v = b.add_node(name, Kind.COMM, rank=rank, dur=us, step=step, bucket=bucket, comm_kind=CommKind.ALL_REDUCE)
    for p in preds:
        b.add_edge(p, v)
    return v


def _ports(b: GraphBuilder, steps: Steps, ready: Sequence[Sequence[int]], node: list[int], link: AlphaBeta, **kw) -> None:
    """Messages through parameter servers: each server's pushes (every worker's, issued at once) and its pulls
    become ``add_ps_part``'s port sub-graph; the pull nodes land in ``node``."""
    n = len(ready)
    pushes: dict[int, list[int]] = {}
    pulls: dict[int, list[int]] = {}
    for i, m in enumerate(steps.messages):
        (pushes.setdefault(m.dst, []) if m.dst >= n else pulls.setdefault(m.src, [])).append(i)
    for server, into in pushes.items():
        part = steps.messages[into[0]].nbytes
        ends = add_ps_part(b, [ready[steps.messages[i].src] for i in into], server - n, part, link, part * len(into) * link.gamma_us_per_byte, **kw)
        for i, v in zip(pulls[server], ends):
            node[i] = v


def ps_devices(server: int) -> tuple[str, str, str]:
    """Names of a parameter server's devices: its network port in, its CPU, its port out."""
    return f"port ps{server} in", f"ps{server} cpu", f"port ps{server} out"


def worker_ports(worker: int) -> tuple[str, str]:
    """Names of a worker's network port: out (its pushes leave here), in (its pulls arrive here)."""
    return f"port w{worker} out", f"port w{worker} in"


def add_ps_part(b: GraphBuilder, ready: Sequence[Sequence[int]], server: int, nbytes: float, link: AlphaBeta, server_us: float, *,
                tag: str = "ps", order: float = 0.0, step: int = -1, bucket: int = -1, pull: bool = True, pushed: float | None = None,
                engines: Sequence[int] | None = None, lane: int | None = None) -> list[int]:
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
    is in (``server_us`` on its CPU). ``costmodel.collectives.ps_allreduce_us`` is this sub-graph's
    closed form. ``pull=False``: a push answered by a bare acknowledgement once summed (a row_sparse key's, whose rows
    the next forward pulls: ``add_ps_pull``); each worker's acknowledgement is returned. ``pushed``: the bytes each push
    carries where not ``nbytes`` (a compressed one: ``traces.mxnet.pslite_bytes``); the server sums and the pulls carry ``nbytes``.
    ``engines``: each worker's pull is an op of its own that its engine issues once the push is acknowledged
    (``_pull_request``), on device ``engines[w]``; None: the pull leaves with the push's answer.
    ``lane``: the server whose CPU does this server's work where not its own (``graph.build_ps.server_lanes``: servers that
    share a host's cores); its ports stay its own.
    """
    port_in, _, port_out = ps_devices(server)
    cpu = ps_devices(server if lane is None else lane)[1]
    dev_in, dev_cpu, dev_out = b.device(port_in, DeviceKind.COMM), b.device(cpu, DeviceKind.COMPUTE), b.device(port_out, DeviceKind.COMM)
    k = ps_chunks(nbytes, len(ready))
    chunk = nbytes / k
    up_bytes = nbytes if pushed is None else pushed
    k_up = ps_chunks(up_bytes, len(ready))
    eps = max(_STEP_EPS, 4 * float(np.spacing(order)))  # chunk i of every message issued at ``order`` shares one priority
    kw = dict(order=order, step=step, bucket=bucket)
    arrived = []
    for w, preds in enumerate(ready):
        up = b.device(worker_ports(w)[0], DeviceKind.COMM, rank=w)
        lat = b.add_node(f"{tag} push latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PUSH, **kw)
        b.add_edges(list(preds), [lat] * len(preds))
        arrived.append(_message(b, lat, up, dev_in, k_up, up_bytes / k_up, link, eps, f"{tag} push ps{server} w{w}", w, CommKind.PUSH, **kw))
    s = b.add_node(f"{tag} ps{server} sum", Kind.COMM, rank=-1, device=dev_cpu, dur=server_us, nbytes=int(up_bytes * len(ready)),
                   comm_kind=CommKind.PUSH, **kw)
    b.add_edges(arrived, [s] * len(arrived))
    pulls = []
    if not pull:
        for w in range(len(ready)):
            pulls.append(b.add_node(f"{tag} ack latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PUSH, **kw))
            b.add_edge(s, pulls[-1])
        return pulls
    for w in range(len(ready)):
        down = b.device(worker_ports(w)[1], DeviceKind.COMM, rank=w)
        answer = s if engines is None else _pull_request(b, s, server, dev_cpu, w, engines[w], link, eps, tag, **kw)
        v = _message(b, answer, dev_out, down, k, chunk, link, eps, f"{tag} pull ps{server} w{w}", w, CommKind.PULL, **kw)
        lat = b.add_node(f"{tag} pull latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PULL, **kw)
        b.add_edge(v, lat)
        pulls.append(lat)
    return pulls


def _pull_request(b: GraphBuilder, summed: int, server: int, dev_cpu: int, w: int, engine: int, link: AlphaBeta, eps: float, tag: str, *,
                  order: float, step: int, bucket: int) -> int:
    """A ``dist_sync`` pull that is an engine op of its own (``kv.pull`` after ``kv.push``, a compressed push): MXNet runs it
    after the key's push is acknowledged, and the server acknowledges once the key is updated. The acknowledgement crosses
    the server's port out and the worker's port in behind the pull answers queued there (ps-lite's one stream a worker),
    the pull op waits for the worker's engine thread (``engine``: one thread runs the kvstore's ops and the compute, so a
    pull waits out the op it came during), and its request crosses back into the server, whose thread (on ``dev_cpu``) answers
    it between updates. Returns the node after which the answer leaves. Measured on a compressed ResNet at 200 Mbit/s: acks came up to
    36 ms after the server's last update, and no push or pull op began inside a compute op (docs/evidence.md, mxpull65)."""
    port_in, _, port_out = ps_devices(server)
    dev_in, dev_out = b.device(port_in, DeviceKind.COMM), b.device(port_out, DeviceKind.COMM)
    up, down = (b.device(p, DeviceKind.COMM, rank=w) for p in worker_ports(w))
    kw = dict(order=order, step=step, bucket=bucket)
    ack = _message(b, summed, dev_out, down, 1, 0.0, link, eps, f"{tag} ack ps{server} w{w}", w, CommKind.PUSH, **kw)
    lat = b.add_node(f"{tag} ack latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PUSH, **kw)
    call = b.add_node(f"{tag} pull op w{w}", Kind.COMM, rank=w, device=engine, comm_kind=CommKind.PULL, **kw)
    asked = b.add_node(f"{tag} pull request latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PULL, **kw)
    b.add_edges([ack, lat, call], [lat, call, asked])
    got = _message(b, asked, up, dev_in, 1, 0.0, link, eps, f"{tag} pull request ps{server} w{w}", w, CommKind.PULL, **kw)
    answer = b.add_node(f"{tag} ps{server} answer w{w}", Kind.COMM, rank=-1, device=dev_cpu, comm_kind=CommKind.PULL, **kw)
    b.add_edge(got, answer)
    return answer


def add_ps_pull(b: GraphBuilder, ready: Sequence[Sequence[int]], server: int, request: float, nbytes: float, link: AlphaBeta,
                serve_us: Sequence[float], *, tag: str = "ps", order: float = 0.0, step: int = -1, bucket: int = -1) -> list[int]:
    """Each worker's pull of rows from server ``server`` (``row_sparse_pull``): its ``request`` (the row ids) through its
    port out into the server's port in, the rows served (``serve_us``, per worker: ps-lite copies them, untraced; on no
    device, as a latency: measured pulls of one worker overlapped rather than queued), the rows (``nbytes``) back through
    the server's port out into the worker's port in, a latency each way, the same ports and chunks as ``add_ps_part``;
    returns each worker's arrival."""
    port_in, _, port_out = ps_devices(server)
    dev_in, dev_out = b.device(port_in, DeviceKind.COMM), b.device(port_out, DeviceKind.COMM)
    eps = max(_STEP_EPS, 4 * float(np.spacing(order)))
    kw = dict(order=order, step=step, bucket=bucket)
    got = []
    for w, preds in enumerate(ready):
        up, down = (b.device(p, DeviceKind.COMM, rank=w) for p in worker_ports(w))
        lat = b.add_node(f"{tag} request latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PULL, **kw)
        b.add_edges(list(preds), [lat] * len(preds))
        asked = _message(b, lat, up, dev_in, 1, request, link, eps, f"{tag} request ps{server} w{w}", w, CommKind.PULL, **kw)
        served = b.add_node(f"{tag} ps{server} serve w{w}", Kind.COMM, rank=w, dur=serve_us[w], nbytes=int(nbytes),
                            comm_kind=CommKind.PULL, **kw)
        b.add_edge(asked, served)
        k = ps_chunks(nbytes, len(ready))
        v = _message(b, served, dev_out, down, k, nbytes / k, link, eps, f"{tag} rows ps{server} w{w}", w, CommKind.PULL, **kw)
        got.append(b.add_node(f"{tag} rows latency w{w}", Kind.COMM, rank=w, dur=link.alpha_us, comm_kind=CommKind.PULL, **kw))
        b.add_edge(v, got[-1])
    return got


def _message(b: GraphBuilder, pred: int, src: int, dst: int, k: int, chunk: float, link: AlphaBeta, eps: float, name: str, rank: int,
             comm_kind: CommKind, *, order: float, step: int, bucket: int) -> int:
    """``k`` chunks from port ``src`` to port ``dst``, pipelined; returns the last chunk's arrival."""
    wire = chunk * link.beta_us_per_byte
    sent = got = pred
    for i in range(k):
        kw = dict(rank=rank, dur=wire, order=order + i * eps, step=step, bucket=bucket, nbytes=round(chunk * (i + 1)) - round(chunk * i),
                  comm_kind=comm_kind)
        v = b.add_node(f"{name} send", Kind.COMM, device=src, **kw)
        b.add_edge(sent, v)
        r = b.add_node(f"{name} recv", Kind.COMM, device=dst, **kw)
        b.add_edges([v, got], [r, r])
        sent, got = v, r
    return got
