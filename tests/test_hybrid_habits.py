"""Hybrid jobs written with habits the first fresh jobs lacked (issue 16): stock torch.profiler traces in tests/data/tp-fresh.

``fsdp-tp``: 2-D FSDP2 x TP on a ("dp", "tp") mesh as torchtitan writes it (``parallelize_module`` with sequence
parallelism and ``loss_parallel``, ``fully_shard(mesh=mesh["dp"])``, ``clip_grad_norm_``, and the script's own scalar
loss all-reduce over TP for its log), one block. ``pipe-dp``: ``torch.distributed.pipelining`` (``Schedule1F1B``, 4
micro-batches) with each stage under FSDP2. ``moe-sub``: expert parallel over ``new_subgroups()``, expert-data parallel
over ``new_group`` pairs, no description anywhere, gradients averaged by the script's own ``dist.all_reduce``.
``bench/tp_fresh/review.py --fixtures tests/data/tp-fresh --jobs fsdp-tp,pipe-dp,moe-sub`` re-records them.
"""
import json

import numpy as np
import pytest
from testdata import DATA

import dagprof
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.passes import scale_workers, set_topology
from dagprof.passes.comm import current_topology
from dagprof.passes.link_fit import priced_comm
from dagprof.passes.workers import refuse_degree
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind
from dagprof.traces.parallelism import Dim

FRESH = DATA / "tp-fresh"


def _groups(name: str) -> dict[str, tuple[str, tuple[int, ...], dict[str, int], dict[str, int]]]:
    par = dagprof.build_graph(dagprof.load(FRESH / name)).meta.parallel
    return {g.name: (g.desc, g.ranks, g.dims, g.nbytes) for g in par.groups}


def test_fsdp_tp_collectives_counted_and_grouped_as_the_script_issues_them():
    """Per rank and step: DP 3 all-gathers (the block's forward and backward, the root's), 2 reduce-scatters (gloo: an
    all-reduce of the whole input) and clip_grad_norm_'s all-reduce over DP; TP 4 all-gathers and 4 reduce-scatters (forward
    and backward), loss_parallel's 3, the 2 norms' partial gradients, the clip norm's and the script's own loss. Before,
    FSDP's all-gathers were unknown, and the clip norm (DTensor) and the loss (after backward) swapped dimensions."""
    got = _groups("fsdp-tp")
    assert {n: (d, r, x) for n, (d, r, x, _) in got.items()} == {
        "1": ("mesh_dp", (0, 2), {"DP": 6 * 4}), "2": ("mesh_dp", (1, 3), {"DP": 6 * 4}),
        "3": ("mesh_tp", (0, 1), {"TP": 15 * 4}), "4": ("mesh_tp", (2, 3), {"TP": 15 * 4})}
    block, root, clip = 18496 * 4, 32832 * 4, 7 * 4  # a block's and the root's TP-local parameters, 7 parameters' norms
    dp = 2 * block + root + block + root + clip  # all-gathers by their gathered bytes (2 DP shards), reduce-scatters by their input
    tp = 4 * 2 * 16384 + 4 * 32768 + 3 * 512 + 2 * 256 + clip + 4  # activations, loss_parallel, norms' gradients, clip, the loss
    assert {n: x for n, (_, _, _, x) in got.items()} == {"1": {"DP": 4 * dp}, "2": {"DP": 4 * dp}, "3": {"TP": 4 * tp}, "4": {"TP": 4 * tp}}


def test_a_scalar_all_reduce_has_its_four_bytes():
    run = dagprof.load(FRESH / "fsdp-tp")
    t = run.ranks[0]
    ev = t.events
    scalars = (ev.kind == Kind.COMM) & np.array([n == "gloo:all_reduce" for n in ev.names])[ev.name] & (ev.nbytes == 4)
    assert scalars.sum() == 2  # the logged loss, each step


@pytest.mark.parametrize("name", ["fsdp-tp", "pipe-dp"])
def test_fsdp_collectives_on_gloo_are_waited_for(name):
    """FSDP2 waits for its all-gather inside ``FSDP::all_gather`` and for its reduce-scatter inside
    ``FSDP::post_backward_reduce``, with no recorded wait: every data-parallel collective now releases its issuing thread, so
    a slower link lengthens the step (it came out the same at 0.1 and 1 Gbit/s before)."""
    g = open_run(FRESH / name).graph
    priced = np.flatnonzero(priced_comm(g))
    assert len(priced) and all(len(g.successors(int(c))) for c in priced)


@pytest.mark.parametrize("name", ["fsdp-tp", "pipe-dp"])
def test_bandwidth_whatif_moves_the_step(name, capsys):
    code = main(["whatif", str(FRESH / name), "--bandwidth", "0.05Gbit,10Gbit", "--allow-model-error", "--json", "--no-trace"])
    out, _ = capsys.readouterr()
    assert code == 0
    slow, fast = (row["predicted_iter_ms"] for row in json.loads(out)["scenarios"])
    # at least the wire time of the step's last reduce-scatter (gloo all-reduces its >= 131,328 B input; a 2-rank ring moves
    # all of it), which the optimizer waits for, at 0.05 Gbit/s less at 10 Gbit/s
    assert slow - fast > 8 * 131328 / 0.05e9 * 1e3 - 8 * 131328 / 10e9 * 1e3


def test_dp_whatif_on_fsdp_tp_leaves_tp_alone():
    g = dagprof.build_graph(dagprof.load(FRESH / "fsdp-tp"))
    g = set_topology(g, current_topology(g))
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    assert not (comm & (g.dim == Dim.UNKNOWN)).any()
    g8 = scale_workers(g, 8)
    comm8 = (g8.kind == Kind.COMM) & (g8.rank < 0)
    tp, tp8 = comm & (g.dim == Dim.TP), comm8 & (g8.dim == Dim.TP)
    assert tp8.sum() == tp.sum() and np.array_equal(np.sort(g8.nbytes[tp8]), np.sort(g.nbytes[tp]))
    assert np.allclose(np.sort(g8.dur[tp8]), np.sort(g.dur[tp]))
    with pytest.raises(DagprofError, match="TP degree of 4 is not modelled"):
        refuse_degree(g, Dim.TP, 4, "--tp-degree")


def test_undescribed_subgroups_give_no_group_sizes_and_refuse_repricing(capsys):
    """new_subgroups() / new_group without a description and gloo's collectives without their group: which group each ran
    in is not known. Before: "DP x4, EP/CP x4" (the all-to-alls ran in pairs) and a --bandwidth answer on that."""
    g = dagprof.build_graph(dagprof.load(FRESH / "moe-sub"))
    par = g.meta.parallel
    assert par.describe() == "DP, EP/CP" and "2 groups without a description" in par.ungrouped
    assert any("without a description" in n for n in par.notes)
    (grp,) = par.groups
    assert grp.dims == {"EP/CP": 5 * 2 * 2 * 4, "DP": 9 * 2 * 4}  # per MoE layer 1 count + 2 token exchanges + 2 in backward
    for flag in (["--bandwidth", "1Gbit"], ["--workers", "8"]):
        code = main(["whatif", str(FRESH / "moe-sub"), *flag, "--allow-model-error", "--no-trace"])
        _, err = capsys.readouterr()
        assert code == 2 and len(err.strip().splitlines()) == 1 and "not modelled" in err


def test_pipelining_schedule_send_recv_paired():
    """Schedule1F1B's batch_isend_irecv over the pp group: 4 activations forward and 4 gradients back per step and pair."""
    got = _groups("pipe-dp")
    assert {n: (d, r, x) for n, (d, r, x, _) in got.items()} == {
        "1": ("mesh_dp", (0, 2), {"DP": 2 * 4}), "2": ("mesh_dp", (1, 3), {"DP": 2 * 4}),
        "3": ("mesh_pp", (0, 1), {"PP": 16 * 2}), "4": ("mesh_pp", (2, 3), {"PP": 16 * 2})}


def test_fsdp_beside_pipeline_stages_refused_as_such(capsys):
    """A dagprof run of pipe-dp: each stage wraps its own half under FSDP2, so ranks 0 and 1 hold different units; it was
    refused as "another job's or a damaged file"."""
    code = main(["analyze", str(FRESH / "pipe-dp-dagprof")])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "never shard together" in err and "FSDP beside pipeline stages" in err and "damaged" not in err
