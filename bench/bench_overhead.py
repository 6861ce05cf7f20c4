"""Overhead of dagprof collection on a real 2-rank gloo DDP job (the demo CNN) and an FSDP2 job, against no profiler and torch.profiler.

This machine has 2 cores shared with other work, so wall times of separate jobs are noisy;
parts 1 and 2 compare modes inside ONE job, under the same background load:

Part 1, interleaved replicas: each rank holds two identical DDP replicas A and B and
alternates their steps; B runs under ``dagprof.profile(kineto=False)``, A under nothing:
B/A is the hook overhead (wall and main-thread CPU time per step, medians of rank 0).
Part 2, alternating blocks: one model; 5-step blocks cycle through no profiler, dagprof hooks
only, dagprof with Kineto, and torch.profiler alone (each profiler opened and its trace written per block, that
one-off work outside the step times). Kineto records every op of the process, so it cannot
join part 1. Part 3, separate jobs per mode (incl. record_shapes=True), medians over jobs. Part 4: part 2 for a
2-rank FSDP2 job (``bench/fsdp_train.py``'s transformer: every block and the root ``fully_shard``-ed). Part 5: part 2
for a 2-rank FSDP1 job (``bench/fsdp1_heldout.py``: ``FullyShardedDataParallel`` with ``size_based_auto_wrap_policy``).
Part 4 runs another FSDP2 script with ``--fsdp-script PATH --fsdp-args "ARGS"`` (any script with ``fsdp_train.py``'s
``parse_args``/``build``/``train``: part 12's held-out tied-embedding LM is ``fsdp_train.py`` with
``fsdp_whatif_table.FRESH``, ``--fsdp-args tiedlm``), and only some modes with ``--fsdp-modes none,hooks``.

    .venv/bin/python bench/bench_overhead.py [--ab-steps 30] [--blocks 4] [--repeats 2] [--fsdp-blocks 4] [--fsdp1-blocks 4] [--small]
    .venv/bin/python bench/bench_overhead.py --ab-steps 0 --blocks 0 --repeats 0 --fsdp1-blocks 0 --fsdp-args tiedlm --fsdp-modes none,hooks
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta

from dagprof.collect.jobs.demo_train import DemoConfig, build_model, spawn_demo_clocks
from dagprof.collect.jobs.netns import free_port

MODES = {  # name -> DemoConfig overrides
    "no profiler": dict(profile_steps=None),
    "dagprof hooks only (kineto=False)": dict(kineto=False),
    "dagprof (hooks + Kineto)": dict(),
    "torch.profiler alone (peer)": dict(profiler="torch"),
    "torch.profiler record_shapes=True (peer)": dict(profiler="torch", record_shapes=True),
}


def _ab_worker(rank: int, cfg: DemoConfig, steps: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect import profile

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size, timeout=timedelta(seconds=300))
    replicas = []
    for _ in range(2):
        torch.manual_seed(cfg.seed)
        model = DDP(build_model(cfg), bucket_cap_mb=cfg.bucket_cap_mb)
        replicas.append((model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)))
    x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    y = torch.randint(0, 10, (cfg.batch_size,))

    def step(model, opt) -> tuple[float, float]:
        c0, t0 = time.thread_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - t0, time.thread_time() - c0

    times: dict[str, list] = {"A": [], "B": []}
    warm = 4
    with tempfile.TemporaryDirectory() as folder, profile(folder, steps=range(warm, warm + steps), model=replicas[1][0], kineto=False) as prof:
        for i in range(warm + steps):
            a = step(*replicas[0])
            b = step(*replicas[1])
            prof.step()
            if i >= warm:
                times["A"].append(a)
                times["B"].append(b)
    dist.destroy_process_group()
    with open(os.path.join(out, f"ab{rank}.json"), "w") as f:
        json.dump(times, f)


def interleaved(cfg: DemoConfig, steps: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_ab_worker, args=(cfg, steps, free_port(), out), nprocs=cfg.world_size, join=True)
        with open(os.path.join(out, "ab0.json")) as f:
            times = json.load(f)
    med = {k: [statistics.median(t[j] for t in v) for j in (0, 1)] for k, v in times.items()}
    return {"wall_a": med["A"][0], "wall_b": med["B"][0], "cpu_a": med["A"][1], "cpu_b": med["B"][1]}


def ddp_job(rank: int, cfg: DemoConfig, port: int):
    """This process's rank of the demo CNN under DDP on gloo, with one fixed batch: the DDP model and a
    function that trains one step on it (zero_grad, forward, loss, backward, optimizer step)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size, timeout=timedelta(seconds=300))
    torch.manual_seed(cfg.seed)
    model = DDP(build_model(cfg), bucket_cap_mb=cfg.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    y = torch.randint(0, 10, (cfg.batch_size,))

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return model, train_step


BLOCK_MODES = ("no profiler", "dagprof hooks only (kineto=False)", "dagprof (hooks + Kineto)", "torch.profiler alone (peer)")
SHORT_MODES = dict(zip(("none", "hooks", "kineto", "torch"), BLOCK_MODES))  # --fsdp-modes names


def _blocks_worker(rank: int, cfg: DemoConfig, blocks: int, block: int, port: int, out: str) -> None:
    """One model; blocks of ``block`` steps cycle through BLOCK_MODES, each profiler opened per block."""
    import torch.distributed as dist
    from torch.profiler import profile as torch_profile

    from dagprof.collect import profile

    model, train_step = ddp_job(rank, cfg, port)
    times: dict[str, list] = {m: [] for m in BLOCK_MODES}

    def run_block(mode: str, tick) -> None:
        for _ in range(block):
            c0, t0 = time.thread_time(), time.perf_counter()
            train_step()
            times[mode].append((time.perf_counter() - t0, time.thread_time() - c0))
            tick()

    with tempfile.TemporaryDirectory() as folder:
        # the first dagprof block installs DDP's comm hook for good (a pass-through outside windows):
        # open and close one window before measuring so that every block runs with it
        with profile(os.path.join(folder, "setup"), steps=range(0, 1), model=model, kineto=False) as prof:
            run_block("no profiler", prof.step)
        times["no profiler"].clear()
        for b in range(blocks):
            for mode in BLOCK_MODES:
                if mode == "no profiler":
                    run_block(mode, lambda: None)
                elif mode.startswith("dagprof"):
                    kineto = "Kineto" in mode
                    with profile(os.path.join(folder, f"{mode[:12]}{b}"), steps=range(0, block), model=model, kineto=kineto) as prof:
                        run_block(mode, prof.step)
                else:
                    with torch_profile() as tp:
                        run_block(mode, lambda: None)
                    tp.export_chrome_trace(os.path.join(folder, f"t{b}.json"))  # same output work as dagprof
    dist.destroy_process_group()
    with open(os.path.join(out, f"blocks{rank}.json"), "w") as f:
        json.dump(times, f)


def alternating_blocks(cfg: DemoConfig, blocks: int, block: int) -> dict[str, tuple[float, float]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_blocks_worker, args=(cfg, blocks, block, free_port(), out), nprocs=cfg.world_size, join=True)
        with open(os.path.join(out, "blocks0.json")) as f:
            times = json.load(f)
    return {m: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for m, v in times.items()}


FSDP_ARGS = ["--model", "transformer", "--blocks", "4", "--width", "256"]  # bench/fsdp_train.py's model, 5 FSDP units
BENCH = os.path.dirname(os.path.abspath(__file__))
FSDP_JOBS = {  # part -> (script, its arguments)
    "fsdp2": (os.path.join(BENCH, "fsdp_train.py"), FSDP_ARGS),
    "fsdp1": (os.path.join(BENCH, "fsdp1_heldout.py"), []),  # FSDP1 (FullyShardedDataParallel), size_based_auto_wrap_policy: 4 units
}


def fsdp_args(given: str | None) -> list[str]:
    """``--fsdp-args``: "tiedlm" (part 12's held-out job, ``fsdp_whatif_table.FRESH``), else the arguments split."""
    if given is None:
        return FSDP_ARGS
    if given == "tiedlm":
        from fsdp_whatif_table import FRESH

        return list(FRESH)
    return given.split()


def _load_script(path: str):
    """The training script at ``path`` as a module (its ``parse_args``, ``build`` and ``train``); ``bench/`` importable."""
    import importlib.util
    import sys

    sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fsdp_blocks_worker(rank: int, job: tuple[str, list[str]], blocks: int, block: int, port: int, out: str,
                        modes: tuple[str, ...] = BLOCK_MODES) -> None:
    """Part 2 for an FSDP job (``job``: its script and arguments): one FSDP model, blocks of steps cycling through ``modes``."""
    import torch
    import torch.distributed as dist
    from torch.profiler import profile as torch_profile

    from dagprof.collect import profile

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=300))
    script, argv = job
    mod = _load_script(script)
    build, train = mod.build, mod.train
    args = mod.parse_args([*argv, "--steps", str(block)])
    model, opt = build(args)
    train(args, model, opt)  # warm-up (lazy init, first all-gathers)
    times: dict[str, list] = {m: [] for m in modes}
    cpu: dict[str, list] = {m: [] for m in modes}  # main-thread CPU per step of each block (its window's end included)
    with tempfile.TemporaryDirectory() as folder:
        for b in range(blocks):
            for mode in modes:
                c0 = time.thread_time()
                if mode == "no profiler":
                    times[mode] += train(args, model, opt)
                elif mode.startswith("dagprof"):
                    with profile(os.path.join(folder, f"{mode[:12]}{b}"), steps=range(0, block), model=model, kineto="Kineto" in mode) as prof:
                        times[mode] += train(args, model, opt, prof)
                        c1 = time.thread_time()
                else:
                    with torch_profile() as tp:
                        times[mode] += train(args, model, opt)
                        c1 = time.thread_time()
                    tp.export_chrome_trace(os.path.join(folder, f"t{b}.json"))
                cpu[mode].append(((c1 if mode != "no profiler" else time.thread_time()) - c0) / block)
    dist.destroy_process_group()
    with open(os.path.join(out, f"fsdp{rank}.json"), "w") as f:
        json.dump({"wall": times, "cpu": cpu}, f)


def fsdp_blocks(blocks: int, block: int, job: tuple[str, list[str]] = FSDP_JOBS["fsdp2"],
                modes: tuple[str, ...] = BLOCK_MODES) -> dict[str, tuple[float, float]]:
    """mode -> (median wall s/step, median main-thread CPU s/step over blocks) of rank 0."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_fsdp_blocks_worker, args=(job, blocks, block, free_port(), out, modes), nprocs=2, join=True)
        with open(os.path.join(out, "fsdp0.json")) as f:
            times = json.load(f)
    return {m: (statistics.median(v), statistics.median(times["cpu"][m])) for m, v in times["wall"].items()}


def separate_jobs(base: DemoConfig, steps: int, repeats: int) -> None:
    window = (6, steps - 2)
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(repeats):
        for mode, overrides in MODES.items():
            cfg = DemoConfig(**{**base.__dict__, "steps": steps, "profile_steps": window, **overrides})
            with tempfile.TemporaryDirectory(prefix="dagprof-bench-") as out:
                clocks = spawn_demo_clocks(cfg, out)
            wall[mode].append(statistics.median(clocks["wall"][0][window[0]:window[1]]) * 1e3)
            cpu[mode].append(statistics.median(clocks["cpu"][0][window[0]:window[1]]) * 1e3)
            print(f"  job {rep + 1}/{repeats} {mode}: {wall[mode][-1]:.1f} ms/step wall, {cpu[mode][-1]:.1f} ms cpu", flush=True)
    off, off_cpu = statistics.median(wall["no profiler"]), statistics.median(cpu["no profiler"])
    print(f"\nPart 3: separate 2-rank jobs, steps {window[0]}-{window[1] - 1}, {repeats} jobs per mode")
    print(f"{'mode':42s} {'wall ms/step':>12s} {'vs none':>8s} {'spread':>14s} {'cpu ms/step':>12s} {'vs none':>8s}")
    for mode, runs in wall.items():
        med, c = statistics.median(runs), statistics.median(cpu[mode])
        print(f"{mode:42s} {med:12.1f} {med / off:8.3f} {min(runs):6.1f}-{max(runs):<7.1f} {c:12.1f} {c / off_cpu:8.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2, help="jobs per mode in part 3 (0 skips part 3)")
    p.add_argument("--steps", type=int, default=22, help="steps per job in part 3")
    p.add_argument("--ab-steps", type=int, default=30, help="interleaved step pairs in part 1 (0 skips it)")
    p.add_argument("--blocks", type=int, default=4, help="rounds of alternating blocks in part 2 (0 skips it)")
    p.add_argument("--fsdp-blocks", type=int, default=4, help="rounds of alternating blocks of an FSDP2 job in part 4 (0 skips it)")
    p.add_argument("--fsdp1-blocks", type=int, default=4, help="rounds of alternating blocks of an FSDP1 job in part 5 (0 skips it)")
    p.add_argument("--fsdp-script", default=FSDP_JOBS["fsdp2"][0], help="part 4's FSDP2 training script (fsdp_train.py's functions)")
    p.add_argument("--fsdp-args", help='part 4\'s script arguments ("tiedlm": part 12\'s held-out LM; default: the transformer)')
    p.add_argument("--fsdp-modes", default=",".join(SHORT_MODES), help="part 4's modes, in block order: " + ",".join(SHORT_MODES))
    p.add_argument("--small", action="store_true", help="the tiny test model (fast smoke run)")
    args = p.parse_args()
    try:
        modes = tuple(SHORT_MODES[m] for m in args.fsdp_modes.split(","))
    except KeyError as err:
        p.error(f"--fsdp-modes: {err.args[0]} is none of {','.join(SHORT_MODES)}")
    if "no profiler" not in modes:
        p.error("--fsdp-modes: none is the baseline each mode is held against")
    fsdp2 = (os.path.abspath(args.fsdp_script), fsdp_args(args.fsdp_args))
    base = DemoConfig.small() if args.small else DemoConfig()
    t0 = time.perf_counter()
    print(f"2-rank gloo DDP demo CNN ({'small' if args.small else 'default'} model, batch {base.batch_size}, "
          f"bucket_cap_mb {base.bucket_cap_mb}, 1 thread per rank)")
    if args.ab_steps:
        ab = interleaved(base, args.ab_steps)
        print(f"\nPart 1: interleaved replicas in one job, {args.ab_steps} step pairs, rank 0 medians")
        print(f"{'':42s} {'wall ms/step':>12s} {'cpu ms/step':>12s}")
        print(f"{'A: no profiler':42s} {ab['wall_a'] * 1e3:12.1f} {ab['cpu_a'] * 1e3:12.1f}")
        print(f"{'B: dagprof hooks (kineto=False)':42s} {ab['wall_b'] * 1e3:12.1f} {ab['cpu_b'] * 1e3:12.1f}")
        print(f"{'ratio B/A':42s} {ab['wall_b'] / ab['wall_a']:12.3f} {ab['cpu_b'] / ab['cpu_a']:12.3f}")
    if args.blocks:
        res = alternating_blocks(base, args.blocks, 5)
        off_w, off_c = res["no profiler"]
        print(f"\nPart 2: one job, {args.blocks} rounds of 5-step blocks per mode (profiler opened per block), rank 0 medians")
        print(f"{'mode':42s} {'wall ms/step':>12s} {'vs none':>8s} {'cpu ms/step':>12s} {'vs none':>8s}")
        for mode, (w, c) in res.items():
            print(f"{mode:42s} {w * 1e3:12.1f} {w / off_w:8.3f} {c * 1e3:12.1f} {c / off_c:8.3f}")
    if args.repeats:
        separate_jobs(base, args.steps, args.repeats)
    for part, job, rounds, what, job_modes in (
            (4, fsdp2, args.fsdp_blocks, f"FSDP2 job ({os.path.relpath(fsdp2[0])} {' '.join(fsdp2[1])})", modes),
            (5, FSDP_JOBS["fsdp1"], args.fsdp1_blocks, "FSDP1 job (bench/fsdp1_heldout.py: FullyShardedDataParallel, "
                                                       "size_based_auto_wrap_policy)", BLOCK_MODES)):
        if not rounds:
            continue
        res = fsdp_blocks(rounds, 5, job, job_modes)
        off_w, off_c = res["no profiler"]
        print(f"\nPart {part}: a 2-rank {what}, {rounds} rounds of 5-step blocks per mode, rank 0 medians "
              "(cpu: the main thread's, per step of a block, the profiler's window end included)")
        print(f"{'mode':42s} {'wall ms/step':>12s} {'vs none':>8s} {'cpu ms/step':>12s} {'vs none':>8s}")
        for mode, (w, c) in res.items():
            print(f"{mode:42s} {w * 1e3:12.1f} {w / off_w:8.3f} {c * 1e3:12.1f} {c / off_c:8.3f}")
    print(f"\n{time.perf_counter() - t0:.0f} s total")


if __name__ == "__main__":
    main()
