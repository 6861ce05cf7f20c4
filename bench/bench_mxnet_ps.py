"""MXNet parameter server on the namespace testbed: what-if (servers, bandwidth) vs measured (run as root).

A real ``dist_sync`` job (scheduler, servers, 2 workers; ``collect/hooks/mxnet_ps.py``) runs with every
process in its own network namespace behind a bridge; each port is shaped with ``tc tbf`` in both
directions (the rank's egress, and the bridge's egress towards the rank: a switch port's downlink),
so a server receiving N pushes takes N times as long, as on a real switch; every port queues the same bytes
(``--buffer-kb``, a switch's buffer), so a slower port is not also a lossier one (each job's TCP retransmits are
counted and shown: dagprof models a lossless link). One configuration is
profiled (1 server, the profiled rate); from that profile dagprof predicts 2 servers and another
rate, and each configuration is measured. Rounds interleave the configurations (the machine is
shared and drifts); each round predicts from its own profile; the table gives medians over rounds.

``--script`` runs a user-style script (``python -m dagprof.collect.hooks.mxnet_ps run`` does the same on localhost)
instead of the built-in one: pushes that overlap the backward pass, whatever the script's optimizer.

Measured: the workers' mean median step over a job's unprofiled steps (a load spike on the shared machine makes single
steps seconds long; a median keeps one from moving a round's figure). Predicted: what ``dagprof whatif`` answers
(``job_iteration_us``: each worker's mean replayed step, the workers' mean, ``GraphMeta.job_of``), so the bench judges the
figure a user reads; the replayed steps' median (each worker's, the workers' mean: the statistic of the measured side)
is printed beside it, and parts with it where one replayed step is skewed (a pull answered late in the profile, the
workers entering its window apart). Every job also profiles
a few steps before its timed ones (the timed steps run with the profiler off), so the exchange
(first push issued -> last pull in, per worker and step) can be compared alone: it shows the
communication model's error apart from the compute's drift between jobs.

    sudo .venv/bin/python bench/bench_mxnet_ps.py --python /opt/mx/bin/python [--rounds 3] [--script bench/frameworks/mx_mlp.py] [--more-workers 4]
    sudo .venv/bin/python bench/bench_mxnet_ps.py --link-check     # raw TCP across the shaped ports, 1, 2 and 4 ms buckets
    sudo .venv/bin/python bench/bench_mxnet_ps.py --ps-pattern-check [--buffer-kb 256]   # raw TCP, 2 and 4 workers into 1 server
    .venv/bin/python bench/bench_mxnet_ps.py --script bench/frameworks/mx_mlp.py --more-workers 4 --repredict DIR   # the rounds kept in DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from dagprof.collect.hooks.mxnet_ps import launch, launch_command
from dagprof.collect.jobs.netns import BUFFER_BYTES, Cluster, available

WORKERS = 2
# steps before the profiler's start-up step: the job's warm-up (its first two, passes.profiler_cost.steady_from) and one
# steady step, which tells the profiler's cost from a change in the job's speed across the window
WARMUP = 3
# tbf's bucket, in ms of traffic. A wire has none: a port that idled passes a whole bucket at once, a gain that does not
# shrink at a slower rate, and the link fit to the profiled rate takes it for bandwidth (scaled to 200 from 500 Mbit/s,
# a gain of G ms per exchange becomes 2.5 G). So the bucket is as small as keeps the rate: a bucket only stands for a wire
# while its timer fires on time, and on a loaded 2-core host it fires late and a small bucket loses what it could have
# sent meanwhile. Raw TCP in the PS pattern (--link-check: 2 senders each sending 4.2 MB to 2 receivers at 500 Mbit/s,
# ideal 70 ms of payload) took 150 ms with a 1 ms bucket and 82 ms with 2 ms at load 13 (4 ms: 80 ms at load 2).
# The bucket is not all the fit reads as bandwidth: mx_embed.py's exchanges at 500 Mbit/s ran 8-18 ms shorter than their
# replay at the payload rate with a 2 ms bucket (9 rounds, load 8-12), 15-20 ms with 4 ms on a quiet machine. The server
# answers the two 2 MB pulls partly one after the other (at 200 Mbit/s one worker's exchange ran 13-101 ms shorter than
# the other's, alternating by step), while the model shares its port out between them; modelled as strictly one after
# the other (a trial, not kept) the fit fell to 431-437 Mbit/s and 200 Mbit/s came out 11-12 % fast instead.
BURST_MS = 2.0


# tbf's queue (netns.BUFFER_BYTES, the DDP testbed's too), in bytes, the same at every rate. With tbf's own ``latency 10ms``
# the raw PS exchange below (--link-check, 4 ms bucket, load 5-9) took 186-424 ms at 200 Mbit/s (ideal 168) with 186-197 drops
# and 209-566 TCP retransmits per sender, against 74-84 ms at 500 Mbit/s (ideal 67) with none; with a 2 MB queue: 0 drops,
# 183-233 ms at 200 and 74-102 at 500 Mbit/s. dagprof models a lossless link, so a what-if to the lossy slower port
# under-predicted it.
def shape(c: Cluster, rate_bit: float, burst_ms: float = BURST_MS, buffer_bytes: int = BUFFER_BYTES,
          bucket_rate_bit: float | None = None) -> None:
    """tbf on every rank's egress (its port out) and on the bridge's port towards it (its port in); a queue of
    ``buffer_bytes`` (0: tbf's ``latency 10ms``, 10 ms of traffic at the rate); a bucket of ``burst_ms`` at
    ``bucket_rate_bit`` (default: the rate). The bench gives every cell the bucket of its slowest rate: the same bytes
    at every rate save each exchange time in proportion to 1 / rate, as a link does, so the rate ratio still scales a
    fitted link (a bucket of 2 ms at each rate saved about as many ms at either, which the fit at 500 Mbit/s read as
    bandwidth: the 4-worker cell at 200 Mbit/s came out -9.0 %, -2.9 % with the bucket's gain kept apart)."""
    burst = max(int((bucket_rate_bit or rate_bit) / 8 / 1000 * burst_ms), 8 * 1514)
    queue = ["limit", str(buffer_bytes)] if buffer_bytes else ["latency", "10ms"]
    for r in range(c.ranks):
        for ns, dev in ((c.ns(r), c.ifname(r)), (f"{c.tag}sw", f"{c.tag}p{r}")):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(rate_bit)}bit",
                            "burst", str(burst), *queue], check=True, capture_output=True)


def retransmits(c: Cluster) -> int:
    """TCP segments retransmitted in all of the cluster's namespaces (each namespace counts from its creation)."""
    total = 0
    for r in range(c.ranks):
        out = subprocess.run(["ip", "netns", "exec", c.ns(r), "nstat", "-az", "TcpRetransSegs"], capture_output=True, text=True).stdout
        total += sum(int(line.split()[1]) for line in out.splitlines() if line.startswith("TcpRetransSegs"))
    return total


_RECEIVER = """
import socket, sys, threading
srv = socket.create_server(("0.0.0.0", 7000)); conns = [srv.accept()[0] for _ in range(int(sys.argv[1]))]
def serve(c):
    while (hdr := c.recv(8, socket.MSG_WAITALL)):
        left = int.from_bytes(hdr, "little")
        while left:
            left -= len(c.recv(min(left, 1 << 20)))
        c.sendall(b"k")
for t in [threading.Thread(target=serve, args=(c,)) for c in conns]: t.start()
"""
_SENDER = """
import json, socket, sys, threading, time
peers, nbytes, start = sys.argv[1].split(","), int(sys.argv[2]), float(sys.argv[3])
socks = [socket.create_connection((a, 7000)) for a in peers]
part = nbytes // len(socks); out = []
def one(s):
    s.sendall(part.to_bytes(8, "little") + bytes(part)); s.recv(1)
for i in range(8):
    time.sleep(max(start + 0.5 * i - time.time(), 0)); t0 = time.time()
    ts = [threading.Thread(target=one, args=(s,)) for s in socks]; [t.start() for t in ts]; [t.join() for t in ts]
    out.append(1e3 * (time.time() - t0))
print(json.dumps(out))
"""


def link_check(rate_bit: float, buffer_bytes: int, nbytes: int = 4_200_000) -> None:
    """Raw TCP in the PS pattern, without MXNet: 2 workers each send ``nbytes`` split over 2 servers at once
    (8 times), with tbf buckets of 1, 2 and 4 ms. Ideal: every port carries ``nbytes`` at the rate."""
    for burst_ms in (1.0, 2.0, 4.0):
        with Cluster(4, tag="mxl") as c:
            shape(c, rate_bit, burst_ms, buffer_bytes)
            for s in (0, 1):
                c.procs.append(subprocess.Popen(["ip", "netns", "exec", c.ns(s), sys.executable, "-c", _RECEIVER, "2"]))
            time.sleep(1.0)
            start = time.time() + 1.0
            senders = [subprocess.Popen(["ip", "netns", "exec", c.ns(w), sys.executable, "-c", _SENDER, f"{c.addr(0)},{c.addr(1)}", str(nbytes),
                                         str(start)], stdout=subprocess.PIPE, text=True) for w in (2, 3)]
            c.procs += senders
            times = [max(ts) for ts in zip(*(json.loads(p.communicate(timeout=120)[0]) for p in senders))]
            lost = retransmits(c)
        print(f"link check, {burst_ms:g} ms bucket: 2x2 exchange of {nbytes / 1e6:g} MB per worker at {rate_bit / 1e6:g} Mbit/s: "
              f"median {statistics.median(times):.0f} ms ({min(times):.0f}..{max(times):.0f}), ideal {8e3 * nbytes / rate_bit:.0f} ms; "
              f"{lost} TCP segments retransmitted")


# mx_mlp.py's keys per layer (each Dense layer's weight and bias with its BatchNorm's), in the order its backward pass pushes them (bytes)
MLP_MESSAGES = (10_280, 527_360, 1_054_720, 1_611_776)
_PS_SERVER = """
import json, socket, sys, threading, time
n, sizes, steps = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
srv = socket.create_server(("0.0.0.0", 7100)); conns = [srv.accept()[0] for _ in range(n)]
lock, count, full, outq = threading.Lock(), {}, {}, [[] for _ in conns]; cv = [threading.Condition() for _ in conns]
def answer(i):
    while True:
        with cv[i]:
            while not outq[i]: cv[i].wait()
            k = outq[i].pop(0)
        conns[i].sendall(bytes(sizes[k]))
def take(i):
    for s in range(steps):
        for k, size in enumerate(sizes):
            left = size
            while left: left -= len(conns[i].recv(min(left, 1 << 20)))
            with lock:
                count[(s, k)] = count.get((s, k), 0) + 1; last = count[(s, k)] == n
                if last: full[f"{s},{k}"] = time.time()
            for j in range(n) if last else ():
                with cv[j]: outq[j].append(k); cv[j].notify()
for i in range(n): threading.Thread(target=answer, args=(i,), daemon=True).start()
ts = [threading.Thread(target=take, args=(i,)) for i in range(n)]; [t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(full), flush=True); time.sleep(2)
"""
_PS_WORKER = """
import json, socket, sys, threading, time
addr, sizes, steps = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
s = socket.create_connection((addr, 7100)); out = []
for _ in range(steps):
    t0 = time.time(); t = threading.Thread(target=lambda: [s.sendall(bytes(n)) for n in sizes]); t.start()
    for size in sizes:
        left = size
        while left: left -= len(s.recv(min(left, 1 << 20)))
    t.join(); out.append((t0, time.time())); time.sleep(0.005)
print(json.dumps(out))
"""


def ps_pattern_check(rate_bit: float, buffer_bytes: int, steps: int = 12) -> None:
    """Raw TCP in mx_mlp.py's parameter-server pattern, without MXNet: N workers each push ``MLP_MESSAGES`` in turn over one
    connection to 1 server, which answers message k to every worker once all N pushed it (dist_sync); a worker begins its next
    step 5 ms after its last answer. Per N: the median step against the ports' payload rate in lockstep (every push into the
    server's port, then the last message out), how far apart the workers began each step and how late the server had every push."""
    nbytes = sum(MLP_MESSAGES)
    for n in (2, 4):
        with Cluster(1 + n, tag="mxp") as c:
            shape(c, rate_bit, BURST_MS, buffer_bytes)
            sizes = ",".join(map(str, MLP_MESSAGES))
            srv = subprocess.Popen(["ip", "netns", "exec", c.ns(0), sys.executable, "-c", _PS_SERVER, str(n), sizes, str(steps)],
                                   stdout=subprocess.PIPE, text=True)
            c.procs.append(srv)
            time.sleep(0.5)
            ws = [subprocess.Popen(["ip", "netns", "exec", c.ns(1 + w), sys.executable, "-c", _PS_WORKER, c.addr(0), sizes, str(steps)],
                                   stdout=subprocess.PIPE, text=True) for w in range(n)]
            c.procs += ws
            per = [json.loads(p.communicate(timeout=300)[0]) for p in ws]
            full = json.loads(srv.communicate(timeout=60)[0])
            lost = retransmits(c)
        rate = rate_bit / 8 * PAYLOAD
        step = statistics.mean(statistics.median(1e3 * (p[i + 1][0] - p[i][0]) for i in range(2, steps - 1)) for p in per)
        ideal = 1e3 * n * (nbytes + MLP_MESSAGES[-1]) / rate + 5.0
        apart = [1e3 * (max(p[i][0] for p in per) - min(p[i][0] for p in per)) for i in range(2, steps)]
        late = [1e3 * (full[f"{i},{len(MLP_MESSAGES) - 1}"] - min(p[i][0] for p in per)) - 1e3 * n * nbytes / rate for i in range(2, steps)]
        print(f"PS pattern, {n} workers into 1 server at {rate_bit / 1e6:g} Mbit/s: step {step:.0f} ms against {ideal:.0f} in lockstep at the "
              f"payload rate ({100 * (step / ideal - 1):+.1f} %); workers began {statistics.median(apart):.0f} ms apart ({min(apart):.0f}..{max(apart):.0f}); "
              f"every push in {statistics.median(late):.0f} ms ({min(late):.0f}..{max(late):.0f}) after the port could carry them; "
              f"{lost} TCP segments retransmitted")


def run_job(python: str, out: str, servers: int, rate_bit: float, profile_steps: int, steps: int, port: int, script: str | None = None,
            workers: int = WORKERS, burst_ms: float = BURST_MS, buffer_bytes: int = BUFFER_BYTES, bucket_rate_bit: float | None = None) -> dict:
    """One job in namespaces (the built-in script, or ``script``); returns its manifest (step times, timed steps), whose
    ``testbed`` also says how many TCP segments the job retransmitted (kept with the run for ``--repredict``)."""
    with Cluster(servers + workers, tag="mx") as c:
        shape(c, rate_bit, burst_ms, buffer_bytes, bucket_rate_bit)

        def spawn(node: int, argv: list, env: dict, log: str, cwd: str | None = None) -> subprocess.Popen:
            with open(log, "w") as f:
                p = subprocess.Popen(["ip", "netns", "exec", c.ns(node)] + argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                     cwd=cwd)
            c.procs.append(p)
            return p

        kw = dict(servers=servers, workers=workers, warmup=WARMUP, profile_steps=profile_steps, port=port, addr=c.addr, ifname=c.ifname, spawn=spawn,
                  timeout_s=240, extra={"testbed": {"rate_bit": rate_bit, "shaped": "both directions", "burst_ms": burst_ms,
                                                     "bucket_rate_bit": bucket_rate_bit or rate_bit, "buffer_bytes": buffer_bytes}})
        if script:
            m = launch_command(out, [python, os.path.abspath(script), "--steps", str(WARMUP + 1 + profile_steps + steps)], python=python, **kw)
        else:
            m = launch(out, python, steps=steps, **kw)
        m["testbed"]["tcp_retransmits"] = retransmits(c)
        with open(os.path.join(out, "mxnet-run.json"), "w") as f:
            json.dump(m, f)
        return m


def step_ms(m: dict, profiled: bool) -> float:
    """The workers' mean median step over the job's timed (unprofiled) or profiled steps.

    Neither the median over steps of the slowest worker in each nor the slowest worker's median: dist_sync couples
    the workers only through the servers, so each step's order of service differs (4 workers at 200 Mbit/s: one
    worker's steps ran 461-1,031 ms), and a maximum of 4 such draws overstates the job's step, which every worker runs
    in the same wall time: per step (1,046 ms against medians of 748-814 ms), and less so over 8 steps (the slowest
    median 1.6-4.6 % above the workers' mean in 3 rounds), while the replay's copies of one worker are served alike."""
    first, stop = m["profiled_steps"]
    return statistics.mean(statistics.median((b - a) / 1e6 for k, a, b in steps if (first <= k < stop if profiled else k >= stop))
                           for steps in m["steps"].values())


def replayed_step_ms(g, res) -> float:
    """The measured side's statistic over a replay: the workers' mean median replayed step."""
    import numpy as np

    from dagprof.traces.events import Kind

    return float(np.mean([np.median(np.diff(np.sort(res.start[(g.kind == Kind.STEP) & (g.rank == r)]))) for r in g.ranks()])) / 1e3


def pulls_apart_ms(g, start) -> float:
    """How far apart the workers' exchanges ended (each one's last pull in: the latest less the earliest), median over steps,
    given ``start`` times (``g.order``: as measured; a replay's ``start``). The replay's copies share a server's port in
    lockstep and end together; measured, TCP serves the pulls unevenly and the first served begins its next step early."""
    import numpy as np

    from dagprof.graph.build_ps import DONE

    done: dict[int, list[float]] = {}
    for v in np.flatnonzero(np.array(g.names)[g.name] == DONE):
        done.setdefault(int(g.step[v]), []).append(float(start[v]))
    return float(np.median([max(t) - min(t) for t in done.values()])) / 1e3


def measured_parts(run_dir: str) -> tuple[float, float, float, float, float, float]:
    """Over the job's profiled steps: the mean exchange, the median of a worker's compute per step (its ops' time, which
    grows where workers crowd the cores: a core shared is an op preempted), of its process's and of its Python thread's
    CPU time per step (nan where the run did not record it), of how far apart the workers began pushing
    (``passes.comm.push_spread_us``) and of how far apart their last pulls came in (``pulls_apart_ms``), in ms."""
    import numpy as np

    from dagprof.graph.build_ps import build_ps_graph
    from dagprof.passes.comm import push_spread_us
    from dagprof.passes.compute import COMPUTE_KINDS
    from dagprof.traces.events import Kind
    from dagprof.traces.load import load

    g = build_ps_graph(load(run_dir))
    ops = (g.rank >= 0) & np.isin(g.kind, [int(k) for k in (*COMPUTE_KINDS, Kind.MEMCPY)])
    compute = [g.dur[ops & (g.rank == r) & (g.step == s)].sum() for r in g.ranks() for s in np.unique(g.step[ops & (g.rank == r)])]
    cpu, front = ([c for _, _, c in per] for per in (g.meta.ps.cpu_us, g.meta.ps.main_cpu_us))
    return (statistics.mean(span for _, _, span in g.meta.ps.exchange_us) / 1e3, float(np.median(compute)) / 1e3,
            float(np.median(cpu)) / 1e3 if cpu else float("nan"), float(np.median(front)) / 1e3 if front else float("nan"),
            float(np.median(push_spread_us(g, g.order))) / 1e3, pulls_apart_ms(g, g.order))


# TCP payload per Ethernet frame as tbf counts it (1448 B of MSS with timestamps in a 1514 B frame): the most a
# lossless port at the tbf rate carries.
PAYLOAD = 1448 / 1514


def predict(run_dir: str, rate0: float, cells: list[tuple[int, float, int]], cores: int | None = None) -> tuple[dict, float, float, str]:
    """Each (servers, rate, workers) from the one profile: ``ps:K`` re-places the keys as ps-lite does; another rate
    reads the fitted bandwidth against the profiled tbf rate as ``whatif --profiled-bandwidth`` does (``passes.comm.ps_bandwidth``:
    scaled by the rate ratio where faster than the tbf, else kept as a limit the slower rate may hide); more workers are copies of the
    profiled ones pushing to the same servers (``whatif --workers``), each keeping its compute as profiled, as
    ``whatif`` does (its note, returned, says so with the profile's CPU figures). Per cell: (step ms, mean exchange ms),
    the same with the tbf bucket kept apart (``bucket_ms``), and the step with the workers' compute queued on this
    machine's ``cores`` (``whatif --cores``; None where the workers do not outnumber them); also the fitted bandwidth
    (bit/s) and the bucket's gain (ms per exchange). Then per cell: how far apart the replayed workers began pushing (median
    over steps, ms; ``passes.workers.shared_port_note`` says why 4 workers measured far more), the replayed steps' median,
    and how far apart their last pulls came in (``pulls_apart_ms``).

    Not queued by default: on mx_convnet.py (4 workers, 1 server, 200 Mbit/s, 2 cores, load 2-9) the 4-worker jobs' ops
    took no longer than the 2-worker jobs' (a worker's compute 11.9 and 12.1 ms per step against 14-22 ms), their workers
    computed mostly staggered (3 or 4 at once in 4-27 % of their compute time), while the replayed copies of 2 profiled
    workers compute in lockstep (all 4 at once in 45 %), so ``--cores 2`` queued them for 42 ms more a step (+29 %).
    At 500 Mbit/s under load 11-17 the pulls came closer together (3 or 4 at once in 48-59 %) and the ops took 1.7x
    as long (a kept trial, /tmp/mxconv/s1 in the session's report), and at 200 Mbit/s under load 13-16 3.5x (127 against
    36-43 ms a step, for 23.5 against 18.6-20.7 ms of CPU): how much 4 workers crowd 2 cores depends on how staggered the
    server's port leaves them and on the host's other load, which the profile does not measure.

    The bucket: every port idle for ``--burst-ms`` passes that much traffic at once, a gain in time that does not shrink
    at a slower rate; the fit takes it for bandwidth (with a 4 ms bucket, 528-537 Mbit/s of payload through a 500 Mbit/s
    tbf, which carries at most 478), and scaled by the rate ratio it makes a slower port too fast. Kept apart, the profile's exchanges are
    replayed at the payload rate (``PAYLOAD``), the gain is that replay minus the measured exchange, and each cell is
    replayed at its own payload rate less the same gain per step. One gain per exchange is a simplification: how often
    a port idles depends on the schedule (mx_embed.py's 4 workers came out +6.6/+10.8 %, against -2.8/+0.3 % with the rate
    scaled), and with a 1 ms bucket on a loaded host late timers cost rate (the gain comes out negative)."""
    import numpy as np

    from dagprof.analysis import job_iteration_us
    from dagprof.analysis.breakdown import other_workers_us
    from dagprof.costmodel.topology import CollectiveSpec
    from dagprof.passes import set_link, set_scheme
    from dagprof.passes.comm import exchange_us, ps_bandwidth, ps_port_share, push_spread_us
    from dagprof.passes.compute import own_cores_note, share_cores
    from dagprof.passes.profiler_cost import measure_profiler_cost, remove_profiler_cost
    from dagprof.passes.workers import scale_workers, shared_port_note
    from dagprof.pipeline import open_run
    from dagprof.replay import replay

    def run(g, ref=None) -> tuple[float, float, float, float, float]:
        """``g``'s step, exchange, push spread and median step; with ``ref`` (the same cell at the profiled worker count) the
        step is ``ref``'s scaled by the span to the last exchange, as ``whatif --workers`` prices it."""
        res = replay(g)
        step = job_iteration_us(g, res) if ref is None else other_workers_us(ref, replay(ref), g, res)
        return (step / 1e3, float(np.mean(list(exchange_us(g, res.start).values()))) / 1e3,
                float(np.median(push_spread_us(g, res.start))) / 1e3, replayed_step_ms(g, res), pulls_apart_ms(g, res.start))

    p = open_run(run_dir)
    cost = measure_profiler_cost(p.graph)  # the cells' steps are timed with the profiler off: taken out first, as whatif does
    profile = remove_profiler_cost(p.graph, cost, job_iteration_us)[0]
    fit = profile.meta.ps_link_fit
    bw0 = fit.bandwidth_bytes_per_s
    gain = run(set_link(profile, rate0 / 8 * PAYLOAD))[1] - fit.target_exchange_us / 1e3
    out = {}
    cores = cores or os.cpu_count() or 1
    for servers, rate, workers in cells:
        base = set_scheme(profile, CollectiveSpec.parse(f"ps:{servers}"))
        g = scale_workers(base, workers) if workers != WORKERS else base

        def linked_of(h, rate=rate):
            if rate == rate0:
                return h
            # as whatif --profiled-bandwidth RATE0 --bandwidth RATE does (``search.scenario``)
            marked = h.replace(meta=h.meta.replace(wire_bytes_per_s=rate0 / 8, ps_asked_bytes_per_s=rate / 8))
            return set_link(marked, ps_bandwidth(bw0, rate0 / 8, rate / 8, ps_port_share(h)))

        other = g is not base  # another worker count: priced from the profiled one's (``other_workers_us``)
        linked, wired = linked_of(g), set_link(g, rate / 8 * PAYLOAD)
        step, exch, spread, median, pulls = run(linked, linked_of(base) if other else None)
        wire_step, wire_exch, *_ = run(wired, set_link(base, rate / 8 * PAYLOAD) if other else None)
        queued = run(share_cores(linked, cores), share_cores(linked_of(base), cores) if other else None)[0] if workers > cores else None
        out[(servers, rate, workers)] = (step, exch, wire_step - gain, wire_exch - gain, queued, spread, median, pulls)
    most = max(c[2] for c in cells)
    fastest = 1e3 * min(v[0] for c, v in out.items() if c[2] == most)  # the shortest step predicted for the most workers, us
    return out, 8 * bw0, gain, "; ".join(filter(None, (cost.describe(), own_cores_note(profile, most, fastest), shared_port_note(profile, most))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=os.environ.get("DAGPROF_MXNET_PYTHON", ""),
                    help="a Python that imports mxnet 1.x (default: $DAGPROF_MXNET_PYTHON, as the tests use)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="timed (unprofiled) steps per job")
    ap.add_argument("--profile-steps", type=int, default=4, help="profiled steps per job, before the timed ones")
    ap.add_argument("--rate", type=float, default=500e6, help="profiled link rate, bit/s")
    ap.add_argument("--other-rate", type=float, default=200e6, help="the rate to predict, bit/s")
    ap.add_argument("--script", default=None, help="a user-style worker script (e.g. bench/frameworks/mx_mlp.py) instead of the built-in one")
    ap.add_argument("--keep", default=None, help="keep the run folders here")
    ap.add_argument("--repredict", default=None, metavar="DIR",
                    help="run nothing: predict again from the rounds kept in DIR (--keep) and compare with their measurements; "
                         "give the kept run's --rate, --other-rate and --more-workers")
    ap.add_argument("--json", default=None, help="also write every round's figures here")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no round that would end past this many seconds, at the rounds so far's pace (one hold of the "
                         "measuring lock; 0: run every round)")
    ap.add_argument("--more-workers", type=lambda t: [int(x) for x in t.split(",") if x], default=[],
                    help="also predict and measure these worker counts (1 server, --other-rate), e.g. 4")
    ap.add_argument("--burst-ms", type=float, default=BURST_MS,
                    help="tbf bucket in ms of traffic: every idle port passes this much at once, which a fit to the profiled rate "
                         "takes for bandwidth (1 ms is closer to a wire but loses rate on a loaded host; 4 ms, the old default, gains twice as much)")
    ap.add_argument("--buffer-kb", type=int, default=BUFFER_BYTES >> 10,
                    help="every shaped port's queue in KiB, the same at every rate as a switch's buffer (0: tbf's 10 ms of traffic, "
                         "which drops packets at slow rates)")
    ap.add_argument("--servers-only", action="store_true",
                    help="only the profiled configuration and 2 servers (a servers what-if judged alone: more rounds in one hold)")
    ap.add_argument("--link-check", action="store_true", help="only time raw TCP exchanges across the shaped ports (no MXNet)")
    ap.add_argument("--ps-pattern-check", action="store_true",
                    help="only time raw TCP in mx_mlp.py's parameter-server pattern, 2 and 4 workers into 1 server at --other-rate (no MXNet)")
    args = ap.parse_args()
    why = None if args.repredict else available()
    if why:
        print(f"bench_mxnet_ps: skipped: {why}", file=sys.stderr)
        return 0
    if args.link_check:
        link_check(args.rate, args.buffer_kb << 10)
        return 0
    if args.ps_pattern_check:
        ps_pattern_check(args.other_rate, args.buffer_kb << 10)
        return 0
    if args.repredict:
        args.rounds = len([d for d in os.listdir(args.repredict) if d.startswith("round")])
    elif not args.python or not os.path.exists(args.python):
        print(f"bench_mxnet_ps: skipped: no MXNet Python at {args.python}", file=sys.stderr)
        return 0
    cells = [(1, args.rate, WORKERS), (2, args.rate, WORKERS), (1, args.other_rate, WORKERS)] + [(1, args.other_rate, w) for w in args.more_workers]
    cells = cells[:2] if args.servers_only else cells
    rows: list[dict] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dagprof-mxps-") as tmp:
        work = args.repredict or args.keep or tmp
        for k in range(args.rounds):
            spent = time.monotonic() - t0
            if args.budget_s and k and spent + spent / k > args.budget_s:  # another round would pass the hold's budget
                print(f"round {k + 1}: not started ({spent:.0f} s spent of the {args.budget_s:g} s budget)", file=sys.stderr)
                args.rounds = k
                break
            pred: dict = {}
            got: dict = {}
            for cell in (cells if k % 2 == 0 else cells[::-1]):
                servers, rate, workers = cell
                out = os.path.join(work, f"round{k}", f"s{servers}_{int(rate / 1e6)}M" + (f"_w{workers}" if workers != WORKERS else ""))
                if args.repredict:
                    with open(os.path.join(out, "mxnet-run.json")) as f:
                        m = json.load(f)
                    args.burst_ms = m["testbed"].get("burst_ms", args.burst_ms)  # the report says how the kept runs were shaped
                    args.buffer_kb = m["testbed"].get("buffer_bytes", args.buffer_kb << 10) >> 10
                else:
                    m = run_job(args.python, out, servers, rate, args.profile_steps, args.steps, 9300 + k * 10 + servers + workers, args.script,
                                workers, args.burst_ms, args.buffer_kb << 10, min(c[1] for c in cells))
                exchange, compute, cpu, front, spread, pulls = measured_parts(out)
                got[cell] = {"iter_ms": step_ms(m, False), "profiled_iter_ms": step_ms(m, True), "exchange_ms": exchange,
                             "compute_ms": compute, "cpu_ms": cpu, "python_cpu_ms": front, "push_spread_ms": spread, "pulls_apart_ms": pulls,
                             "retransmits": m["testbed"].get("tcp_retransmits", -1)}
                lost = got[cell]["retransmits"]
                if cell == cells[0]:
                    pred, bw, gain, note = predict(out, rate, cells)
                print(f"round {k + 1}: {servers} server(s) {rate / 1e6:g} Mbit/s {workers} workers: {got[cell]['iter_ms']:.1f} ms/step "
                      f"(exchange {got[cell]['exchange_ms']:.1f} ms, {lost} TCP segments retransmitted)", file=sys.stderr)
            for c in cells:
                rows.append({"round": k, "servers": c[0], "rate_bit": c[1], "workers": c[2], **got[c], "pred_iter_ms": pred[c][0],
                             "pred_exchange_ms": pred[c][1], "bucket_iter_ms": pred[c][2], "bucket_exchange_ms": pred[c][3], "cores_iter_ms": pred[c][4],
                             "pred_push_spread_ms": pred[c][5], "pred_median_iter_ms": pred[c][6], "pred_pulls_apart_ms": pred[c][7],
                             "fitted_bit_per_s": bw, "bucket_gain_ms": gain, "note": note})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    report(rows, cells, args)
    print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


def report(rows: list[dict], cells: list[tuple[int, float, int]], args) -> None:
    def med(c, key):
        v = [r[key] for r in rows if (r["servers"], r["rate_bit"], r["workers"]) == c]
        return statistics.median(v), min(v), max(v)

    def slower(c) -> float:
        """How much slower the job's timed (unprofiled) steps ran than its own profiled ones, in %, median over rounds."""
        return 100 * (statistics.median(r["iter_ms"] / r["profiled_iter_ms"] for r in rows if (r["servers"], r["rate_bit"], r["workers"]) == c) - 1)

    script = os.path.basename(args.script) if args.script else "built-in CNN"
    print(f"MXNet 1.9 dist_sync, {script}, profiled: {WORKERS} workers, 1 server at {args.rate / 1e6:g} Mbit/s; {args.rounds} interleaved rounds "
          f"on a shared 2-core machine (other jobs running); medians over rounds (min..max); tbf both directions, "
          f"{args.burst_ms:g} ms bucket at the slowest rate, the same bytes at every rate, "
          + (f"{args.buffer_kb} KiB queue" if args.buffer_kb else "10 ms queue"))
    print("step = the workers' mean median over a job's unprofiled steps; predicted = the round's profile replayed under the what-if, "
          "as dagprof whatif answers (the workers' mean replayed step);")
    print("exchange = mean over workers and profiled steps of first push issued -> last pull in (predicted: replayed)")
    print("timed/prof = the job's unprofiled steps against its own profiled ones: where ports drop packets (4 workers into one "
          "server's port), TCP retransmits slow later steps, which a lossless link model does not predict")
    print(f"{'workers':>7} {'servers':>7} {'link':>9} | {'measured ms':>22} {'predicted ms':>22} {'error':>7} | "
          f"{'exchange meas.':>14} {'pred.':>7} {'error':>7} | {'TCP retransmits':>15} {'timed/prof':>10} | "
          f"{'bucket apart: step':>18} {'error':>7} {'exchange':>8} {'error':>7}")
    errs, apart = [], []
    for c in cells:
        m, p = med(c, "iter_ms"), med(c, "pred_iter_ms")
        xm, xp = med(c, "exchange_ms")[0], med(c, "pred_exchange_ms")[0]
        bs, bx = med(c, "bucket_iter_ms")[0], med(c, "bucket_exchange_ms")[0]
        err = 100 * (p[0] - m[0]) / m[0]
        errs.append(abs(err))
        apart.append(abs(100 * (bs - m[0]) / m[0]))
        tag = "  (profiled)" if c == cells[0] else ""
        print(f"{c[2]:>7} {c[0]:>7} {c[1] / 1e6:>5g}Mbit | {m[0]:>7.1f} ({m[1]:>5.1f}..{m[2]:<5.1f}) {p[0]:>7.1f} ({p[1]:>5.1f}..{p[2]:<5.1f}) {err:>+6.1f}% | "
              f"{xm:>14.1f} {xp:>7.1f} {100 * (xp - xm) / xm:>+6.1f}% | {med(c, 'retransmits')[0]:>15.0f} {slower(c):>+9.1f}% | "
              f"{bs:>18.1f} {100 * (bs - m[0]) / m[0]:>+6.1f}% {bx:>8.1f} {100 * (bx - xm) / xm:>+6.1f}%{tag}")
    print(f"max |error| of the iteration: {max(errs):.1f} % (goal 8 %); with the tbf bucket kept apart: {max(apart):.1f} %")
    bw = statistics.median(r["fitted_bit_per_s"] for r in rows)
    print(f"link rate fitted to the profile's exchanges: {bw / 1e6:.0f} Mbit/s of a {args.rate / 1e6:g} Mbit/s tbf "
          f"({100 * bw / args.rate:.0f} %; TCP/IP over Ethernet carries at most 96 % of the wire as payload)")
    print(f"the tbf bucket's gain, kept apart: {statistics.median(r['bucket_gain_ms'] for r in rows):.1f} ms per exchange (the profile's "
          f"exchanges replayed at the payload rate, {100 * PAYLOAD:.1f} % of the tbf, less their measured length)")
    prof = statistics.median(r["profiled_iter_ms"] / r["iter_ms"] for r in rows)
    print(f"profiler overhead: a job's profiled steps take {100 * (prof - 1):+.1f} % (median) against its unprofiled ones")
    print("a worker's compute per profiled step (its ops' time: where workers crowd the cores, ops are preempted and take longer) / its "
          "process's CPU time per step / its Python thread's (the untraced front end), medians over rounds: " + "; ".join(
              f"{c[2]} workers, {c[0]} server(s), {c[1] / 1e6:g} Mbit/s {med(c, 'compute_ms')[0]:.1f} / {med(c, 'cpu_ms')[0]:.1f} / "
              f"{med(c, 'python_cpu_ms')[0]:.1f} ms" for c in cells))
    print("the workers' first pushes apart in a step (latest less earliest; median over steps, then rounds), measured / replayed: " + "; ".join(
        f"{c[2]} workers, {c[0]} server(s), {c[1] / 1e6:g} Mbit/s {med(c, 'push_spread_ms')[0]:.0f} / {med(c, 'pred_push_spread_ms')[0]:.0f} ms"
        for c in cells))
    print("their last pulls apart in a step (latest less earliest; median over steps, then rounds), measured / replayed: " + "; ".join(
        f"{c[2]} workers, {c[0]} server(s), {c[1] / 1e6:g} Mbit/s {med(c, 'pulls_apart_ms')[0]:.0f} / {med(c, 'pred_pulls_apart_ms')[0]:.0f} ms"
        for c in cells))
    print("the replayed steps' median instead (each worker's, the workers' mean, as the measured side), error: " + "; ".join(
        f"{c[2]} workers, {c[0]} server(s), {c[1] / 1e6:g} Mbit/s {med(c, 'pred_median_iter_ms')[0]:.1f} ms "
        f"{100 * (med(c, 'pred_median_iter_ms')[0] - med(c, 'iter_ms')[0]) / med(c, 'iter_ms')[0]:+.1f} %" for c in cells))
    for c in cells:
        queued = [r["cores_iter_ms"] for r in rows if (r["servers"], r["rate_bit"], r["workers"]) == c and r["cores_iter_ms"] is not None]
        if queued:
            m = med(c, "iter_ms")[0]
            print(f"{c[2]} workers with their compute queued on this machine's {os.cpu_count()} cores (whatif --cores): "
                  f"{statistics.median(queued):.1f} ms, {100 * (statistics.median(queued) - m) / m:+.1f} %")
    for note in dict.fromkeys(r["note"] for r in rows if r["note"]):
        print(f"note (round {next(r['round'] for r in rows if r['note'] == note) + 1}'s profile): {note}")


if __name__ == "__main__":
    sys.exit(main())
