"""Which ``/proc/stat`` figure less a job's own CPU is the other processes' (``traces.window_cpu``): over 3 s of a loopback
ping-pong (this process: the job), user+nice+system less ours, the non-idle time (all but idle and iowait) less ours, and
every other process's utime+stime (``/proc/PID/stat``, which the kernel scales to its precise runtime; processes born or
ended inside are missed). No timing: run it anywhere, ideally beside other work (2026-12-07 21:38, load 3.4: non-idle
1.317-1.340 cores, the processes 1.317-1.353, user+nice+system 0.09 lower: our softirq work is in our CPU clock).

    python bench/other_load_probe.py
"""
from __future__ import annotations

import os
import socket
import threading
import time

SECONDS = 3.0
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine() -> list[int]:
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def processes() -> dict[str, int]:
    """Every other process's utime + stime, ticks."""
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                with open(f"/proc/{p}/stat") as f:
                    x = f.read().rsplit(")", 1)[1].split()
                out[p] = int(x[11]) + int(x[12])
            except (OSError, IndexError, ValueError):
                continue
    return out


def main() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()

    def pong() -> None:
        while data := b.recv(65536):
            b.sendall(data)
    threading.Thread(target=pong, daemon=True).start()
    p0, s0, c0, w0 = processes(), machine(), time.process_time_ns(), time.monotonic_ns()
    msg = b"x" * 60000
    while time.monotonic_ns() - w0 < SECONDS * 1e9:
        a.sendall(msg)
        got = 0
        while got < len(msg):
            got += len(a.recv(65536))
    s1, c1, w1, p1 = machine(), time.process_time_ns(), time.monotonic_ns(), processes()
    wall = (w1 - w0) / 1e9
    d = dict(zip(FIELDS, ((y - x) / hz / wall for x, y in zip(s0, s1))))
    own = (c1 - c0) / 1e9 / wall
    others = sum(v - p0[k] for k, v in p1.items() if k in p0) / hz / wall
    busy = d["user"] + d["nice"] + d["system"]
    non_idle = sum(d.values()) - d["idle"] - d["iowait"]
    print(f"cores: user+nice+system {busy:.3f} idle {d['idle']:.3f} softirq {d['softirq']:.3f} steal {d['steal']:.3f} ours {own:.3f} | "
          f"others: by user+nice+system {busy - own:+.3f}, by non-idle {non_idle - own:+.3f}, by the processes {others:.3f}")


if __name__ == "__main__":
    main()
