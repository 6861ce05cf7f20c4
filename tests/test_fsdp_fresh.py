"""What fresh user-style FSDP scripts (bench/fsdp_fresh) found: gradient accumulation (``set_requires_gradient_sync(False)``
on micro-batches: several forward+backward passes per optimizer step, ``tests/data/fsdp/accum-nested`` and ``accum-root``),
mixed precision into DDP, and HSDP labelled as data parallelism on a 2-D mesh (``tests/data/fsdp/hsdp``)."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import Passes, check_fsdp_edges, fsdp_collectives, issuers
from dagprof.graph.meta import CoreGroup
from dagprof.passes.data_parallel import to_data_parallel
from dagprof.passes.fsdp import set_reshard
from dagprof.passes.fsdp_units import merge_units
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind

NESTED, ROOT = DATA / "fsdp" / "accum-nested", DATA / "fsdp" / "accum-root"
COMPILED = DATA / "fsdp" / "compiled-blocks"


def passes(g):
    """(step, micro-batch, kind, forward?, unit) -> count"""
    out, in_pass = Counter(), Passes(g)
    for c in fsdp_collectives(g):
        micro, fwd = in_pass.of_collective(c.node, min(issuers(g, c.node)))
        out[(int(g.step[c.node]), micro, c.kind.label, fwd if c.kind.label == "all_gather" else None, c.unit)] += 1
    return out


def test_each_micro_batch_gathers_in_forward_and_again_in_backward():
    g = build_graph(read_run(NESTED))
    units = {u.name: u.resharded_after_forward for u in g.meta.fsdp.units}
    assert len(units) == 8 and not units["<root>"]  # rnn, layers.i and layers.i.ffn nested, the root kept
    check_fsdp_edges(g)
    got = passes(g)
    for step in (3, 4):
        for unit, again in units.items():
            for micro in (0, 1):
                assert got[(step, micro, "all_gather", True, unit)] == 1
                assert got[(step, micro, "all_gather", False, unit)] == int(again)
            # gradients sync on the last micro-batch only
            assert got[(step, 1, "reduce_scatter", None, unit)] == 1 and got[(step, 0, "reduce_scatter", None, unit)] == 0


def test_merge_all_keeps_one_gather_per_micro_batch_as_the_root_only_job_does():
    merged = passes(merge_units(build_graph(read_run(NESTED)), "merge:all"))
    measured = passes(build_graph(read_run(ROOT)))
    assert merged == measured
    assert sum(n for k, n in measured.items() if k[0] == 3 and k[2] == "all_gather") == 2


def test_regathering_the_kept_root_delays_each_micro_batchs_backward():
    g = build_graph(read_run(NESTED))
    out = set_reshard(g, True)
    changed = np.flatnonzero(out.dur != g.dur)
    assert len(changed) and (g.kind[changed] == Kind.BACKWARD).all()
    per = Counter((int(g.step[v]), int(g.rank[v])) for v in changed.tolist())
    assert set(per.values()) == {2}  # one op per micro-batch on each rank and step, not both gathers on the first


def test_ddp_from_a_mixed_precision_profile_is_refused_in_one_line():
    """The forward and backward ran in bf16; DDP would run them in fp32 (on this job 1.7x as long): not predicted."""
    with pytest.raises(DagprofError, match=r"computes in bfloat16 .* not modelled") as e:
        to_data_parallel(build_graph(read_run(NESTED)), "ddp")
    assert "\n" not in str(e.value)


def test_hsdp_is_data_parallel_on_a_2d_mesh_and_whatif_says_nothing_is_left_as_measured():
    from dagprof.search.scenario import Scenario
    from dagprof.search.whatif import evaluate
    g = build_graph(read_run(DATA / "fsdp" / "hsdp"))
    par = g.meta.parallel
    assert par.dp_mesh and par.describe() == "DP x4 on a 2-D mesh (groups of 2 ranks: HSDP's replicate x shard)"
    out = evaluate(g, [Scenario(bandwidth="1Gbit")], tolerance_pct=None)
    assert not [n for n in out["notes"] if "keep their measured" in n or "not recorded" in n]


def test_ranks_past_the_hosts_cores_are_noted_unless_cores_models_them():
    """``tests/data/fsdp/hsdp-conv``: 4 ranks of bench/fsdp_fresh/hsdp_convnet.py on a 2-core host (``cpus`` recorded)."""
    from dagprof.search.scenario import Cluster, Scenario
    from dagprof.search.whatif import evaluate
    g = build_graph(read_run(DATA / "fsdp" / "hsdp-conv"))
    assert g.meta.host_cpus == {"vm": CoreGroup(4, 2)} and g.meta.parallel.dp_mesh
    said = [n for n in evaluate(g, [Scenario(units="merge:all")], tolerance_pct=None)["notes"] if "shared 2 cores" in n]
    assert len(said) == 1 and "--cores 2" in said[0]
    modelled = evaluate(g, [Scenario(units="merge:all")], Cluster(cores=2), tolerance_pct=None)["notes"]
    assert not [n for n in modelled if "shared 2 cores" in n]
    assert build_graph(read_run(DATA / "fsdp" / "hsdp")).meta.host_cpus == {}  # recorded before cpus: nothing said


def test_a_command_that_fails_before_profiling_is_not_blamed_on_the_model_wrapping(tmp_path, capsys):
    """A mistyped flag (torchrun's own usage error, status 2) is the command's failure, not a model dagprof cannot see."""
    import sys

    from dagprof.cli.main import main
    assert main(["profile", "-o", str(tmp_path / "run"), "--", sys.executable, "-c", "import sys; sys.exit(2)"]) == 2
    err = capsys.readouterr().err
    assert "exited with status 2 before any rank wrote a profile" in err and "sees only" not in err


def test_passes_index_places_every_op_in_its_micro_batch():
    # Passes sorts the graph once; each (rank, step)'s ops in program order must number their micro-batches as a scan
    # of that rank and step alone does: each forward that follows a backward starts the next one
    g = build_graph(read_run(NESTED))
    in_pass = Passes(g)
    comp = (g.kind == Kind.FORWARD) | (g.kind == Kind.BACKWARD)
    for r, step in {(int(g.rank[v]), int(g.step[v])) for v in np.flatnonzero(comp).tolist()}:
        mine = np.flatnonzero(comp & (g.rank == r) & (g.step == step))
        mine = mine[np.argsort(g.order[mine], kind="stable")]
        micro, prev_forward = -1, False
        for v in mine.tolist():
            forward = g.kind[v] == Kind.FORWARD
            micro += forward and not prev_forward
            prev_forward = forward
            assert in_pass.at(r, step, float(g.order[v]), after=True) == (max(micro, 0), bool(forward))
    assert in_pass.at(99, 3, 0.0, after=True) == (0, True)  # no ops there: the first forward


def test_blocks_compiled_before_fully_shard_are_warned_of_and_timed_without_memory(tmp_path, capsys):
    """``fsdp/compiled-blocks`` (bench/fsdp_fresh/compiled_fsdp.py --compile blocks: ``block.compile()`` then
    ``fully_shard``): Dynamo ran the blocks' leaves without the hooks added after it compiled, and only the embedding's
    and the final norm's were timed, unsaid. Now no module is hooked, each rank says so, and FSDP's own records (its hooks
    run outside Dynamo's graphs) build the usual graph; whatif prices it and says it has no peak memory (it failed,
    telling to profile again with this dagprof, on every FSDP what-if)."""
    run = read_run(COMPILED)
    said = [w for w in map(str, run.meta.warnings) if "no layer's forward or backward hook ran (a model under torch.compile" in w]
    assert len(said) == 2 and not any(t.meta.layer_saved_bytes for t in run.ranks)
    g = build_graph(run)
    assert not np.isin(g.kind, [Kind.FORWARD, Kind.BACKWARD]).any()
    kinds = Counter((int(g.step[c.node]), c.kind.label) for c in fsdp_collectives(g))
    assert {k: n for k, n in kinds.items() if k[0] == 3} == {(3, "all_gather"): 7, (3, "reduce_scatter"): 4}  # 3 blocks + root
    # off gave on's time, merge:all -54.6 %; ddp and optimize refused without saying why
    for argv in (["whatif", "--reshard-after-forward", "off"], ["whatif", "--units", "merge:all"], ["whatif", "--data-parallel", "ddp"]):
        assert main([argv[0], str(COMPILED), "-o", str(tmp_path / "out"), *argv[1:], "--allow-model-error"]) == 2
        assert "a model under torch.compile runs its modules without their hooks" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main(["optimize", str(COMPILED), "-o", str(tmp_path / "out")]) == 2
    assert "a model under torch.compile, whose modules dagprof leaves unhooked" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main(["whatif", str(COMPILED), "-o", str(tmp_path / "out"), "--bandwidth", "200Mbit", "--json", "--allow-model-error"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["scenarios"]
    assert "peak_memory_mb" not in row and row["predicted_iter_ms"] > out["model_iter_ms"]
    assert any(n.startswith("no peak memory in 1 row: the profile has no activation sizes (layer_saved_bytes: a model under torch.compile")
               for n in out["notes"])


UNET = DATA / "fsdp-fresh" / "unet-accum"


def test_accumulated_gradients_are_in_the_peak_of_the_last_micro_batch():
    """FSDP2 keeps every unit's unsharded gradients across ``set_requires_gradient_sync(False)`` micro-batches until their
    reduce-scatters in the last one: the U-Net's 2-micro-batch steps peaked at 3.05-3.21 MiB per rank (median 3.08,
    ``unet_dcp.py --memory``; 2.55-2.76 with one micro-batch), which this recording's peak without them read as 2.54 (-18 %)."""
    from dagprof.search.fsdp_memory import _Job, fsdp_peak

    g = build_graph(read_run(UNET))
    assert Passes(g).most_micro_batches() == 2 and Passes(build_graph(read_run(DATA / "fsdp" / "fsdp4"))).most_micro_batches() == 1
    full_grads = sum(u.grad_numel * 4 for u in g.meta.fsdp.units)  # reduce_dtype float32
    assert sum(_Job(g, None, None, True).accumulated) == full_grads and not any(_Job(g, None, None).accumulated)
    for mem in fsdp_peak(g).values():
        assert abs(mem.total / 2**20 / 3.08 - 1) < 0.05


T5 = DATA / "tp-fresh" / "t5-dp-tp-dagprof"


def test_workers_of_a_dp_x_tp_fsdp_job_shard_over_its_data_parallel_degree():
    """``--workers`` counts every rank: the 2 x 2 T5 job (FSDP2 over ``dp``) at 4 workers is the profiled job, at 8 it
    shards over 4. It was priced sharded over 4 and 8 (its optimizer step 1.5 % short at the profiled size)."""
    from dagprof.passes.fsdp_mesh import workers_mesh
    from dagprof.search.fsdp_memory import fsdp_peak

    g = build_graph(read_run(T5))
    assert workers_mesh(g, 4) == (1, 2) and workers_mesh(g, 8) == (1, 4)
    same, wider = fsdp_peak(g, workers=4)[0], fsdp_peak(g, workers=8)[0]
    assert same == fsdp_peak(g)[0]
    assert wider.params == same.params / 2 and wider.optimizer == same.optimizer / 2


def test_a_profile_without_shard_sizes_gives_no_peak_memory(capsys):
    """A job that ended inside the window wrote 0-byte shards (before 2026-12-05): its peak left out the parameters and
    optimizer state, unsaid. Now ``missing_sizes`` says why (whatif answers without memory), ``fsdp_peak`` refuses in one line."""
    import dataclasses

    from dagprof.graph.meta import FsdpShards
    from dagprof.search.fsdp_memory import NO_SHARDS, fsdp_peak, missing_sizes

    g = build_graph(read_run(T5))
    assert missing_sizes(g.meta.fsdp) is None
    fs = dataclasses.replace(g.meta.fsdp, memory={r: FsdpShards(0, 0, 0) for r in g.meta.fsdp.memory})
    empty = g.replace(meta=g.meta.replace(fsdp=fs))
    assert missing_sizes(fs) == NO_SHARDS
    with pytest.raises(DagprofError, match="no sizes of the FSDP shards"):
        fsdp_peak(empty)
