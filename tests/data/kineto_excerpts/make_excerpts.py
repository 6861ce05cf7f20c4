"""How the excerpts in this folder were cut from public traces (a maintainer's tool, not a test).

Each excerpt keeps a time window of one real trace: every metadata event, every complete event that
lies wholly inside the window, the GPU ops (and ``cuda_sync`` records) of the runtime calls kept, and
the trace's header. Events are copied unchanged; ``python_function`` events (the reader skips them)
are left out. Tiny traces are copied whole.

    python tests/data/kineto_excerpts/make_excerpts.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}

TB_RESNET = "kineto-corpus/kineto/tb_plugin_samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
# (excerpt, source under --data, window in ms from the trace's first event, or None for the whole file)
EXCERPTS = [
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


def cut(doc, window: tuple[float, float]):
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("pid"), int) and isinstance(e.get("ts"), (int, float))]
    base = min(e["ts"] for e in xs)
    a, b = base + window[0] * 1e3, base + window[1] * 1e3
    inside = [e for e in xs if e.get("cat") not in GPU_CATS | {"cuda_sync", "python_function"} and a <= e["ts"] and e["ts"] + e.get("dur", 0) <= b]
    corr = {e.get("args", {}).get("correlation") for e in inside} - {None}
    linked = [e for e in xs if e.get("cat") in GPU_CATS | {"cuda_sync"} and e.get("args", {}).get("correlation") in corr]
    keep = {id(e) for e in inside + linked}
    kept = [e for e in events if e.get("ph") == "M" or id(e) in keep]
    if isinstance(doc, dict):
        return {**doc, "traceEvents": kept}
    return kept


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the folder holding kineto-public/ and kineto-corpus/")
    args = p.parse_args()
    for name, src, window in EXCERPTS:
        path, out = os.path.join(args.data, src), os.path.join(HERE, name)
        if window is None:
            shutil.copyfile(path, out)
        else:
            doc = cut(json.loads(gzip.open(path).read()), window)
            with gzip.GzipFile(out, "wb", mtime=0) as f:
                f.write(json.dumps(doc, separators=(",", ":")).encode())
        print(f"{name}: {os.path.getsize(out) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
