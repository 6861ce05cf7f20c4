"""An emulated cluster on one machine: one network namespace per rank, joined by a bridge.

Launcher code for the demo, ``dagprof optimize --verify --emulate`` and the testbed
(bench/testbed); it needs root and iproute2, never torch.

Rank i lives in namespace ``<tag>r<i>`` with interface ``<tag>r<i>`` (10.213.0.<i+1>/24); the
peer end of its veth pair sits on a bridge inside a switch namespace ``<tag>sw``, so nothing
is added to the root namespace. A link rate is a ``tc tbf`` qdisc on each rank's egress:
every byte of a ring all-reduce leaves through exactly one shaped port, so each hop runs at
the rate (this kernel has no netem: latency cannot be emulated with tc). Each port queues
``BUFFER_BYTES`` as a switch port would; the packets it still drops are counted per job
(``Cluster.drops``, ``run_ranks``) and warned about, since dagprof models a lossless link.

``Cluster`` removes every namespace it made on exit, on an exception, at interpreter exit
and on SIGINT/SIGTERM; processes it started are killed first (by their own pid).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

SUBNET = "10.213.0"
NETNS_ETC = "/etc/netns"  # iproute2's per-namespace /etc (``ip netns exec NS`` bind-mounts NETNS_ETC/NS/FILE over /etc/FILE)

# tbf's queue, in bytes, the same at every rate: a switch port's buffer is memory, not time. tbf's ``latency 10ms`` holds
# 10 ms of traffic (250 kB at 200 Mbit/s), fewer bytes than TCP keeps in flight, so a slower port is also a lossier one.
# DDP at 200 Mbit/s (demo_train cnn, 15 steps with DDP's defaults then 15 with PowerSGD, 2 jobs each, interleaved, load
# 1.5-2.5) dropped 2,451 and 1,372 packets with it, none with 2 MiB; the MXNet parameter server's exchange
# (bench/bench_mxnet_ps.py --link-check) took up to 2.5x its ideal time with 186-197 drops, and no drops with 2 MiB.
# A dropped packet costs TCP a retransmit, after up to its 200 ms minimum timeout: dagprof models a lossless link.
BUFFER_BYTES = 2 << 20


def available() -> str | None:
    """None when the testbed can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (`ip`, `tc`)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def _sh(*args: str) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")


@dataclass
class Cluster:
    ranks: int
    tag: str = field(default_factory=lambda: f"dpt{os.getpid() % 100000}")
    made: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)  # per job run_ranks ran on the cluster
    buffer_bytes: int = BUFFER_BYTES  # each shaped port's queue; 0: tbf's ``latency 10ms`` (the queue before BUFFER_BYTES)
    # Ranks as hosts: every rank's interface named alike (Horovod's gloo binds one interface name on every rank), and this
    # machine's hostname resolving to the rank's address inside its namespace (its own /etc/hosts, ``ip netns exec`` mounts
    # /etc/netns/NS/hosts): Horovod 0.28.1 binds a process set's gloo device by the hostname, which /etc/hosts here puts on
    # the loopback. None: interfaces named ``<tag>r<i>``, the hostname as the machine resolves it.
    iface: str | None = None
    _retired: list[int] | None = field(default=None, init=False, repr=False)  # per rank, what the qdiscs set_rate replaced had dropped

    def ns(self, rank: int) -> str:
        return f"{self.tag}r{rank}"

    def ifname(self, rank: int) -> str:
        return self.iface or f"{self.tag}r{rank}"

    def addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def __enter__(self) -> "Cluster":
        atexit.register(self.close)
        self._old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, signum, frame) -> None:
        self.close()
        raise SystemExit(128 + signum)

    def _build(self) -> None:
        sw = f"{self.tag}sw"
        _sh("ip", "netns", "add", sw)
        self.made.append(sw)
        _sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", sw, "link", "set", "br0", "up")
        for r in range(self.ranks):
            ns, dev, peer = self.ns(r), self.ifname(r), f"{self.tag}p{r}"
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
            _sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", sw)
            _sh("ip", "-n", sw, "link", "set", peer, "master", "br0")
            _sh("ip", "-n", sw, "link", "set", peer, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.addr(r)}/24", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.iface:
                os.makedirs(self._etc(r), exist_ok=True)
                with open(os.path.join(self._etc(r), "hosts"), "w") as f:
                    f.write(f"127.0.0.1 localhost\n{self.addr(r)} {socket.gethostname()}\n")

    def _etc(self, rank: int) -> str:
        """The folder whose files ``ip netns exec`` mounts over /etc in rank ``rank``'s namespace."""
        return os.path.join(NETNS_ETC, self.ns(rank))

    def set_rate(self, rate_bit: float | None, burst_bytes: int | None = None) -> None:
        """Shape every rank's egress to ``rate_bit`` bit/s (None: unlimited); its bucket ``burst_bytes`` (default 1 ms
        at the rate, at least 8 frames)."""
        self._retired = list(self.drops() or ()) or None  # a new qdisc counts from 0
        for r in range(self.ranks):
            base = ["ip", "netns", "exec", self.ns(r), "tc", "qdisc"]
            subprocess.run(base + ["del", "dev", self.ifname(r), "root"], capture_output=True)
            if rate_bit:
                burst = burst_bytes or max(int(rate_bit / 8 / 1000), 8 * 1514)
                _sh(*base, "add", "dev", self.ifname(r), "root", "tbf", "rate", f"{int(rate_bit)}bit", "burst", str(burst),
                    *(["limit", str(self.buffer_bytes)] if self.buffer_bytes else ["latency", "10ms"]))

    def drops(self) -> tuple[int, ...] | None:
        """Packets each rank's egress port has dropped since the cluster was built (``tc -s qdisc``), or None where
        the counters could not be read: reading them never fails a run."""
        now = []
        for r in range(self.ranks):
            try:
                out = subprocess.run(["ip", "netns", "exec", self.ns(r), "tc", "-s", "-j", "qdisc", "show", "dev", self.ifname(r)],
                                     capture_output=True, text=True, timeout=10).stdout
                now.append(sum(int(q.get("drops", 0)) for q in json.loads(out)))
            except (OSError, subprocess.SubprocessError, ValueError, TypeError, AttributeError):
                return None
        return tuple(now) if self._retired is None else tuple(a + b for a, b in zip(self._retired, now))

    def spawn(self, rank: int, argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        """Start ``argv`` inside rank ``rank``'s namespace with gloo bound to its interface."""
        full_env = {**os.environ, **env, "GLOO_SOCKET_IFNAME": self.ifname(rank), "MASTER_ADDR": self.addr(0)}
        with open(log, "w") as out:
            p = subprocess.Popen(["ip", "netns", "exec", self.ns(rank)] + argv, env=full_env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def close(self) -> None:
        stop_all(self.procs)
        self.procs.clear()
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            if self.iface:
                shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
        self.made.clear()
        if self.iface:
            with contextlib.suppress(OSError):  # kept while another cluster's files are there
                os.rmdir(NETNS_ETC)
        if hasattr(self, "_old"):
            for s, h in self._old.items():
                signal.signal(s, h)
            del self._old
        atexit.unregister(self.close)


@dataclass(frozen=True)
class Dropped:
    """Packets the shaped ports dropped during one phase (a job, or a link rate of one), per rank's egress."""

    phase: str
    per_rank: tuple[int, ...] | None  # None: the qdisc counters could not be read

    @staticmethod
    def between(before: tuple[int, ...] | None, after: tuple[int, ...] | None, phase: str) -> "Dropped":
        """The counters' growth from ``before`` to ``after`` (``Cluster.drops``)."""
        ok = before is not None and after is not None and len(before) == len(after) and all(a >= b for a, b in zip(after, before))
        return Dropped(phase, tuple(a - b for a, b in zip(after, before)) if ok else None)

    @property
    def total(self) -> int | None:
        return None if self.per_rank is None else sum(self.per_rank)

    def warning(self) -> str | None:
        """One line where the link lost packets (dagprof models a lossless one) or the counters could not be read."""
        if self.per_rank is None:
            return f"testbed: {self.phase}: the shaped ports' drop counters (tc -s qdisc) could not be read"
        if not self.total:
            return None
        ranks = ", ".join(f"rank {r} {n:,}" for r, n in enumerate(self.per_rank) if n)
        return (f"testbed: {self.phase}: the shaped ports dropped {self.total:,} packets ({ranks}); TCP retransmits them, "
                "a lossy link dagprof does not model")

    def to_dict(self) -> dict:
        return {"phase": self.phase, "dropped_packets": self.total, "per_rank": None if self.per_rank is None else list(self.per_rank)}


def run_ranks(argv: list[str], ranks: int, log_dir: str, env: dict[str, str] | None = None, cluster: Cluster | None = None,
              timeout_s: float = 900.0) -> Dropped | None:
    """Run ``argv`` once per rank as a torch.distributed job (env:// rendezvous) and wait for all.

    ``cluster`` None: plain processes on loopback; else one per namespace of ``cluster``
    (gloo bound to the rank's interface). Each rank gets RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT and writes its output to ``<log_dir>/rank<r>.log``. A rank that
    fails (or a job past ``timeout_s``) stops the others and raises ``RuntimeError`` with the
    tail of its log. On ``cluster``, returns the packets its ports dropped during the job (also appended to
    ``cluster.dropped``), and says on stderr where they dropped any.
    """
    os.makedirs(log_dir, exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen] = []
    before = cluster.drops() if cluster is not None else None
    try:
        for r in range(ranks):
            e = {**(env or {}), "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks), "MASTER_PORT": str(port),
                 "OMP_NUM_THREADS": (env or {}).get("OMP_NUM_THREADS", "1")}
            log = os.path.join(log_dir, f"rank{r}.log")
            if cluster is not None:
                procs.append(cluster.spawn(r, argv, e, log))
            else:
                with open(log, "w") as out:
                    procs.append(subprocess.Popen(argv, env={**os.environ, **e, "MASTER_ADDR": "127.0.0.1"}, stdout=out,
                                                  stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad or time.monotonic() > deadline:
                _fail(procs, log_dir, bad[0] if bad else None)
            time.sleep(0.05)
        bad = [r for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            _fail(procs, log_dir, bad[0])
    finally:
        stop_all(procs)
    if cluster is None:
        return None
    dropped = Dropped.between(before, cluster.drops(), f"job {log_dir}")
    cluster.dropped.append(dropped)
    if (line := dropped.warning()) is not None:
        print(line, file=sys.stderr)
    return dropped


def _fail(procs: list[subprocess.Popen], log_dir: str, rank: int | None) -> None:
    stop_all(procs)
    with open(os.path.join(log_dir, f"rank{rank or 0}.log")) as f:
        tail = f.read()[-2000:]
    what = f"rank {rank} failed (exit {procs[rank].returncode})" if rank is not None else "timed out"
    raise RuntimeError(f"{what}; log {os.path.join(log_dir, f'rank{rank or 0}.log')}:\n{tail}")


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Kill each of ``procs`` still running and reap it: a failed or finished job leaves no rank behind."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on loopback now, all bound at once so that no two are alike; inside namespaces every port is free."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
