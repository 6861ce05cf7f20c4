"""S-SGD DAG with compute and all-reduces slowing each other (``sgd.contention``), priced from a ``calibrate --overlap``
measurement in the link-model file: hand-solved fixed points, fused untouched, the CLI's default and ``--no-contention``."""
from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from dagprof.cli.main import main
from dagprof.collect.measure.overlap import Overlap, overlap_from_table
from dagprof.costmodel import AlphaBeta
from dagprof.costmodel.topology import save_link_model
from dagprof.sgd import CommModel, Contention, Policy, closed_form, make_schedule, predict, replay_schedule
from dagprof.traces.layerwise import LayerProfile

# two layers: the last one's all-reduce (1 ms at 1 GB/s) runs beside the first one's backward (1 ms); the first sends nothing
TWO = LayerProfile(names=["l0", "l1"], forward_us=np.zeros(2), backward_us=np.array([1000.0, 1000.0]),
                   grad_bytes=np.array([0, 1_000_000], np.int64), allreduce_us=None, workers=None, io_us=0.0, h2d_us=0.0, update_us=0.0)
LINK = CommModel(default=AlphaBeta(0.0, 1e-3))


def wfbp(contention: Contention | None, workers: int = 2) -> float:
    s = make_schedule(TWO, Policy.WFBP, workers, LINK)
    return replay_schedule(TWO, s, iterations=4, contention=contention).iter_us


def test_hand_solved_fixed_points():
    assert wfbp(None) == pytest.approx(2000.0)  # B_l1, then B_l0 beside C_l1: hidden
    # both slowed by a whole unit: each runs beside the other all its time, so each takes twice as long
    assert wfbp(Contention(1.0, 1.0)) == pytest.approx(3000.0, rel=1e-4)
    # compute only: B_l0 of d us overlaps the 1 ms all-reduce for 1000/d of its time, d = 1000 (1 + 1000 / d): the golden ratio
    assert wfbp(Contention(1.0, 0.0)) == pytest.approx(1000.0 + 1000.0 * (1 + 5**0.5) / 2, rel=1e-4)
    # the all-reduce only, symmetrically
    assert wfbp(Contention(0.0, 1.0)) == pytest.approx(1000.0 + 1000.0 * (1 + 5**0.5) / 2, rel=1e-4)
    # 8 workers, every one's backward beside the channel alike: the all-reduce (ring) c = 1750 us outlasts B_l0, which takes
    # 2000; the all-reduce d = c (1 + 2000 / d)
    c = 2 * 7 / 8 * 1000.0
    assert wfbp(Contention(1.0, 1.0), workers=8) == pytest.approx(1000.0 + (c + (c * c + 4 * c * 2000.0) ** 0.5) / 2, rel=1e-4)


def test_what_overlaps_nothing_is_the_closed_form():
    """A fused all-reduce runs after the whole backward, and no overlap is no overlap: the closed forms stand."""
    comm = CommModel(default=AlphaBeta(0.0, 1e-3), contention={2: Contention(2.0, 3.0, "test")})
    scaling = predict(TWO, [1, 2], comm)
    for policy in (Policy.FUSED, Policy.SEQUENTIAL):
        assert [r.iter_us for r in scaling.table[policy]] == pytest.approx(
            [closed_form(TWO, make_schedule(TWO, policy, n, comm)).iter_us for n in (1, 2)], rel=1e-9)
    wf = scaling.table[Policy.WFBP]
    assert wf[0].iter_us == pytest.approx(2000.0) and wf[1].iter_us > 3000.0  # one worker sends nothing
    assert predict(TWO, [2], comm, contention=False).table[Policy.WFBP][0].iter_us == pytest.approx(2000.0)
    # jittered replays take it too (no step-to-step variation here: the same answer)
    steps = TWO.with_(step_forward_us=np.zeros((3, 2)), step_backward_us=np.tile(TWO.backward_us, (3, 1)), step_update_us=np.zeros(3))
    jittered = predict(steps, [2], comm, jitter_samples=2).table[Policy.WFBP][0].iter_us
    assert jittered == pytest.approx(wf[1].iter_us, rel=1e-4)


def overlap(slowdown: float, comm_slowdown: float) -> dict:
    return msgspec.to_builtins(Overlap(slowdown, 600.0, [slowdown], 8 << 20, 0.07, per_undisturbed=True, comm_slowdown=comm_slowdown))


def test_link_model_with_overlap_is_used_by_default(tmp_path, capsys):
    f = tmp_path / "two.csv"
    f.write_text("layer,forward_us,backward_us,grad_bytes\nl0,0,1000,0\nl1,0,1000,1000000\n")
    link = save_link_model(tmp_path / "link.json", AlphaBeta(0.0, 1e-3), backend="gloo", workers=2, points=[[1 << 20, 1500.0]],
                           overlap=overlap(1.0, 1.0))
    assert main(["sgd", str(f), "--workers", "2", "--link-model", link, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["policies"]["wfbp"][0]["iter_time_s"] == pytest.approx(3000e-6, rel=1e-4)
    assert r["contention"] == {"2": {"compute_slowdown": 1.0, "comm_slowdown": 1.0, "source": "link.json"}}
    assert any("all-reduces x(1 + 1.00 f) beside compute" in n for n in r["notes"])
    assert main(["sgd", str(f), "--workers", "2", "--link-model", link, "--json", "--no-contention"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["policies"]["wfbp"][0]["iter_time_s"] == pytest.approx(2000e-6) and r["contention"] == {}
    # measured on 2 workers: 4 workers are priced without it (ring-scaled link, no contention measured there)
    assert main(["sgd", str(f), "--workers", "4", "--link-model", link, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["contention"] == {}


def test_files_before_the_comm_slowdown_read_as_zero():
    old = {k: v for k, v in overlap(0.5, 0.0).items() if k != "comm_slowdown"}
    assert overlap_from_table(old, "old.json").comm_slowdown == 0.0


def test_calibrate_overlap_end_to_end(tmp_path, capsys):
    """A real 2-rank gloo ``calibrate --overlap`` at the job's message size, then ``dagprof sgd`` priced by what it measured."""
    out = tmp_path / "link.json"
    assert main(["calibrate", "--world", "2", "--max-mb", "0.0625", "--iters", "2", "--overlap", "--overlap-mb", "0.25", "-o", str(out),
                 "--json"]) == 0
    o = json.loads(capsys.readouterr().out)["overlap"]
    assert o["allreduce_bytes"] == 2**18 and o["comm_slowdown"] >= 0 and o["slowdown"] >= 0
    f = tmp_path / "two.csv"
    f.write_text("layer,forward_us,backward_us,grad_bytes\nl0,0,1000,0\nl1,0,1000,1000000\n")
    assert main(["sgd", str(f), "--workers", "2", "--link-model", str(out), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["contention"]["2"]
    assert c["comm_slowdown"] == pytest.approx(o["comm_slowdown"]) and c["compute_slowdown"] == pytest.approx(o["slowdown"])


def test_overlap_beside_the_jobs_own_backward(tmp_path):
    """``measure_overlap`` beside a model's backward (``backward_work``) on a real one-rank gloo group: each unit
    back-propagates the one forward graph again, so the gradients are whole multiples of one backward's."""
    import torch
    import torch.distributed as dist

    from dagprof.collect.measure.overlap import MATMUL, backward_work, measure_overlap

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.ReLU(), torch.nn.Linear(64, 8, bias=False))
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    torch.nn.functional.mse_loss(model(x), y).backward()
    one = model[0].weight.grad.clone()
    model.zero_grad(set_to_none=True)
    work = backward_work(lambda: torch.nn.functional.mse_loss(model(x), y))
    work.run(3)
    assert torch.allclose(model[0].weight.grad, 3 * one, rtol=1e-5)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        o = measure_overlap(1 << 16, repeats=2, work=work)
        loop = measure_overlap(1 << 16, repeats=2)
    finally:
        dist.destroy_process_group()
    assert o.beside == "backward" and loop.beside == MATMUL and o.per_undisturbed
    assert o.slowdown >= 0 and o.comm_slowdown >= 0 and o.matmul_us > 0 and o.allreduce_bytes == 1 << 16
    assert overlap_from_table(msgspec.to_builtins(o), "o.json").beside == "backward"
