"""gloo's ring all-gather and ring all-reduce (its reduce-scatter is one) replayed message by message from each rank's
arrival: how much of a ring's transfer its ranks' skew hides.

The algorithms, as in gloo's ``allgather.cc`` and ``allreduce.cc`` (``ring``, segments of at most 1 MiB: a tensor up
to n MiB moves in 2n segments): each rank keeps two sends and two receives in flight, waiting for the ones two
iterations back before it posts the next; the all-gather sends its half-chunks to rank + 1 and posts each send before
its receive, the all-reduce sends to rank - 1 (a reduce-scatter then an all-gather phase) and posts each receive
first. gloo's TCP transport sends a payload only once the receiver's recv-ready notice arrived (a rendezvous,
``transport/tcp/pair.cc``), and each rank's sends and notices leave through one port in order (one FIFO, the testbed's
``tc tbf`` per rank). So every link carries (n-1)/n of the all-gathered bytes, 2(n-1)/n of the all-reduced ones,
which is the link model's bytes-per-link rule when the ranks arrive together; when one arrives late, the links away
from it have already moved up to two segments per hop, and the first rank out finishes before the late rank's own
links could carry their share. On the kept 200 Mbit/s testbed rings (2, 3, 4, 6 ranks, ``bench/bench_hsdp_mesh.py
--keep``) the first rank out after the last join came -0.1 to +3.3 ms (median) after this replay's, the all-gather's head start at 6
ranks (up to 5 ms when the last rank arrives 7 ms after the others) included.
2-rank rings took 1.08-1.17x this replay in the 6-rank jobs (three such rings at a time) and ran as the 4-rank ring of
their round in the 4-rank jobs: not the ring's algorithm (gloo has no 2-rank one) nor a cost per message; not modelled.

The replay is in units of the link's time per byte: no rate or latency is assumed (messages are fluid, notices nearly
free, no propagation delay), and no CPU time but the all-reduce's reductions where given (``reduce_us``): in its
reduce-scatter gloo sums each received segment into its own (``opts.reduce``) after waiting for it and before posting
the next send, the one segment in flight on each side hiding that work while the wire takes longer.
``unhidden_reduce_us`` reads the reduction back from what a transfer took beyond its wire."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence

import numpy as np

NOTICE_BYTES = 64  # a recv-ready notice: it queues behind the data its rank already sent


class _Op:
    __slots__ = ("done", "waiters", "nbytes")

    def __init__(self, nbytes: float = 0.0):
        self.done, self.waiters, self.nbytes = False, [], nbytes


def ring_done(all_gather: bool, arrivals: Sequence[float], nbytes: float, us_per_byte: float, reduce_us: float = 0.0) -> np.ndarray:
    """Each rank's completion (us, the arrivals' clock) of a ring all-gather (``all_gather``; ``nbytes`` gathered) or
    all-reduce (``nbytes`` reduced) whose ranks, in ring order, start at ``arrivals``; ``us_per_byte``: a port's time
    per byte. With equal arrivals every rank ends at (n-1)/n * ``nbytes`` (all-reduce: twice that) * ``us_per_byte``,
    plus, with ``reduce_us`` (an all-reduce's time to sum one received segment into the rank's own), what of those
    sums the segments in flight do not hide: the last one's at least."""
    n = len(arrivals)
    events: list[tuple[float, int, Callable[[float], None]]] = []
    order = itertools.count()
    port_free = [0.0] * n
    unmatched: dict[tuple[int, int], list[_Op]] = {}  # (sender, receiver) -> sends waiting for a notice
    notices: dict[tuple[int, int], int] = {}  # (sender, receiver) -> notices waiting for a send
    receiving: dict[tuple[int, int], list[_Op]] = {}  # (receiver, sender) -> receives waiting for their payload
    now = [0.0] * n
    done = np.full(n, np.nan)

    def at(t: float, fn: Callable[[float], None]) -> None:
        heapq.heappush(events, (t, next(order), fn))

    def complete(op: _Op, t: float) -> None:
        op.done = True
        for w in op.waiters:
            at(t, w)
        op.waiters = []

    def port(rank: int, t: float, nbytes: float, then: Callable[[float], None]) -> None:
        port_free[rank] = max(t, port_free[rank]) + nbytes * us_per_byte
        at(port_free[rank], then)

    def transmit(s: int, d: int, op: _Op, t: float) -> None:
        complete(op, t)  # in the socket: gloo's waitSend returns
        port(s, t, op.nbytes, lambda t2: complete(receiving[(d, s)].pop(0), t2))

    def send(s: int, d: int, nbytes: float) -> _Op:
        op = _Op(nbytes)
        if notices.get((s, d), 0):
            notices[(s, d)] -= 1
            transmit(s, d, op, now[s])
        else:
            unmatched.setdefault((s, d), []).append(op)
        return op

    def recv(d: int, s: int) -> _Op:
        op = _Op()
        receiving.setdefault((d, s), []).append(op)

        def noticed(t: float) -> None:
            if unmatched.get((s, d)):
                transmit(s, d, unmatched[(s, d)].pop(0), t)
            else:
                notices[(s, d)] = notices.get((s, d), 0) + 1
        port(d, now[d], NOTICE_BYTES, noticed)
        return op

    def program(r: int) -> Iterator[tuple[_Op, _Op] | float]:
        if all_gather:
            chunk = nbytes / n
            ops: list[tuple[_Op, _Op]] = []
            for i in range(2 * (n - 1)):
                if i >= 2:
                    yield ops[i - 2]
                s = send(r, (r + 1) % n, chunk / 2)
                ops.append((s, recv(r, (r - 1) % n)))
            yield from ops[-2:]
            return
        for phase in range(2):  # reduce-scatter (each received segment summed), all-gather
            ops = []
            for i in range(2 * n):
                if i >= 2:
                    yield ops[i - 2]
                    if phase == 0 and reduce_us > 0:
                        yield float(reduce_us)
                if i < 2 * n - 2:
                    rv = recv(r, (r + 1) % n)
                    ops.append((send(r, (r - 1) % n, nbytes / (2 * n)), rv))

    def run(r: int, steps: Iterator[tuple[_Op, _Op] | float], waiting: tuple[_Op, ...], t: float) -> None:
        now[r] = t
        while True:
            late = [op for op in waiting if not op.done]
            if late:
                late[0].waiters.append(lambda t2: run(r, steps, waiting, t2))
                return
            try:
                step = next(steps)
            except StopIteration:
                done[r] = t
                return
            if isinstance(step, float):  # work on the rank's cores: it posts nothing meanwhile
                at(t + step, lambda t2: run(r, steps, (), t2))
                return
            waiting = step

    for r in range(n):
        at(float(arrivals[r]), (lambda r: lambda t: run(r, program(r), (), t))(r))
    while events:
        t, _, fn = heapq.heappop(events)
        fn(t)
    return done


def head_start(all_gather: bool, arrivals: np.ndarray, nbytes: float, us_per_byte: float) -> float:
    """Mean over the rows of ``arrivals`` (steps x ranks in ring order, us) of the first rank's completion after the
    last arrival, over that with equal arrivals: what the skew hides of the ring's transfer (1: nothing)."""
    together = ring_done(all_gather, np.zeros(arrivals.shape[1]), nbytes, us_per_byte).min()
    if arrivals.shape[1] < 2 or together <= 0 or not len(arrivals):
        return 1.0
    return float(np.mean([ring_done(all_gather, a, nbytes, us_per_byte).min() - a.max() for a in arrivals]) / together)


def unhidden_reduce_us(excess_us: float, nbytes: float, workers: int, us_per_byte: float) -> float:
    """The time to sum one segment (``ring_done``'s ``reduce_us``) with which an all-reduce of ``nbytes`` on ``workers``
    ranks, arriving together, takes ``excess_us`` beyond its bare transfer at ``us_per_byte``: what of that excess a
    wire slow enough to hide every other segment's sum still shows (the last segment's sum, serial after its
    receive). Where the sums outlast the segments' wire time (a fast wire, the cores busy) all but that one are serial
    too, and the excess is several sums, not one: gloo's fp16 sums on the two-host testbed at 1 Gbit/s took 12-17 ns
    a byte beyond the wire (their least), 8-10 ns at 200 Mbit/s, read back here as 7-10. At most ``excess_us``."""
    if excess_us <= 0 or nbytes <= 0 or workers < 2:
        return 0.0
    zeros = np.zeros(workers)
    bare = float(ring_done(False, zeros, nbytes, us_per_byte).min())
    lo, hi = 0.0, float(excess_us)
    for _ in range(40):  # the excess grows with the sum's time: bisect
        mid = 0.5 * (lo + hi)
        if float(ring_done(False, zeros, nbytes, us_per_byte, mid).min()) - bare < excess_us:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
