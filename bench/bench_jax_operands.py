"""Does an all-reduce's operand count, not its bytes, set its time on the testbed link? A gloo ``psum`` of jax_mixer's 36
gradient shapes (266 kB, 22 operands of a few hundred bytes) against one array and four arrays of the same bytes, and
36 arrays of 256 B against one of their 9 kB, in the same job, on the namespace testbed's shaped loopback
(``bench_frameworks --testbed``'s link; a rate of 10000 Mbit/s is as good as none), no profiler. Per rate and variant:
the median, first quartile and fastest repetition, beside the wire's time for the bytes (2 S / rate).

    (root) DAGPROF_JAX_PYTHON=/opt/jax/bin/python python bench/bench_jax_operands.py --rates 108,43,26 [--reps 30]

On 2026-12-03 (load 3-8) one or four arrays ran at the wire at every rate, the 36 at their own wire only at best: a stall
spread from 0 to 60-150 ms at 26-200 Mbit/s (docs/evidence.md, "Those two effects are one"). At load 9-15 the 36 arrays of 256 B
took a median 125-143 ms at 40, 100, 1000 and 10000 Mbit/s (fastest 10-100 ms), one array of their bytes 0.5-6 ms: about one
scheduler tick (4 ms) an operand, whatever the link (``analysis.operand_stall``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# jax_mixer's parameter shapes (bench/frameworks/jax_mixer.py, 3 blocks): the stem, the head, then per block its two
# LayerNorm scales and the token- and channel-mixing Dense layers
CH, TOKENS, HID, CLASSES = 64, 16, 128, 10
SHAPES = [(48, CH), (CH,), (CH, CLASSES), (CLASSES,)] + 3 * [(CH,), (TOKENS, HID), (HID,), (HID, TOKENS), (TOKENS,),
                                                            (CH,), (CH, HID), (HID,), (HID, CH), (CH,)]


def worker(rank: int, port: int, reps: int, out: str) -> None:
    """One of the two processes: each variant ``reps`` times, twice, interleaved; rank 0 writes the seconds to ``out``."""
    import time

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank)
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    total = sum(int(np.prod(s)) for s in SHAPES)

    def arrays(shapes):
        return [jax.make_array_from_process_local_data(NamedSharding(mesh, P("dp")), np.ones((1, *s), np.float32), (2, *s))
                for s in shapes]

    variants = {"36 shapes": arrays(SHAPES), "four": arrays([(total // 4,)] * 4), "one": arrays([(total,)]),
                "36 x 256 B": arrays([(64,)] * 36), "one 9 kB": arrays([(36 * 64,)])}
    f = jax.jit(jax.shard_map(lambda t: [jax.lax.psum(x, "dp") for x in t], mesh=mesh, in_specs=P("dp"), out_specs=P()))
    got: dict[str, list[float]] = {}
    for name, x in list(variants.items()) * 2:
        jax.block_until_ready(f(x))
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            got.setdefault(name, []).append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"bytes": {name: sum(int(x.nbytes) for x in arrs) // 2 for name, arrs in variants.items()}, "seconds": got}, fh)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="108,43,26", help="Mbit/s, comma-separated")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(int(args.worker[0]), int(args.worker[1]), args.reps, args.worker[2])
        return 0
    import numpy as np

    sys.path.insert(0, HERE)
    import bench_frameworks as bf
    from shaped_loopback import namespace, shape_loopback

    from dagprof.collect.jobs.netns import available, free_ports

    python = os.environ.get("DAGPROF_JAX_PYTHON")
    why = available() or (None if python else "set DAGPROF_JAX_PYTHON to a Python with JAX")
    if why:
        print(f"bench_jax_operands: skipped: {why}", file=sys.stderr)
        return 0
    rates = [float(r) * 1e6 for r in args.rates.split(",")]
    env = dict(os.environ, PYTHONPATH=bf.SRC)
    with namespace("jxop", None) as (ns, tmp):
        for rate in rates:
            shape_loopback(ns, rate, min(rates))  # the bucket of the same bytes at every rate, as the testbed's pairs
            out, port = os.path.join(tmp, "times.json"), free_ports(1)[0]
            procs = [subprocess.Popen(["ip", "netns", "exec", ns, python, os.path.abspath(__file__), "--reps", str(args.reps),
                                       "--worker", str(k), str(port), out], env=env, stdout=subprocess.DEVNULL) for k in range(2)]
            codes = [p.wait() for p in procs]
            if any(codes):
                print(f"{rate / 1e6:g} Mbit/s: the workers exited {codes}", file=sys.stderr)
                continue
            with open(out) as fh:
                got = json.load(fh)
            for name, secs in got["seconds"].items():
                ms, wire = 1e3 * np.array(secs), 8 * 2 * got["bytes"][name] / rate * 1e3
                print(f"{rate / 1e6:6g} Mbit/s {name:10s} median {np.median(ms):7.1f} ms, q25 {np.percentile(ms, 25):7.1f}, fastest "
                      f"{ms.min():7.1f}; the wire for its bytes {wire:6.1f} ms; load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
