"""The namespace testbed's shaped loopback, and what a job profiled on it measured and predicts: ``tc tbf`` set and read
back (``shape_loopback``, ``check_rate``), the bytes it carried (``payload_share``), each script's what-if pair (``PAIRS``,
``pick_pair``), a job's median step and collectives and its unprofiled steps (``measured``, ``unprofiled_steps_us``:
what ``bench_frameworks.py`` and ``bench_coverage.py`` judge an interval by), and the bandwidth what-if from its profile
(``predict_rate``). ``bench_frameworks.py --testbed`` and ``bench_workers_testbed.py`` run the jobs.

The testbed as hosts (``bench_frameworks.py --testbed --hosts``): each worker in a namespace of its own, its egress port
shaped (``shape_hosts``, ``hosts_qdisc``, ``hosts_tx``); the functions that price the wire take ``own_ports`` for it. There
every byte a worker sends crosses its own port at the rate, as on a full-duplex link, where on the loopback the workers'
bytes, both ways, share the one device.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from dagprof.analysis.foreign_cpu import foreign_cpu  # noqa: E402
from dagprof.collect.jobs.netns import BUFFER_BYTES  # noqa: E402
from dagprof.graph.meta import WARMUP_STEPS  # noqa: E402
from dagprof.passes.profiler_cost import MIN_STEPS, job_steps, resumed_step  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.scenario import Scenario  # noqa: E402
from dagprof.search.whatif import evaluate  # noqa: E402

# tbf's bucket: 1 ms of traffic at the pair's slower rate, at least 2 frames, the same bytes at both rates. A full bucket
# passes at once, refilled in the gaps between collectives; a bucket of the same bytes at both rates saves each collective
# time in proportion to 1 / rate, as the link does, so the rate ratio still scales a fitted link. A bucket of 1 ms at each
# rate saved up to 1 ms a collective at either rate, a latency below zero that no fit holds: tf_gru_fit's ten ~34 kB
# all-reduces a step ran 15 ms at 312 Mbit/s, under the wire's 17.5 ms, and 125 Mbit/s was predicted 34 % short on them;
# tf_cnn_loop's 22 kB all-reduce ran as fast at 200 as at 500 Mbit/s, inside the bucket.
BURST_MS = 1.0
# The rate a pilot job runs at to size the what-if pair (``--rate auto``), and the bounds of the pair's slower rate, bit/s.
PILOT_RATE = 1e9
SLOW_RATE_BOUNDS = (5e6, 200e6)
FAST_OVER_SLOW = 2.5  # profiled at 2.5 times the rate predicted, as 500 -> 200 Mbit/s
# Each script's what-if pair (profiled, predicted) in bit/s, fixed: a pair picked by the pilot moved with the load that
# slowed the pilot (jax_mixer 370 -> 148 quiet, 108 -> 43 to 62 -> 25 under load), and its errors ran opposite ways with
# the pair, so no two sessions judged the same what-if. The pairs are the quiet pilots' (2026-12-03), rounded; jax_mixer's
# the loaded ones' (its collectives over half the step at both rates). 500 -> 200 Mbit/s elsewhere.
# jax_gnn_jit's by the pilot's rule (``pick_pair``) from its step on an unshaped loopback (52 ms; 283 kB a step on it:
# 108 -> 43 Mbit/s), rounded as jax_mixer's: at 500 -> 200 Mbit/s the wire added 8 ms, within gloo's per-array stall
# (+-16 ms at even odds, ``analysis.operand_stall.stall_outweighs``), and same-rate jobs' median steps spread 38-65 ms.
PAIRS = {"tf_gru_fit": (400e6, 160e6), "tf_cnn_loop": (50e6, 20e6), "jax_mixer": (100e6, 40e6), "jax_gnn_jit": (100e6, 40e6)}
DEFAULT_PAIR = (500e6, 200e6)


@contextlib.contextmanager
def namespace(tag: str, keep: str | None) -> Iterator[tuple[str, str]]:
    """A fresh testbed namespace (root; removed on exit) and the folder its jobs' runs go to: ``keep``, else a temporary one."""
    from dagprof.collect.jobs.netns import Cluster

    with Cluster(1, tag=f"{tag}{os.getpid() % 10000}") as c, tempfile.TemporaryDirectory(prefix=f"dagprof-{tag}-") as tmp:
        os.makedirs(keep or tmp, exist_ok=True)
        yield c.ns(0), keep or tmp


@contextlib.contextmanager
def hosts_namespaces(tag: str, keep: str | None, workers: int) -> Iterator[tuple[object, str]]:
    """The testbed as hosts (root; removed on exit): a ``Cluster`` of ``workers`` namespaces, each worker's interface
    ``eth0`` as on hosts, and the folder its jobs' runs go to: ``keep``, else a temporary one."""
    from dagprof.collect.jobs.netns import Cluster

    with Cluster(workers, tag=f"{tag}{os.getpid() % 10000}", iface="eth0") as c, tempfile.TemporaryDirectory(prefix=f"dagprof-{tag}-") as tmp:
        os.makedirs(keep or tmp, exist_ok=True)
        yield c, keep or tmp


def shape_loopback(ns: str, rate_bit: float, bucket_rate_bit: float | None = None) -> None:
    """``tc tbf`` at ``rate_bit`` on the loopback of namespace ``ns``, its MTU an Ethernet frame's (1500 B: TCP segments as on
    a wire, and tbf's bucket must hold a whole packet). Both workers live in ``ns``, so every byte between them, either way,
    crosses this one shaped device: the pair shares the rate, as on a half-duplex link. Its bucket is ``BURST_MS`` at
    ``bucket_rate_bit`` (default: the rate); its queue the DDP testbed's ``BUFFER_BYTES`` (``latency 50ms`` held 50 kB at
    8 Mbit/s: a port that drops a collective's tail waits for TCP's retransmission timeout). TCP keeps no metrics between
    connections there (``tcp_no_metrics_save``): a job would otherwise start from the reordering and RTT the namespace's
    previous job left (seen growing 10 -> 72 across Horovod jobs), the first job in a namespace from none. The rate is read back (``check_rate``):
    a job is never profiled on a link other than the one its figures are filed under."""
    burst = max(int((bucket_rate_bit or rate_bit) / 8 / 1000 * BURST_MS), 2 * 1514)
    for cmd in (["ip", "link", "set", "lo", "mtu", "1500"], ["ip", "link", "set", "lo", "up"],
                ["sysctl", "-q", "-w", "net.ipv4.tcp_no_metrics_save=1"], ["ip", "tcp_metrics", "flush", "all"],
                ["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", f"{int(rate_bit)}bit", "burst", str(burst), "limit", str(BUFFER_BYTES)]):
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)
    check_rate(ns, rate_bit)


def shape_hosts(cluster, rate_bit: float, bucket_rate_bit: float | None = None) -> None:
    """The testbed as hosts: ``tc tbf`` at ``rate_bit`` on each worker's egress port (``collect.jobs.netns.Cluster``, its
    veth of the default 1500 B MTU), bucket and queue as ``shape_loopback``'s, TCP keeping no metrics between jobs in any
    namespace; the rate read back on every port (``hosts_qdisc``)."""
    burst = max(int((bucket_rate_bit or rate_bit) / 8 / 1000 * BURST_MS), 2 * 1514)
    for r in range(cluster.ranks):
        for cmd in (["sysctl", "-q", "-w", "net.ipv4.tcp_no_metrics_save=1"], ["ip", "tcp_metrics", "flush", "all"]):
            subprocess.run(["ip", "netns", "exec", cluster.ns(r), *cmd], check=True, capture_output=True)
    cluster.set_rate(rate_bit, burst)
    got = hosts_qdisc(cluster)[0]
    if any(abs(g - rate_bit) > 1e-3 * rate_bit for g in got):
        raise RuntimeError(f"the workers' ports are shaped at {', '.join(f'{g / 1e6:g}' for g in got)} Mbit/s, not {rate_bit / 1e6:g}")


def hosts_qdisc(cluster) -> tuple[list[float], int]:
    """(each worker's port's tbf rate, bit/s (0: none); the bytes they have sent, together) on the testbed as hosts."""
    got = [qdisc(cluster.ns(r), cluster.ifname(r)) for r in range(cluster.ranks)]
    return [rate for rate, _ in got], sum(sent for _, sent in got)


def hosts_tx(cluster) -> int:
    """Bytes the workers' namespaces' interfaces have sent, together, as their counters (the collector's reading) have them."""
    return sum(loopback_tx(cluster.ns(r), None) for r in range(cluster.ranks))


def qdisc(ns: str, dev: str = "lo") -> tuple[float, int]:
    """(rate bit/s of the tbf at the root of ``ns``'s device ``dev``, 0 if none; bytes it has sent)."""
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "-s", "qdisc", "show", "dev", dev], capture_output=True, text=True, check=True)
    root = [q for q in json.loads(r.stdout or "[]") if q.get("root")]
    if not root or root[0].get("kind") != "tbf":
        return 0.0, int(root[0].get("bytes", 0)) if root else 0
    return 8.0 * root[0]["options"]["rate"], int(root[0].get("bytes", 0))


def check_rate(ns: str, rate_bit: float) -> None:
    """Refuse (RuntimeError) unless ``ns``'s loopback is shaped at ``rate_bit`` (tc stores bytes/s: within 0.1 %)."""
    got = qdisc(ns)[0]
    if abs(got - rate_bit) > 1e-3 * rate_bit:
        raise RuntimeError(f"namespace {ns}: the loopback is shaped at {got / 1e6:g} Mbit/s, not {rate_bit / 1e6:g}")


def median_step_ms(g) -> float:
    """The median over a graph's steps of the slowest rank's step, replayed (as built, the measured steps): one load
    spike on the shared machine moves a mean over 4 steps by tens of %, a median much less."""
    from dagprof.analysis.interval import step_times
    from dagprof.replay import replay

    return float(np.median(step_times(g, replay(g)))) / 1e3


def comm_per_step_ms(g) -> float:
    """The priced collectives' transfer time per step (as measured, or as a what-if re-priced them): the link model's part
    alone, apart from the compute's drift between jobs on the shared machine."""
    from dagprof.passes.link_fit import priced_comm, profiled_collectives

    comm = priced_comm(g) & (g.dur > 0)
    return float(profiled_collectives(g)[1].sum()) / max(len(np.unique(g.step[comm])), 1) / 1e3


def kept_comm_ms(g, rate: float, other: float, share: float, own_ports: bool = False) -> float:
    """The collectives per step at ``other`` bit/s with what each took beyond the wire at ``rate`` kept after the wire: the
    most a Horovod what-if's collectives take, where it prices them at the least (that excess hidden by the longer transfer)."""
    from dagprof.passes.link_fit import priced_comm, priced_world_size, profiled_collectives

    n = max(priced_world_size(g), 2)
    nbytes, dur = profiled_collectives(g)
    wire = 2 * (n - 1) / n * nbytes * 8e6 / link_bit(rate, n, share, own_ports)  # us: the ring's bytes on a worker's link
    comm = priced_comm(g) & (g.dur > 0)
    return float((wire * rate / other + np.maximum(dur - wire, 0.0)).sum()) / max(len(np.unique(g.step[comm])), 1) / 1e3


def measured(out: str) -> dict:
    """A profiled job's iteration: dagprof's measured figure (the slowest rank's, averaged over the window), the median step
    and the collectives' time per step; and the median of its unprofiled steps (``unprofiled_steps_us``; None under
    ``MIN_STEPS`` of them), what a what-if's interval is for."""
    p = open_run(out)
    steps = unprofiled_steps_us(p.graph)
    foreign = foreign_cpu(p.graph.meta)
    return {"measured_ms": p.analysis.measured_us / 1e3, "measured_median_ms": median_step_ms(p.graph), "comm_ms": comm_per_step_ms(p.graph),
            "unprofiled_median_ms": statistics.median(steps) / 1e3 if len(steps) >= MIN_STEPS else None, "unprofiled_steps": len(steps),
            # the ranks' waits for a core beyond their own threads' CPU in the window, % of the median step (the most of any
            # rank; ``analysis.foreign_cpu``): with a core a rank (``--hosts``), other processes' share of it; None: not recorded
            "foreign_pct": None if foreign is None else round(100.0 * foreign.share, 1)}


def unprofiled_steps_us(g) -> list[float]:
    """The job's steps outside the profiled window past its warm-up, each as ``job_steps`` joins it (the slowest rank's), us: what
    a what-if's 90 % interval is for (``analysis.interval``: a run's median step, without the profiler's cost). ``[]``
    where the run did not time them (``GraphMeta.loop_steps``)."""
    loop = g.meta.loop_steps
    return [] if loop is None else job_steps(loop.unprofiled, None, g.meta.job_of, WARMUP_STEPS, resumed_step(loop))


# Payload bytes per frame on the shaped loopback: a 1448 B TCP segment (timestamps on) in a 1514 B Ethernet frame. The wire's
# time per payload byte at a rate is 8 / (rate x share) s, this share the most it can be: small messages and acknowledgements
# carry more headers per payload byte (``payload_share``).
PAYLOAD_SHARE = 1448 / 1514
# beside a testbed job's run: the bytes the shaped device and the loopback's counter saw over the job (as hosts: the
# workers' ports and their namespaces' counters, each summed)
WIRE_FILE = "tb-wire.json"


def loopback_tx(ns: str, dev: str | None = "lo") -> int:
    """Bytes the loopback of namespace ``ns`` (``dev``; None: every interface) has sent, as its counter (``/proc/net/dev``,
    the collector's reading) has them."""
    r = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/dev"], capture_output=True, text=True, check=True)
    return sum(int(line.split(":", 1)[1].split()[8]) for line in r.stdout.splitlines()[2:] if dev is None or line.split(":", 1)[0].strip() == dev)


def payload_share(out: str, workers: int, own_ports: bool = False) -> tuple[float, str]:
    """The collectives' payload over the bytes the shaped wire carried per profiled step, measured on the profiled job:
    the window's bytes on the loopback as the collector counted them (``window_tx_bytes``, the largest rank's; with
    ``own_ports`` each rank counted its own namespace's: their sum), over its steps,
    times what the tbf charged per byte the loopback counted over the job (the tbf counts each TCP segment's headers, the
    counter one set per offloaded send). jax_mixer's 36 gradients a step, many of a few hundred bytes, put 1.23 B on the wire
    per payload byte (655-658 kB a step, alike at 1 Gbit/s and 45 Mbit/s), not 1.05: the wire's part of each collective was
    priced 15 % short, and what a slower link adds with it. ``PAYLOAD_SHARE`` where the profile has no count (Horovod
    recordings before the collector counted its window). Returns (share, how it was found)."""
    from dagprof.errors import DagprofError
    from dagprof.traces.load import load

    try:
        with open(os.path.join(out, WIRE_FILE)) as f:
            job = json.load(f)
        counts = [c for t in load(out).ranks if (c := t.meta.window_tx_bytes_per_step) is not None]
        window = (sum if own_ports else max)(counts)
    except (OSError, ValueError, KeyError, DagprofError):
        return PAYLOAD_SHARE, "full frames (no count of the window's bytes)"
    payload = 2 * (workers - 1) * bytes_per_step(out, own_ports)
    if not (window > 0 and job["tbf_bytes"] > 0 and job["loopback_bytes"] > 0 and payload > 0):
        return PAYLOAD_SHARE, "full frames (no bytes counted)"
    wire = window * job["tbf_bytes"] / job["loopback_bytes"]
    return min(payload / wire, PAYLOAD_SHARE), f"{wire / 1e3:.0f} kB on the wire a step for {payload / 1e3:.0f} kB of payload"


def link_bit(rate: float, workers: int, share: float = PAYLOAD_SHARE, own_ports: bool = False) -> float:
    """The link rate, bit/s of payload, a ring all-reduce of ``workers`` sees on the testbed at ``rate`` bit/s, as the model
    prices a link: N workers' ring all-reduce of S bytes puts 2 (N - 1) S on the one shaped loopback, and the model prices
    it 2 (N - 1) / N S per link, so the model's link is rate / N (of payload: ``share`` of the wire's bytes); with
    ``own_ports`` each worker's 2 (N - 1) / N S leaves by its own port: the link is the rate."""
    return rate * share / (1 if own_ports else workers)


def wire_rate(rate: float, workers: int, share: float = PAYLOAD_SHARE, own_ports: bool = False) -> str:
    """``link_bit`` as ``dagprof whatif`` reads a bandwidth."""
    return f"{link_bit(rate, workers, share, own_ports) / 1e6:.6g}Mbit"


class RateModels(NamedTuple):
    """A profile's bandwidth what-if as ``predict_rate`` builds it: the settings (the profiled wire), the payload share and
    how it was found, the model of the profiled run (the fitted link at the profiled rate) and the what-if's graph."""

    settings: object  # search.scenario.Cluster
    share: float
    how: str
    model: object  # graph.dag.Graph
    what_if: object


def rate_models(g, out: str, rate: float, other: float, own_ports: bool = False) -> RateModels:
    """``predict_rate``'s graphs for the profile ``g`` read from ``out``: the one way the benches price ``other`` from ``rate``."""
    from dagprof.costmodel.alphabeta import parse_bandwidth
    from dagprof.passes import set_link, set_topology
    from dagprof.passes.link_fit import priced_world_size
    from dagprof.search.scenario import Cluster as Settings, base_topology, profiled_at, wire_bandwidth

    n = priced_world_size(g)
    share, how = payload_share(out, n, own_ports)
    settings = Settings(profiled_bandwidth=wire_rate(rate, n, share, own_ports), half_duplex=not own_ports)  # the loopback: one medium
    marked = profiled_at(g, settings)
    base = base_topology(marked, settings)
    flat = set_topology(marked, base)
    what_if = set_link(flat, wire_bandwidth(marked, parse_bandwidth(wire_rate(other, n, share, own_ports)), base))
    return RateModels(settings, share, how, flat, what_if)


def predict_rate(out: str, rate: float, other: float, own_ports: bool = False) -> dict:
    """From the profile at ``rate``, the iteration at ``other`` as ``dagprof whatif --bandwidth OTHER --profiled-bandwidth RATE``
    predicts it (both as the model's link, ``wire_rate``): the link fitted to the profile's collectives with its time per byte
    beyond the wire's kept as work on the cores (on a loaded machine the fit ran at 45-71 % of the wire, and scaling the
    whole fit by the rate ratio stretched that CPU time as wire time: +50 to +80 % on the collectives), op times as profiled
    (``raw``: the measurement it is compared with is a profiled run too). Also the median replayed step of that what-if, and
    of the model it starts from (the fitted link at the profiled rate) against the profile's own: its reproduction.
    On the loopback the what-if is told that every byte, both ways, crosses one shaper (``whatif --half-duplex``): fitted on
    ports, JAX's ZeRO by hand (2-rank all-gathers beside reduce-scatters) put the link at 188 % of the wire, and 200 Mbit/s
    19-22 % short. ``own_ports``: the job ran on the testbed as hosts (``wire_rate``), each worker's port its own."""
    from dagprof.passes.link_fit import priced_world_size

    p = open_run(out)
    n = priced_world_size(p.graph)
    m = rate_models(p.graph, out, rate, other, own_ports)
    res = evaluate(p.graph, [Scenario(bandwidth=wire_rate(other, n, m.share, own_ports))], m.settings, measured_us=p.analysis.measured_us,
                   tolerance_pct=None, raw=True)
    fit, row = res["link_fit"], res["scenarios"][0]
    got = measured(out)
    model_median = median_step_ms(m.model)
    return got | {"model_pct": res["model_error_pct"], "model_median_ms": model_median,
                  "model_median_pct": 100.0 * (model_median - got["measured_median_ms"]) / got["measured_median_ms"],
                  "predicted_ms": row.predicted_iter_ms, "predicted_median_ms": row.interval.point_us / 1e3,  # the interval's centre
                  "predicted_comm_ms": comm_per_step_ms(m.what_if),
                  "most_comm_ms": kept_comm_ms(p.graph, rate, other, m.share, own_ports) if other < rate else got["comm_ms"],
                  "fit_bit_per_s": 8 * fit["bandwidth_bytes_per_s"],
                  # the fitted bandwidth against the wire's (rate / N, own ports' the rate). Well below 100 %: the profile's collectives spent their
                  # time on the cores (load), kept fixed at the other rate (jax_mixer 45 %). Above (TF, 109-200 %): bytes that
                  # crossed outside the timed transfer, e.g. sent before the last worker joined: the whole fit scales
                  "fit_of_wire_pct": 100.0 * 8 * fit["bandwidth_bytes_per_s"] / link_bit(rate, n, 1.0, own_ports),
                  "payload_share_pct": 100.0 * m.share, "payload_share": m.how,
                  "fit_latency_us": fit["latency_us"], "weak_fit": fit.get("weak"), "stall_outweighs": row.stall_outweighs,
                  "interval_ms": [row.interval.lo_us / 1e3, row.interval.hi_us / 1e3], "interval_terms": list(row.interval.terms)}


def bytes_per_step(out: str, own_ports: bool = False) -> float:
    """The priced collectives' all-reduce-equivalent bytes per step of a profiled job, on the shaped loopback at their
    bytes' share of its one medium (``passes.link_fit.medium_equivalent_bytes``: a 2-rank all-gather half its gathered
    bytes, not gloo's 3/4 on two ports); ``own_ports``: the testbed as hosts, each port its own."""
    from dagprof.passes.link_fit import priced_comm, profiled_collectives
    from dagprof.search.scenario import Cluster as Settings, profiled_at

    g = profiled_at(open_run(out).graph, Settings(half_duplex=not own_ports))
    comm = priced_comm(g) & (g.dur > 0)
    return float(profiled_collectives(g)[0].sum()) / max(len(np.unique(g.step[comm])), 1)


def pick_pair(out: str, workers: int) -> tuple[float, float, str]:
    """The what-if pair for a script from a pilot job profiled at ``PILOT_RATE`` in ``out``: the slower rate is the one at
    which the gradients' bytes alone take as long on the wire as the pilot's whole step (so collectives are about half the
    step there, and a third at the profiled rate, ``FAST_OVER_SLOW`` times faster), within ``SLOW_RATE_BOUNDS``. The
    workers share one shaped loopback: a ring all-reduce of S bytes puts 2 (N - 1) S on it. Chosen from the bytes and the
    step alone, never from a prediction. Returns (profiled rate, predicted rate, why, in words)."""
    step_ms, nbytes = measured(out)["measured_median_ms"], bytes_per_step(out)
    wire = 2 * (workers - 1) * nbytes
    slow = float(np.clip(8 * wire / (step_ms / 1e3), *SLOW_RATE_BOUNDS))
    slow = float(max(round(slow / 1e6), 1) * 1e6)
    fast = float(round(FAST_OVER_SLOW * slow / 1e6) * 1e6)
    why = (f"{wire / 1e3:.0f} kB a step on the shaped loopback, a {step_ms:.1f} ms step at {PILOT_RATE / 1e6:g} Mbit/s: the wire "
           f"alone takes {8 * wire / slow * 1e3:.1f} ms a step at {slow / 1e6:g} Mbit/s, {8 * wire / fast * 1e3:.1f} ms at {fast / 1e6:g}")
    return fast, slow, why
