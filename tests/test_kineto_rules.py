"""Each dependency rule of the Kineto reader on an excerpt of a real trace (tests/data/kineto_excerpts).

Every test also checks the invariant the rules must keep: no inferred edge is contradicted by the
measured timeline (its destination never began before its source ended), and the replay of the
measured configuration reproduces the measured iteration.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from dagprof.graph.build import build_graph
from dagprof.graph.provenance import provenance, violations
from dagprof.replay import replay
from dagprof.traces.events import Dep, Kind, LaneKind, Run
from dagprof.traces.kineto import read_kineto

EXCERPTS = os.path.join(os.path.dirname(__file__), "data", "kineto_excerpts")


def excerpt(name: str):
    return read_kineto(os.path.join(EXCERPTS, name))


def flows(t, rule: Dep) -> list[tuple[str, str]]:
    ev = t.events
    return [(ev.name_of(s), ev.name_of(d)) for s, d in t.flows[t.rules() == rule].tolist()]


def rows(t, name: str) -> np.ndarray:
    ev = t.events
    return np.flatnonzero(np.array([ev.names[k] == name for k in ev.name]))


def assert_consistent(t, steps: range | None = None):
    """No rule's edge is contradicted, and the replay reproduces the measured iteration."""
    g = build_graph(Run([t], t.source), steps)
    assert [c for c in violations(g) if c.violated] == []
    res = replay(g)
    marks = np.flatnonzero(g.kind == Kind.STEP)
    predicted = (res.start[marks].max() - res.start[marks].min()) / len(g.meta.steps)
    assert predicted == pytest.approx(g.meta.measured_iter_us[t.rank], rel=1e-9)
    return g, res


def test_launch_binds_to_the_call_start_because_a_blocking_copy_returns_after_its_copy_ran():
    t = excerpt("hta_cuda_event_sync.json.gz")  # .item(): cudaMemcpyAsync D2H into pageable memory
    ev = t.events
    call, copy = rows(t, "cudaMemcpyAsync")[0], rows(t, "Memcpy DtoH (Device -> Pageable)")[0]
    assert ev.start[copy] < ev.end[call]  # binding the launch at the call's end would be a false edge
    assert [int(call), int(copy)] in t.flows[t.rules() == Dep.LAUNCH].tolist()
    g, _ = assert_consistent(t)
    p = provenance(g)
    launch = p.rule == Dep.LAUNCH
    assert np.all(p.mend[p.src[launch]] <= p.mstart[p.dst[launch]])


def test_blocking_copy_is_a_wait_on_its_copy():
    t = excerpt("hta_cuda_event_sync.json.gz")
    assert ("Memcpy DtoH (Device -> Pageable)", "cudaMemcpyAsync") in flows(t, Dep.COPY)
    g, res = assert_consistent(t)
    waits = [v for v in np.flatnonzero(g.kind == Kind.COMM_WAIT) if g.node_name(v) == "rank0.cudaMemcpyAsync"]
    assert len(waits) == 1 and g.dur[waits[0]] == 0  # the call's time is waiting, not work
    copy = next(v for v in range(len(g)) if g.node_name(v).startswith("rank0.Memcpy DtoH"))
    assert copy in g.predecessors(waits[0]) and res.start[waits[0]] >= res.end[copy]


def test_recorded_syncs_wait_for_what_the_record_names():
    t = excerpt("hta_cuda_event_sync.json.gz")
    sync = flows(t, Dep.SYNC)
    assert ("Memcpy DtoH (Device -> Pageable)", "cudaStreamSynchronize") in sync  # Stream Sync: the last op on stream 7
    assert ("at::cuda::(anonymous namespace)::spin_kernel(long)", "cudaEventSynchronize") in sync  # the op before the record
    assert ("at::cuda::(anonymous namespace)::spin_kernel(long)", "cudaDeviceSynchronize") in sync  # Context Sync
    assert not any(dst == "cudaEventQuery" for _, dst in sync)  # a poll is not a wait
    assert_consistent(t)


def test_rocm_names_synchronous_copy_and_device_sync():
    t = excerpt("hta_mi250_minitoy_train.json.gz")  # ROCm 6.2, MI250: hip* runtime calls
    assert flows(t, Dep.COPY) == [("Memcpy HtoD (Host -> Device)", "hipMemcpyWithStream")] * 2  # synchronous copies
    (src, dst), = flows(t, Dep.SYNC)
    assert dst == "hipDeviceSynchronize" and src.startswith("void at::native::(anonymous namespace)::multi_tensor_apply_kernel")
    assert_consistent(t, range(1, 2))  # step 2 holds no op of the loop: the profiler's stop() closed it (test_cut_step)


def test_recorded_stream_wait_joins_the_two_streams():
    t = excerpt("hta_cuda_event_sync_multi_stream.json.gz")
    ev = t.events
    (s, d), = t.flows[t.rules() == Dep.STREAM_WAIT].tolist()
    assert (t.lanes[ev.lane[s]].name, ev.name_of(s)) == ("GPU 0 stream 20", "ampere_sgemm_128x64_nn")
    assert (t.lanes[ev.lane[d]].name, ev.name_of(d)) == ("GPU 0 stream 24", "Memset (Device)")
    assert sorted(t.lanes[ev.lane[s]].name for s, _ in t.flows[t.rules() == Dep.SYNC].tolist()) == [
        "GPU 0 stream 20", "GPU 0 stream 24", "GPU 0 stream 28"]  # cudaDeviceSynchronize: every stream's last op
    assert_consistent(t)


def test_nccl_stream_joins_the_callers_stream_and_plain_waits_are_declined_when_contradicted():
    t = excerpt("hta_nccl_ddp_end_of_backward.json.gz")  # DDP ResNet-50, A100, NCCL: the last buckets of a backward
    ev = t.events
    comm = np.flatnonzero(ev.kind == Kind.COMM)
    ready = t.flows[t.rules() == Dep.COLL_READY]
    assert set(ready[:, 1].tolist()) == set(comm.tolist())  # every all-reduce follows the compute issued before it
    assert {t.lanes[ev.lane[s]].name for s in ready[:, 0]} == {"GPU 0 stream 7"}
    plain = t.flows[t.rules() == Dep.STREAM_WAIT_PLAIN]
    assert len(plain) and np.all(ev.start[plain[:, 1]] >= ev.end[plain[:, 0]])  # kept only where the trace agrees
    # the gradient copy that runs while the latest all-reduce is still in flight does not wait for it
    assert t.meta.declined.get("STREAM_WAIT_PLAIN", 0) >= 1
    assert_consistent(t)


def test_single_rank_collectives_keep_their_measured_duration():
    t = excerpt("hta_nccl_ddp_end_of_backward.json.gz")  # rank 0 of 2: the peer's trace is not here
    g, res = assert_consistent(t)
    comm = np.flatnonzero(g.kind == Kind.COMM)
    ev = t.events
    measured = sorted(ev.dur[ev.kind == Kind.COMM].tolist())
    assert sorted(g.dur[comm].tolist()) == pytest.approx(measured)  # waiting for the peer included, as measured
    assert np.allclose(res.end[comm] - res.start[comm], g.dur[comm])


def test_autograd_thread_follows_the_main_thread_and_the_main_thread_waits_for_it():
    t = excerpt("hta_nccl_ddp_end_of_backward.json.gz")
    (_, dst), = flows(t, Dep.BACKWARD_END)
    assert dst == "aten::_foreach_mul_"  # the optimizer resumes when backward() returns
    t = excerpt("kineto_tb_resnet50_forward_to_backward.json.gz")  # PyTorch 1.8, TensorBoard plugin sample
    (src, dst), = flows(t, Dep.BACKWARD_START)
    assert dst == "NllLossBackward"
    ev = t.events
    s, d = t.flows[t.rules() == Dep.BACKWARD_START][0]
    assert t.lanes[ev.lane[s]].main and not t.lanes[ev.lane[d]].main and ev.end[s] <= ev.start[d]
    assert_consistent(t)


def test_pageable_host_to_device_copy_waits_for_its_stream_only_when_it_outlived_its_copy():
    t = excerpt("hta_alexnet_h2d_pageable.json.gz")  # cudaMemcpyAsync from pageable memory, A100
    ev = t.events
    launch = dict((d, s) for s, d in t.flows[t.rules() == Dep.LAUNCH].tolist())
    staged = {int(d) for _, d in t.flows[t.rules() == Dep.STAGE].tolist()}
    copies = [g for g in launch if ev.name_of(g) == "Memcpy HtoD (Pageable -> Device)"]
    assert copies and staged
    for g in copies:
        call = launch[g]
        if call in staged:
            assert ev.end[call] > ev.start[g]
    t2 = excerpt("kineto_tb_resnet50_h2d_copy.json.gz")  # one call returned before its copy began: staging only
    ev2 = t2.events
    call = rows(t2, "cudaMemcpyAsync")[1]
    assert ev2.end[call] < ev2.start[rows(t2, "Memcpy HtoD (Pageable -> Device)")[1]]
    assert call not in t2.flows[t2.rules() == Dep.STAGE][:, 1]
    assert_consistent(t)
    assert_consistent(t2)


def test_early_kineto_categories_and_the_json_array_format():
    t = excerpt("kineto_tb_resnet50_array_format.json.gz")  # PyTorch 1.8: a bare event array, "Kernel"/"Runtime" categories
    gpu = [lane for lane in t.lanes if lane.kind == LaneKind.GPU_STREAM]
    assert [lane.name for lane in gpu] == ["GPU 0 stream 7"]
    ev = t.events
    kernels = np.flatnonzero(np.isin(ev.lane, [t.lanes.index(gpu[0])]))
    assert len(kernels) == 8 and set(t.flows[t.rules() == Dep.LAUNCH][:, 1].tolist()) == set(kernels.tolist())
    assert_consistent(t)


def test_cuda_graph_launch_releases_its_kernels():
    t = excerpt("tracelens_graph_execution.json.gz")  # vLLM decode replaying a captured graph, MI300X
    ev = t.events
    launch = rows(t, "hipGraphLaunch")[0]
    released = t.flows[(t.rules() == Dep.LAUNCH) & (t.flows[:, 0] == launch)][:, 1]
    assert len(released) > 400 and np.all(ev.start[released] >= ev.start[launch])
    assert_consistent(t)


def test_kernels_past_a_step_boundary_keep_the_step_that_launched_them():
    t = excerpt("hta_ns_resolution_step101.json.gz")  # one ResNet-50 step on a V100; the GPU lags the host
    ev = t.events
    (step, _, end), = t.step_spans().tolist()
    gpu = np.isin(ev.lane, [i for i, lane in enumerate(t.lanes) if lane.kind == LaneKind.GPU_STREAM])
    late = gpu & (ev.end > end)
    assert late.sum() > 100 and np.all(ev.step[late] == step)
    g, res = assert_consistent(t)
    assert (g.kind == Kind.KERNEL).sum() + (g.kind >= 0).sum() > 0
