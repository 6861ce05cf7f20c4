"""Minimal hand-written Kineto files for what the public traces do not cover:
NCCL >= 2.19 kernel names with the 2026+ ``Seq`` argument, RCCL, a sub-group, and the kind rules."""
from __future__ import annotations

import json

import numpy as np

from dagprof.align.matching import match_collectives
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.kineto import read_kineto
from dagprof.traces.kineto_dir import read_trace_dir


def _trace(rank: int, seqs: list[int], kernel: str, pg: str = "5", skew_us: float = 0.0) -> dict:
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 10, "tid": 11, "args": {"name": "thread 11 (pt_main_thread)"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 10, "tid": 11, "ts": 0.0 + skew_us, "dur": 1000.0},
    ]
    t = 10.0
    for k, seq in enumerate(seqs):
        corr = 100 + k
        meta = {"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "BFloat16",
                "Group size": 2, "Process Group Name": pg, "Process Group Ranks": "[0, 1]", "Seq": seq}
        ev += [
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 10, "tid": 11, "ts": t + skew_us, "dur": 50.0},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 11, "ts": t + 5 + skew_us, "dur": 40.0, "args": meta},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": t + 10 + skew_us, "dur": 5.0,
             "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 40, "ts": t + 100 + skew_us, "dur": 80.0,
             "args": {"correlation": corr, "stream": 40, "device": 0, **meta}},
        ]
        t += 200.0
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
                                "pg_config": [{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": pg, "ranks": [0, 1]}]},
            "traceEvents": ev}


def test_explicit_seq_group_and_bf16_bytes(tmp_path):
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(_trace(0, [40, 41, 42], "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)")))
    t = read_kineto(p)
    ev = t.events
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    assert ev.seq[comm].tolist() == [40, 41, 42] and t.meta.explicit_seq
    assert t.groups == ["5"] and t.group_ranks["5"] == [0, 1]
    assert np.all(ev.nbytes[comm] == 2000)  # 1000 bf16 elements
    assert t.meta.collectives.kind == [CommKind.ALL_REDUCE] * 3
    enq = np.flatnonzero((ev.kind == Kind.COMM_ENQUEUE) & (ev.group >= 0))
    assert [ev.name_of(i) for i in enq] == ["c10d::allreduce_"] * 3 and ev.seq[enq].tolist() == [40, 41, 42]


def test_explicit_seq_matches_across_a_lost_event(tmp_path):
    kernel = "ncclSymDevKernel_AllReduce_RSxLD_bf16(ncclSymDevArgs)"
    (tmp_path / "rank-0.json").write_text(json.dumps(_trace(0, [40, 41, 42], kernel)))
    (tmp_path / "rank-1.json").write_text(json.dumps(_trace(1, [40, 42], kernel, skew_us=3.0)))  # seq 41 not recorded
    m = match_collectives(read_trace_dir(tmp_path, use_cache=False), strict=False)
    full = sorted(it.seq for it in m.instances if sorted(it.ranks) == [0, 1])
    assert full == [40, 42] and any("#41" in p and "missing on rank(s) [1]" in p for p in m.problems)


def test_rccl_generic_kernel_takes_the_name_of_its_host_call(tmp_path):
    doc = _trace(0, [1], "ncclDevKernel_Generic_4(ncclDevComm*, unsigned long, ncclWork*)")
    for e in doc["traceEvents"]:  # old RCCL: no collective metadata anywhere
        if e.get("args"):
            for k in ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Process Group Name", "Seq"):
                e["args"].pop(k, None)
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    t = read_kineto(p)
    comm = np.flatnonzero(t.events.kind == Kind.COMM)
    assert len(comm) == 1 and t.meta.collectives.kind == [CommKind.ALL_REDUCE] and t.groups == ["0"]
    assert t.events.seq[comm].tolist() == [0] and not t.meta.explicit_seq


def test_kinds_from_wrappers_names_and_step_phase(tmp_path):
    """DataLoader range -> DATA, ops before the first backward -> FORWARD, autograd nodes -> BACKWARD,
    Optimizer.step range -> UPDATE, kernels inherit their launcher's, a stream sync waits on the last kernel."""
    def x(name, ts, dur, cat="cpu_op", tid=11, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 10 if cat != "kernel" else 0, "tid": tid, "ts": ts, "dur": dur, "args": args}
    ev = [
        x("ProfilerStep#3", 0, 1000, "user_annotation"),
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 50, "user_annotation"),
        x("aten::stack", 15, 30),
        x("aten::mm", 100, 50),
        x("cudaLaunchKernel", 110, 5, "cuda_runtime", correlation=1),
        x("fwd_kernel", 120, 40, "kernel", tid=7, correlation=1),
        x("autograd::engine::evaluate_function: MmBackward0", 200, 100),
        x("MmBackward0", 205, 90),
        x("cudaLaunchKernel", 210, 5, "cuda_runtime", correlation=2),
        x("bwd_kernel", 220, 200, "kernel", tid=7, correlation=2),
        x("Optimizer.step#SGD.step", 500, 100, "user_annotation"),
        x("aten::add_", 510, 20),
        x("cudaLaunchKernel", 512, 5, "cuda_runtime", correlation=3),
        x("upd_kernel", 520, 10, "kernel", tid=7, correlation=3),
        x("cudaStreamSynchronize", 700, 50, "cuda_runtime", correlation=4),
    ]
    p = tmp_path / "one.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    t = read_kineto(p)
    e = t.events
    kind = {e.name_of(i): Kind(e.kind[i]) for i in range(len(e)) if e.name_of(i) != "cudaLaunchKernel"}
    assert kind["aten::stack"] == Kind.DATA and kind["aten::mm"] == Kind.FORWARD and kind["fwd_kernel"] == Kind.FORWARD
    assert kind["MmBackward0"] == Kind.BACKWARD and kind["bwd_kernel"] == Kind.BACKWARD
    assert kind["aten::add_"] == Kind.UPDATE and kind["upd_kernel"] == Kind.UPDATE
    assert kind["ProfilerStep#3"] == Kind.STEP and kind["cudaStreamSynchronize"] == Kind.COMM_WAIT
    depth = {e.name_of(i): int(e.depth[i]) for i in range(len(e))}
    assert depth["ProfilerStep#3"] == -1 and depth["Optimizer.step#SGD.step"] == -1 and depth["aten::add_"] == 0
    assert depth["MmBackward0"] == 1 and np.all(e.step[e.kind != Kind.STEP] == 3)
    idx = {e.name_of(i): i for i in range(len(e)) if e.name_of(i) != "cudaLaunchKernel"}
    assert [idx["upd_kernel"], idx["cudaStreamSynchronize"]] in t.flows.tolist()
    assert t.meta.rank_source.startswith("assumed") and t.lanes[e.lane[idx["aten::mm"]]].main
