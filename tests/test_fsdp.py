"""FSDP2 (``fully_shard``) jobs: real recordings (tests/data/fsdp) read, built, replayed and what-if'd; one live zero-code run.

The recordings are 2-rank (4-rank for HSDP) gloo CPU runs of ``bench/fsdp_train.py`` (an embedding, 2 MLP
blocks and a head; every block and the root are units), profiled with hooks only.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from testdata import DATA

from dagprof.analysis import analyze
from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import check_fsdp_edges, fsdp_collectives, max_in_flight
from dagprof.graph.dag import NODE_COLUMNS, csr_graph
from dagprof.passes.link_fit import graph_world_size
from dagprof.replay import replay
from dagprof.search.scenario import Cluster, Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.traces.run_schema import RankFile, read_file

FSDP = DATA / "fsdp"
RESHARD, KEEP, HSDP = FSDP / "reshard", FSDP / "keep-bf16-prefetch", FSDP / "hsdp"
UNITS = ["<root>", "blocks.0", "blocks.1"]


def graph(path):
    return build_graph(read_run(path))


@pytest.mark.parametrize("path", [RESHARD, KEEP, HSDP])
def test_units_collectives_and_memory_are_read(path):
    run = read_run(path)
    assert run.meta.fsdp and not run.meta.ddp and not run.meta.warnings
    for t in run.ranks:
        info = t.meta.fsdp
        assert [u.name for u in info.units] == UNITS
        assert [t.layers[i] for i in info.units[1].layers] == ["blocks.0.up", "blocks.0.down"]
        assert [t.layers[i] for i in info.units[0].layers] == ["embed", "head"]  # not the blocks' layers
        shard = len(info.units[0].mesh) and info.units[0].mesh[-1]
        numel = sum(u.numel for u in info.units)
        assert info.param_shard_bytes == sum(u.shard_bytes for u in info.units) == numel * 4 // shard
        assert info.grad_shard_bytes == info.param_shard_bytes  # fp32 gradient shards
        assert info.optim_state_bytes == 2 * info.param_shard_bytes  # AdamW: two moments per element
        for c in info.collectives:
            unit = info.units[c.unit]
            full = unit.numel * (2 if c.dtype == "bfloat16" else 4)
            # an all-gather gathers, a reduce-scatter reduces, the whole unit; HSDP all-reduces the shard across replicas
            assert c.nbytes == (full // shard if c.kind == "all_reduce" else full), c


def test_rank_files_decode_into_the_typed_schema():
    f = read_file(RESHARD / "rank0.json", RankFile)
    assert [u.name for u in f.fsdp.units] == UNITS and f.fsdp.units[1].reshard_after_forward
    first = f.fsdp.collectives[0]
    assert (first.kind, first.unit, first.phase, first.prefetched_by, first.group) == ("all_gather", 0, "forward", -1, "0,1")


def test_mixed_precision_dtypes():
    info = read_run(KEEP).ranks[0].meta.fsdp
    assert {(u.param_dtype, u.reduce_dtype) for u in info.units} == {("bfloat16", "float32")}
    assert {(c.kind, c.dtype) for c in info.collectives} == {("all_gather", "bfloat16"), ("reduce_scatter", "float32")}


def test_hsdp_groups_split_shard_and_replicate():
    run = read_run(HSDP)
    assert run.ranks[0].meta.fsdp.units[0].mesh == [2, 2]
    assert [t.groups for t in run.ranks] == [["0,1", "0,2"], ["0,1", "1,3"], ["0,2", "2,3"], ["1,3", "2,3"]]
    kinds = {(c.kind, c.group) for c in run.ranks[0].meta.fsdp.collectives}
    assert kinds == {("all_gather", "0,1"), ("reduce_scatter", "0,1"), ("all_reduce", "0,2")}


@pytest.mark.parametrize("path, backward_gathers, prefetched", [(RESHARD, True, 8), (KEEP, False, 4), (HSDP, True, 16)])
def test_fsdp_orderings_are_edges(path, backward_gathers, prefetched):
    g = graph(path)
    counts = check_fsdp_edges(g)
    n = graph_world_size(g)
    steps = len(g.meta.steps)
    assert counts["forward_waits_all_gather"] == len(UNITS) * steps * n
    # reshard_after_forward: every unit gathered again in backward; kept: none
    assert counts["backward_all_gather_after_reshard"] == (len(UNITS) * steps * n if backward_gathers else 0)
    assert counts["reduce_scatter_after_backward"] == len(UNITS) * steps * n
    assert counts["prefetched"] == prefetched  # default backward prefetch (resharded) or explicit forward prefetch (KEEP)
    assert all(u.resharded_after_forward == backward_gathers for u in g.meta.fsdp.units)
    res = replay(g)
    assert max_in_flight(g, res.start, res.end) == 1  # gloo on CPU: FSDP's collectives block, one per group at a time


def test_a_missing_ordering_is_reported():
    """The checks fail on a graph without the all-gather -> forward dependency."""
    g = graph(RESHARD)
    ag = next(c.node for c in fsdp_collectives(g) if c.kind.label == "all_gather")
    keep = np.ones(len(g.succ), dtype=bool)
    keep[g.indptr[ag]:g.indptr[ag + 1]] = False
    src = np.repeat(np.arange(len(g)), np.diff(g.indptr))[keep]
    cut = csr_graph(len(g), src, g.succ[keep].astype(np.int64), names=g.names, devices=g.devices, layers=g.layers,
                    meta=g.meta.copy(), **{c: getattr(g, c) for c in NODE_COLUMNS})
    with pytest.raises(DagprofError, match="nothing on rank 0 waits for it"):
        check_fsdp_edges(cut)


@pytest.mark.parametrize("path, rel", [(RESHARD, 1e-3), (KEEP, 1e-3), (HSDP, 1e-2)])
def test_replay_of_the_measured_configuration(path, rel):
    """Exact up to clock alignment: the recordings' host is named "localhost", which names no clock, so each rank's
    offset is fitted to collective ends; with 4 ranks on 2 cores its residual leaves up to 1 % (HSDP)."""
    g = graph(path)
    a = analyze(g, replay(g))
    for r, measured in a.measured_iter_us.items():
        assert a.predicted_iter_us[r] == pytest.approx(measured, rel=rel)


def test_bandwidth_whatif_prices_gathers_as_half_an_all_reduce():
    g = graph(RESHARD)
    out = evaluate(g, [Scenario(bandwidth="200Mbit"), Scenario(bandwidth="1Gbit"),
                       Scenario(workers=4)])
    slow, fast, four = (r.predicted_iter_ms for r in out["scenarios"])
    moved = 0.0
    for c in fsdp_collectives(g):
        if g.step[c.node] == g.meta.steps[0]:
            # n=2 ring: an all-gather of S sends S/2; gloo's reduce-scatter is an all-reduce of S (sends S)
            moved += g.nbytes[c.node] * (0.5 if c.kind.label == "all_gather" else 1.0)
    # the difference between the two links is the bytes on the wire at each rate (collectives block on CPU)
    assert slow - fast == pytest.approx(moved * (1 / 25e6 - 1 / 125e6) * 1e3, rel=0.05)
    assert four > out["model_iter_ms"] * 0.9  # 4 ranks: more on the wire, the optimizer on half the shards


def test_unmodelled_whatifs_are_refused_in_one_line(capsys):
    with pytest.raises(DagprofError, match="FSDP job; --bucket-mb .* not modelled for FSDP"):
        evaluate(graph(RESHARD), [Scenario(bucket_mb=5)])
    with pytest.raises(DagprofError, match="FSDP job; --no-overlap"):
        evaluate(graph(RESHARD), [Scenario()], Cluster(overlap=False))
    with pytest.raises(DagprofError, match="HSDP job .* multiple of the shard degree 2, got 7"):
        evaluate(graph(HSDP), [Scenario(workers=7)])
    row = evaluate(graph(HSDP), [Scenario(bandwidth="1Gbit")])["scenarios"][0]
    assert row.predicted_iter_ms > 0 and 0 < row.scaling_efficiency < 1  # one worker of an HSDP job: one replica, its 2 shards (1x2)
    assert main(["optimize", str(RESHARD), "--budget", "1", "--accumulate", "2"]) == 2  # optimize searches FSDP now (test_fsdp_optimize)
    err = capsys.readouterr().err
    assert "FSDP job" in err and len(err.strip().splitlines()) == 1


def test_analyze_names_fsdp_collectives(capsys):
    assert main(["analyze", str(RESHARD), "--json"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce" not in out and "bucket" not in out


def test_zero_code_profile_of_an_fsdp_job(tmp_path):
    pytest.importorskip("torch")
    script = DATA.parent.parent / "bench" / "fsdp_train.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           "--blocks", "2", "--width", "64", "--vocab", "256", "--batch", "4", "--seq", "16", "--steps", "5"]
    assert main(["profile", "-o", str(tmp_path), "--steps", "2:4", "--no-kineto", "--"] + cmd) == 0
    run = read_run(tmp_path)
    assert run.meta.manifest.mode == "launcher" and run.meta.fsdp
    assert run.ranks[0].meta.steps_profiled == [2, 3]
    assert check_fsdp_edges(build_graph(run))["forward_waits_all_gather"] == 2 * 3 * 2
    ev = run.ranks[0].events
    assert (ev.kind == Kind.UPDATE).sum() == 2


def test_a_tied_embedding_lm_profiles_and_every_fsdp_whatif_answers(tmp_path, capsys):
    """``fsdp_train.py --model tiedlm`` (``bench_fsdp.py --part 12``'s held-out job: ``nn.TransformerEncoderLayer`` blocks, the
    head tied to the embedding), profiled with the zero-code command at fully_shard's default: the tied weight is one
    parameter of the root unit, counted once, and every what-if part 12 measures answers with its point inside its
    interval (its accuracy is the bench's, on quiet rounds)."""
    pytest.importorskip("torch")
    import json

    script = DATA.parent.parent / "bench" / "fsdp_train.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), "--model", "tiedlm",
           "--blocks", "2", "--width", "32", "--vocab", "128", "--batch", "4", "--seq", "16", "--steps", "8", "--reshard", "default"]
    assert main(["profile", "-o", str(tmp_path), "--steps", "2:5", "--no-kineto", "--"] + cmd) == 0
    units = {u.name: u for u in read_run(tmp_path).ranks[0].meta.fsdp.units}
    assert sorted(units) == UNITS
    assert units["<root>"].numel == 128 * 32 + 16 * 32 + 2 * 32  # embedding (= head), positions, final norm
    assert not units["<root>"].reshard_after_forward and units["blocks.0"].reshard_after_forward
    capsys.readouterr()  # the profile's own lines
    for args in (["--bandwidth", "200Mbit"], ["--workers", "4", "--cores", "2"], ["--mesh", "2x2", "--cores", "2"],
                 ["--reshard-after-forward", "off"], ["--units", "merge:2"], ["--reduce-dtype", "bfloat16"], ["--data-parallel", "ddp"]):
        assert main(["whatif", str(tmp_path), *args, "--json", "--no-trace", "--allow-model-error"]) == 0, args
        row = json.loads(capsys.readouterr().out)["scenarios"][0]
        assert 0 < row["lo_ms"] <= row["predicted_median_ms"] <= row["hi_ms"], args
