"""dagprof's own runs of a GPU job (``bench/gpu/record.sh`` on an H200, torch 2.11, one NCCL rank, ``tests/data/gpu``).

The GPU's kernels and copies are graph nodes on their streams, joined to the host where the trace joins them: a kernel
after the start of the runtime call that launched it, a host sync released when the kernel it waited for ends. The
hooks' main-lane spans are coarse (one span launches a layer's kernels), so joining a kernel to its span's end put it
late (the DDP run replayed +6.4 % off itself). And FSDP2 on a torch before 2.13 calls ``all_gather_into_tensor`` /
``reduce_scatter_tensor``: the collector patches whichever names this torch has (it raised on 2.11 and recorded nothing).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dagprof.analysis import job_iteration_us
from dagprof.cli.main import main
from dagprof.graph.dag import DeviceKind
from dagprof.graph.provenance import violations
from dagprof.passes.comm import current_topology
from dagprof.passes.link_fit import link_fit
from dagprof.passes.profiler_cost import on_accelerator, scale_host_work
from dagprof.pipeline import open_run
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.search.scenario import on_link
from dagprof.traces.events import Kind, LaneKind
from dagprof.traces.kineto import read_kineto
from dagprof.traces.run_comm import exchange_starts
from dagprof.traces.run_schema import RankFile, read_file

DATA = os.path.join(os.path.dirname(__file__), "data", "gpu")
RUNS = ("ddp-nccl-1", "fsdp-nccl-1")
GLOO = os.path.join(DATA, "fsdp-gloo-2-step12")  # 2 gloo ranks on one GPU, FSDP2 per block: one step of the run


@pytest.mark.parametrize("name", RUNS)
def test_kernels_are_nodes_on_their_streams(name):
    g = open_run(os.path.join(DATA, name)).graph
    assert any(d.kind == DeviceKind.HOST for d in g.devices)
    assert int(on_accelerator(g).sum()) > 1000  # a 6-block transformer's kernels, 5 steps
    assert all("stream" in g.devices[k].name for k in np.unique(g.device[on_accelerator(g)]))


@pytest.mark.parametrize("name", RUNS)
def test_measured_configuration_replays_as_measured(name):
    run = open_run(os.path.join(DATA, name))
    assert abs(run.analysis.predicted_us / run.analysis.measured_us - 1) < 0.005
    assert all(check.violated == 0 for check in violations(run.graph))  # no edge the measured timeline contradicts
    averaged = open_run(os.path.join(DATA, name), template=True).analysis
    assert abs(averaged.predicted_us / averaged.measured_us - 1) < 0.02


def test_fsdp_on_torch_2_11_is_profiled():
    """Before, the window's start raised (``all_gather_single`` is 2.13's) and no step was profiled. One rank shards over a
    mesh of one, where FSDP2 issues no collective (the 2-rank gloo run of the same script recorded 65 all-gathers and 35
    reduce-scatters in 5 steps: one step of it is ``fsdp-gloo-2-step12``)."""
    f = read_file(os.path.join(DATA, "fsdp-nccl-1", "rank0.json"), RankFile)
    assert f.torch.startswith("2.11") and f.steps_profiled == [10, 11, 12, 13, 14]
    assert len(f.fsdp.units) == 7  # the 6 blocks and the root
    stats = json.load(open(os.path.join(DATA, "fsdp-nccl-1", "unprofiled-stats.json")))
    assert stats["gpu"] == "NVIDIA H200"


def test_fsdp_peak_memory_against_max_memory_allocated():
    """The peak per rank the what-ifs give, as profiled, against the unprofiled run's ``torch.cuda.max_memory_allocated``
    after warm-up: 2817.5 against 2750.4 MiB (+2.4 %; the 2-rank gloo run of the same script +0.8 %)."""
    run = open_run(os.path.join(DATA, "fsdp-nccl-1"))
    predicted = max(m.total for m in fsdp_peak(run.graph).values())
    measured = max(json.load(open(os.path.join(DATA, "fsdp-nccl-1", "unprofiled-stats.json")))["max_memory_allocated"])
    assert abs(predicted / measured - 1) < 0.05


def _exchanges(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, exchange start, end) us of every collective Kineto shows on a host thread of the trace."""
    kt = read_kineto(path, rank=0)
    ev = kt.events
    host = np.array([lane.kind != LaneKind.GPU_STREAM for lane in kt.lanes])
    idx = np.flatnonzero((ev.kind == Kind.COMM) & host[ev.lane]).tolist()
    begin = exchange_starts(ev, idx)
    return ev.start[idx], np.array([begin[i] for i in idx]), (ev.start + ev.dur)[idx]


def test_gloo_transfer_starts_once_its_input_is_on_the_host():
    """gloo's op on CUDA tensors first synchronizes the stream that copied them to the host: that wait is the GPU's, not
    the wire's (``run_comm.exchange_starts``). NCCL's kernels have no such calls inside: they start where they start."""
    start, begin, end = _exchanges(os.path.join(GLOO, "rank0.kineto.json.gz"))
    assert len(start) == 20  # one step: 13 all-gathers and 7 reduce-scatters (the root's and 6 blocks')
    assert ((begin > start) & (begin < end)).all()
    _, begin, _ = _exchanges(os.path.join(DATA, "ddp-nccl-1", "rank0.kineto.json.gz"))
    start, _, _ = _exchanges(os.path.join(DATA, "ddp-nccl-1", "rank0.kineto.json.gz"))
    assert (begin == start).all()


def test_gloo_fsdp_kinds_fitted_apart(capsys):
    """gloo's all-gather of a block took ~64 ms and its all-reduce (FSDP's reduce-scatter on gloo) ~35 ms: per
    all-reduce-equivalent byte the all-gather costs three times as much. One link fitted to both explained 1 % of their
    durations, put all in latency and priced the root's 1-2 MB collectives (1-4 ms) at 47 ms: the model of the profiled
    step +14.7 % off its replay, and the what-if refused. One overhead with each kind's own slope: within 2 %."""
    g = open_run(GLOO).graph
    fit = link_fit(g)
    kinds = dict(fit.kinds)
    assert fit.weak is None and fit.r2 > 0.9 and kinds["all_gather"].beta_us_per_byte > 2.5 * kinds["reduce_scatter"].beta_us_per_byte
    model = on_link(g, current_topology(g))
    assert abs(job_iteration_us(model) / job_iteration_us(g) - 1) < 0.02
    comm = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    root = [int(c) for c in comm if g.node_name(int(c)).startswith(("all_gather <root>", "reduce_scatter <root>"))]
    assert len(root) == 2 and (model.dur[root] < 5e3).all()
    assert main(["whatif", GLOO, "--no-trace", "--json", "--reshard-after-forward", "on,off"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["model_error_pct"]) < 2.0


def test_the_profilers_cost_is_taken_off_the_host_not_the_gpu():
    """The correction shortens host work only: this GPU-bound step (gemms on the critical path) replays 46.5 ms with
    the host's work at 0.742 (the factor the 2-rank FSDP run's correction found), near its 47.2 ms unprofiled median,
    where shortening the kernels too gave 36.9."""
    g = open_run(os.path.join(DATA, "ddp-nccl-1")).graph
    gpu = on_accelerator(g)
    assert gpu.sum() > 1000 and not gpu[g.device < 0].any()
    h = scale_host_work(g, 0.742)
    assert (h.dur[gpu] == g.dur[gpu]).all() and (h.gap[gpu] == g.gap[gpu]).all()
    assert (h.dur[~gpu & (g.rank >= 0)] <= g.dur[~gpu & (g.rank >= 0)]).all()
    assert job_iteration_us(h) > 0.9 * job_iteration_us(g)
