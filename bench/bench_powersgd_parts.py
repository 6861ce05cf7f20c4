"""PowerSGD priced by its parts, against torch's own hook timed part by part in a real job.

As root: the held-out DDP embedding job (``bench/ddp_heldout_embed.py``'s model: a 16,384 x 64 embedding,
wide linears, biases) on an emulated 2-host cluster (``--link``), profiled with DDP's defaults (the link
model and bucket layout the pricing starts from); then the same job with torch's ``powerSGD_hook``
registered as ``dagprof.apply`` registers it (chained), each rank timing, per bucket and compressed
step, the hook to its first all-reduce, each all-reduce (issue to completion: the link, and any wait
for the peer), and the callbacks between and after them. The codec costs are measured here as
``dagprof optimize`` measures them; each bucket is priced by ``passes.compression.powersgd_parts``,
with the kernels alone (the old pricing) and with torch's hook measured whole per gradient.

    sudo .venv/bin/python bench/bench_powersgd_parts.py [--rank 2] [--steps 24] [--link 200Mbit] [--json]

The machine is shared: read the load average and both ranks' medians. On the 2-core VM (load 1.8, rank 2,
DDP's two buckets), the embedding bucket (its biases and the 16,384 x 64 table) in us, predicted with the
kernels alone / with the hook measured whole, against rank 0 / rank 1: hook to the first all-reduce
1,040 / 1,563 vs 2,600 / 2,100; unpack + middle 563 / 644 vs 848 / 672; decode 515 / 1,490 vs 2,251 /
2,205; the P all-reduce 5,840 vs 6,892 / 6,162; the two small all-reduces 99 + 77 (the link model,
fitted on the buckets, has no latency) vs 819-3,477 + 2,282-2,371, the largest part left unpriced.
The job then times small all-reduces chained by completion callbacks as ``overlap.json`` measures them for
``dagprof optimize`` (``collect.measure.overlap.chained_allreduce``) and a third prediction adds their median excess
over the link model to each of the three all-reduces. On the quiet VM (load 0.0) they took 968 / 3,201 / 2,763 us at
4 / 16 / 64 KiB, 793 us more each: the small all-reduces priced 77-351 us come out 869-1,143 us against 833-1,436
measured (the first bucket's uncompressed one, 3,171 / 2,808, also waits for the peer's backward, which the replay's
join models). Under load 5.4 they took 296 / 1,674 / 3,084 us (235 us more each) against 2-4 ms more in the hook:
measured on ranks that start each chain together, it leaves out how far apart the two ranks reach each of the hook's
all-reduces (each rank's CPU stretches between them differ by 0.5-1 ms under load).

Each compressed chain is also split on both ranks' one clock (``split_chains``: from the later rank's issue of each
all-reduce to its first completion, the gaps between on the later rank with its thread CPU, the earlier rank's waits),
and every step reads ``/proc``'s schedstat (CPU and time runnable but waiting for a core), under DDP's defaults first,
then PowerSGD, in the same process. Three runs on 2026-12-04 (load 5.0 / 4.4 / 5.6 at their start), the embedding
bucket after the backward: the chain 17.6 / 24.1 / 20.6 ms against 13.0 / 13.0 / 10.7 priced (stretch 2.0 / 2.7 / 2.1
measured in the job); the small all-reduces 0.8-2.3 ms each against 0.3-1.0, the P all-reduce 5.3-7.1 against 6.0-6.7;
the gap after the Q all-reduce 3.1 / 5.7 / 6.8 ms against 1.1-1.5, its decode alone 2.3 / 2.9 / 3.1 ms of thread CPU
against 0.55-0.62 priced (its fastest run on an idle core); the middle 2.1-2.3 ms of thread CPU against 1.4-1.6. The
training thread's CPU plus its waits for a core came to 2.1-2.2x its CPU per step in both setups alike (third run):
the waits are the machine's load, the same under the defaults the profile runs. The decode's marks also read the
thread's kernel time and page faults (``decode_kernel``): a fourth run (load 4.1), the decode 1.3 / 2.8 ms of thread
CPU per rank against 0.45 priced, of it 0-16 us in the kernel and 2-68 minor faults: user CPU, not faults; its two
products alone take 0.23-0.30 ms on this VM, beside a process streaming memory too (load 9). What the rest of the
decode's CPU in the job is, is open.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))


def job(out: str, rank: int, steps: int) -> None:
    """One rank: the job under torch's chained PowerSGD hook; writes its part timings to ``out``.RANK."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect.deploy.apply import chained
    from dagprof.collect.measure.overlap import chained_allreduce, chained_stretch

    sys.path.insert(0, HERE)
    from fsdp1_heldout import CTR

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(CTR(16384, 64, 32, 512))
    ev: list[tuple[int, str, float]] = []
    current = [0]
    plain = dist.all_reduce

    def mark(b: int, what: str) -> None:  # wall time (CLOCK_MONOTONIC: one clock for both ranks on one host), thread CPU, thread
        ru = resource.getrusage(resource.RUSAGE_THREAD)  # the thread's kernel time and page faults too
        ev.append((b, what, time.perf_counter(), time.thread_time(), threading.get_ident(), ru.ru_stime, ru.ru_minflt))

    def all_reduce(t, *a, **k):  # the hook's three all-reduces: issue and completion times
        b = current[0]
        mark(b, "issue")
        fut = plain(t, *a, **k).get_future()
        fut.then(lambda f: mark(b, "done"))

        class Work:
            def get_future(self):
                return fut

        return Work()

    def hook(state, bucket):
        current[0] = b = bucket.index()
        compressed = state.iter >= state.start_powerSGD_iter
        mark(b, "hook" if compressed else "plain")
        return psgd.powerSGD_hook(state, bucket).then(lambda f: (mark(b, "end"), f.value())[1])

    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2, min_compression_rate=2,
                               use_error_feedback=True, warm_start=True)  # as dagprof.apply sets it
    model.register_comm_hook(state, chained(hook))
    g = torch.Generator().manual_seed(dist.get_rank())

    def train(m, n: int) -> list[list[float]]:  # per step: wall, then the process's and the training thread's CPU and run-queue wait (ns)
        opt, out = torch.optim.Adam(m.parameters(), lr=1e-3), []
        for _ in range(n):
            t0, before = time.perf_counter_ns(), schedstat()
            ids = torch.randint(0, 16384, (64, 20), generator=g)
            loss = F.binary_cross_entropy_with_logits(m(ids, torch.randn(64, 32, generator=g)), (ids[:, 0] % 2).float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append([time.perf_counter_ns() - t0] + [b - a for a, b in zip(before, schedstat())])
        return out

    dist.all_reduce = plain
    sched_defaults = train(DDP(CTR(16384, 64, 32, 512)), 10)  # the same job under DDP's defaults first, as the profile runs it
    dist.all_reduce = all_reduce
    sched = train(model, steps)
    dist.all_reduce = plain
    chained = chained_allreduce()  # what dagprof measures on a job's group (overlap.json), here on this one
    stretch = chained_stretch()
    parts: dict[int, dict[str, list[float]]] = {}
    occ: dict[int, dict] = {}
    chains: list[dict] = []  # every compressed occurrence, raw, for the cross-rank split (``split_chains``)
    for b, what, t, cpu, tid, stime, faults in ev:
        if what in ("hook", "plain"):
            occ[b] = {"kind": what, "t0": t, "issue": [], "done": [], "cpu": [], "n": occ[b]["n"] + 1 if b in occ else 0}
        elif what in ("issue", "done"):
            occ[b][what].append(t)
            occ[b]["cpu"].append((what, cpu, tid))
            occ[b].setdefault("kernel", []).append((stime, faults))
        elif occ[b]["kind"] == "hook" and len(occ[b]["issue"]) == 3 == len(occ[b]["done"]):
            o, p = occ[b], parts.setdefault(b, {})
            chains.append({"bucket": b, "n": o["n"], "t0": o["t0"], "issue": o["issue"], "done": o["done"], "end": t,
                           "callback_cpu_us": callback_cpu_us(o["cpu"], cpu, tid),
                           # the decode's kernel time (us) and page faults, where its two marks ran on one thread
                           "decode_kernel": [(stime - o["kernel"][5][0]) * 1e6, faults - o["kernel"][5][1]] if o["cpu"][5][2] == tid else None})
            i, d = o["issue"], sorted(o["done"])
            for k, v in (("issue", i[0] - o["t0"]), ("allreduce_unc", d[0] - i[0]), ("unpack", i[1] - d[0]), ("allreduce_p", d[1] - i[1]),
                         ("middle", i[2] - d[1]), ("allreduce_q", d[2] - i[2]), ("decode", t - d[2]), ("total", t - o["t0"])):
                p.setdefault(k, []).append(v * 1e6)
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump({"chained_allreduce": chained, "chained_stretch": stretch, "chains": chains, "sched": sched, "sched_defaults": sched_defaults,
                   **{str(b): {k: statistics.median(v[2:] or v) for k, v in p.items()} for b, p in parts.items()}}, f)
    dist.barrier()
    dist.destroy_process_group()


def schedstat() -> tuple[int, int, int, int]:
    """(CPU, run-queue wait) in ns of all this process's threads, then of the calling thread (``/proc``'s schedstat:
    the wait is time runnable but not running, i.e. waiting for a core)."""
    total = [0, 0]
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu, wait = f.read().split()[:2]
        except OSError:  # a thread that ended meanwhile
            continue
        total = [total[0] + int(cpu), total[1] + int(wait)]
    with open("/proc/thread-self/schedstat") as f:
        cpu, wait = f.read().split()[:2]
    return total[0], total[1], int(cpu), int(wait)


def callback_cpu_us(marks: list[tuple[str, float, int]], end_cpu: float, end_tid: int) -> dict[str, float | None]:
    """Thread CPU time (us) of the hook's callbacks: unpack (the uncompressed all-reduce's completion to the P issue),
    middle (P issue to Q issue: the thread blocks in the P all-reduce's wait between, so what it spent is the
    orthogonalisation and Q = M^T P) and decode (the Q all-reduce's completion, else its issue, to the hook's end: the
    thread that ran the decode); None where the two marks ran on different threads."""
    (_, d0, td0), (_, i1, ti1), (_, i2, ti2), (_, d2, td2) = marks[1], marks[2], marks[4], marks[5]

    def on_one(a: float, ta: int, b: float, tb: int) -> float | None:
        return (b - a) * 1e6 if ta == tb else None

    decode = on_one(d2, td2, end_cpu, end_tid)
    return {"unpack": on_one(d0, td0, i1, ti1), "middle": on_one(i1, ti1, i2, ti2), "decode": on_one(i2, ti2, end_cpu, end_tid) if decode is None else decode}


def split_chains(per_rank: list[list[dict]], skip: int = 2) -> dict[str, list[float]]:
    """Each compressed bucket's chain on both ranks' one clock (us), from the later rank's first issue to the later
    rank's end: each all-reduce from the later rank's issue to its first completion (``transfer_*``: the link, gloo's
    hand-off to its worker thread and that thread's wake-up), and between them the later rank's gap (``gap_*``: its
    callback's wake-up, its CPU, and any lag behind the first completion), split into that rank's thread CPU and the
    rest (``gap_*_other``); ``peer_wait_*``: how long the earlier rank waited for the later at each all-reduce."""
    out: dict[str, list[float]] = {}
    other = {(c["bucket"], c["n"]): c for c in per_rank[1]}  # the same bucket's same occurrence on the other rank
    for c0 in per_rank[0]:
        c1 = other.get((c0["bucket"], c0["n"]))
        if c1 is None or c0["n"] < skip:
            continue
        cs = (c0, c1)
        late = [max(c["issue"][k] for c in cs) for k in range(3)]
        first = [min(c["done"][k] for c in cs) for k in range(3)]
        later = [max(range(2), key=lambda r: cs[r]["issue"][k]) for k in range(3)]
        row = {"chain": max(c["end"] for c in cs) - late[0]}
        for k, name in enumerate(("unc", "p", "q")):
            row[f"transfer_{name}"] = first[k] - late[k]
            row[f"peer_wait_{name}"] = late[k] - min(c["issue"][k] for c in cs)
        ends = [late[1], late[2], max(c["end"] for c in cs)]
        for k, name in enumerate(("unpack", "middle", "decode")):
            row[f"gap_{name}"] = ends[k] - first[k]
            r = later[k + 1] if k < 2 else max(range(2), key=lambda i: cs[i]["end"])
            cpu = cs[r]["callback_cpu_us"][name]  # None where its marks ran on two threads: kept, so every list has a value per chain
            out.setdefault(f"gap_{name}_cpu", []).append(cpu)
            out.setdefault(f"gap_{name}_other", []).append(None if cpu is None else row[f"gap_{name}"] * 1e6 - cpu)
        for k, v in row.items():
            out.setdefault(k, []).append(v * 1e6)
        out.setdefault("bucket", []).append(c0["bucket"])
    return out


@contextmanager
def emulated(bench: str, link: str, keep: str | None):
    """(folder, cluster) for a bench's 2-rank job on an emulated cluster (``link``), the folder ``keep`` else a temporary one;
    (folder, None), the reason on stderr, where no cluster can be made."""
    from dagprof.closeloop import hosts
    from dagprof.collect.jobs.netns import available

    why = available()
    if why:
        print(f"{bench}: skipped: the emulated cluster {why}", file=sys.stderr)
        yield keep, None
        return
    with tempfile.TemporaryDirectory(prefix=f"dagprof-{bench}-") as tmp, hosts(2, link, tag=f"dpp{os.getpid() % 10000}") as on:
        yield keep or tmp, on.cluster


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=2, help="PowerSGD's matrix approximation rank")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--link", default="200Mbit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", default=None, help="keep the profile and the job's part timings (parts.RANK) in this folder")
    ap.add_argument("--job", nargs=3, metavar=("OUT", "RANK", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.job[0], int(args.job[1]), int(args.job[2]))
        return 0
    from dagprof.collect.jobs.launch import Bootstrap, launch
    from dagprof.collect.jobs.netns import run_ranks
    from dagprof.collect.measure.codec_costs import measure_codec_costs
    from dagprof.costmodel.codecs import CodecCosts
    from dagprof.passes.bucket_plan import BucketSlots
    from dagprof.passes.compression import Chained, chained_latency_us, powersgd_parts
    from dagprof.passes.gradients import gradient_order
    from dagprof.pipeline import open_run

    load = os.getloadavg()[0]
    with emulated("bench_powersgd_parts", args.link, args.keep) as (work, cluster):
        if cluster is None:
            return 0
        run = os.path.join(work, "run")
        launch([sys.executable, os.path.join(HERE, "ddp_heldout_embed.py"), "--steps", "14"], Bootstrap(profile=run, steps=range(4, 12), kineto=False),
               ranks=2, cluster=cluster, log_dir=os.path.join(work, "logs"), timeout_s=600)
        out = os.path.join(work, "parts")
        run_ranks([sys.executable, os.path.abspath(__file__), "--job", out, str(args.rank), str(args.steps)], 2, os.path.join(work, "logs2"),
                  cluster=cluster)
        measured = [json.load(open(f"{out}.{r}")) for r in (0, 1)]
        p = open_run(run)
        order = gradient_order(p.graph, p.run.ranks[0].buckets)
        costs = measure_codec_costs([(n, s) for n, s in zip(order.params, order.shapes) if s is not None], (args.rank,))
        kernels = CodecCosts(costs.encode_us_per_byte, costs.decode_us_per_byte,
                             {r: {n: type(c)(c.encode_us, c.middle_us, c.decode_us) for n, c in per.items()} for r, per in costs.powersgd.items()},
                             costs.copy_us_per_byte)  # the old pricing: the kernels alone
        price = BucketSlots(p.graph, order, costs).price
        pairs = tuple((int(b), float(us)) for b, us in measured[0]["chained_allreduce"])  # every rank's is the slowest's
        chain = Chained(pairs, float(measured[0]["chained_stretch"]))
        latency = chained_latency_us(chain, price)
        split = split_chains([m["chains"] for m in measured])
        rows = []
        for b, (first, last) in enumerate(order.bucket_params(order.profiled_ends)):
            pred = {}
            for label, c, lat in (("kernels", kernels, 0.0), ("whole", costs, 0.0), ("latency", costs, latency)):
                x = powersgd_parts(order, first, last, args.rank, c)
                pred[label] = {"issue": x.issue_us, "allreduce_unc": price(x.uncompressed * 4) + lat, "allreduce_p": price(x.p * 4) + lat,
                               "middle": x.middle_us, "allreduce_q": price(x.q * 4) + lat, "decode": x.decode_us}
                pred[label]["total"] = sum(pred[label].values())
            idx = str(b)  # DDP numbers its rebuilt buckets in gradient-ready order, as ``order`` lists them
            x = powersgd_parts(order, first, last, args.rank, costs)
            now = {"transfer_unc": price(x.uncompressed * 4) + latency, "transfer_p": price(x.p * 4) + latency,
                   "transfer_q": price(x.q * 4) + latency, "gap_unpack+middle": x.middle_us * chain.cpu_factor,
                   "gap_decode": x.decode_us * chain.cpu_factor}  # as ``passes.compression`` prices a bucket after the backward
            mine = [i for i, bb in enumerate(split.get("bucket", [])) if bb == b]
            known = {k: [v[i] for i in mine if v[i] is not None] for k, v in split.items() if k != "bucket"}
            med = {k: statistics.median(v) for k, v in known.items() if v}
            if mine and "gap_unpack" in med:
                med["gap_unpack+middle"] = statistics.median(split["gap_unpack"][i] + split["gap_middle"][i] for i in mine)
            rows.append({"bucket": order.params[first] + ".." + order.params[last], "predicted": pred,
                         "measured": [m.get(idx, {}) for m in measured], "split": med, "priced_now": now,
                         "cpu_idle": {"unpack+middle": x.middle_us, "decode": x.decode_us}})
    print(f"PowerSGD rank {args.rank}, 2 ranks, {args.link}, load average {load:.1f} (after {os.getloadavg()[0]:.1f}): "
          "per bucket and part, us per compressed step "
          "(predicted: kernels alone / torch's hook measured whole / and each all-reduce paying the chained latency the job's group "
          f"measured, {latency:.0f} us from {', '.join(f'{b // 1024} KiB {us:.0f}' for b, us in pairs)}; measured: rank 0 / rank 1 medians)")
    for rank, m in enumerate(measured):
        for name, key in (("PowerSGD", "sched"), ("DDP's defaults", "sched_defaults")):
            st = [statistics.median(x[k] for x in m[key][4:]) / 1e6 for k in range(5)]
            print(f"rank {rank}, {name}, per step (medians, ms): wall {st[0]:.1f}; all threads' CPU {st[1]:.1f}, waiting for a core {st[2]:.1f}; "
                  f"the training thread's CPU {st[3]:.1f}, waiting for a core {st[4]:.1f} ({(st[3] + st[4]) / st[3]:.2f}x its CPU)")
    for r in rows:
        print(f"bucket {r['bucket']}")
        for k in ("issue", "allreduce_unc", "unpack", "allreduce_p", "middle", "allreduce_q", "decode", "total"):
            a, w, lt = (r["predicted"][x].get(k) for x in ("kernels", "whole", "latency"))
            m = [x.get(k) for x in r["measured"]]
            fmt = lambda v: f"{v:8.0f}" if v is not None else "       -"  # noqa: E731
            print(f"  {k:<14} predicted {fmt(a)} / {fmt(w)} / {fmt(lt)}   measured {fmt(m[0])} / {fmt(m[1])}")
        sp, now = r["split"], r["priced_now"]
        if sp:
            print(f"  on both ranks' clock (medians, us; priced as after the backward, stretch {chain.stretch:.2f}): chain {sp['chain']:.0f} "
                  f"against {sum(now.values()):.0f} priced")
            for k in ("transfer_unc", "gap_unpack", "transfer_p", "gap_middle", "gap_unpack+middle", "transfer_q", "gap_decode"):
                cpu = sp.get(k + "_cpu")
                print(f"    {k:<18} {sp[k]:8.0f}" + (f"  (later rank's thread CPU {cpu:.0f}, the rest {sp[k + '_other']:.0f})" if cpu is not None else "")
                      + (f"   priced {now[k]:8.0f}" if k in now else "")
                      + (f"   peer wait {sp['peer_wait_' + k[9:]]:.0f}" if k.startswith("transfer") else ""))
            print(f"    hook CPU priced idle: unpack+middle {r['cpu_idle']['unpack+middle']:.0f}, decode {r['cpu_idle']['decode']:.0f}")
    if args.json:
        print(json.dumps({"load": load, "load_after": os.getloadavg()[0], "chained_stretch": chain.stretch, "chained_allreduce": pairs,
                          "latency_us": latency, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
