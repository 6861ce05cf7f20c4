"""What a reviewer's fresh PyTorch scripts found, on their real recordings: DDP's sparse embedding gradients sized at the
rows gloo all-gathers (not the dense table), and reentrant activation checkpointing's no_grad forwards not taken for an
evaluation pass, while a checkpoint-wrapped FSDP2 model's evaluation passes still are."""
from __future__ import annotations

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json

from dagprof.cli.main import main
from dagprof.collect.hooks.ddp_buckets import sparse_wire_bytes
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.passes.buckets import refuse_own_ddp_setup, sparse_buckets
from dagprof.passes.data_parallel import to_data_parallel
from dagprof.passes.workers import scale_workers
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommKind, Kind
from dagprof.traces.run_schema import Rec

SPARSE = DATA / "ddp-fresh" / "sparse"  # bench/ddp_fresh/sparse_recsys.py: 3 EmbeddingBag(20000, 32, sparse=True) + MLPs
TABLE_BYTES = 20000 * 32 * 4


def bucket_comms(g) -> np.ndarray:
    return np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.bucket >= 0))


def test_a_sparse_gradients_bucket_is_an_all_gather_of_the_rows_touched():
    """Each table's bucket carries the rows a step touched, gathered from both ranks (256 bags of 1-8 ids: under 2,304
    rows of 128 B plus 8 B of index each, per rank), not the 2.4 MiB table; the dense MLPs' bucket stays an all-reduce."""
    run = read_run(SPARSE)
    assert not any("fewer all-reduces" in w or "nowhere" in w for t in run.ranks for w in t.meta.warnings)  # Kineto's spans matched
    g = build_graph(run)
    comms = bucket_comms(g)
    assert sparse_buckets(g) == {0, 1, 2}
    for v in comms.tolist():
        kind = g.comm_kind[v]
        if int(g.bucket[v]) in (0, 1, 2):
            assert kind == CommKind.ALL_GATHER
            assert 2 * 256 * (32 * 4 + 8) <= g.nbytes[v] <= 2 * 256 * 8 * (32 * 4 + 8) < TABLE_BYTES
        else:
            assert kind == CommKind.ALL_REDUCE
            assert g.nbytes[v] == sum(b.nbytes for b in run.ranks[0].buckets if b.index == 3)


def test_sparse_buckets_are_refused_where_new_buckets_are_laid_out_and_gather_more_with_more_workers():
    g = build_graph(read_run(SPARSE))
    refuse_own_ddp_setup(g, "a link what-if", wire=True)
    with pytest.raises(DagprofError, match="3 sparse gradients"):
        refuse_own_ddp_setup(g, "--bucket-mb")
    out = scale_workers(g, 4)
    before, after = bucket_comms(g), bucket_comms(out)
    gathered = lambda h, c: {(int(h.step[v]), int(h.bucket[v])): int(h.nbytes[v]) for v in c.tolist()}  # noqa: E731
    was, now = gathered(g, before), gathered(out, after)
    assert now == {k: 2 * nb if k[1] in (0, 1, 2) else nb for k, nb in was.items()}


@pytest.mark.parametrize("argv, code", [
    (["whatif", "--bandwidth", "200Mbit", "--workers", "2,4", "--allow-model-error", "--no-trace"], 0),
    (["whatif", "--bucket-mb", "1", "--allow-model-error", "--no-trace"], 2),
    (["optimize", "--budget", "1"], 2),
])
def test_the_commands_price_or_refuse_a_sparse_job(tmp_path, capsys, argv, code):
    assert main([argv[0], str(SPARSE), "-o", str(tmp_path / "out"), *argv[1:]]) == code
    if code:
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "sparse gradients" in err[0]


def test_analyze_names_a_sparse_bucket_and_offers_no_search_for_it(tmp_path, capsys):
    assert main(["analyze", str(SPARSE)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # wherever the terminal's width folds a line
    assert "all-gather sparse bucket" in out and "all-reduce bucket 0" not in out
    assert "3 sparse gradients go in buckets of their own" in out and "(dagprof optimize)" not in out


def test_diff_matches_sparse_buckets_whose_rows_differ(tmp_path, capsys):
    """Another run touches other rows: its sparse buckets gather other bytes, and are the same buckets all the same (they
    were ops without a counterpart, their time put down to structure, and 'gradient buckets differ' was said)."""
    other = copy_fixture(tmp_path, "ddp-fresh/sparse")
    for r in (0, 1):
        def more_rows(doc):
            sparse = {rec[2] for rec in doc["records"] if rec[0] == Rec.ENQ_BEGIN and rec[4] == 1}
            for rec in doc["records"]:
                if rec[0] == Rec.ENQ_END and rec[2] in sparse:
                    rec[4] = int(rec[4] * 1.1)
        edit_json(other / f"rank{r}.json", more_rows)
    assert main(["diff", str(SPARSE), str(other), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "matched 100.0 %" in out or "100.0 % of A" in out
    assert "note: ops without a counterpart" not in out and "buckets differ" not in out


def test_the_collector_sizes_a_sparse_gradient_by_its_coalesced_rows():
    torch = pytest.importorskip("torch")
    grad = torch.sparse_coo_tensor(torch.tensor([[3, 7, 3]]), torch.ones(3, 16), (100, 16), check_invariants=True)  # row 3 twice: 2 rows
    assert sparse_wire_bytes(grad, 2) == 2 * (2 * 8 + 2 * 16 * 4)


def test_reentrant_checkpointing_is_no_evaluation_pass():
    """bench/ddp_fresh/ckpt_static_tied.py: checkpoint(use_reentrant=True) runs every block's forward under no_grad, and
    again inside backward; no step is said to hold an evaluation pass."""
    p = open_run(DATA / "ddp-fresh" / "ckpt-static")
    assert not [w for w in p.warnings if "torch.no_grad" in w]
    g = p.graph
    fwd = np.flatnonzero(g.kind == Kind.FORWARD)
    assert sum(g.layers[g.layer[v]].startswith("blocks.0.") for v in fwd.tolist()) == 2 * 2 * 3 * 2  # ranks, steps, leaves, runs


def test_ddp_to_fsdp_gathers_a_unit_before_its_recomputation():
    """--data-parallel fsdp from a checkpointed DDP profile: each block's forward runs again in backward, after FSDP
    gathered the block again (it was taken for forward: the gather went after it, between it and the block's backward)."""
    g = open_run(DATA / "ddp-fresh" / "ckpt-static").graph
    out = to_data_parallel(g, "fsdp", None, None, None)
    for step in out.meta.steps:
        for rank in (0, 1):
            lane = np.flatnonzero((out.rank == rank) & (out.step == step))
            names = [out.node_name(int(v)).split(".", 1)[1] for v in lane[np.argsort(out.order[lane], kind="stable")]]
            first_bwd = next(k for k, n in enumerate(names) if n.endswith(" backward"))
            recomputed = [k for k, n in enumerate(names) if k > first_bwd and n.startswith("blocks.") and n.endswith(" forward")]
            assert len(recomputed) == 4 * 3
            for k in recomputed:
                block = ".".join(names[k].split(".")[:2])
                gathered = [j for j, n in enumerate(names) if n == f"wait all_gather {block}"]
                assert any(first_bwd < j < k for j in gathered), (step, rank, names[k])


def test_evaluation_passes_of_a_checkpoint_wrapped_fsdp_model_are_counted():
    """bench/fsdp_fresh/gnn_ckpt_eval.py: non-reentrant checkpoint_wrapper layers recompute in backward, and an evaluation
    pass under no_grad runs between two steps: all 23 leaves' forwards of it are counted, in the 2 steps that hold one."""
    p = open_run(DATA / "fsdp-fresh" / "gnn-ckpt-eval")
    (said,) = [w for w in p.warnings if "torch.no_grad" in w]  # once for both ranks
    assert said.startswith("ranks 0-1: 2 of 3 profiled steps (step 2, 4) ran 46 layer forwards") and len(p.rank_warnings[said]) == 2
