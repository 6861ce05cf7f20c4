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

import pytest

from dagprof.graph.dag import DeviceKind
from dagprof.graph.provenance import violations
from dagprof.pipeline import open_run
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.traces.run_schema import RankFile, read_file

DATA = os.path.join(os.path.dirname(__file__), "data", "gpu")
RUNS = ("ddp-nccl-1", "fsdp-nccl-1")


@pytest.mark.parametrize("name", RUNS)
def test_kernels_are_nodes_on_their_streams(name):
    g = open_run(os.path.join(DATA, name)).graph
    streams = [k for k, d in enumerate(g.devices) if d.kind == DeviceKind.COMPUTE and "stream" in d.name]
    assert streams and any(d.kind == DeviceKind.HOST for d in g.devices)
    assert int(sum((g.device == k).sum() for k in streams)) > 1000  # a 6-block transformer's kernels, 5 steps


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
    reduce-scatters in 5 steps: too large to keep here)."""
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
