"""Re-create tests/data from the reference data set (``--data``, by default ../shared/data beside the repository).

Small files are copied as they are; large Kineto traces are cut to a window of whole profiler
steps (every CPU event that starts in it, the GPU work and flows those launched, all metadata),
so each excerpt is still a valid trace of the same job; nccl-tests tables keep every 16th row.
``kineto_excerpts/`` (one dependency rule of the Kineto reader each) holds time windows cut by
``window_excerpt``. What each file is and where it comes from: README.md here. Run from the repository root:

    python tests/data/make_excerpts.py [--data DIR]
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent.parent.parent / "shared" / "data"

COPY = [
    "kineto-public/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "kineto-public/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "kineto-public/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "kineto-public/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "kineto-public/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "kineto-public/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "kineto-public/distributed_info_unavailable/distributed_info_not_found.json.gz",
    "kineto-public/execution_trace/benchmark_simple_add_et.json.gz",
    "kineto-public/execution_trace/benchmark_simple_add_trace.json.gz",
    "kineto-public/rank_non_gpu/rank_non_gpu.json.gz",
    "kineto-public/rank_unavailable/rank_not_found.json.gz",
    "kineto-public/trace_filter/sampled_rank-0.json.gz",
    "kineto-public/trace_filter/sampled_rank-1.json.gz",
    "kineto-public/triton_example/triton_example.json.gz",
    *[f"kineto-corpus/param/dlrm_kineto/worker{r}_step_12.{ts}.pt.trace.json.gz" for r, ts in enumerate(
        ["1694128201545", "1694128201556", "1694128201554", "1694128201557", "1694128201547", "1694128201549",
         "1694128201553", "1694128201553"])],
    "kineto-corpus/kineto/docs_traces/before_fix_trace.json",
    "kineto-corpus/tracelens/mi300/gaunernst_bert-small-uncased__1016001.json.gz",
    "kineto-corpus/tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "kineto-corpus/tracelens/inference/graph_full/graph_execution.json.gz",
    *[f"bcaffe-k80-googlenet/{n}" for n in ("allreduce2.log", "allreduce4.log", "allreduce8.log", "tmp2comm.log",
                                           "tmp4comm.log", "tmp4ocomm.log", "tmp8comm.log", "tmp8ocomm.log", "tmpcomm.log")],
]
# (file, first step kept, number of steps)
STEPS = [
    ("kineto-public/nccl_parser_config/nccl_data.json.gz", 5, 1),
    ("kineto-public/df_index_resolver/df_index_resolver.json.gz", None, 1),  # None: the middle step
    ("kineto-public/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", None, 1),
    ("kineto-corpus/kineto/tb_plugin_samples/resnet50_num_workers_0/worker0.pt.trace.json.gz", None, 1),
    ("kineto-corpus/kineto/tb_plugin_samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz", None, 1),
]
# kineto_excerpts/ cut by whole steps: (excerpt, source, first step kept, number of steps)
STEP_WINDOWS = [
    ("hta_nccl_poller_two_steps.json.gz", "kineto-public/nccl_parser_config/nccl_data.json.gz", 4, 2),  # a cudaEventQuery polling thread
]
TB_RESNET = "kineto-corpus/kineto/tb_plugin_samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
# kineto_excerpts/: (excerpt, source, window in ms from the trace's first event, or None for the whole file)
WINDOWS = [
    ("hta_cuda_event_sync.json.gz", "kineto-public/critical_path/cuda_event_sync/event_sync_trace.json.gz", None),
    ("hta_cuda_event_sync_multi_stream.json.gz", "kineto-public/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz", None),
    ("hta_mi250_minitoy_train.json.gz", "kineto-public/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", None),
    ("hta_param_simple_add.json.gz", "kineto-public/execution_trace/benchmark_simple_add_trace.json.gz", None),
    ("hta_nccl_ddp_end_of_backward.json.gz", "kineto-public/nccl_parser_config/nccl_data.json.gz", (185.0, 213.5)),
    ("hta_ns_resolution_step101.json.gz", "kineto-public/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", (0.0, 35.2)),
    ("kineto_tb_resnet50_h2d_copy.json.gz", TB_RESNET, (69.0, 72.0)),
    ("kineto_tb_resnet50_forward_to_backward.json.gz", TB_RESNET, (118.0, 121.5)),
    ("hta_alexnet_h2d_pageable.json.gz", "kineto-public/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz", (30429.0, 30442.0)),
    ("kineto_tb_resnet50_array_format.json.gz", "kineto-corpus/kineto/tb_plugin_samples/resnet50_num_workers_0/worker0.pt.trace.json.gz", (68.5, 70.5)),
    ("tracelens_graph_execution.json.gz", "kineto-corpus/tracelens/inference/graph_full/graph_execution.json.gz", (0.0, 1e9)),
]
WINDOW_LICENSES = ["facebookresearch+HolisticTraceAnalysis.LICENSE", "pytorch+kineto.LICENSE", "AMD-AGI+TraceLens.LICENSE"]
LUT_EVERY = 16
LICENSES = ["facebookresearch+HolisticTraceAnalysis.LICENSE", "pytorch+kineto.LICENSE", "facebookresearch+param.LICENSE",
            "AMD-AGI+TraceLens.LICENSE", "shyhuai+B-Caffe.LICENSE", "VIA-Research+vTrain.LICENSE"]
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def _load(path: Path):
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        return json.load(f)


def _save(doc, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, separators=(",", ":")).encode()
    if path.suffix == ".gz":
        with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as z:
            z.write(text)
    else:
        path.write_bytes(text)


def step_excerpt(doc, first: int | None, count: int):
    """The events of ``count`` whole profiler steps from ProfilerStep#``first`` (the middle one when None)."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    steps = sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    k = len(steps) // 2 if first is None else [e["name"] for e in steps].index(f"ProfilerStep#{first}")
    w0, w1 = steps[k]["ts"], steps[k + count - 1]["ts"] + steps[k + count - 1]["dur"]
    inside = (lambda e: w0 <= float(e.get("ts", w0 - 1)) <= w1)
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") not in GPU_CATS and inside(e)]
    corr = {(e.get("args") or {}).get("correlation") for e in cpu} - {None}
    keep = []
    for e in events:
        ph, cat, args = e.get("ph"), e.get("cat"), e.get("args") or {}
        if ph == "M" or cat == "Trace":
            keep.append(e)
        elif ph == "X" and cat in GPU_CATS:
            if args.get("correlation") in corr or ("correlation" not in args and inside(e)):
                keep.append(e)
        elif ph in ("s", "f", "t") and cat in ("ac2g", "async"):
            if e.get("id") in corr:
                keep.append(e)
        elif inside(e):
            keep.append(e)
    return {**doc, "traceEvents": keep} if isinstance(doc, dict) else keep


def window_excerpt(doc, window: tuple[float, float]):
    """Every metadata event, every complete event wholly inside ``window`` (ms from the first event), the GPU ops and
    ``cuda_sync`` records of the runtime calls kept; ``python_function`` events (the reader skips them) left out."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("pid"), int) and isinstance(e.get("ts"), (int, float))]
    base = min(e["ts"] for e in xs)
    a, b = base + window[0] * 1e3, base + window[1] * 1e3
    inside = [e for e in xs if e.get("cat") not in GPU_CATS | {"cuda_sync", "python_function"} and a <= e["ts"] and e["ts"] + e.get("dur", 0) <= b]
    corr = {e.get("args", {}).get("correlation") for e in inside} - {None}
    linked = [e for e in xs if e.get("cat") in GPU_CATS | {"cuda_sync"} and e.get("args", {}).get("correlation") in corr]
    keep = {id(e) for e in inside + linked}
    kept = [e for e in events if e.get("ph") == "M" or id(e) in keep]
    return {**doc, "traceEvents": kept} if isinstance(doc, dict) else kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT, help=f"reference data folder (default {DEFAULT})")
    src = ap.parse_args().data
    if not src.is_dir():
        raise SystemExit(f"reference data not found: {src} (pass --data DIR)")
    for rel in COPY:
        (HERE / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, HERE / rel)
    for rel, first, count in STEPS:
        _save(step_excerpt(_load(src / rel), first, count), HERE / rel)
    for name, rel, window in WINDOWS:
        out = HERE / "kineto_excerpts" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        if window is None:
            shutil.copyfile(src / rel, out)
        else:
            _save(window_excerpt(_load(src / rel), window), out)
    for name, rel, first, count in STEP_WINDOWS:
        _save(step_excerpt(_load(src / rel), first, count), HERE / "kineto_excerpts" / name)
    for gpu in ("a100", "v100"):
        for table in sorted((src / "nccl-tests-lut" / gpu).iterdir()):
            lines = table.read_text().splitlines(keepends=True)
            out = HERE / "nccl-tests-lut" / gpu / table.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("".join(lines[:1] + lines[1::LUT_EVERY]))
    (HERE / "LICENSES").mkdir(exist_ok=True)
    for name in LICENSES:
        shutil.copyfile(src / "LICENSES" / name, HERE / "LICENSES" / name)
    (HERE / "kineto_excerpts" / "LICENSES").mkdir(parents=True, exist_ok=True)
    for name in WINDOW_LICENSES:
        shutil.copyfile(src / "LICENSES" / name, HERE / "kineto_excerpts" / "LICENSES" / name)
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(f"tests/data: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
