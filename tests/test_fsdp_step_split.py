"""The optimizer step of an FSDP2 profile split by its own Kineto ops (``traces.fsdp_run.optimizer_ops``,
``graph.build_fsdp.profiled_step``): the ops DTensor's dispatch runs on the local shards scale with the shard's bytes,
the rest (the dispatches, the Python between the ops) stays per tensor when ``--mesh`` / ``--workers`` change the shard
degree (``passes.fsdp_mesh.step_scale``). On the vendored MoE recording (tests/data/review6/moe-routers: RAdam on 51
DTensor parameters, 2 ranks, Kineto on)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.costmodel.fsdp_costs import DTENSOR_STEP, FsdpCosts, StepFit
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import step_size
from dagprof.passes.fsdp_mesh import set_mesh, step_scale, uncalibrated_step_note
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import EventTable, Kind
from dagprof.traces.fsdp_run import optimizer_ops
from dagprof.traces.run_rank import read_rank

MOE = DATA / "review6" / "moe-routers"
HSDP = DATA / "fsdp" / "hsdp"  # hooks only: no Kineto


@pytest.fixture(scope="module")
def moe():
    return build_graph(read_run(MOE))


def test_the_reader_splits_each_ranks_steps():
    for r in (0, 1):
        ops = read_rank(str(MOE / f"rank{r}.json")).meta.optimizer_ops
        # 2 steps of RAdam before its rectification starts: 7 DTensor ops on each of 50 parameters a step (the 51st, the
        # frozen embedding, has no gradient)
        assert ops.steps == 2 and ops.dispatches == 700
        assert 0 < ops.local_us < ops.us
    assert read_rank(str(MOE / "rank0.json"), kineto=False).meta.optimizer_ops is None


def test_the_per_tensor_part_is_read_and_does_not_scale_with_the_shard(moe):
    fit = moe.meta.fsdp.step_fit
    tensors, nbytes = step_size(moe.meta.fsdp.units)
    assert tensors == 51 and fit.us_per_tensor > 0 and fit.us_per_byte > 0
    ranks = [read_rank(str(MOE / f"rank{r}.json")).meta.optimizer_ops for r in (0, 1)]
    steps = sum(o.steps for o in ranks)
    # the two parts give back the mean Kineto step, and the per-tensor one is what the dispatches' side took
    assert fit.us(tensors, nbytes / 2) == pytest.approx(sum(o.us for o in ranks) / steps)
    assert fit.us_per_tensor * tensors == pytest.approx(sum(o.us - o.local_us for o in ranks) / steps)
    fixed = fit.us_per_tensor * tensors / fit.us(tensors, nbytes / 2)
    for shard in (4, 8, 64):
        assert step_scale(moe, 2, shard, None) == pytest.approx(fixed + (1 - fixed) * 2 / shard)
        assert step_scale(moe, 2, shard, None) > fixed > 2 / shard  # never below the per-tensor part, unlike the bytes rule
    m = set_mesh(moe, 1, 4)  # rank 0 keeps its own steps, on half its shards
    upd = (moe.kind == Kind.UPDATE) & (moe.rank == 0)
    assert m.dur[(m.kind == Kind.UPDATE) & (m.rank == 0)].sum() == pytest.approx(moe.dur[upd].sum() * step_scale(moe, 2, 4, None))


def test_fsdps_measured_costs_come_first(moe):
    costs = FsdpCosts(2, StepFit(10.0, 0.0), StepFit(0.0, 1.0), 0.0, 0.0, 0.0)  # a step by the bytes alone
    assert step_scale(moe, 2, 4, costs) == pytest.approx(0.5)


def test_without_kineto_a_cpu_step_splits_as_the_measured_dtensor_step_and_says_so(capsys):
    g = build_graph(read_run(HSDP))
    tensors, nbytes = step_size(g.meta.fsdp.units)
    fit = DTENSOR_STEP[g.meta.torch_minor][1]
    assert g.meta.fsdp.step_fit is None
    assert step_scale(g, 2, 4, None) == pytest.approx(fit.us(tensors, nbytes / 4) / fit.us(tensors, nbytes / 2))
    assert 0.5 < step_scale(g, 2, 4, None) < 1.0 and step_scale(g, 2, 2, None) == 1.0
    assert f"by the DTensor step measured for torch {g.meta.torch_minor}" in uncalibrated_step_note(g, [4])
    # a torch version not measured: the shards' bytes alone, said so
    other = g.replace(meta=g.meta.replace(torch="2.99.0"))
    assert step_scale(other, 2, 4, None) == 0.5
    assert "by their shards' bytes (no Kineto ops" in uncalibrated_step_note(other, [4])
    # FSDP1 steps plain flat parameters, not DTensors: the bytes
    fsdp1 = build_graph(read_run(DATA / "fsdp" / "fsdp1"))
    assert fsdp1.meta.fsdp.step_fit is None and step_scale(fsdp1, 2, 4, None) == 0.5
    # on a GPU the step's bytes are its kernels' and its host ops launch them: not this split
    assert build_graph(read_run(DATA / "gpu" / "fsdp-gloo-2-step12")).meta.fsdp.step_fit is None
    assert main(["whatif", str(MOE), "--mesh", "1x4", "--no-trace", "--allow-model-error", "--json"]) == 0
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if "shard degree" in n]
    assert len(notes) == 1 and "from the profile's Kineto ops" in notes[0] and "stays per tensor" in notes[0]


def test_only_the_ops_under_the_dispatches_count_once_each():
    """A step of 100 us: a dispatch (10-40) holding an op (15-35) with its own child (20-30), a nested dispatch (16-18);
    an op outside every dispatch (50-60); a second step outside the window."""
    names = ["Optimizer.step#AdamW.step", "PythonSubclass", "aten::mul_", "aten::to", "aten::add_"]
    rows = [(0, 0, 100), (1, 10, 30), (2, 15, 20), (3, 20, 10), (1, 16, 2), (4, 50, 10), (0, 200, 100), (1, 210, 30), (2, 215, 20)]
    ev = EventTable.from_columns(names, name=[n for n, _, _ in rows], kind=[int(Kind.UPDATE)] * len(rows), lane=[0] * len(rows),
                                 start=[s for _, s, _ in rows], dur=[d for _, _, d in rows])
    ops = optimizer_ops(ev, np.array([True] * 6 + [False] * 3))
    assert (ops.steps, ops.us, ops.local_us, ops.dispatches) == (1, 100.0, 20.0, 1)
    assert optimizer_ops(ev, np.zeros(len(rows), dtype=bool)) is None
