"""Mesh labels on jobs dagprof was not built with (issue 16): stock torch.profiler traces of bench/tp_fresh's jobs.

tests/data/tp-fresh (``bench/tp_fresh/review.py --fixtures`` re-records them; gloo, torch 2.13, 2 profiled steps):
``tp-sp`` tensor + sequence parallel on 2 ranks (AdamW), ``tp-outer`` DP x TP with TP the outer mesh dimension (TP groups
{0,2},{1,3}; DDP over DTensor, SGD), ``pp-dp`` hand-written pipeline (send/recv) x DDP, ``ep-dp`` all-to-all experts
beside DDP. Also each with its process groups stripped, as an old Megatron-style trace, or no ``distributedInfo`` at all.
"""
import gzip
import json

import numpy as np
import pytest
from testdata import DATA

import dagprof
from dagprof.analysis.breakdown import iteration_times
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.passes import scale_workers, set_topology
from dagprof.passes.comm import current_topology
from dagprof.passes.compute import COMPUTE_KINDS
from dagprof.passes.workers import refuse_degree
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.traces.parallelism import Dim, label_run

FRESH = DATA / "tp-fresh"


def _groups(path) -> dict[str, tuple[str, tuple[int, ...], dict[str, int]]]:
    """The labelled groups as the graph has them (gloo's collectives moved to their mesh groups first)."""
    par = dagprof.build_graph(dagprof.load(path)).meta.parallel
    return {g.name: (g.desc, g.ranks, g.dims) for g in par.groups}


def _stripped(tmp_path, name: str, keep_identity: bool):
    """The vendored traces of ``name`` without pg_config (``keep_identity``) or without distributedInfo."""
    out = tmp_path / f"{name}-{'stripped' if keep_identity else 'nodist'}"
    out.mkdir()
    for path in (FRESH / name).glob("*.json.gz"):
        with gzip.open(path) as f:
            doc = json.load(f)
        if keep_identity:
            del doc["distributedInfo"]["pg_config"]
        else:
            del doc["distributedInfo"]
        (out / path.name.removesuffix(".gz")).write_text(json.dumps(doc))
    return out


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_sequence_parallel_all_gathers_and_partial_gradients_are_tp():
    """DTensor's all-gathers (unknown before) and the optimizer's all-reduces of the norms' partial gradients (DP before)."""
    par, _ = label_run(dagprof.load(FRESH / "tp-sp"))
    assert par.describe() == "TP x2" and not par.dp_size
    (grp,) = par.groups
    assert set(grp.dims) == {"TP"} and any("issued by a DTensor op" in e for e in grp.evidence)


def test_tp_as_the_outer_mesh_dimension():
    """TP groups {0,2},{1,3}: DDP over a DTensor model reduces the replicated norms' partial gradients in from_local's backward."""
    got = _groups(FRESH / "tp-outer")
    assert {n: (d, r, set(x)) for n, (d, r, x) in got.items()} == {
        "1": ("mesh_tp", (0, 2), {"TP"}), "2": ("mesh_tp", (1, 3), {"TP"}),
        "3": ("mesh_dp", (0, 1), {"DP"}), "4": ("mesh_dp", (2, 3), {"DP"})}
    assert all(x["DP"] == 2 * 2 for d, _, x in got.values() if d == "mesh_dp")  # one DDP bucket a step, 2 steps, 2 ranks


def test_dp_whatif_on_tp_outer_leaves_tp_alone():
    g = dagprof.build_graph(dagprof.load(FRESH / "tp-outer"))
    g = set_topology(g, current_topology(g))
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    tp = comm & (g.dim == Dim.TP)
    assert tp.any() and (comm & (g.dim == Dim.DP)).any() and not (comm & (g.dim == Dim.UNKNOWN)).any()
    g8 = scale_workers(g, 8)
    c8 = (g8.kind == Kind.COMM) & (g8.rank < 0)
    assert g8.meta.parallel.dp_size == 4
    assert np.array_equal(g8.dur[c8 & (g8.dim == Dim.TP)], g.dur[tp]) and np.array_equal(g8.nbytes[c8 & (g8.dim == Dim.TP)], g.nbytes[tp])
    with pytest.raises(DagprofError, match="TP degree of 4 is not modelled"):
        refuse_degree(g, Dim.TP, 4, "--tp-degree")
    refuse_degree(g, Dim.TP, 2, "--tp-degree")


def test_tp_only_whatifs_refused_in_one_line(capsys, tmp_path):
    for argv, why in [(("--workers", 4), "re-price data-parallel collectives only, and this trace has none"),
                      (("--tp-degree", 4), "TP degree of 4 is not modelled (profiled: 2)")]:
        code, out, err = _cli(capsys, "whatif", FRESH / "tp-sp", *argv, "--allow-model-error", "-o", tmp_path)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1 and out == "", (argv, err)


def test_groups_stripped_claim_no_sizes_and_refuse(capsys, tmp_path):
    """Without pg_config every gloo collective sits in the default group: the labels still tell DP from TP, but the
    group's size is not either's degree, so a TP degree (even the profiled 2), --workers and re-pricing on another link are
    refused (the collectives are matched across all ranks in issue order; nothing waits for them in the graph)."""
    run = _stripped(tmp_path, "tp-outer", keep_identity=True)
    par, _ = label_run(dagprof.load(run))
    assert par.describe() == "DP, TP" and par.groups[0].ranks == () and par.ungrouped
    for argv, why in [(("--tp-degree", 2), "TP degree of 2 is not modelled (profiled: not recorded"),
                      (("--workers", 8), "does not say which process group each collective ran in"),
                      (("--bandwidth", "1Gbit"), "does not say which process group each collective ran in")]:
        code, out, err = _cli(capsys, "whatif", run, *argv, "--allow-model-error", "-o", tmp_path)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1 and out == "", (argv, err)


def test_traces_without_distributed_info_take_the_folders_world_size(tmp_path):
    """Older torch writes no distributedInfo: each file alone says only rank + 1 ranks (refused as 'not one job' before)."""
    run = dagprof.load(_stripped(tmp_path, "ep-dp", keep_identity=False))
    assert [t.world_size for t in run.ranks] == [2, 2] and run.ranks[0].group_ranks["0"] == [0, 1]
    assert label_run(run)[0].describe() == "DP x2, EP/CP x2"


def test_pipeline_send_recv_paired_across_stages(capsys, tmp_path):
    """Each send meets its peer stage's recv (by group, peer and order): matched by position like a collective, stage 0's
    send met stage 1's send, and the recv ran inside its op with its wait for the peer as framework overhead."""
    got = _groups(FRESH / "pp-dp")
    assert {n: (d, r, set(x)) for n, (d, r, x) in got.items()} == {
        "1": ("mesh_pp", (0, 2), {"PP"}), "2": ("mesh_pp", (1, 3), {"PP"}),
        "3": ("mesh_dp", (0, 1), {"DP"}), "4": ("mesh_dp", (2, 3), {"DP"})}
    g = dagprof.build_graph(dagprof.load(FRESH / "pp-dp"))
    pp = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.PP))
    assert len(pp) == 2 * 2 * 2 * 2 and not g.meta.parallel.unpaired_p2p  # per pipeline pair: 2 steps x 2 micro-batches x fwd/bwd
    for c in pp.tolist():
        (sync,) = g.predecessors(c).tolist()
        senders = {int(g.rank[u]) for u in g.predecessors(sync).tolist()}
        receivers = {int(g.rank[v]) for v in g.successors(c).tolist()}
        assert senders in ({0, 2}, {1, 3}) and receivers and receivers <= senders, (senders, receivers)  # a sender done early: its own join
    got = iteration_times(g, replay(g))
    assert max(abs(got[r] / g.meta.measured_iter_us[r] - 1) for r in range(4)) < 1e-3  # the measured run, bubbles and all
    code, out, _ = _cli(capsys, "analyze", FRESH / "pp-dp", "--json")
    r = json.loads(out)
    assert code == 0 and [d["dim"] for d in r["communication_by_dim"]] == ["DP", "PP"]
    assert any("PP send" in n and "paired across ranks" in n for n in r["parallelism"]["notes"])
    code, out, err = _cli(capsys, "whatif", FRESH / "pp-dp", "--pp-degree", 4, "-o", tmp_path)
    assert code == 2 and "PP degree of 4 is not modelled (profiled: 2)" in err and len(err.strip().splitlines()) == 1


def test_a_slower_stage_moves_the_other_through_send_recv():
    """Stage 0 (ranks 0, 1) and stage 1 (ranks 2, 3) share no data-parallel group: only the pairs tie them."""
    g = dagprof.build_graph(dagprof.load(FRESH / "pp-dp"))
    base = iteration_times(g, replay(g))
    slow = np.isin(g.rank, [0, 1]) & np.isin(g.kind, [int(k) for k in COMPUTE_KINDS])
    dur = g.dur.copy()
    dur[slow] *= 4
    got = iteration_times(g, replay(g.replace(dur=dur)))
    added = float(g.dur[slow].sum()) * 3 / len(g.meta.steps) / 2  # per iteration and stage-0 rank
    for r in (2, 3):
        assert got[r] - base[r] > 0.25 * added, (r, got[r] - base[r], added)


def test_compute_speed_on_pipeline_and_tp_only_jobs(capsys, tmp_path):
    """TP-only: refused before (no data-parallel collective to fit a link to), though every collective keeps its measured
    time; PP: the stages' waits move with them. Faster, and by no more than the compute on any path (at most all of it) allows."""
    for run in (FRESH / "pp-dp", FRESH / "tp-sp", FRESH / "tp-outer", DATA / "hybrid-tp-only"):
        g = dagprof.build_graph(dagprof.load(run))
        compute = float(g.dur[(g.rank >= 0) & np.isin(g.kind, [int(k) for k in COMPUTE_KINDS])].sum()) / len(g.meta.steps)
        code, out, err = _cli(capsys, "whatif", run, "--compute-speed", 2, "--allow-model-error", "--json", "-o", tmp_path)
        assert code == 0, err
        r = json.loads(out)
        model, (row,) = r["model_iter_ms"] * 1e3, r["scenarios"]
        pred = row["predicted_iter_ms"] * 1e3
        assert max(model / 2, model - compute / 2) <= pred < model, (run.name, model, pred, compute)


def test_dagprof_run_pipeline_send_recv_unpaired_refuse_compute_speed(capsys, tmp_path):
    code, out, err = _cli(capsys, "whatif", FRESH / "pp-dp-dagprof", "--compute-speed", 2, "--allow-model-error", "-o", tmp_path)
    assert code == 2 and "--compute-speed on this pipeline job is not modelled: 32 send/recv" in err and len(err.strip().splitlines()) == 1


def test_expert_all_to_all_beside_dp():
    got = _groups(FRESH / "ep-dp")
    assert {n: set(x) for n, (_, _, x) in got.items()} == {"0": {"EP/CP", "DP"}}


def test_dagprof_run_of_a_hybrid_job_knows_its_tp_degree(capsys, tmp_path):
    """dagprof's hooks see DDP over the DP sub-mesh only; its Kineto trace shows the TP all-reduces inside the ops, labelled by
    their mesh_tp groups of 2 (``in_op_groups``): TP 1 is refused as 'profiled: 2' (it was accepted at first, then refused
    as 'which dimension they hold not recorded'), and TP 2 is the profiled degree."""
    code, out, err = _cli(capsys, "whatif", DATA / "hybrid-dp-tp-dagprof", "--tp-degree", 1, "-o", tmp_path)
    assert code == 2 and "a TP degree of 1 is not modelled (profiled: 2)" in err
    assert len(err.strip().splitlines()) == 1 and out == ""
    code, out, err = _cli(capsys, "whatif", DATA / "hybrid-dp-tp-dagprof", "--tp-degree", 2, "-o", tmp_path)
    assert code == 0 and "Traceback" not in err


def test_mesh_on_a_dagprof_run_of_fsdp_beside_tp_refuses_as_hybrid(capsys, tmp_path):
    """FSDP2 over the dp sub-mesh beside TP (stop 58's MLP-Mixer, here the vendored T5): ``--mesh 1x4`` said "the graph holds
    4 of 4 ranks (mesh 1x2); give it the unfolded profile", which a user cannot act on; analyze said the TP ranks' other
    collectives were "not recorded", though the run counts them inside the ops."""
    for mesh in ("1x4", "2x2"):
        code, out, err = _cli(capsys, "whatif", FRESH / "t5-dp-tp-dagprof", "--mesh", mesh, "-o", tmp_path)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "shards over 2 of its 4 ranks beside another dimension" in err and "unfolded" not in err
    code, out, err = _cli(capsys, "analyze", FRESH / "t5-dp-tp-dagprof")
    assert code == 0 and "timed inside the ops that issued them: TP)" in out and "not recorded" not in out


def test_a_dagprof_run_of_fsdp_beside_tp_counts_its_tp_collectives_under_tp_inside_the_ops(capsys, tmp_path):
    """The TP all-reduces a dagprof FSDP x TP run times inside the layers (no hook sees them; Kineto shows them on the TP
    group's own gloo threads, as a stock trace's are grouped) were in no row of the breakdown by dimension: each is now
    labelled by its group's description (DeviceMesh's mesh_tp) and counted under TP as time inside the ops; a DDP run's
    (SyncBatchNorm's, in DDP's group) count under DP, and no TP row appears."""
    run = read_run(FRESH / "t5-dp-tp-dagprof")
    for t in run.ranks:  # 16 in the layers a step (the README's count) and clipping's over tp; clipping's 2 over dp
        tp, dp = f"{t.rank // 2 * 2},{t.rank // 2 * 2 + 1}", f"{t.rank % 2},{t.rank % 2 + 2}"  # mesh (dp, tp) = (2, 2)
        assert {(x.group, x.dim): x.count for x in t.meta.in_op_groups} == {(tp, "TP"): 17, (dp, "DP"): 2}
        assert all(x.us > 0 for x in t.meta.in_op_groups)
    a = open_run(FRESH / "t5-dp-tp-dagprof").analysis
    rows = {d.dim: d for d in a.comm_dims}
    recorded = [x for t in run.ranks for x in t.meta.in_op_groups if x.dim == "TP"]
    tp = rows[Dim.TP]
    assert tp.collectives == 0 and tp.replayed_us == 0 and tp.groups == ["0,1", "2,3"]
    assert tp.inside_ops == sum(x.count for x in recorded) / 2 == 34  # group instances: each rank's over its group's 2
    assert tp.inside_us == pytest.approx(sum(x.us for x in recorded) / 2)
    assert rows[Dim.DP].collectives == 12 and rows[Dim.DP].inside_ops == 4  # the graph's own DP collectives unchanged
    code, out, err = _cli(capsys, "analyze", FRESH / "t5-dp-tp-dagprof", "--json")
    row = next(d for d in json.loads(out)["communication_by_dim"] if d["dim"] == "TP")
    assert code == 0 and row["inside_ops_per_iter"] == 34 and row["inside_ops_ms_per_iter"] == pytest.approx(tp.inside_us / 1e3)
    code, out, err = _cli(capsys, "report", FRESH / "t5-dp-tp-dagprof", "-o", tmp_path, "--json")
    html = open(json.loads(out)["files"]["report"]).read()
    assert code == 0 and "<td>TP</td>" in html and "inside the ops ms" in html
    syncbn = open_run(DATA / "ddp-fresh" / "syncbn").analysis
    rows = {d.dim: d for d in syncbn.comm_dims}
    assert set(rows) == {Dim.DP} and rows[Dim.DP].inside_ops / syncbn.steps == (9 + 9) * 2 / 2  # a step and rank, 2 ranks, one group


def test_a_dagprof_run_of_fsdp_beside_tp_sizes_its_tp_collectives_as_the_models_shapes_imply(capsys, tmp_path):
    """FSDP's recorder patched the functional collectives for none of the job's own calls, so the TP row of an FSDP x TP run
    had a count and a time but no bytes. Now each DTensor all-reduce outside FSDP's calls is recorded (kind, group size, bytes
    per rank) and its bytes reach the TP row. bench/tp_fresh/t5_dp_tp.py --layers 1 (batch 4, source 16, target 12, dim 64,
    fp32) per rank and step over tp: 8 all-reduces of batch x 16 x 64 x 4 bytes (the encoder's 2 row-wise outputs, its 4
    column-wise inputs' gradients, the cross-attention's k and v of the memory) and 8 of batch x 12 x 64 x 4 (the decoder's
    3 outputs, 5 input gradients), and clipping's norms of its 16 TP-split weights (4 bytes each); over dp, clipping's
    norms of 13 replicated tensors and of the 16."""
    enc, dec = 4 * 16 * 64 * 4, 4 * 12 * 64 * 4
    tp_bytes, dp_bytes = 8 * enc + 8 * dec + 16 * 4, 13 * 4 + 16 * 4
    run = read_run(FRESH / "t5-dp-tp-dagprof")
    for t in run.ranks:
        got = {x.dim: (x.count, x.sized, x.nbytes) for x in t.meta.in_op_groups}
        assert got == {"TP": (17, 17, tp_bytes), "DP": (2, 2, dp_bytes)}
        pieces = t.events.nbytes[t.events.group_size > 0]  # those that blocked their op: re-priced by link what-ifs
        assert len(pieces) and set(pieces.tolist()) <= {enc, dec, 16 * 4, 13 * 4}
    code, out, err = _cli(capsys, "analyze", FRESH / "t5-dp-tp-dagprof", "--json")
    row = next(d for d in json.loads(out)["communication_by_dim"] if d["dim"] == "TP")
    assert code == 0 and row["inside_ops_mb_per_iter"] == pytest.approx(2 * tp_bytes / 2 ** 20)  # two TP groups, 1 step
    assert row["inside_ops_sized_per_iter"] == row["inside_ops_per_iter"] == 34
    code, out, err = _cli(capsys, "analyze", FRESH / "t5-dp-tp-dagprof")
    assert f"34.0 inside the ops, {2 * tp_bytes / 2 ** 20:.3f} MB," in " ".join(out.split())
    code, out, err = _cli(capsys, "report", FRESH / "t5-dp-tp-dagprof", "-o", tmp_path, "--json")
    assert code == 0 and "inside the ops MB" in open(json.loads(out)["files"]["report"]).read()
    for flag, value, said in (("--workers", "8", "--workers keeps the 17 at their measured time and group size"),
                              ("--bandwidth", "100Mbit", "link what-ifs re-price")):
        code, out, err = _cli(capsys, "whatif", FRESH / "t5-dp-tp-dagprof", flag, value, "--no-trace", "--allow-model-error",
                              "-o", tmp_path)
        out = " ".join(out.split())  # wherever the terminal's width folds a line
        assert code == 0 and "17 TP collectives a step per rank ran inside the ops" in out and said in out


def test_a_dagprof_run_of_fsdp1_beside_tp_sizes_its_tp_collectives_as_the_models_shapes_imply(capsys):
    """FSDP1's recorder patched FSDP's own c10d calls only, so an FSDP1 x TP job's DTensor all-reduces had a count and a time
    in the TP row but no bytes, and link what-ifs kept them as measured. It now patches the functional collectives as
    FSDP2's does. bench/tp_fresh/fsdp1_tp.py --layers 1 (batch 4, seq 16, dim 64, fp32) per rank and step over tp: 2
    all-reduces in forward (proj's and down's outputs) and 4 in backward (q's, k's, v's and up's input gradients), each
    4 x 16 x 64 x 4 bytes."""
    one = 4 * 16 * 64 * 4
    run = read_run(FRESH / "fsdp1-tp-dagprof")
    for t in run.ranks:
        assert t.meta.fsdp.api == "FullyShardedDataParallel"
        assert {x.dim: (x.count, x.sized, x.nbytes) for x in t.meta.in_op_groups} == {"TP": (6, 6, 6 * one)}
        pieces = t.events.nbytes[t.events.group_size > 0]  # those that blocked their op: re-priced by link what-ifs
        assert len(pieces) and set(pieces.tolist()) == {one}
    code, out, err = _cli(capsys, "analyze", FRESH / "fsdp1-tp-dagprof", "--json")
    row = next(d for d in json.loads(out)["communication_by_dim"] if d["dim"] == "TP")
    assert code == 0 and row["inside_ops_mb_per_iter"] == pytest.approx(2 * 6 * one / 2 ** 20)  # two TP groups, 1 step


def test_a_dagprof_run_of_fsdp_beside_tp_cuts_each_functional_collective_where_kinetos_wait_tensor_held_its_end():
    """DTensor's backward waits on its all-reduces through C++, not the patched ``wait_tensor``: where the recorded wait came
    after the transfer's end, the all-reduce counted as hidden and link what-ifs left it as measured inside its op
    (``run_comm.in_op_sizes``). On the T5 fixture 13-14 of a rank's 19 were pieces; with Kineto's waits, all but one of
    rank 0's (its transfer ended before any wait)."""
    run = read_run(FRESH / "t5-dp-tp-dagprof")
    assert [int((t.events.group_size > 0).sum()) for t in run.ranks] == [18, 19, 19, 19]


def test_compute_speed_on_a_dagprof_run_beside_tp_says_its_tp_collectives_speed_up_with_their_ops(capsys, tmp_path):
    """The TP all-reduces a dagprof run times inside the layers (about a quarter of stop 58's MLP-Mixer step) are divided by
    --compute-speed with those ops, where the note said every non-DP collective kept its measured time."""
    for flag, said in (("--compute-speed", True), ("--bandwidth", False)):
        code, out, err = _cli(capsys, "whatif", FRESH / "t5-dp-tp-dagprof", flag, "2" if said else "1Gbit", "--no-trace",
                              "--allow-model-error", "-o", tmp_path)
        assert code == 0 and ("timed inside the ops with them: the gain is an upper bound" in out) is said


def test_dagprof_run_keeps_pipeline_send_recv_out_of_the_data_parallel_dimension(capsys, tmp_path):
    """dagprof's hooks see DDP; Kineto adds the main thread's send/recv, in DDP's group: they were labelled DP and
    --workers re-priced them as data-parallel collectives."""
    g = dagprof.build_graph(dagprof.load(FRESH / "pp-dp-dagprof"))
    par = g.meta.parallel
    assert par.describe() == "DP x2, PP" and par.dp_size == 2
    assert {x.name: set(x.dims) for x in par.groups} == {"ddp 0,1": {"DP"}, "ddp 2,3": {"DP"}, "ddp 0,1 (PP)": {"PP"}, "ddp 2,3 (PP)": {"PP"}}
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    assert int((comm & (g.dim == Dim.PP)).sum()) == 0 and int((comm & (g.dim == Dim.DP)).sum()) == 2 * 2
    # in DDP's group, not theirs: unpaired (each rank's own node, as measured), not joined with the DDP peer's send/recv
    lone = (g.kind == Kind.COMM) & (g.rank >= 0)
    assert int(lone.sum()) == 2 * 2 * 2 * 2 * 2 and par.unpaired_p2p.startswith("32 send/recv")  # 4 ranks x 2 steps x 2 micro x fwd/bwd
    g8 = scale_workers(set_topology(g, current_topology(g)), 8)
    assert int(((g8.kind == Kind.COMM) & (g8.rank < 0) & (g8.dim == Dim.DP)).sum()) == 2 * 2
    code, out, err = _cli(capsys, "whatif", FRESH / "pp-dp-dagprof", "--pp-degree", 2, "-o", tmp_path)
    assert code == 2 and "PP degree of 2 is not modelled (profiled: not recorded" in err and len(err.strip().splitlines()) == 1


def test_dagprof_run_with_an_unseen_all_to_all_refuses_workers(capsys, tmp_path):
    """The experts' all-to-alls run inside the forward and backward ops, so only Kineto shows them: the job looked
    like plain DDP and --workers answered as such."""
    par = dagprof.build_graph(dagprof.load(FRESH / "ep-dp-dagprof")).meta.parallel
    assert par.describe() == "DP x2, EP/CP" and any("EP/CP all_to_all" in n and "inside the ops" in n for n in par.notes)
    code, out, err = _cli(capsys, "whatif", FRESH / "ep-dp-dagprof", "--workers", 4, "--allow-model-error", "-o", tmp_path)
    assert code == 2 and "does not say which ranks the EP/CP collectives" in err and len(err.strip().splitlines()) == 1 and out == ""


def test_pipeline_without_process_groups_refused_saying_why(capsys, tmp_path):
    """Stage 0 and stage 1 issue different collectives; with every one in group 0 they cannot be matched."""
    code, out, err = _cli(capsys, "analyze", _stripped(tmp_path, "pp-dp", keep_identity=True))
    assert code == 2 and "mismatched collectives" in err and "record no process group" in err
    assert len(err.strip().splitlines()) == 1 and out == ""
