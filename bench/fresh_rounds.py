"""Held-out what-ifs on fresh user scripts (issues 16, 20): each job profiled at 2 ranks, then measured unprofiled as asked.

Jobs: stop 63's DDP BiLSTM-CRF (``crf``) and HSDP dual encoder (``dual``: profiled 1x2 with ``--shard 2``, so 4 ranks
run 2x2, the replicate degree ``--workers`` grows), stop 64's DDP PPO (``ppo``) and FSDP2 NeRF (``nerf``), six more DDP
scripts of ``bench/ddp_fresh`` that stop 65 held out for ``--workers 4 --cores 2``, stop 65's DDP GAT (``gat``,
``find_unused_parameters=True``), two that stop 66 held out for it (``dqn``, a Double DQN; ``retrieval``, a dual encoder of
asynchronous collectives), stop 66's HSDP scripts, each profiled 1x2 with ``--shard 2`` (4 ranks run 2x2): a Glow
normalizing flow (``glow``, new), the causal transformer (``hsdptf``) and the Swin classifier (``swin``), stop 66's
DDP N-BEATS (``nbeats``: bf16 autocast, ``no_sync`` accumulation of 4), FSDP2 character MoE LM (``moechar``: top-2 by
hand, explicit prefetch, the root kept gathered) and DDP SimSiam (``simsiam``: two optimizers at different rates,
``gradient_as_bucket_view``), and stop 66's DDP DANN (``dann``: a gradient reversal ``autograd.Function``) and VQ-VAE
(``vqvae``: ``no_sync`` accumulation, an EMA model, dead-code restarts), and stop 67's FSDP2 ALBERT (``albert``: one
shared layer's unit called 4 times a forward), HSDP ConvE (``conve``: its entity table a unit of its own, profiled 1x2 with ``--shard 2``)
and DDP DNA transformer (``dna``: per-rank LayerDrop under ``find_unused_parameters``, a loader worker process).

Per job and round, in a shuffled order (as root: the 200 Mbit/s and 1 Gbit/s cells on the namespace testbed,
``collect.jobs.netns``, each rank in its own namespace behind a shaped port):
- ``profile-lo``: the 2-rank job profiled on loopback (the zero-code bootstrap, Kineto on, steps 5:10), which predicts
  ``w4`` by ``whatif --workers 4 --cores 2`` (4 ranks on this machine's 2 cores);
- ``profile-1G``: the 2-rank job profiled at 1 Gbit/s, which predicts ``200M`` by ``whatif --bandwidth 200Mbit
  --profiled-bandwidth 1Gbit``;
- ``profile-200M`` (only when ``--profiles`` names it): the 2-rank job profiled at 200 Mbit/s, which predicts nothing; it is
  there to compare, op by op, with what ``whatif --bandwidth 200Mbit`` laid out from ``profile-1G``;
- unprofiled: ``lo`` (2 ranks, as profiled), ``w4`` (4 ranks), ``1G`` and ``200M`` (2 ranks on the testbed): rank 0's
  median step as the script prints it;
- the HSDP jobs (``WIRE_WORKERS``) also ``w4-1G``: 4 ranks at 1 Gbit/s, which ``profile-1G`` predicts by ``whatif
  --workers 4 --cores 2 --profiled-bandwidth 1Gbit``, a what-if that rebuilds the collectives of a profile whose wire is
  known (each floored kind's head start carried, ``passes.comm.carried_own_time``).
Each cell: predicted, measured, error (median steps), and the change error (the prediction over the model of its profile,
the same what-if's median step at the profiled setting, against the measured cell over the job measured as profiled in the
same round), which takes out the level the profiler and the minute's load put the profile at; and the model's own error
(that median against its unprofiled twin's).

    dp-excl .venv/bin/python bench/fresh_rounds.py --keep KEPT --jobs crf,dual      # one round each, added to KEPT
    dp-excl .venv/bin/python bench/fresh_rounds.py --keep KEPT --jobs dann --profiles profile-1G   # 1G -> 200M only
    .venv/bin/python bench/fresh_rounds.py --offline KEPT [--src TREE/src]          # predicted by a tree, no lock
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whatif_cli import Refused, whatif_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = {"crf": ["ddp_fresh/crf_ner_stream.py"], "dual": ["fsdp_fresh/hsdp_dual_encoder.py", "--shard", "2"],
        "ppo": ["ddp_fresh/ppo_cartpole.py"], "nerf": ["fsdp_fresh/nerf_rays.py"], "gat": ["ddp_fresh/gat_edges.py"],
        # stop 65's held-out DDP scripts for --workers 4 --cores 2 (w4cores65)
        "ddpm": ["ddp_fresh/ddpm_unet_ema.py"], "capsnet": ["ddp_fresh/capsnet_scaler.py"], "tied": ["ddp_fresh/ckpt_static_tied.py"],
        "dlrm": ["ddp_fresh/dlrm_mini.py"], "twotower": ["ddp_fresh/two_tower.py"], "grulm": ["ddp_fresh/tied_gru_lm.py"],
        # stop 66's held-out DDP scripts for --workers 4 --cores 2 (crfcpu66)
        "dqn": ["ddp_fresh/dqn_replay.py"], "retrieval": ["ddp_fresh/async_retrieval.py"],
        # stop 66's HSDP scripts (hsdp66)
        "glow": ["fsdp_fresh/hsdp_glow.py", "--shard", "2"], "hsdptf": ["fsdp_fresh/hsdp_transformer.py", "--shard", "2"],
        "swin": ["fsdp_fresh/hsdp_swin.py", "--shard", "2"],
        # stop 66's fresh scripts (fresh66t)
        "nbeats": ["ddp_fresh/nbeats_accum4.py", "--steps", "12"], "moechar": ["fsdp_fresh/moe_charlm_prefetch.py", "--steps", "12"],
        "simsiam": ["ddp_fresh/simsiam_two_opts.py", "--steps", "12"],
        # stop 66's held-out scripts for the profiler's CPU (level66)
        "dann": ["ddp_fresh/dann_grl.py", "--steps", "16"], "vqvae": ["ddp_fresh/vqvae_ema.py"],
        # stop 67's fresh scripts (fresh67t)
        "albert": ["fsdp_fresh/albert_shared_block.py"], "conve": ["replicate_fresh/conve_sharded_entities.py", "--shard", "2"],
        "dna": ["ddp_fresh/layerdrop_dna.py"]}
# the jobs that save a checkpoint: its directory's flag (each round's own, not the shared default under $TMPDIR)
CKPT_FLAG = {"crf": "--ckpt-dir", "swin": "--ckpt"}
RATES = {"lo": None, "1G": 1e9, "200M": 200e6}
WINDOW = range(5, 10)
# cell: (ranks, link); the profiles and the cells each predicts, with the what-if and the measured twin of the profile
CELLS = {"lo": (2, "lo"), "w4": (4, "lo"), "1G": (2, "1G"), "200M": (2, "200M"), "w4-1G": (4, "1G")}
WIRE_WORKERS = {"dual", "glow", "hsdptf", "swin", "conve"}  # the jobs whose rounds run ``w4-1G``
# each profile's link (its measured twin is the cell of that name)
PROFILES = {"profile-lo": "lo", "profile-1G": "1G", "profile-200M": "200M"}
DEFAULT_PROFILES = "profile-lo,profile-1G"  # ``profile-200M`` predicts nothing: asked for to hold a what-if's layout against
# (profile, the cell it predicts, the what-if); each asks the profiled setting first: its median step is the model's, to hold
# against the measured twin's median
WHATIFS = [("profile-lo", "w4", ("--workers", "2,4", "--cores", "2")),
           ("profile-1G", "200M", ("--bandwidth", "1Gbit,200Mbit", "--profiled-bandwidth", "1Gbit")),
           ("profile-1G", "w4-1G", ("--workers", "2,4", "--cores", "2", "--profiled-bandwidth", "1Gbit"))]
MIN_CELL_S = 25
GRACE_S = 8
# a cell's longest run, s (dry runs at load 4-22: the CRF 17-45 s, the dual encoder 87-119)
CAP_S = {"crf": 75, "dual": 120, "ppo": 75, "nerf": 120, "gat": 60, "ddpm": 75, "capsnet": 75, "tied": 75, "dlrm": 75, "twotower": 75,
         "grulm": 75, "dqn": 60, "retrieval": 60, "glow": 90, "hsdptf": 60, "swin": 90, "nbeats": 75, "moechar": 75, "simsiam": 75,
         "dann": 60, "vqvae": 60, "albert": 75, "conve": 60, "dna": 60}
_MEDIAN = re.compile(r"median step ([0-9.]+) ms")


def command(job: str, scratch: str) -> list[str]:
    script, *args = JOBS[job]
    ckpt = [CKPT_FLAG[job], os.path.join(scratch, "ckpt")] if job in CKPT_FLAG else []
    return [sys.executable, os.path.join(HERE, script), *args, *ckpt]


def run_cell(argv: list[str], env: dict[str, str], ranks: int, cluster, log_dir: str, cap_s: float, profiled: bool) -> str:
    """One job on ``ranks`` ranks (``cluster`` None: loopback), as ``netns.run_ranks`` starts them, done when every rank
    exits or, unprofiled, ``GRACE_S`` after rank 0 printed its median step: at exit an unprofiled DDP rank sometimes
    deadlocks in torch's teardown (the Reducer's ProcessGroupGloo joins its runloop thread, which waits for the GIL the
    joining thread holds; ``collect.hooks.exit_gc`` spares profiled ranks that), long after its steps were timed; a
    profiled rank writes its profile at exit. Stopped at ``cap_s``; returns what ended it."""
    from dagprof.collect.jobs.netns import free_port, stop_all

    os.makedirs(log_dir, exist_ok=True)
    port, procs, said = free_port(), [], "timed out"
    try:
        for r in range(ranks):
            e = {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks), "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            log = os.path.join(log_dir, f"rank{r}.log")
            if cluster is not None:
                procs.append(cluster.spawn(r, argv, e, log))
                continue
            with open(log, "w") as out:
                procs.append(subprocess.Popen(argv, env={**os.environ, **e, "MASTER_ADDR": "127.0.0.1"}, stdout=out, stderr=subprocess.STDOUT))
        t0, printed = time.monotonic(), None
        while time.monotonic() - t0 < cap_s:
            if all(p.poll() is not None for p in procs):
                said = "ok" if all(p.returncode == 0 for p in procs) else f"exit {[p.returncode for p in procs]}"
                break
            if any(p.poll() not in (None, 0) for p in procs):
                said = f"a rank failed: exit {[p.poll() for p in procs]}"
                break
            printed = printed or (time.monotonic() if measured_ms(os.path.dirname(log_dir), os.path.basename(log_dir)[:-5]) else None)
            if printed and not profiled and time.monotonic() - printed > GRACE_S:
                said = f"ok, {sum(p.poll() is None for p in procs)} rank(s) stopped {GRACE_S} s after rank 0's median"
                break
            time.sleep(0.2)
    finally:
        stop_all(procs)
    return said


def run_round(job: str, out: str, clusters: dict, seed: int, deadline: float, profiles: list[str]) -> None:
    """The ``profiles`` and the unprofiled cells they predict and are held against, of one round into ``out``, shuffled;
    each with its seconds and load. No cell starts within ``MIN_CELL_S`` of ``deadline`` (``time.monotonic``), and none
    runs past it or the job's cap."""
    from dagprof.collect.jobs.launch import Bootstrap

    todo = profiles + [c for c in CELLS if (c != "w4-1G" or job in WIRE_WORKERS)
                       and any(c == PROFILES[p] or (p, c) in {(w[0], w[1]) for w in WHATIFS} for p in profiles)]
    random.Random(seed).shuffle(todo)
    for name in todo:
        ranks, link = (2, PROFILES[name]) if name in PROFILES else CELLS[name]
        boot = Bootstrap(profile=os.path.join(out, name), steps=WINDOW) if name in PROFILES else Bootstrap()
        cluster = None if RATES[link] is None else clusters[ranks]
        if cluster is not None:
            cluster.set_rate(RATES[link])
        left = deadline - time.monotonic()
        if left < MIN_CELL_S:
            print(f"    {job} {name}: not run, {left:.0f} s of the budget left", flush=True)
            continue
        t0, load = time.perf_counter(), os.getloadavg()[0]
        said = run_cell(command(job, out), boot.env(), ranks, cluster, os.path.join(out, f"{name}-logs"), min(left, CAP_S[job]),
                        profiled=name in PROFILES)
        print(f"    {job} {name}: {time.perf_counter() - t0:.0f} s, load {load:.2f} -> {os.getloadavg()[0]:.2f} {said}", flush=True)


def measured_ms(out: str, name: str) -> float | None:
    """Rank 0's median step as the script printed it (None: not run, or failed)."""
    try:
        with open(os.path.join(out, f"{name}-logs", "rank0.log")) as f:
            found = _MEDIAN.findall(f.read())
    except OSError:
        return None
    return float(found[-1]) if found else None


def judge(out: str, src: str | None) -> list[dict]:
    rows = []
    for profile, cell, args in WHATIFS:
        run = os.path.join(out, profile)
        if not os.path.isdir(run) or not os.path.isdir(os.path.join(out, f"{cell}-logs")):  # not profiled, or the cell never ran
            continue
        row = {"profile": profile, "cell": cell, "measured_as_ms": measured_ms(out, PROFILES[profile]), "measured_ms": measured_ms(out, cell)}
        with tempfile.TemporaryDirectory() as tmp:  # whatif writes beside its input: a copy
            try:
                d = whatif_json(shutil.copytree(run, os.path.join(tmp, profile)), *args, src=src)
            except Refused as e:
                rows.append(row | {"refused": str(e)})
                continue
        base, s = d["scenarios"]
        row |= {"predicted_ms": s["predicted_median_ms"], "model_ms": base["predicted_median_ms"], "lo_ms": s["lo_ms"], "hi_ms": s["hi_ms"]}
        if row["measured_as_ms"]:
            row["model_error_pct"] = 100 * (row["model_ms"] / row["measured_as_ms"] - 1)
        if row["measured_ms"]:
            row["error_pct"] = 100 * (row["predicted_ms"] / row["measured_ms"] - 1)
            if row["measured_as_ms"]:
                row["change_error_pct"] = 100 * ((row["predicted_ms"] / row["model_ms"]) / (row["measured_ms"] / row["measured_as_ms"]) - 1)
        rows.append(row)
    return rows


def offline(keep: str, src: str | None) -> None:
    fmt = lambda v, f="8.1f": format(v, f) if v is not None else "-".rjust(8)  # noqa: E731
    print(f"{'job':<5} {'round':<7} {'cell':<5} {'as':>8} {'model':>8} {'m.err':>7} {'pred':>8} {'interval':>15} {'meas':>8} "
          f"{'error':>7} {'change':>7}")
    summary: dict[tuple[str, str], list[dict]] = {}
    for job in sorted(j for j in os.listdir(keep) if j in JOBS):
        for r in sorted(os.listdir(os.path.join(keep, job)), key=lambda r: int(r[5:])):
            for row in judge(os.path.join(keep, job, r), src):
                summary.setdefault((job, row["cell"]), []).append(row)
                if "refused" in row:
                    print(f"{job:<5} {r:<7} {row['cell']:<5} refused: {row['refused']}")
                    continue
                print(f"{job:<5} {r:<7} {row['cell']:<5} {fmt(row['measured_as_ms'])} {fmt(row['model_ms'])} "
                      f"{fmt(row.get('model_error_pct'), '+6.1f')}% {fmt(row['predicted_ms'])} {row['lo_ms']:7.1f}-{row['hi_ms']:<7.1f} "
                      f"{fmt(row['measured_ms'])} {fmt(row.get('error_pct'), '+6.1f')}% {fmt(row.get('change_error_pct'), '+6.1f')}%")
    for (job, cell), rows in sorted(summary.items()):
        for key in ("error_pct", "change_error_pct", "model_error_pct"):
            xs = [r[key] for r in rows if key in r]
            if xs:
                print(f"{job} {cell}: {key[:-4]} median {statistics.median(xs):+.1f} % over {len(xs)} round(s), "
                      f"range {min(xs):+.1f} .. {max(xs):+.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="crf,dual", help=f"comma-separated, of {', '.join(JOBS)}")
    ap.add_argument("--keep", help="add one round per job here")
    ap.add_argument("--offline", metavar="KEPT", help="run nothing: predict the kept rounds and judge them")
    ap.add_argument("--src", default=None, help="the dagprof tree's src to predict with (default: this one's)")
    ap.add_argument("--budget-s", type=float, default=270, help="start no job past this many seconds (a hold of the lock stays short)")
    ap.add_argument("--profiles", default=DEFAULT_PROFILES, help=f"comma-separated, of {', '.join(PROFILES)}: those and their cells only")
    args = ap.parse_args()
    if args.offline:
        offline(args.offline, args.src)
        return 0
    from dagprof.collect.jobs.netns import Cluster, available

    if why := available():
        print(f"fresh_rounds: skipped: {why}")
        return 0
    jobs = args.jobs.split(",")
    if bad := [j for j in jobs if j not in JOBS]:
        ap.error(f"unknown job(s) {', '.join(bad)}; known: {', '.join(JOBS)}")
    profiles = args.profiles.split(",")
    if bad := [p for p in profiles if p not in PROFILES]:
        ap.error(f"unknown profile(s) {', '.join(bad)}; known: {', '.join(PROFILES)}")
    if not args.keep:
        ap.error("give --keep DIR (the rounds are judged afterwards by --offline DIR)")
    print(f"fresh_rounds: into {args.keep}, load {os.getloadavg()[0]:.2f}", flush=True)
    deadline = time.monotonic() + args.budget_s
    with Cluster(4 if WIRE_WORKERS & set(jobs) else 2) as cluster:  # a 2-rank job on a 4-rank cluster uses its first 2 ports
        for job in random.sample(jobs, len(jobs)):
            base = os.path.join(args.keep, job)
            os.makedirs(base, exist_ok=True)
            k = sum(1 for e in os.listdir(base) if e.startswith("round"))
            os.makedirs(os.path.join(base, f"round{k}"))
            run_round(job, os.path.join(base, f"round{k}"), {2: cluster, 4: cluster}, seed=k + 100 * len(job), deadline=deadline,
                      profiles=profiles)
    print(f"fresh_rounds: done, load {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
