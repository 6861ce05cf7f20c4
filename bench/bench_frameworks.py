"""User-style TensorFlow, JAX, MXNet and Horovod scripts (bench/frameworks/), each profiled N times as a user would:
crashes (a worker that died, by its exit status or signal), the model the what-ifs start from against the
profiled run (must be within 2 %; less the profiler's own cost, measured on the run, unless it could not be told:
``raw_model_pct`` is the model of the op times as profiled against the run as measured), and the averaged replay
(``--template``) against the measurement.

    DAGPROF_TF_PYTHON=/opt/tf/bin/python DAGPROF_JAX_PYTHON=/opt/jax/bin/python DAGPROF_MXNET_PYTHON=/opt/mx/bin/python \\
    DAGPROF_HOROVOD_VENV=/opt/hvd python bench/bench_frameworks.py --runs 20 [--only tf_text,jax_shardmap,mx_mlp,hvd_text] [--keep DIR]

MXNet scripts run as ``dist_sync`` jobs under ``python -m dagprof.collect.hooks.mxnet_ps run`` (scheduler, 1 server,
the workers), its exit status standing for the job's (a process that died fails the launcher). Horovod scripts carry
no dagprof line: ``dagprof profile -o RUN --steps A:B -- horovodrun -np N -H localhost:N --gloo python SCRIPT`` (the
venv of ``bench/horovod/build_horovod.sh``), whose exit status is the job's (dagprof's own refusal, 2, is told apart
by its message).

The framework's Python needs dagprof importable (this checkout's src/ is put on PYTHONPATH).
Workers share this host's loopback; on 2 busy cores figures vary from run to run: medians and spreads are reported.
``--testbed --hosts`` (Horovod) confines each emulated host's processes to a core of its own, as hosts each have theirs,
and every testbed job says the CPU others took beside it (``others_cpu_pct``): a level that moved with it is the load's;
and how long its ranks waited for a core beyond their own threads' CPU (``foreign_pct``, ``analysis.foreign_cpu``): on a
core a rank, the share of it other processes took.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from dagprof.analysis.foreign_cpu import NOTE_SHARE  # noqa: E402
from dagprof.collect.jobs.netns import Cluster, free_ports  # noqa: E402  (stdlib only: TF is imported by the job, not here)
from dagprof.errors import DagprofError  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search.scenario import Scenario  # noqa: E402
from dagprof.search.whatif import evaluate  # noqa: E402

sys.path.insert(0, HERE)
from shaped_loopback import (  # noqa: E402
    DEFAULT_PAIR,
    PAIRS,
    PILOT_RATE,
    WIRE_FILE,
    hosts_namespaces,
    hosts_qdisc,
    hosts_tx,
    loopback_tx,
    measured,
    namespace,
    pick_pair,
    predict_rate,
    qdisc,
    shape_hosts,
    shape_loopback,
)

SSH_SHIM = os.path.join(HERE, "testbed", "ssh_shim")  # an ``ssh`` that runs the command in the namespace owning the host's address

SCRIPTS = {  # name -> (framework, environment variable naming its Python, extra environment)
    "tf_text": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_mlp_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_shardmap": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_jit_embed": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "tf_gru_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "tf_cnn_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_lstm_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_mixer": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_pmap_adam": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "tf_widedeep_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "tf_transformer_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_gnn_jit": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_scan_rnn": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_mlp": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_embed": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_lstm": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_convnet": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_text": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_resnet": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_transformer": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_sparse_gru": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "mx_attn_accum": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_kv_manual": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_autoencoder": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_manual_allreduce": ("horovod", "DAGPROF_HOROVOD_VENV", {}),  # its own hvd.* calls: refused in one line, counted as such
    "tf_vae_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_vit_optax": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_wlm_clip": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_tcn_groups": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_seq2seq_fp16": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_lstm_lm_remat": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_textcnn_sched": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_dlrm_dense": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "jax_fsdp_conv": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "tf_mobilenet_accum": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "mx_sparse_mf": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "mx_fasttext_sparse": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "jax_two_tower": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "hvd_kws_amp": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_unet_ema": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_diffusion_accum": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_dae_metric": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_pointnet_frozen": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_lstm_lm": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "jax_zero_rs": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_moe_a2a": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_tfm_zero_scan": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "tf_bilstm_tagger_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_wavenet_lion": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_gru_forecast": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "tf_recsys_ragged": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_textcls_buckets": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_skipgram_negative": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_siamese_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "tf_dcn_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "hvd_simclr": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_tft_forecast_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_flow_fori": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_charcnn_iter": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_vit_warmup": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_kws_specaug_gather": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_node_pmap_accum": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_deepfm_workers": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_bert_mlm_join": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_fttransformer_xla": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_vae_sharded": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_pointnet_accum": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_sasrec_accum": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_mmoe_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_kge_complex": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_gcn_molecule": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_gine_molecules": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "hvd_bucketed_tagger": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_wgan_gp_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_pinn_poisson": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "tf_autoint_strings_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_t5_adafactor_scan": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_resnet_2bit": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_crnn_ctc": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_tfidf_bigram_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_settf_pmap_flat": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_tcn_frozen": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_unet_resume": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "mx_bow_2bit": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "tf_distill_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_lru_multiopt": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_capsnet_routing": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_nerf_rays": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_translator_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_gat_segment_ema": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_ssd_multibox": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_convnext_ema": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_speech_ctc_loop": ("tensorflow", "DAGPROF_TF_PYTHON", {}),
    "jax_clip_gather": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_caption_attn": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_centernet_gn": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
    "tf_espcn_sr_fit": ("tensorflow", "DAGPROF_TF_PYTHON", {"TF_USE_LEGACY_KERAS": "1"}),
    "jax_pixelcnn_jit": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "jax_mdn_rmsprop": ("jax", "DAGPROF_JAX_PYTHON", {}),
    "mx_triplet_hard": ("mxnet", "DAGPROF_MXNET_PYTHON", {}),
    "hvd_seq2seq_sort": ("horovod", "DAGPROF_HOROVOD_VENV", {}),
}
# A testbed round's reference jobs (``testbed``): the profiled configuration again, just before and just after the measured job
REFERENCES = ("before", "after")
HOGGED = "hogged"  # ``--hog``: a round's profiled configuration profiled again beside a busy loop on host 1's core, predicted as the profiled one
HOG = "while True: pass"
MXNET_SERVERS = {"mx_kv_manual": 2}  # servers of an MXNet script's job (1 elsewhere)
# Horovod: (the profiled window, the script's arguments). Its fusion depends on timing, so the collectives differ from step
# to step and run to run: 10 steps, not 4 (one 117 ms step among 25-35 ms ones set a 4-step window's mean off by 80 %).
# The ResNet's window lies in its second epoch, clear of the first epoch's end (its sampler and scheduler).
HOROVOD_RUN = {"hvd_text": ("6:16", ["--steps", "20"]), "hvd_resnet": ("16:26", []), "hvd_transformer": ("6:16", ["--steps", "20"]),
               "hvd_sparse_gru": ("6:16", ["--steps", "20"]), "hvd_autoencoder": ("6:16", ["--steps", "20"]),
               "hvd_manual_allreduce": ("6:16", ["--steps", "20"]), "hvd_tcn_groups": ("6:16", ["--steps", "20"]),
               "hvd_dlrm_dense": ("6:16", ["--steps", "20"]), "hvd_kws_amp": ("6:16", ["--steps", "20"]),
               "hvd_pointnet_frozen": ("6:16", ["--steps", "20"]), "hvd_lstm_lm": ("6:16", ["--steps", "20"]),
               "hvd_simclr": ("6:16", ["--steps", "20"]),
               "hvd_vit_warmup": ("6:16", ["--steps", "20"]), "hvd_sasrec_accum": ("6:16", ["--steps", "20"]),
               "hvd_gine_molecules": ("6:16", ["--steps", "20"]), "hvd_bucketed_tagger": ("6:16", ["--steps", "20"]),
               "hvd_crnn_ctc": ("6:16", ["--steps", "20"]), "hvd_unet_resume": ("6:16", ["--steps", "20"]),
               "hvd_nerf_rays": ("6:16", ["--steps", "20"]), "hvd_convnext_ema": ("6:16", ["--steps", "20"]),
               "hvd_centernet_gn": ("6:16", ["--steps", "20"]), "hvd_seq2seq_sort": ("6:16", ["--steps", "20"]),
               # its epochs of 20 and 19 batches (rank 0, 1), hvd.join() after each: the window inside the first (one that holds a
               # join is refused, traces.horovod._check_no_join: its default 12 batches put one after rank 0's step 11)
               "hvd_bert_mlm_join": ("6:16", ["--batches", "20", "--epochs", "1"])}


def launch(name: str, python: str, out: str, workers: int, timeout: float, src: str = SRC, prefix: tuple[str, ...] = (),
           script_args: tuple[str, ...] = (), hosts: Cluster | None = None, own_cores: bool = False) -> list[int]:
    """Run the script on ``workers`` processes with the collector in ``src``; their exit statuses (negative: killed by that signal).
    ``prefix`` goes before every command started (``ip netns exec NS``: the job in that namespace); ``script_args`` after a
    TF or JAX script's own (``--script-args``). ``hosts`` (Horovod, TensorFlow, JAX): each worker on a host of its own, a namespace
    of ``hosts``, as a user starts a job on two hosts: ``horovodrun -H ADDR0:1,ADDR1:1`` from the first, its ``ssh`` the
    shim that enters the namespace owning the address (``SSH_SHIM``); a TF or JAX worker started in its host's namespace,
    TF_CONFIG naming the hosts' addresses, a JAX script's ``--coordinator`` host 0's. ``own_cores`` (Horovod, with
    ``hosts``): each host's processes confined to a core of their own (``host_cores``), as on hosts that each have theirs."""
    framework, _, extra = SCRIPTS[name]
    script = os.path.join(HERE, "frameworks", f"{name}.py")
    env = dict(os.environ, PYTHONPATH=src, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    ports = free_ports(workers)
    if framework == "mxnet":
        servers = str(MXNET_SERVERS.get(name, 1))
        cmd = [sys.executable, "-m", "dagprof.collect.hooks.mxnet_ps", "run", "--out", out, "--servers", servers, "--workers", str(workers),
               "--port", str(ports[0]), "--profile-steps", "5", "--timeout", str(int(timeout)), "--", python, script, "--steps", "16"]
        with open(os.path.join(out, "launcher.txt"), "w") as log:
            return [subprocess.run([*prefix, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=log, timeout=timeout + 60).returncode]
    if framework == "horovod":  # python names the venv's interpreter; horovodrun and the ranks' python come from its bin/
        bindir = os.path.dirname(python)
        env |= {"PATH": bindir + os.pathsep + env.get("PATH", ""), "OMP_NUM_THREADS": "1"}
        where = f"localhost:{workers}"
        if hosts is not None:
            prefix, where = ("ip", "netns", "exec", hosts.ns(0)), ",".join(f"{hosts.addr(r)}:1" for r in range(workers))
            env |= {"PATH": SSH_SHIM + os.pathsep + env["PATH"],
                    "DAGPROF_NETNS_HOSTS": ",".join(f"{hosts.addr(r)}={hosts.ns(r)}" for r in range(workers))}
            if own_cores:  # the launcher and rank 0 on host 0's core (affinity is inherited), the shim puts each other rank on its host's
                cores = host_cores(workers)
                prefix += ("taskset", "-c", str(cores[0]))
                env |= {"MKL_NUM_THREADS": "1", "DAGPROF_NETNS_CORES": ",".join(f"{hosts.addr(r)}={cores[r]}" for r in range(workers))}
        window, hvd_args = HOROVOD_RUN[name]
        cmd = [sys.executable, "-m", "dagprof.cli.main", "profile", "-o", out, "--steps", window, "--json", "--",
               os.path.join(bindir, "horovodrun"), "-np", str(workers), "-H", where, "--gloo", "python", script, *hvd_args]
        log_path = os.path.join(out, "launcher.txt")
        with open(log_path, "w") as log:
            code = subprocess.run([*prefix, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=log, timeout=timeout + 60).returncode
        with open(log_path) as log:
            said = re.search(r"the (?:profiled )?command exited with status (-?\d+)", log.read())
        return [int(said.group(1)) if said else 0 if code == 2 else code]  # 2 alone: dagprof refused a finished job (judge says why)
    procs = []
    addr = [hosts.addr(r) if hosts is not None else "127.0.0.1" for r in range(workers)]
    for rank in range(workers):
        # with ``hosts``: each worker in its namespace, started as on its host (its hostname resolves to its own address
        # there, ``Cluster(iface=...)``, which JAX's gloo binds), TF's cluster spec or JAX's coordinator host 0's address
        where = prefix if hosts is None else ("ip", "netns", "exec", hosts.ns(rank), *prefix)
        if framework == "tensorflow":
            cluster = {"worker": [f"{a}:{p}" for a, p in zip(addr, ports)]}
            penv = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}))
            cmd = [python, script, "--out", out, *script_args]
        else:
            coordinator = ("--coordinator", addr[0]) if hosts is not None else ()  # JAX: every rank meets rank 0 there
            penv, cmd = env, [python, script, "--out", out, "--rank", str(rank), "--world", str(workers), "--port", str(ports[0]),
                              *coordinator, *script_args]
        procs.append(subprocess.Popen([*where, *cmd], env=penv, stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, f"log{rank}.txt"), "w")))
    deadline = time.monotonic() + timeout
    codes: list[int | None] = [None] * workers
    while any(c is None for c in codes):
        codes = [p.poll() for p in procs]
        if time.monotonic() > deadline or any(c not in (None, 0) for c in codes):
            time.sleep(2.0 if time.monotonic() <= deadline else 0.0)  # let the others fail on their own first
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            codes = [p.wait() for p in procs]
            break
        time.sleep(0.2)
    return [int(c) for c in codes]


def host_cores(workers: int) -> list[int]:
    """The core each of ``workers`` hosts runs on (``--hosts``): this process's cores in turn, host r on the r-th (hosts
    share one only where they outnumber the cores). Ranks free on both of 2 cores, each with its main, Horovod's background
    and gloo's threads, beside the launcher and the ssh shim, took each other's cores: the same 200 Mbit/s job's median
    step spread 40.5 % over 4 jobs (hvd_text; 49.8 % hvd_autoencoder), 3.6 % confined (35.1 %, 4.5 % without its first
    job; ``bench/horovod/hosts_level.py``, 2026-12-06). A confined rank cannot move off its core: one busy process beside
    it halves its pace (``_others_cpu_pct`` says how much of the cores others took during each job)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return [cores[r % len(cores)] for r in range(workers)]


def profiled_again(out: str) -> int:
    """How many times the TF/JAX collector profiled its window again because a rank's profile was lost (0 elsewhere)."""
    try:
        with open(os.path.join(out, "rank0.json")) as f:
            return sum("profiled again" in w for w in json.load(f).get("warnings", []))
    except (OSError, ValueError):
        return 0


def collecting_children_died(out: str) -> int:
    """TF: the collecting children that died, over every rank file's notes (a window's collection retried in a fresh child,
    or lost when all its children died); 0 elsewhere."""
    died = 0
    for name in os.listdir(out):
        if re.fullmatch(r"rank\d+\.json", name):
            try:
                with open(os.path.join(out, name)) as f:
                    notes = json.load(f).get("warnings", [])
            except (OSError, ValueError):
                continue
            died += sum(int(n) for w in notes
                        for n in re.findall(r"(?:crashed|failed) while collecting in (\d+) child", w))
    return died


def judge(out: str) -> dict:
    """The model's error on the profiled run (what-ifs start from it) and the averaged replay's, %; or the refusal."""
    try:
        p = open_run(out)
        measured = p.analysis.measured_us
        r = evaluate(p.graph, [Scenario()], measured_us=measured, tolerance_pct=None)
        raw = evaluate(p.graph, [Scenario()], measured_us=measured, tolerance_pct=None, raw=True)
        avg = open_run(out, template=True).analysis.error_pct
        fit, cost = r["link_fit"] or {}, r["profiler_cost"]
        return {"model_pct": r["model_error_pct"], "model_ms": r["model_iter_ms"], "reference_ms": r["reference_iter_ms"],
                "raw_model_pct": raw["model_error_pct"], "raw_model_ms": raw["model_iter_ms"], "measured_ms": measured / 1e3,
                "profiled_step_ms": cost["profiled_step_ms"], "unprofiled_step_ms": cost["unprofiled_step_ms"],
                "profiler_cost": cost["text"], "cost_corrected": cost["corrected"],
                "replay_pct": p.analysis.error_pct, "averaged_pct": avg, "weak_fit": fit.get("weak")}
    except DagprofError as e:
        return {"refused": str(e)}


JUDGED = ("model_pct", "replay_pct", "averaged_pct", "model_ms", "measured_ms", "reference_ms", "refused")  # --judge's line


def judge_kept(runs: list[str], say) -> dict[str, dict]:
    """``judge`` on run folders kept before (``--keep``'s NAME-i, or any profiled run), no job: a change to the model
    judged on runs it was not developed on; one line a run of the figures in ``JUDGED`` to ``say`` as it goes."""
    out = {}
    for run in runs:
        out[run] = judge(run)
        print(f"{run}: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out[run].items() if k in JUDGED})}",
              file=say, flush=True)
    return out


def run_job(name: str, python: str, out: str, where: str | Cluster, rate: float, args, bucket_rate: float | None = None,
            hog: int | None = None) -> dict:
    """One job on the loopback of namespace ``where`` shaped at ``rate`` (a ``Cluster``: on its namespaces as hosts, each
    worker's port shaped), the rate read back before and after it: a job whose link was not ``rate`` throughout is refused,
    never filed under ``rate``. Also the bytes the shaped devices carried. ``out`` starts empty: a job run again never reads
    the files of the one before. ``hog``: a busy loop pinned to that core for the whole job (counted in ``others_cpu_pct``)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    (shape_loopback if isinstance(where, str) else shape_hosts)(where, rate, bucket_rate)
    load, (_, sent0, lo0), cpu0 = os.getloadavg()[0], _link(where), _cpu_now()
    busy = None if hog is None else subprocess.Popen(["taskset", "-c", str(hog), sys.executable, "-c", HOG])
    try:
        if isinstance(where, str):
            codes = launch(name, python, out, args.workers, args.timeout, prefix=("ip", "netns", "exec", where), script_args=tuple(args.script_args.split()))
        else:
            codes = launch(name, python, out, args.workers, args.timeout, hosts=where, script_args=tuple(args.script_args.split()),
                           own_cores=not args.shared_cores)
        others = _others_cpu_pct(cpu0, _cpu_now())
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    after, sent1, lo1 = _link(where)
    with open(os.path.join(out, WIRE_FILE), "w") as f:
        json.dump({"tbf_bytes": sent1 - sent0, "loopback_bytes": lo1 - lo0}, f)
    got = {"load": load, "exit": codes, "wire_mb": (sent1 - sent0) / 1e6, "others_cpu_pct": others}
    if any(abs(a - rate) > 1e-3 * rate for a in after):
        return got | {"refused": f"the link was shaped at {', '.join(f'{a / 1e6:g}' for a in after)} Mbit/s after the job, not {rate / 1e6:g}"}
    if any(codes):  # a job that failed leaves no step to predict from or to measure: say so, not what its reader makes of its files
        return got | {"refused": f"{name}: the job exited with status {', '.join(map(str, codes))} (its logs: {out}/log*.txt, launcher.txt)"}
    return got


def _cpu_now() -> tuple[float, float, float]:
    """(now, the machine's busy CPU seconds in user and system time, this process's and its reaped children's), for
    ``_others_cpu_pct``."""
    with open("/proc/stat") as f:
        user, nice, system = (int(v) for v in f.readline().split()[1:4])
    t = os.times()
    return time.monotonic(), (user + nice + system) / os.sysconf("SC_CLK_TCK"), t.user + t.system + t.children_user + t.children_system


def _others_cpu_pct(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """CPU that processes outside this bench and its job used while the job ran, % of one core: the machine's busy time
    less ours (the job's processes are reaped children, their time counted as they exit). The load average says how
    many waited; this, how much of the cores others took: a rank confined to one core (``--hosts``) runs at half speed
    beside one busy process on it (2026-12-06: a 1 Gbit/s hvd_text job's median step 85 and 99 ms beside another
    session's pytest, 50-52 ms without). Softirq time (the emulated wires' packets) is not counted."""
    wall, busy, ours = (b - a for a, b in zip(before, after))
    return round(100.0 * max(0.0, busy - ours) / wall, 1) if wall > 0 else 0.0


def _link(where: str | Cluster) -> tuple[list[float], int, int]:
    """(the shaped devices' rates, bit/s; the bytes they sent; the bytes the namespaces' counters saw) of a loopback
    namespace, or of a ``Cluster``'s workers as hosts (their ports, and every interface's counter)."""
    if isinstance(where, str):
        rate, sent = qdisc(where)
        return [rate], sent, loopback_tx(where)
    rates, sent = hosts_qdisc(where)
    return rates, sent, hosts_tx(where)


def testbed(names: list[str], args) -> dict:
    """Bandwidth what-if on the namespace testbed: per script a settle job at the faster rate of its pair (``_settle``), then
    per round a profiled job at that rate and one at the slower (their order alternating by round), the second predicted from the first's profile,
    and two reference jobs at the faster rate just before and after the slower one (``tb-NAME-K-RATEM-before``, ``-after``: the profiled
    configuration's level around the measurement, for ``change_error_pct``, ``_round``). The pair is the
    script's in ``PAIRS`` (``--rate fixed``, the default), a given one, or, with ``--rate auto``, a pilot job's
    (``pick_pair``); it is written to ``tb-NAME-pair.json`` for ``--repredict``.
    Judged on the median step (the slowest rank's, replayed as measured), each round against its own measured job.
    ``--hosts`` (Horovod): each worker in a namespace of its own, its port shaped (``launch``, ``shaped_loopback.shape_hosts``),
    each host's processes on a core of their own (``host_cores``; ``--shared-cores``: free on all)."""
    from dagprof.collect.jobs.netns import available

    why = available()
    if why:
        print(f"bench_frameworks --testbed: skipped: {why}", file=sys.stderr)
        return {}
    results = {}
    with (hosts_namespaces("fwh", args.keep, args.workers) if args.hosts else namespace("fwtb", args.keep)) as (ns, keep):
        for name in names:
            python = python_for(name)
            if not python:
                continue
            if args.rate == "fixed":
                fast, slow = PAIRS.get(name, DEFAULT_PAIR)
                said = "fixed (PAIRS)"
            elif args.rate == "auto":
                pilot = os.path.join(keep, f"tb-{name}-pilot")
                got = run_job(name, python, pilot, ns, PILOT_RATE, args)
                try:
                    if "refused" in got:
                        raise DagprofError(got["refused"])
                    fast, slow, said = pick_pair(pilot, args.workers)
                except DagprofError as e:
                    print(f"{name}: the pilot job gave no pair ({e}); skipped", file=sys.stderr, flush=True)
                    continue
            else:
                fast, slow, said = float(args.rate), args.other_rate, "given"
            pair = {"rate_bit": fast, "other_rate_bit": slow, "why": said, "hosts": args.hosts, "own_cores": args.hosts and not args.shared_cores}
            with open(os.path.join(keep, f"tb-{name}-pair.json"), "w") as f:
                json.dump(pair, f)
            print(f"{name}: profiled at {fast / 1e6:g} Mbit/s, predicted at {slow / 1e6:g} ({said})", file=sys.stderr, flush=True)
            settle = _settle(name, python, os.path.join(keep, f"tb-{name}-settle"), ns, fast, min(fast, slow), args)
            rounds = []
            for k in range(args.rounds):
                got: dict[str, dict] = {}
                hogged = (HOGGED,) * args.hog
                for side in (("profiled", *hogged, "before", "other", "after") if k % 2 == 0 else ("before", "other", "after", *hogged, "profiled")):
                    rate = slow if side == "other" else fast
                    out = os.path.join(keep, f"tb-{name}-{k}-{int(rate / 1e6)}M{f'-{side}' if side in (*REFERENCES, HOGGED) else ''}")
                    hog = host_cores(args.workers)[1] if side == HOGGED else None
                    got[side] = run_job(name, python, out, ns, rate, args, min(fast, slow), hog)
                    if "refused" in got[side]:  # the link changed under the job: once more, from a freshly shaped link
                        print(f"{name} round {k + 1}, {side} {rate / 1e6:g} Mbit/s: {got[side]['refused']}; again", file=sys.stderr, flush=True)
                        got[side] = run_job(name, python, out, ns, rate, args, min(fast, slow), hog)
                    if "refused" not in got[side]:
                        try:
                            got[side] |= predict_rate(out, rate, slow, args.hosts) if side in ("profiled", HOGGED) else measured(out)
                        except DagprofError as e:
                            got[side]["refused"] = str(e)
                    print(f"{name} round {k + 1}, {side} {rate / 1e6:g} Mbit/s: {got[side]}", file=sys.stderr, flush=True)
                rounds.append(_round(k, got["profiled"], got["other"], (got["before"], got["after"])) | _hogged_row(got, k))
            results[name] = {"pair": pair, "settle": settle, "rounds": rounds, "summary": _summary(rounds, pair, settle)}
    return results


def _settle(name: str, python: str, out: str, ns: str | Cluster, rate: float, bucket_rate: float, args) -> dict:
    """A script's first job on the testbed, at the profiled rate and judged nowhere, so that no round's job is the first
    of its script: in the quiet rounds of 2026-12-03 (``--rounds 2`` twice, six scripts in a row) a round's profiled job
    run first, the script's first job right after another script's, ran +10 to +35 % above the level of its references
    (Horovod, 4 of 4), where run last -4 to +16 %. Its median step is kept (``settle_drift_pct``, ``_summary``), so every
    run shows whether a script's first job still stands apart."""
    got = run_job(name, python, out, ns, rate, args, bucket_rate)
    if "refused" not in got:
        try:
            got |= measured(out)
        except DagprofError as e:
            got["refused"] = str(e)
    print(f"{name} settle {rate / 1e6:g} Mbit/s: {got}", file=sys.stderr, flush=True)
    return got


def repredict(kept: str, names: list[str], args) -> dict:
    """``testbed``'s rounds kept by ``--keep`` (``tb-NAME-K-RATEM`` folders) predicted again with this dagprof: no job
    runs, no root; each round's own measurement at the slower rate is the reference. The pair is the kept
    ``tb-NAME-pair.json``'s (its testbed too: as hosts or not), else ``--rate``, ``--other-rate`` and ``--hosts``."""
    results = {}
    for name in names:
        try:
            with open(os.path.join(kept, f"tb-{name}-pair.json")) as f:
                pair = json.load(f)
        except OSError:
            if args.rate in ("auto", "fixed"):
                continue
            pair = {"rate_bit": float(args.rate), "other_rate_bit": args.other_rate, "why": "given", "hosts": args.hosts}
        fast, slow = pair["rate_bit"], pair["other_rate_bit"]
        rounds = []
        for k in range(args.rounds):
            folder = {"profiled": os.path.join(kept, f"tb-{name}-{k}-{int(fast / 1e6)}M"), "other": os.path.join(kept, f"tb-{name}-{k}-{int(slow / 1e6)}M")}
            folder |= {side: os.path.join(kept, f"tb-{name}-{k}-{int(fast / 1e6)}M-{side}") for side in (*REFERENCES, HOGGED)}
            if not all(os.path.isdir(folder[side]) for side in ("profiled", "other")):
                continue
            got = {}
            for side, out in folder.items():
                if not os.path.isdir(out):  # kept before the bench ran reference jobs
                    continue
                try:
                    got[side] = {"load": float("nan")} | (predict_rate(out, fast, slow, pair.get("hosts", False)) if side in ("profiled", HOGGED)
                                                          else measured(out))
                except DagprofError as e:
                    got[side] = {"load": float("nan"), "refused": str(e)}
            refs = tuple(got[side] for side in REFERENCES if side in got)
            rounds.append(_round(k, got["profiled"], got["other"], refs if len(refs) == 2 else None) | _hogged_row(got, k))
            print(f"{name} round {k + 1}: {rounds[-1].get('error_pct', rounds[-1]['profiled'].get('refused'))}", file=sys.stderr, flush=True)
        if rounds:
            results[name] = {"pair": pair, "rounds": rounds, "summary": _summary(rounds, pair)}
    return results


def _round(k: int, a: dict, b: dict, refs: tuple[dict, dict] | None = None) -> dict:
    """One round's row: the profiled job ``a`` (with its prediction) against the job measured at the other rate ``b``.
    ``error_pct`` is the median step's (the headline); the mean's and the collectives' alone beside it; ``in_interval``: the
    median of ``b``'s unprofiled steps inside the prediction's interval (what the interval is for, as ``bench_coverage``
    judges it; absent where ``b`` timed too few, ``shaped_loopback.measured``). With ``refs``, the profiled configuration run again just before
    and after ``b`` (as ``b`` is run: the script with its window profiled), their mean median step is the profiled rate's
    level around the measurement, and ``change_error_pct`` the what-if's own error: its change (the prediction less its
    model of ``a``) less the measured one (``b`` less that level), over ``b``. ``error_pct`` is that plus the model's error
    on ``a`` plus ``a``'s departure from the level (``level_drift_pct``, of the level), each over ``b``: neither of the last
    two is the what-if's. ``level_moved_pct``: after against before, how far the level itself moved across ``b``. (A ratio
    of the changes would scale the milliseconds the wire adds by the model's error on ``a``.)"""
    row = {"round": k, "profiled": a, "other": b} | ({"refs": list(refs)} if refs else {})
    if "predicted_ms" in a and "measured_ms" in b:
        row["error_pct"] = 100.0 * (a["predicted_median_ms"] - b["measured_median_ms"]) / b["measured_median_ms"]
        if refs and all("measured_median_ms" in x for x in refs):
            before, after = (x["measured_median_ms"] for x in refs)
            level = 0.5 * (before + after)
            change = (a["predicted_median_ms"] - a["model_median_ms"]) - (b["measured_median_ms"] - level)
            row["change_error_pct"] = 100.0 * change / b["measured_median_ms"]
            row["level_drift_pct"] = 100.0 * (a["measured_median_ms"] - level) / level
            row["level_moved_pct"] = 100.0 * (after - before) / before
        row["mean_error_pct"] = 100.0 * (a["predicted_ms"] - b["measured_ms"]) / b["measured_ms"]
        row["comm_error_pct"] = 100.0 * (a["predicted_comm_ms"] - b["comm_ms"]) / b["comm_ms"]
        # the measured collectives between the what-if's (the least) and the most: a slower wire's with the profile's excess over
        # the wire kept after it, a faster one's the profiled time (Horovod's bounds, ``search.wire_notes``)
        row["comm_in_bounds"] = a["predicted_comm_ms"] <= b["comm_ms"] <= a["most_comm_ms"]
        if b.get("unprofiled_median_ms") is not None:
            row["in_interval"] = a["interval_ms"][0] <= b["unprofiled_median_ms"] <= a["interval_ms"][1]
    return row


def _hogged_row(got: dict[str, dict], k: int) -> dict:
    """A round's hogged profile (``--hog``) as ``_round`` holds the quiet one, against the same measured job: ``hogged`` is
    that row's profiled side, ``hogged_error_pct`` its error; empty without one."""
    if HOGGED not in got:
        return {}
    row = _round(k, got[HOGGED], got["other"])
    return {HOGGED: got[HOGGED]} | ({"hogged_error_pct": row["error_pct"]} if "error_pct" in row else {})


def _stats(vals: list[float], within: float | None = None) -> dict:
    """Median and [min, max] of a list of %, and how many are within ``within`` (absolute)."""
    if not vals:
        return {"median": None, "spread": None}
    out = {"median": float(np.median(vals)), "spread": [float(min(vals)), float(max(vals))]}
    return out | ({f"within_{within:g}": sum(abs(v) <= within for v in vals)} if within is not None else {})


def _summary(rounds: list[dict], pair: dict, settle: dict | None = None) -> dict:
    """The rounds' errors: the median step's (the verdict, per round and pooled), the model's reproduction of each profiled
    job, the mean step's and the collectives' alone; the measured median steps and the collectives' share of them per rate, the load.
    With the ``settle`` job (the script's first, ``_settle``): its median step against the first round's reference level."""
    col = lambda key, side="profiled": [r[side][key] for r in rounds if key in r[side]]  # noqa: E731
    loads = [x["load"] for r in rounds for x in (r["profiled"], r["other"], *r.get("refs", ())) if "load" in x]
    share = {side: [100.0 * x["comm_ms"] / x["measured_median_ms"] for r in rounds if "comm_ms" in (x := r[side])]
             for side in ("profiled", "other")}
    fast, slow = (f"{pair[k] / 1e6:g}Mbit" for k in ("rate_bit", "other_rate_bit"))
    pred, meas = col("predicted_median_ms"), col("measured_median_ms", "other")
    return {"rate_bit": pair["rate_bit"], "other_rate_bit": pair["other_rate_bit"], "pair": pair["why"], "rounds": len(rounds),
            "judged": sum("error_pct" in r for r in rounds),
            "error_pct": _stats([r["error_pct"] for r in rounds if "error_pct" in r], 8),
            # the what-if's change against the measured change from the profiled rate's level around the measurement (rounds
            # with a reference job, ``_round``): its own error apart from the model's on the profiled job and from job-to-job drift
            "change_error_pct": _stats([r["change_error_pct"] for r in rounds if "change_error_pct" in r], 8),
            "level_drift_pct": _stats([r["level_drift_pct"] for r in rounds if "level_drift_pct" in r]),
            "level_moved_pct": _stats([r["level_moved_pct"] for r in rounds if "level_moved_pct" in r]),
            # rounds whose what-if said its point is not told apart from the profiled run's (a JAX job's per-array stall on
            # gloo moves a step further than the row changes it: ``analysis.operand_stall.stall_outweighs``), the others' error
            "stall_outweighs": sum(bool(r["profiled"].get("stall_outweighs")) and "error_pct" in r for r in rounds),
            "told_error_pct": _stats([r["error_pct"] for r in rounds if "error_pct" in r and not r["profiled"].get("stall_outweighs")], 8),
            # the measured job's unprofiled median step inside the what-if's 90 % interval, of the rounds that timed enough of them
            "in_interval": sum(r.get("in_interval", False) for r in rounds), "interval_judged": sum("in_interval" in r for r in rounds),
            # the median prediction against the median measurement, over the rounds: one job's drift moves neither much
            "pooled_error_pct": 100.0 * (np.median(pred) - np.median(meas)) / np.median(meas) if pred and meas else None,
            "model_pct": _stats(col("model_median_pct"), 2),
            "mean_step_error_pct": _stats([r["mean_error_pct"] for r in rounds if "mean_error_pct" in r], 8),
            "collectives_error_pct": _stats([r["comm_error_pct"] for r in rounds if "comm_error_pct" in r]),
            "collectives_in_bounds": sum(r.get("comm_in_bounds", False) for r in rounds),
            "measured_median_ms": {fast: _stats(col("measured_median_ms")), slow: _stats(col("measured_median_ms", "other"))},
            "predicted_median_ms": _stats(col("predicted_median_ms")),
            "fit_of_wire_pct": _stats(col("fit_of_wire_pct")),
            "comm_share_pct": {fast: _stats(share["profiled"]), slow: _stats(share["other"])},
            "refused": [x["refused"] for r in rounds for x in (r["profiled"], r["other"], *r.get("refs", ())) if "refused" in x],
            "load_median": float(np.median(loads)), "load_max": float(max(loads)),
            # CPU others took beside each job (``_others_cpu_pct``), % of a core: a round's jobs at different levels beside others' work
            "others_cpu_pct": _stats([x["others_cpu_pct"] for r in rounds for x in (r["profiled"], r["other"], *r.get("refs", ()))
                                      if "others_cpu_pct" in x]),
            # each job's ranks' waits for a core beyond their own threads' CPU (``shaped_loopback.measured``), % of its median step: with
            # a core a rank (``--hosts``), other processes' share of it; a round whose profiled or measured job ran off its level shows it
            "foreign_pct": {side: [x.get("foreign_pct") for r in rounds if (x := r[side]) and "refused" not in x] for side in ("profiled", "other")},
            # the rounds whose profiled and measured jobs both waited under ``NOTE_SHARE`` so (quiet cores), their error
            "hogged_error_pct": _stats([r["hogged_error_pct"] for r in rounds if "hogged_error_pct" in r], 8),
            # the hogged profiles' error where the measured job ran on quiet cores: a measured job that others loaded stands off the
            # job's level by a load its profile did not hold (2026-12-07, hvdlvl62: a quiet hvd_tcn_groups profile -56 % against a
            # job others held 39 % of a step), which no removal or interval of the profile can tell
            "hogged_quiet_error_pct": _stats([r["hogged_error_pct"] for r in rounds if "hogged_error_pct" in r and _quiet(r, ("other",))], 8),
            "hogged_foreign_pct": [r[HOGGED].get("foreign_pct") for r in rounds if HOGGED in r and "refused" not in r[HOGGED]],
            "quiet_error_pct": _stats([r["error_pct"] for r in rounds if "error_pct" in r and _quiet(r)], 8),
            "settle_drift_pct": _settle_drift(settle, rounds[0] if rounds else {})}


def _quiet(row: dict, sides: tuple[str, ...] = ("profiled", "other")) -> bool:
    """The round's jobs ``sides`` (both, unless told) ran on quiet cores: each one's ``foreign_pct`` recorded and under
    ``NOTE_SHARE`` of its step."""
    return all((x := row[side].get("foreign_pct")) is not None and x < 100 * NOTE_SHARE for side in sides)


def _settle_drift(settle: dict | None, first: dict) -> float | None:
    """The settle job's median step against the first round's level (its reference jobs' mean median step), %; None
    without either."""
    refs = [x["measured_median_ms"] for x in first.get("refs", ()) if "measured_median_ms" in x]
    if not settle or "measured_median_ms" not in settle or len(refs) != 2:
        return None
    level = 0.5 * sum(refs)
    return 100.0 * (settle["measured_median_ms"] - level) / level


def python_for(name: str) -> str | None:
    """The framework's Python for a script (a Horovod venv's bin/python), or None (said on stderr)."""
    python = os.environ.get(SCRIPTS[name][1])
    if python and SCRIPTS[name][0] == "horovod":
        python = os.path.join(python, "bin", "python")
    if not python:
        print(f"{name}: skipped, set {SCRIPTS[name][1]} to a Python with {SCRIPTS[name][0]}", file=sys.stderr)
    return python or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default=",".join(SCRIPTS))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", help="keep the run folders here")
    ap.add_argument("--baseline-src", help="another checkout's src/ (e.g. before a collector fix): its collector profiles every "
                                           "other run, in interleaved rounds, and crashes are counted per collector")
    ap.add_argument("--testbed", action="store_true", help="(root) the bandwidth what-if on the namespace testbed instead: profile at "
                    "a rate, predict and measure another, in --rounds interleaved rounds per script (TF, JAX, Horovod); the profiled "
                    "rate run again just before and after each measurement tells the what-if's own error (change_error_pct) from drift")
    ap.add_argument("--rate", default="fixed", help="--testbed: the profiled link rate, bit/s; fixed (the default): each script's "
                    f"pair in PAIRS, else {DEFAULT_PAIR[0] / 1e6:g} -> {DEFAULT_PAIR[1] / 1e6:g} Mbit/s; auto: a pilot job at "
                    f"{PILOT_RATE / 1e6:g} Mbit/s picks a pair where the collectives are a sizeable share of the step (to size a new script's pair)")
    ap.add_argument("--other-rate", type=float, default=200e6, help="--testbed: the rate predicted and measured, bit/s (with a given --rate)")
    ap.add_argument("--rounds", type=int, default=3, help="--testbed: rounds (each a job at either rate)")
    ap.add_argument("--hosts", action="store_true", help="--testbed, Horovod: each worker on a host of its own (a namespace, its "
                    "port shaped at the rate, a veth through a bridge), started as on hosts: horovodrun -H ADDR0:1,ADDR1:1 "
                    "with an ssh that enters the namespace owning the address (bench/testbed/ssh_shim); each host's processes "
                    "confined to a core of their own (taskset), as hosts each have theirs")
    ap.add_argument("--shared-cores", action="store_true", help="--hosts: every host's processes free to run on all of this "
                    "machine's cores (before 2026-12-06: the jobs' level moved between jobs, see host_cores)")
    ap.add_argument("--hog", action="store_true", help="--testbed --hosts: each round also profiles the configuration beside a busy loop "
                    "pinned to host 1's core for the whole job (tb-NAME-K-RATEM-hogged), predicted as the quiet profile and judged "
                    "against the same measured job (hogged_error_pct): a profile taken beside others' work")
    ap.add_argument("--repredict", metavar="KEPT", help="--testbed: run nothing; predict the rounds a --keep folder holds again "
                    "with this dagprof, against their measurements (give its --rounds; the pair: its tb-NAME-pair.json, else --rate, --other-rate)")
    ap.add_argument("--judge", nargs="+", metavar="RUN", help="run nothing: judge kept run folders again with this dagprof "
                    "(the model's error on each profiled run, the replay's and the averaged replay's; --json: all of judge's fields)")
    ap.add_argument("--script-args", default="", help="more arguments for each TF/JAX script (one string: \"--steps-per-execution 1\")")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.hosts and args.rate == "auto":
        ap.error("--hosts takes a fixed or given pair: the pilot's rule (shaped_loopback.pick_pair) sizes the one shared loopback")
    if args.judge:
        results = judge_kept(args.judge, sys.stderr if args.json else sys.stdout)
        if args.json:
            print(json.dumps(results, indent=1))
        return 0
    if args.testbed:
        names = [n for n in args.only.split(",") if SCRIPTS[n][0] != "mxnet" and (SCRIPTS[n][0] == "horovod" or not args.hosts)]  # MXNet: bench_mxnet_ps.py
        results = repredict(args.repredict, names, args) if args.repredict else testbed(names, args)
        print(json.dumps(results, indent=1) if args.json else "\n".join(f"{n}: {json.dumps(r['summary'])}" for n, r in results.items()))
        return 0
    results = {}
    for name in args.only.split(","):
        python = python_for(name)
        if not python:
            continue
        rows = []
        collectors = [SRC, args.baseline_src] if args.baseline_src else [SRC]
        for i in range(args.runs * len(collectors)):
            src = collectors[(i + i // len(collectors)) % len(collectors)]  # A B, B A, ...
            out = os.path.join(args.keep, f"{name}-{i}") if args.keep else tempfile.mkdtemp(prefix=f"dagprof-{name}-")
            os.makedirs(out, exist_ok=True)
            t0 = time.monotonic()
            codes = launch(name, python, out, args.workers, args.timeout, src, script_args=tuple(args.script_args.split()))
            row = {"run": i, "collector": "baseline" if src != SRC else "this", "exit": codes, "seconds": round(time.monotonic() - t0, 1)}
            died = [c for c in codes if c not in (0, -signal.SIGKILL)] or [c for c in codes if c != 0]  # not the ones stopped after it
            row |= {"crash": died[0]} if died else judge(out)
            row["profiled_again"] = profiled_again(out)
            row["children_died"] = collecting_children_died(out)
            rows.append(row)
            print(f"{name} run {i}: {row}", file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
        mine = [r for r in rows if r["collector"] == "this"]
        ok = [r for r in mine if "model_pct" in r]
        summary = {"runs": len(mine), "crashes": sum("crash" in r for r in mine), "refused": sum("refused" in r for r in mine),
                   "profiled_again": sum(r["profiled_again"] > 0 for r in mine),  # runs whose window was lost on a rank and profiled again
                   "children_died": sum(r["children_died"] for r in mine),  # TF: collecting children that died (each retried)
                   "cost_corrected": sum(bool(r.get("cost_corrected")) for r in ok)}  # runs whose profiler cost stood out and was removed
        if args.baseline_src:
            base = [r for r in rows if r["collector"] == "baseline"]
            summary["baseline"] = {"runs": len(base), "crashes": sum("crash" in r for r in base)}
        for key in ("model_pct", "averaged_pct"):
            vals = np.abs([r[key] for r in ok]) if ok else np.zeros(0)
            summary[key] = None if not len(vals) else {"median_abs": float(np.median(vals)), "max_abs": float(vals.max()),
                                                       "within_2": int((vals <= 2).sum()), "within_3": int((vals <= 3).sum())}
        results[name] = {"summary": summary, "rows": rows}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, r in results.items():
            print(f"{name}: {json.dumps(r['summary'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
