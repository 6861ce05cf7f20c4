"""Each collective's mesh dimension (DP, TP, PP, EP/CP, unknown) on real traces, and what-ifs that respect it.

Fixtures: the 8-rank DLRM job (embedding all-to-all beside a dense all-reduce, old NCCL schema), our own
4-rank DP x TP DTensor job and a 2-rank TP-only one (gloo: no group per collective; ``tests/hybrid_job.py``
re-records them), a stock-profiled gloo DDP run and a dagprof-profiled one.
"""
import json

import numpy as np
import pytest
from testdata import DATA, GLOO_WINDOWS, KINETO_CORPUS, KINETO_PUBLIC

import dagprof
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.passes import scale_workers, set_topology
from dagprof.passes.comm import current_topology
from dagprof.passes.workers import replica_ranks
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.parallelism import Dim, desc_dim, label_run

DLRM = KINETO_CORPUS / "param" / "dlrm_kineto"
CPU_ONLY = KINETO_PUBLIC / "cpu_only"  # one gloo rank of 300: all-reduces outside any pass, in the default group
DP_TP = DATA / "hybrid-dp-tp"
DP_TP_RUN = DATA / "hybrid-dp-tp-dagprof"
TP_ONLY = DATA / "hybrid-tp-only"


def _labels(run) -> dict[CommKind, dict[str, int]]:
    """collective -> {dim: instances} over every rank, from the labelled events."""
    par, per_event = label_run(run)
    out: dict[str, dict[str, int]] = {}
    for trace, dims in zip(run.ranks, per_event):
        ev = trace.events
        coll = trace.meta.collectives.by_event()
        for i in np.flatnonzero(ev.kind == Kind.COMM).tolist():
            d = out.setdefault(coll[i], {})
            d[Dim(int(dims[i])).text] = d.get(Dim(int(dims[i])).text, 0) + 1
    return out


def _comm_dims(g) -> np.ndarray:
    return g.dim[(g.kind == Kind.COMM) & (g.rank < 0)]


@pytest.fixture(scope="module")
def hybrid_graph():
    g = dagprof.build_graph(dagprof.load(DP_TP))
    return set_topology(g, current_topology(g))  # the DP collectives priced by the fitted link, as whatif starts


def test_descriptions_name_dimensions():
    assert [desc_dim(d) for d in ("mesh_dp", "mesh_tp", "mesh_pp", "mesh_ep", "mesh_dp_shard", "TENSOR_MODEL_PARALLEL_GROUP")] == \
        [Dim.DP, Dim.TP, Dim.PP, Dim.EP_CP, Dim.DP, Dim.TP]
    assert [desc_dim(d) for d in ("DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "EXPERT_MODEL_PARALLEL_GROUP",
                                  "CONTEXT_PARALLEL_GROUP", "mesh_dp_shard_cp")] == [Dim.DP, Dim.PP, Dim.PP, Dim.EP_CP, Dim.EP_CP, Dim.DP]
    assert desc_dim("default_pg") is Dim.UNKNOWN and desc_dim("undefined") is Dim.UNKNOWN
    assert desc_dim("TENSOR_AND_DATA_PARALLEL_GROUP") is Dim.UNKNOWN


def test_dlrm_embedding_all_to_all_beside_dense_all_reduce():
    labels = _labels(dagprof.load(DLRM))
    assert labels == {CommKind.ALL_TO_ALL: {"EP/CP": 5 * 8}, CommKind.ALL_REDUCE: {"DP": 3 * 8}}


def test_dp_x_tp_job_labelled_and_matched_within_its_mesh_groups(hybrid_graph):
    par = hybrid_graph.meta.parallel
    assert par.describe() == "DP x2, TP x2" and par.dp_size == 2
    by_name = {grp.name: grp for grp in par.groups}
    assert {n: (grp.desc, grp.ranks, set(grp.dims)) for n, grp in by_name.items()} == {
        "1": ("mesh_dp", (0, 2), {"DP"}), "2": ("mesh_dp", (1, 3), {"DP"}),
        "3": ("mesh_tp", (0, 1), {"TP"}), "4": ("mesh_tp", (2, 3), {"TP"})}
    dims = _comm_dims(hybrid_graph)  # 3 steps: per TP pair 2 forward + 1 backward all-reduce, per DP pair one bucket
    assert int((dims == Dim.TP).sum()) == 2 * 3 * 3 and int((dims == Dim.DP).sum()) == 2 * 3
    assert any("assigned to their mesh group by position" in n for n in par.notes)


def test_tp_without_group_records_labelled_from_position_and_size():
    run = dagprof.load(DP_TP)
    for t in run.ranks:  # as an old trace: no description tells the groups apart
        t.meta.group_desc = {}
    assert _labels(run) == {CommKind.ALL_REDUCE: {"TP": 9 * 4, "DP": 3 * 4}}
    tp_only = dagprof.load(TP_ONLY)  # one group spanning the job, as an old Megatron TP trace
    assert _labels(tp_only) == {CommKind.ALL_REDUCE: {"TP": 9 * 2}}


def test_gloo_ddp_runs_are_all_data_parallel(prof):
    assert _labels(dagprof.load(GLOO_WINDOWS / "same")) == {CommKind.ALL_REDUCE: {"DP": 6 * 2}, CommKind.BROADCAST: {"DP": 6 * 2}}
    dims = _comm_dims(prof.graph)  # a dagprof-profiled DDP run: its buckets say so
    assert len(dims) and (dims == Dim.DP).all() and not prof.graph.meta.parallel.hybrid


def test_dp_whatif_scales_data_parallel_only_and_leaves_tp_alone(hybrid_graph):
    g = hybrid_graph
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    tp, dp = comm & (g.dim == Dim.TP), comm & (g.dim == Dim.DP)
    assert replica_ranks(g) == 2
    g8 = scale_workers(g, 8)
    assert g8.meta.parallel.dp_size == 4 and g8.meta.world_size == 8
    c8 = (g8.kind == Kind.COMM) & (g8.rank < 0)
    assert np.array_equal(g8.dur[c8 & (g8.dim == Dim.TP)], g.dur[tp])  # TP groups keep their size and traffic
    assert np.array_equal(g8.nbytes[c8 & (g8.dim == Dim.TP)], g.nbytes[tp])
    assert (g8.dur[c8 & (g8.dim == Dim.DP)] > g.dur[dp]).all()  # ring all-reduce over 4 instead of 2 ranks
    with pytest.raises(DagprofError, match="multiple of 2"):
        scale_workers(g, 5)


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_whatif_refuses_what_it_does_not_model_in_one_line(capsys, tmp_path):
    for argv, why in [((DP_TP, "--tp-degree", 4), "TP degree of 4 is not modelled"),
                      ((DP_TP, "--pp-degree", 2), "PP degree of 2 is not modelled"),
                      ((TP_ONLY, "--workers", 16), "re-price data-parallel collectives only, and this trace has none"),
                      ((DLRM, "--workers", 16), "EP/CP collectives of group 0 span data-parallel ranks"),
                      ((CPU_ONLY, "--allow-missing-ranks", "--workers", 600), "nothing tells the unknown ones' dimension")]:
        code, out, err = _cli(capsys, "whatif", *argv, "-o", tmp_path)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1 and out == "", (argv, err)


def test_whatif_and_analyze_on_a_hybrid_job(capsys, tmp_path):
    # the stock trace's model of itself is +4.3 % (gloo's collectives on busy cores): past the 2 % gate, so asked for explicitly
    code, out, _ = _cli(capsys, "whatif", DP_TP, "--workers", "4,8", "--tp-degree", 2, "--allow-model-error", "--json", "--no-trace", "-o", tmp_path)
    assert code == 0
    r = json.loads(out)
    assert [row["workers"] for row in r["scenarios"]] == [4, 8]
    assert r["scenarios"][0]["speedup_vs_profiled"] == pytest.approx(1.0)
    assert any("only the data-parallel collectives are modelled" in n for n in r["notes"])
    code, out, _ = _cli(capsys, "analyze", DP_TP, "--json")
    assert code == 0
    rows = {d["dim"]: d for d in json.loads(out)["communication_by_dim"]}
    assert set(rows) == {"DP", "TP"} and rows["TP"]["collectives_per_iter"] == 6 and rows["DP"]["collectives_per_iter"] == 2


def test_dagprof_profile_of_a_hybrid_job_scales_its_data_parallel_groups(capsys, tmp_path):
    """dagprof's hooks see DDP over the DP sub-mesh only; its rank files record that group's ranks."""
    g = dagprof.build_graph(dagprof.load(DP_TP_RUN))
    par = g.meta.parallel
    assert par.hybrid and par.dp_size == 2 and sorted(grp.name for grp in par.groups) == ["ddp 0,2", "ddp 1,3"]
    assert replica_ranks(g) == 2 and (_comm_dims(g) == Dim.DP).all()
    code, _, err = _cli(capsys, "whatif", DP_TP_RUN, "--workers", 5, "-o", tmp_path)
    assert code == 2 and "multiple of 2" in err
    code, out, _ = _cli(capsys, "whatif", DP_TP_RUN, "--workers", 8, "--json", "--no-trace", "-o", tmp_path)
    assert code == 0 and json.loads(out)["scenarios"][0]["workers"] == 8
