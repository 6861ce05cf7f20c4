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
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def job(out: str, rank: int, steps: int) -> None:
    """One rank: the job under torch's chained PowerSGD hook; writes its part timings to ``out``.RANK."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect.deploy.apply import chained
    from dagprof.collect.measure.overlap import chained_allreduce

    sys.path.insert(0, HERE)
    from fsdp1_heldout import CTR

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(CTR(16384, 64, 32, 512))
    ev: list[tuple[int, str, float]] = []
    current = [0]
    plain = dist.all_reduce

    def all_reduce(t, *a, **k):  # the hook's three all-reduces: issue and completion times
        b = current[0]
        ev.append((b, "issue", time.perf_counter()))
        fut = plain(t, *a, **k).get_future()
        fut.then(lambda f: ev.append((b, "done", time.perf_counter())))

        class Work:
            def get_future(self):
                return fut

        return Work()

    def hook(state, bucket):
        current[0] = b = bucket.index()
        compressed = state.iter >= state.start_powerSGD_iter
        ev.append((b, "hook" if compressed else "plain", time.perf_counter()))
        return psgd.powerSGD_hook(state, bucket).then(lambda f: (ev.append((b, "end", time.perf_counter())), f.value())[1])

    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2, min_compression_rate=2,
                               use_error_feedback=True, warm_start=True)  # as dagprof.apply sets it
    model.register_comm_hook(state, chained(hook))
    dist.all_reduce = all_reduce
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        ids = torch.randint(0, 16384, (64, 20), generator=g)
        loss = F.binary_cross_entropy_with_logits(model(ids, torch.randn(64, 32, generator=g)), (ids[:, 0] % 2).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.all_reduce = plain
    chained = chained_allreduce()  # what dagprof measures on a job's group (overlap.json), here on this one
    parts: dict[int, dict[str, list[float]]] = {}
    occ: dict[int, dict] = {}
    for b, what, t in ev:
        if what in ("hook", "plain"):
            occ[b] = {"kind": what, "t0": t, "issue": [], "done": []}
        elif what in ("issue", "done"):
            occ[b][what].append(t)
        elif occ[b]["kind"] == "hook" and len(occ[b]["issue"]) == 3 == len(occ[b]["done"]):
            o, p = occ[b], parts.setdefault(b, {})
            i, d = o["issue"], sorted(o["done"])
            for k, v in (("issue", i[0] - o["t0"]), ("allreduce_unc", d[0] - i[0]), ("unpack", i[1] - d[0]), ("allreduce_p", d[1] - i[1]),
                         ("middle", i[2] - d[1]), ("allreduce_q", d[2] - i[2]), ("decode", t - d[2]), ("total", t - o["t0"])):
                p.setdefault(k, []).append(v * 1e6)
    with open(f"{out}.{dist.get_rank()}", "w") as f:
        json.dump({"chained_allreduce": chained,
                   **{str(b): {k: statistics.median(v[2:] or v) for k, v in p.items()} for b, p in parts.items()}}, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=2, help="PowerSGD's matrix approximation rank")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--link", default="200Mbit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--job", nargs=3, metavar=("OUT", "RANK", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.job[0], int(args.job[1]), int(args.job[2]))
        return 0
    from dagprof.closeloop import hosts
    from dagprof.collect.jobs.launch import Bootstrap, launch
    from dagprof.collect.jobs.netns import available, run_ranks
    from dagprof.collect.measure.codec_costs import measure_codec_costs
    from dagprof.costmodel.codecs import CodecCosts
    from dagprof.passes.bucket_plan import BucketSlots
    from dagprof.passes.compression import Chained, chained_latency_us, powersgd_parts
    from dagprof.passes.gradients import gradient_order
    from dagprof.pipeline import open_run

    why = available()
    if why:
        print(f"bench_powersgd_parts: skipped: the emulated cluster {why}", file=sys.stderr)
        return 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dagprof-psgd-parts-") as work, hosts(2, args.link, tag=f"dpp{os.getpid() % 10000}") as on:
        run = os.path.join(work, "run")
        launch([sys.executable, os.path.join(HERE, "ddp_heldout_embed.py"), "--steps", "14"], Bootstrap(profile=run, steps=range(4, 12), kineto=False),
               ranks=2, cluster=on.cluster, log_dir=os.path.join(work, "logs"), timeout_s=600)
        out = os.path.join(work, "parts")
        run_ranks([sys.executable, os.path.abspath(__file__), "--job", out, str(args.rank), str(args.steps)], 2, os.path.join(work, "logs2"),
                  cluster=on.cluster)
        measured = [json.load(open(f"{out}.{r}")) for r in (0, 1)]
        p = open_run(run)
        order = gradient_order(p.graph, p.run.ranks[0].buckets)
        costs = measure_codec_costs([(n, s) for n, s in zip(order.params, order.shapes) if s is not None], (args.rank,))
        kernels = CodecCosts(costs.encode_us_per_byte, costs.decode_us_per_byte,
                             {r: {n: type(c)(c.encode_us, c.middle_us, c.decode_us) for n, c in per.items()} for r, per in costs.powersgd.items()},
                             costs.copy_us_per_byte)  # the old pricing: the kernels alone
        price = BucketSlots(p.graph, order, costs).price
        pairs = tuple((int(b), float(us)) for b, us in measured[0]["chained_allreduce"])  # every rank's is the slowest's
        latency = chained_latency_us(Chained(pairs), price)
        rows = []
        for b, (first, last) in enumerate(order.bucket_params(order.profiled_ends)):
            pred = {}
            for label, c, lat in (("kernels", kernels, 0.0), ("whole", costs, 0.0), ("latency", costs, latency)):
                x = powersgd_parts(order, first, last, args.rank, c)
                pred[label] = {"issue": x.issue_us, "allreduce_unc": price(x.uncompressed * 4) + lat, "allreduce_p": price(x.p * 4) + lat,
                               "middle": x.middle_us, "allreduce_q": price(x.q * 4) + lat, "decode": x.decode_us}
                pred[label]["total"] = sum(pred[label].values())
            idx = str(b)  # DDP numbers its rebuilt buckets in gradient-ready order, as ``order`` lists them
            rows.append({"bucket": order.params[first] + ".." + order.params[last], "predicted": pred,
                         "measured": [m.get(idx, {}) for m in measured]})
    print(f"PowerSGD rank {args.rank}, 2 ranks, {args.link}, load average {load:.1f}: per bucket and part, us per compressed step "
          "(predicted: kernels alone / torch's hook measured whole / and each all-reduce paying the chained latency the job's group "
          f"measured, {latency:.0f} us from {', '.join(f'{b // 1024} KiB {us:.0f}' for b, us in pairs)}; measured: rank 0 / rank 1 medians)")
    for r in rows:
        print(f"bucket {r['bucket']}")
        for k in ("issue", "allreduce_unc", "unpack", "allreduce_p", "middle", "allreduce_q", "decode", "total"):
            a, w, lt = (r["predicted"][x].get(k) for x in ("kernels", "whole", "latency"))
            m = [x.get(k) for x in r["measured"]]
            fmt = lambda v: f"{v:8.0f}" if v is not None else "       -"  # noqa: E731
            print(f"  {k:<14} predicted {fmt(a)} / {fmt(w)} / {fmt(lt)}   measured {fmt(m[0])} / {fmt(m[1])}")
    if args.json:
        print(json.dumps({"load": load, "chained_allreduce": pairs, "latency_us": latency, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
