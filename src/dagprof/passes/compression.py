"""Gradient compression and tensor partition: what one bucket costs on the wire and on the CPU.

A bucket's all-reduce costs ``encode`` on the thread that runs backward (the comm hook runs
there, before the all-reduce is issued) and ``channel`` time on the communication channel
(transfers plus what the completion callbacks compute before DDP may use the result):

- plain: the link model's all-reduce of the bucket, in ``parts`` pieces one after another on
  the one channel (tensor partition: every piece pays the per-collective overhead);
- fp16/bf16: half the bytes on the wire; the casts at their measured cost per byte;
- PowerSGD rank r (torch's hook): three all-reduces one after another -- the uncompressed
  tensors (vectors, and matrices too small to gain 2x; issued even when there are none), the P
  factors, the Q factors -- with the measured matrix products and orthogonalisation between them
  (``costmodel.codecs``), each stretch as torch's hook measured it whole per gradient (its
  allocations and Python included: 1.1-1.7x the kernels on a 2-core VM).
  ``dagprof.apply`` chains the hook (``collect.deploy.apply.chained``): a bucket's hook starts when
  the previous bucket completed, so every bucket's hook but the first's is on the channel's
  sequence. The callbacks run on gloo's threads, on the cores that also train (CPU jobs): while
  backward still runs (every bucket but the one the last gradient closes) their CPU -- and a
  chained hook's -- is charged to the training thread too, and they run as much slower as compute beside
  collectives measured (``beside``: the overlap slowdown, ``collect.measure.overlap``; two threads on one core);
  after it, the training thread only waits. In the demo's strategy rounds (their own profiles) the first bucket's
  chain then came out 27.9 ms from ready to done against 28.5 measured (23.2 without).
  The costs are measured on an idle core; under contention they grow, and PowerSGD's prediction is
  the least sure of the codecs. Each of the three all-reduces also pays what a small all-reduce issued from a
  completion callback took in the job's group (a user's job: in ``calibrate --overlap``'s on its cluster) beyond the link
  model's bytes term (``chained_latency_us``; ``chained``, measured per run like ``beside``, not one of the machine's ``CodecCosts``): the link
  model is fitted on DDP's buckets, whose transfers hide gloo's thread hand-offs and wake-ups; PowerSGD's factors
  are small and pay them whole (on the testbed under load 7, 1-4 ms each against 0.1-0.4 ms priced). The line's
  intercept prices none of them (``chained_line``): fitted on large buckets it is their stalls, not a small call's latency. After the
  backward the hook's CPU between and after its all-reduces takes what the hook's kind of CPU between chained
  all-reduces took there per unit of its idle time (``Chained.stretch``: the priced profile's own, its training thread's
  CPU plus waits for a core over its CPU, ``search.measured.profiled_stretch``; else measured beside ``chained``,
  minutes before the profile at another load), or where more, what it took in ``calibrate``'s chain of the hook's
  kind with every rank's chain running (``Chained.callback_factor``): those callbacks run on gloo's threads, both ranks'
  at once on the shared cores, each after a wake-up, which the training thread's stretch across its step does not see
  (held-out BERT4Rec's rounds: their stretch 1.03-1.07, the chain's 1.93-2.42; P's CPU and waits beyond its wire
  1.3-1.8x, Q's 1.8-2.0x the idle price, ``bench_psgd_rounds_split.py``): the codec costs
  are the fastest runs on an idle core, and in the chain each rank also waits for a core, the wake-up after it and the
  later rank at each all-reduce (the held-out conv job's chain, 7.8 ms of it CPU, 20 ms at the median against 12.4 priced).
  A bucket's issue (the hook's CPU before its first all-reduce, on the training thread) takes that stretch too, during
  the backward as after it: it is the training thread's CPU on the same loaded cores, whose backward ops the profile
  timed with their waits for a core in them, where the idle price has none (a one-bucket hook after the backward: its
  fastest tenth of steps at about the idle price, its median 1.2-1.8x, in the held-out embedding and LSTM jobs' strategy
  runs under load 2-5, ``bench_powersgd_phases --cycle``; the first of two buckets, inside the backward: 8.8-13.3 ms
  against 4.7 priced idle (conv) and 8.7-9.1 against 3.5 (LSTM), the training thread's stretch 1.5-2.1, load 7,
  ``bench_powersgd_backward``). Beside the chain the backward's own CPU did not grow (47.1-47.8 ms a step against
  46.1-47.7 with no collective beside it): what the callbacks cost it is their CPU on its core (``steal``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable

from ..costmodel.codecs import Codec, CodecCosts, powersgd_split
from ..errors import DagprofError
from .gradients import GradientOrder


@dataclass(frozen=True)
class Chained:
    """PowerSGD's chain as measured in the job's group or on its cluster, per run (``collect.measure.overlap``;
    ``search.measured.chained_in_job``): small all-reduces chained by completion callbacks, and CPU between them."""

    allreduce: tuple[tuple[int, float], ...] = ()  # (bytes, us per all-reduce); empty: not measured
    stretch: float = 0.0  # the hook's CPU per unit of its idle price (after the backward; its issue always; ``measured.chained_in_job``); 0: none
    busy: tuple[tuple[int, float], ...] = ()  # (bytes, us per all-reduce) issued beside a busy backward; empty: ``allreduce`` there too
    in_chain: float = 0.0  # the hook's kind of CPU between chained all-reduces on the cluster, both ranks' chains running; 0: not measured

    @property
    def cpu_factor(self) -> float:
        """What the hook's CPU on the training thread takes per unit of its idle price: never below it, as before where not measured."""
        return max(1.0, self.stretch)

    @property
    def callback_factor(self) -> float:
        """What the callbacks' CPU after the backward takes per unit of its idle price: the training thread's stretch, or
        where more, what that CPU took between chained all-reduces with every rank's chain running (``in_chain``): the
        callbacks run on gloo's threads while each rank's chain computes at once and each callback waits for a core after
        its wake-up, which the training thread's stretch, read across a step of its own CPU, does not see."""
        return max(self.cpu_factor, self.in_chain)


UNMEASURED = Chained()  # a run that measured neither: PowerSGD priced by the link model and the codecs' idle costs alone


def chained_text(table: Iterable[tuple[int, float]], digits: int = 1) -> str:
    """A (bytes, us per all-reduce) table of chained all-reduces as ``optimize``'s notes and ``calibrate``'s text say it."""
    return ", ".join(f"{b // 1024} KiB {us / 1e3:.{digits}f} ms" for b, us in table)


@dataclass(frozen=True)
class BucketCost:
    encode_us: float  # on the compute lane, before the all-reduce is issued
    channel_us: float  # on the communication channel
    wire_bytes: int


def bucket_cost(order: GradientOrder, first: int, last: int, codec: Codec, parts: int, price: Callable[[float], float],
                costs: CodecCosts | None = None, beside: float = 0.0, chained: Chained = UNMEASURED) -> BucketCost:
    """Cost of the bucket holding parameters ``first..last``; ``price(nbytes)`` is the link model's all-reduce time;
    ``beside``: how much slower CPU work runs on a core shared with a busy thread (the measured overlap slowdown)."""
    nbytes = float(order.nbytes[first : last + 1].sum())
    if codec.name == "none":
        return BucketCost(0.0, parts * price(nbytes / parts), int(nbytes))
    if costs is None:
        raise DagprofError(f"{codec.label()} needs measured encode/decode costs (collect.measure.codec_costs)")
    if codec.name in ("fp16", "bf16"):
        wire = nbytes / 2
        enc, dec = costs.encode_us_per_byte.get(codec.name), costs.decode_us_per_byte.get(codec.name)
        if enc is None or dec is None:
            raise DagprofError(f"no measured cost for the {codec.name} cast")
        return BucketCost(enc * nbytes, parts * price(wire / parts) + dec * nbytes, int(wire))
    if codec.name == "powersgd":
        return _powersgd(order, first, last, codec.rank, price, costs, beside, chained)
    raise DagprofError(f"unknown gradient codec {codec.name!r}")


@dataclass(frozen=True)
class PowerSGDParts:
    """One bucket under torch's PowerSGD hook, part by part: the elements of its three all-reduces and the CPU
    (microseconds) before the first (``issue``: error feedback, packing, P = M Q), between the P and Q
    all-reduces (``middle``: orthogonalise P, Q = M^T P) and after the last (``decode``: M = P Q^T, the error update)."""

    uncompressed: int
    p: int
    q: int
    issue_us: float
    middle_us: float
    decode_us: float


def powersgd_parts(order: GradientOrder, first: int, last: int, rank: int, costs: CodecCosts) -> PowerSGDParts:
    """The parts of the bucket holding parameters ``first..last``: torch's hook measured whole per gradient where
    ``costs`` has it, else the measured kernels and copies."""
    per = costs.powersgd.get(rank)
    if per is None:
        raise DagprofError(f"no measured cost for PowerSGD rank {rank}")
    unc = p = q = 0
    enc = mid = dec = 0.0
    hook = [0.0, 0.0, 0.0]
    whole = costs.powersgd_bucket_us > 0  # torch's hook measured whole on every compressed gradient
    for i in range(first, last + 1):
        shape = order.shapes[i]
        if shape is None:
            raise DagprofError("PowerSGD needs the parameter shapes, which this profile lacks (profile again with this dagprof)")
        u, pi, qi = powersgd_split(shape, rank)
        unc, p, q = unc + u, p + pi, q + qi
        c = per.get(order.params[i])
        if pi and c is None:
            raise DagprofError(f"no measured PowerSGD cost for parameter {order.params[i]!r}")
        if pi:
            enc, mid, dec = enc + c.encode_us, mid + c.middle_us, dec + c.decode_us
            hook = [hook[0] + c.hook_issue_us, hook[1] + c.hook_middle_us, hook[2] + c.hook_decode_us]
            whole = whole and c.whole
    if whole:
        # What torch's hook took whole, stretch by stretch: per bucket, per compressed gradient, and passes over the
        # uncompressed bytes -- their error feedback (add, clone; the update after) and packing (cat; unpack between).
        pass_us = costs.copy_us_per_byte * unc * order.element_size
        return PowerSGDParts(unc, p, q, costs.powersgd_bucket_us + hook[0] + 3 * pass_us, hook[1] + pass_us, hook[2] + pass_us)
    copies = costs.copy_us_per_byte * float(order.nbytes[first : last + 1].sum())  # one pass: the error's add, clone, update
    return PowerSGDParts(unc, p, q, enc + 2 * copies, mid, dec + copies)


def _powersgd(order: GradientOrder, first: int, last: int, rank: int, price: Callable[[float], float], costs: CodecCosts,
              beside: float, chained: Chained) -> BucketCost:
    parts = powersgd_parts(order, first, last, rank, costs)
    es = order.element_size
    later = first > 0  # a later bucket's hook runs when the previous bucket completed, on the channel's sequence
    hook = parts.issue_us if later else 0.0
    during_backward = last < len(order) - 1
    line = chained_line(chained, price)
    transfers = (line(parts.uncompressed * es) + line(parts.p * es) + line(parts.q * es)
                 + 3 * chained_latency_us(chained, line, during_backward))
    cpu = hook + parts.middle_us + parts.decode_us
    # While backward runs, the channel's CPU work shares the training thread's core: the backward loses that CPU (steal)
    # and the callbacks run ``beside`` slower themselves; after the last gradient the training thread only waits, and the
    # callbacks take what CPU between chained all-reduces took on the cluster (``Chained.stretch``).
    channel = transfers + cpu * (1.0 + beside if during_backward else chained.callback_factor)
    steal = cpu if during_backward else 0.0
    issue = (parts.issue_us - hook) * chained.cpu_factor  # the training thread's CPU, as stretched as its profiled ops
    return BucketCost(issue + steal, channel, int((parts.uncompressed + parts.p + parts.q) * es))


def nonempty_allreduces(order: GradientOrder, ends: Iterable[int], rank: int) -> int:
    """How many of PowerSGD's all-reduces a step carry data under buckets ending at ``ends``: each bucket's uncompressed
    part, P and Q, where not empty (torch issues the empty ones too: 0.15-0.37 ms from issue to the next, callback
    included, in the CTR ranker's and the word2vec job's strategy runs, against 1.5-8.8 ms for a non-empty one)."""
    count, first = 0, 0
    for last in sorted(int(e) for e in ends):
        split = [powersgd_split(s, rank) for s in order.shapes[first : last + 1] if s is not None]
        count += sum(any(x[k] for x in split) for k in range(3))
        first = last + 1
    return count


def chained_line(chained: Chained, price: Callable[[float], float]) -> Callable[[float], float]:
    """The line PowerSGD's all-reduces are priced on before ``chained_latency_us``: where the job measured chained small
    all-reduces, ``price`` less its intercept (its bytes' term alone), so their latency is the one measured at their
    sizes; else ``price``. The link model's intercept is fitted on DDP's buckets, where it holds those large transfers'
    stalls (fitted on one size, all of it: held-out GRU4Rec's and BERT4Rec's profiles priced a 2.5 kB all-reduce at
    3.9-18 ms, their chained 4-64 kB all-reduces measured 3-5 ms whole)."""
    if not chained.allreduce:
        return price
    intercept = price(0.0)
    return lambda nbytes: price(nbytes) - intercept


def chained_latency_us(chained: Chained, price: Callable[[float], float], during_backward: bool = False) -> float:
    """What a small all-reduce issued from a completion callback took in the job's group beyond ``price`` (the link
    model), the median over the measured sizes; 0 where the job measured none. ``during_backward`` (a bucket closed
    before the last gradient): as measured issued beside a busy backward (``Chained.busy``) where that was measured,
    else (link models written before it was) as on idle cores."""
    table = chained.busy if during_backward and chained.busy else chained.allreduce
    if not table:
        return 0.0
    return statistics.median(max(0.0, us - price(nbytes)) for nbytes, us in table)
