"""Stock Kineto traces: every public trace reads (or fails in one line), fields the graph builder needs are right."""
from __future__ import annotations

import glob
import gzip
import json
import os

import numpy as np
import pytest
from testdata import DATA as TESTDATA, KINETO_PUBLIC as DATA

from dagprof.errors import DagprofError
from dagprof.traces.events import CommKind, Dep, Kind, LaneKind
from dagprof.traces.kineto import read_kineto
from dagprof.traces.kineto_schema import canonical_collective, comm_role, kernel_dtype

from gloo_kineto import gloo_traces

EXPECTED_ERRORS = {
    "kineto-public/execution_trace/benchmark_simple_add_et.json.gz": "not a Kineto trace",  # a Chakra ET, not Kineto
    "kineto-public/rank_unavailable/rank_not_found.json.gz": "distributedInfo has no rank",
}
VENDORED = sorted(os.path.relpath(p, TESTDATA) for pat in ("kineto-*/**/*.json.gz", "kineto-*/**/*.json")
                  for p in glob.glob(f"{TESTDATA}/{pat}", recursive=True))


def _no_overlap_at_depth0(trace) -> None:
    ev = trace.events
    for lane in range(len(trace.lanes)):
        m = (ev.lane == lane) & (ev.depth == 0)
        s, e = ev.start[m], ev.end[m]
        o = np.argsort(s, kind="stable")
        assert np.all(s[o][1:] >= e[o][:-1] - 1e-6), trace.lanes[lane]


@pytest.mark.parametrize("rel", VENDORED)
def test_every_public_trace_reads_or_fails_in_one_line(rel):
    path = os.path.join(TESTDATA, rel)
    if rel in EXPECTED_ERRORS:
        with pytest.raises(DagprofError) as err:
            read_kineto(path)
        msg = str(err.value)
        assert EXPECTED_ERRORS[rel] in msg and path in msg and "\n" not in msg
        return
    t = read_kineto(path)
    assert len(t.events) > 0 and t.world_size >= 1 and 0 <= t.rank < t.world_size
    assert np.all(t.events.dur >= 0) and np.all(np.isfinite(t.events.start))
    _no_overlap_at_depth0(t)
    if len(t.flows):
        assert t.flows.min() >= 0 and t.flows.max() < len(t.events)


def test_fallbacks_are_documented_in_meta():
    t = read_kineto(f"{DATA}/distributed_info_unavailable/distributed_info_not_found.json.gz")
    assert (t.rank, t.world_size) == (0, 1) and t.meta.rank_source.startswith("assumed")
    assert read_kineto(f"{DATA}/rank_unavailable/rank_not_found.json.gz", rank=3).rank == 3
    cpu = read_kineto(f"{DATA}/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert (cpu.rank, cpu.world_size, cpu.backend) == (34, 300, "gloo") and len(cpu.group_ranks) == 11  # 10 numbered groups + one hashed name


def test_nccl_data_fields_for_replay():
    t = read_kineto(f"{DATA}/nccl_parser_config/nccl_data.json.gz")
    ev = t.events
    streams = [lane for lane in t.lanes if lane.kind == LaneKind.GPU_STREAM]
    assert sorted(lane.name for lane in streams) == ["GPU 0 stream 40", "GPU 0 stream 7"]
    assert sum(lane.main for lane in t.lanes) == 1 and "pt_main_thread" in next(lane.name for lane in t.lanes if lane.main)
    assert t.step_spans()[:, 0].tolist() == [5]  # the excerpt: step 5 of 4-6
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    assert len(comm) == 7 and all(ev.name_of(i).startswith("ncclKernel_") for i in comm)
    assert t.groups == ["0"] and t.group_ranks == {"0": [0, 1]}
    assert sorted(ev.seq[comm].tolist()) == list(range(7))
    assert np.all(ev.nbytes[comm] > 0)  # from the collective metadata (In msg nelems * dtype)
    # every kernel and memcpy is launched by a runtime call: one flow each
    gpu = np.flatnonzero(np.isin(ev.lane, [i for i, lane in enumerate(t.lanes) if lane.kind == LaneKind.GPU_STREAM]))
    launch = t.flows[t.rules() == Dep.LAUNCH]
    assert set(launch[:, 1].tolist()) == set(gpu.tolist()) and np.all(ev.kind[launch[:, 0]] == Kind.RUNTIME)
    # kernels inherit forward / backward / update from the op that launched them
    kern = ev.kind[gpu]
    assert (kern == Kind.FORWARD).sum() > 200 and (kern == Kind.BACKWARD).sum() > 400 and (kern == Kind.UPDATE).sum() > 0
    # the comm stream waits for the compute stream's work issued before each collective
    into_comm = t.flows[np.isin(t.flows[:, 1], comm) & (t.rules() == Dep.COLL_READY)]
    assert len(into_comm) == 7 and not np.isin(into_comm[:, 0], comm).any()  # one per collective of the step
    _no_overlap_at_depth0(t)


def test_df_index_resolver_un_bucketed_allreduces():
    t = read_kineto(f"{DATA}/df_index_resolver/df_index_resolver.json.gz")  # the excerpt: one of its 5 steps
    ev = t.events
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    assert len(comm) == 404 and t.step_spans().shape[0] == 1
    assert sorted(ev.seq[comm].tolist()) == list(range(404))
    per_step = np.bincount(ev.step[comm])
    assert sorted(per_step[per_step > 0].tolist()) == [404]
    assert all(c == CommKind.ALL_REDUCE and d == "float" for c, d in zip(t.meta.collectives.kind, t.meta.collectives.dtype))


def test_old_schema_sizes_from_input_dims():
    t = read_kineto(f"{DATA}/trace_filter/sampled_rank-0.json.gz")
    ev = t.events
    enq = np.flatnonzero((ev.kind == Kind.COMM_ENQUEUE) & (ev.group >= 0))
    assert len(enq) and np.all(ev.nbytes[enq] > 0)


def test_gloo_cpu_trace():
    folder = gloo_traces()
    for path in sorted(glob.glob(f"{folder}/*.json")):
        t = read_kineto(path)
        ev = t.events
        assert t.backend == "gloo" and t.world_size == 2 and t.group_ranks == {"0": [0, 1]}
        assert len(t.step_spans()) == 3
        main = [lane for lane in t.lanes if lane.main]
        assert len(main) == 1 and main[0].kind == LaneKind.CPU_THREAD
        comm = np.flatnonzero(ev.kind == Kind.COMM)
        names = {ev.name_of(i) for i in comm}
        assert names == {"gloo:all_reduce", "gloo:broadcast"}  # gradients; BatchNorm buffers each forward
        assert all(t.lanes[ev.lane[i]].kind == LaneKind.COMM_THREAD for i in comm)
        assert sorted(ev.seq[comm].tolist()) == list(range(len(comm)))
        assert np.all(ev.nbytes[comm] > 0) and np.all(ev.nbytes[comm] % 4 == 0)
        # each transfer has its enqueue (c10d::allreduce_, same seq), and feeds a host wait
        enq = {d: s for s, d in t.flows if d in set(comm.tolist())}
        assert len(enq) == len(comm)
        assert all(ev.name_of(s) == ev.name_of(d).replace("gloo:", "c10d::").replace("all_reduce", "allreduce") + "_" for d, s in enq.items())
        enq = list(enq.values())
        assert set(ev.seq[enq].tolist()) == set(ev.seq[comm].tolist())
        waits = [d for s, d in t.flows if s in set(comm.tolist())]
        assert waits and all(ev.kind[d] == Kind.COMM_WAIT for d in waits)
        kinds = set(ev.kind[ev.depth == 0].tolist())
        assert {Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.COMM, Kind.COMM_WAIT} <= kinds
        assert np.all(ev.depth[ev.kind == Kind.STEP] == -1)  # wrappers are transparent
        _no_overlap_at_depth0(t)


def test_truncated_and_foreign_files_fail_in_one_line(tmp_path):
    folder = gloo_traces()
    good = open(sorted(glob.glob(f"{folder}/*.json"))[0], "rb").read()
    cases = {
        "cut.json": good[: len(good) // 2],
        "cut.json.gz": gzip.compress(good)[:-100],
        "list.json": b"[1, 2, 3]",
        "chrome.json": json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]}).encode(),
        "binary.json": b"\x00\x01\x02garbage",
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(DagprofError) as err:
            read_kineto(p)
        assert str(p) in str(err.value) and "\n" not in str(err.value), name
    with pytest.raises(DagprofError, match="cannot read"):
        read_kineto(tmp_path / "missing.json")


def test_unexpected_field_types_take_the_lenient_path(tmp_path):
    folder = gloo_traces()
    doc = json.load(open(sorted(glob.glob(f"{folder}/*.json"))[0]))
    strict = read_kineto(sorted(glob.glob(f"{folder}/*.json"))[0])
    for e in doc["traceEvents"]:
        if e.get("name") == "gloo:all_reduce":
            e["args"]["Input type"] = 7  # a foreign type in one field
            break
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    t = read_kineto(p)
    assert len(t.events) == len(strict.events)
    assert np.array_equal(t.events.kind, strict.events.kind)


def test_schema_table():
    assert comm_role("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == ("transfer", "allreduce")
    assert comm_role("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)") == ("transfer", "allgather")
    assert comm_role("kernel", "ncclSymDevKernel_ReduceScatter_LD(ncclSymDevArgs)") == ("transfer", "reducescatter")
    assert comm_role("kernel", "ncclDevKernel_SendRecv(ncclDevComm*)") == ("transfer", "sendrecv")
    assert comm_role("user_annotation", "gloo:all_reduce") == ("transfer", "allreduce")
    assert comm_role("cpu_op", "c10d::_allgather_base_") == ("enqueue", "allgather")
    assert comm_role("cpu_op", "c10d::wait") [0] == "wait"
    assert comm_role("cpu_op", "aten::mm") is None
    assert [canonical_collective(s) for s in ("all_to_all", "alltoall_base", "_reduce_scatter_base", "allgather_into_tensor_coalesced", "recv")] == \
        ["alltoall", "alltoall", "reducescatter", "allgather", "recv"]
    assert kernel_dtype("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)") == "bf16"


def test_cuda_sync_records_become_cross_stream_and_host_waits():
    t = read_kineto(f"{DATA}/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz")
    ev = t.events
    pairs = {(t.lanes[ev.lane[s]].name, t.lanes[ev.lane[d]].name, ev.name_of(d)) for (s, d), r in zip(t.flows, t.rules()) if r != Dep.LAUNCH}
    assert ("GPU 0 stream 20", "GPU 0 stream 24", "Memset (Device)") in pairs  # Stream Wait Event
    assert any(dst == "cudaDeviceSynchronize" for _, _, dst in pairs)  # host blocked on the device
    assert not any(dst == "cudaEventQuery" for _, _, dst in pairs)  # a poll is not a wait


def _same_table(a, b) -> None:
    for c in a.events.COLUMNS:
        assert np.array_equal(getattr(a.events, c), getattr(b.events, c)), c
    assert a.events.names == b.events.names and np.array_equal(a.flows, b.flows)


def test_numbers_written_as_strings_read_as_numbers(tmp_path):
    """TraceLens/ROCm, vLLM and SGLang traces write some numeric args as strings ("bytes": "1")."""
    src = TESTDATA / "kineto-corpus" / "tracelens" / "mi300" / "gaunernst_bert-small-uncased__1016001.json.gz"
    doc = json.load(gzip.open(src))
    for e in doc["traceEvents"]:
        for k, v in (e.get("args") or {}).items():
            if k in ("bytes", "correlation") and isinstance(v, str):
                e["args"][k] = int(v)
    fixed = tmp_path / "rank-0.json"
    fixed.write_text(json.dumps(doc))
    _same_table(read_kineto(src), read_kineto(fixed))
    for rel in ("inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", "inference/graph_full/graph_execution.json.gz"):
        assert len(read_kineto(TESTDATA / "kineto-corpus" / "tracelens" / rel).events) > 0


def test_a_foreign_value_is_dropped_not_the_trace(tmp_path):
    """Values no type conversion explains lose only themselves; an event without a readable time is skipped and counted."""
    path = sorted(glob.glob(f"{gloo_traces()}/*.json"))[0]
    doc = json.load(open(path))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    xs[0]["args"]["Input Dims"] = {"not": "a list"}  # a raw field: kept as it is
    xs[1]["name"] = 12  # a number where a string belongs: its text
    xs[2]["ts"] = "soon"  # no time: the event cannot be placed
    xs[3]["args"]["correlation"] = [1]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    t = read_kineto(p)
    assert len(t.events) == len(read_kineto(path).events) - 1
    assert "12" in t.events.names
    assert any("1 of" in str(w) and "unreadable" in str(w) for w in t.meta.warnings)


def test_kineto_first_json_and_its_category_names():
    """PyTorch 1.8 wrote a bare list of events with categories Operator / Runtime / Kernel / Memcpy."""
    t = read_kineto(TESTDATA / "kineto-corpus" / "kineto" / "tb_plugin_samples" / "resnet50_num_workers_0" / "worker0.pt.trace.json.gz")
    ev = t.events
    gpu = [i for i, lane in enumerate(t.lanes) if lane.kind == LaneKind.GPU_STREAM]
    assert gpu and len(t.step_spans()) == 1
    kernels = np.isin(ev.lane, gpu)
    assert kernels.sum() > 500 and not np.any(ev.kind[kernels] == Kind.RUNTIME)
    launched = set(t.flows[ev.kind[t.flows[:, 0]] == Kind.RUNTIME][:, 1].tolist())
    assert len(launched) > 0.9 * kernels.sum()  # cudaLaunchKernel -> kernel by correlation, as in later schemas
    assert {Kind.FORWARD, Kind.BACKWARD} <= set(ev.kind[kernels].tolist())


def test_a_folder_of_several_runs_reads_the_latest():
    from dagprof.traces.kineto_dir import read_trace_dir

    run = read_trace_dir(TESTDATA / "kineto-corpus" / "kineto" / "tb_plugin_samples" / "resnet50_num_workers_0", use_cache=False)
    assert len(run.ranks) == 1 and os.path.basename(run.ranks[0].source).startswith("worker0.1623143089861")
    assert "2 runs" in str(run.meta.warnings[0])


def test_eight_nccl_ranks_match_completely():
    from dagprof.align.matching import match_collectives
    from dagprof.traces.kineto_dir import read_trace_dir

    run = read_trace_dir(TESTDATA / "kineto-corpus" / "param" / "dlrm_kineto", use_cache=False)
    m = match_collectives(run)
    assert [t.rank for t in run.ranks] == list(range(8)) and not m.problems and not m.warnings
    assert m.instances and all(len(it.ranks) == 8 for it in m.instances)
