"""Collectives a DDP model issues itself, beside its gradient buckets, on real recordings (tests/data/ddp-fresh):
a CLIP loss's differentiable all_gather (its backward: gloo's all-to-all, run as scatters) and synchronised BatchNorm's
statistics (an all-gather in forward, an all-reduce in backward). The collector sees them only in the Kineto trace,
inside the ops that issued them: they must be counted and said by every answer that leaves them as measured, never
re-bucketed or scaled as gradients. And ranks that trained uneven inputs (DDP's ``Join``) past a common step are refused
in one line that says why and which window to profile."""
from __future__ import annotations

import json

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import CommKind, Kind

FRESH = DATA / "ddp-fresh"
# per step and rank, as the scripts issue them: CLIP all-gathers its text and image embeddings (2) and each gather's
# backward all-to-all runs as one scatter per rank (2 x 2); the convnet has 9 synchronised BatchNorm2d layers
IN_OPS = {"clip": {CommKind.ALL_GATHER: 2, CommKind.SCATTER: 4}, "syncbn": {CommKind.ALL_GATHER: 9, CommKind.ALL_REDUCE: 9}}


@pytest.mark.parametrize("name", sorted(IN_OPS))
def test_in_op_collectives_are_counted_and_kept_apart_from_the_buckets(name):
    run = read_run(FRESH / name)
    for t in run.ranks:
        steps = len(t.meta.steps_profiled)
        assert {k: u.count / steps for k, u in t.meta.unseen_collectives.items()} == IN_OPS[name]
        assert all(t.meta.unseen_collectives[k].us > 0 for k in IN_OPS[name])
    p = open_run(FRESH / name)
    g = p.graph
    par = g.meta.parallel
    assert dict(par.in_ops_kinds) == IN_OPS[name] and par.in_ops[0] == sum(IN_OPS[name].values()) and par.in_ops[1] > 0
    # the graph's shared collectives are DDP's bucket and buffer broadcasts only: none of the model's became a bucket
    shared = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0))
    names = {g.node_name(int(v)).rsplit(".", 1)[0] for v in shared}
    assert not any("all_gather" in n or "scatter" in n for n in names)
    assert par.in_ops_text() in par.notes


@pytest.mark.parametrize("argv", [["--bandwidth", "200Mbit"], ["--workers", "4"], ["--bucket-mb", "1"]])
def test_what_ifs_say_what_they_leave_as_measured(argv, capsys):
    """Link, worker and bucket what-ifs re-price DDP's buckets only: each says, with the count per kind and the time, that
    the model's own collectives stay timed inside its ops."""
    for name, kinds in IN_OPS.items():
        assert main(["whatif", str(FRESH / name), *argv, "--json", "--no-trace"]) == 0
        notes = json.loads(capsys.readouterr().out)["notes"]
        said = [n for n in notes if "ran inside the model's own ops" in n]
        assert len(said) == 1 and all(f"{k.label} x{n:g}" in said[0] for k, n in kinds.items()), notes


def test_a_what_if_that_changes_no_communication_says_nothing_of_them(capsys):
    assert main(["whatif", str(FRESH / "clip"), "--compute-speed", "2", "--json", "--no-trace"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "model's own ops" in n]


def test_analyze_and_diff_say_where_their_time_went(capsys):
    assert main(["analyze", str(FRESH / "syncbn")]) == 0
    assert "all_gather x9, all_reduce x9" in capsys.readouterr().out
    assert main(["diff", str(FRESH / "clip"), str(FRESH / "clip"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "inside the model's own ops (A 6 (" in out and "counted in the ops that issued them" in out


def test_uneven_inputs_past_the_shortest_rank_are_refused_in_one_line(capsys):
    """join_uneven.py: rank 0 trains 4 batches, rank 1 6 under ``Join``; a window of steps 3-5 holds steps rank 1 ran
    alone (rank 0 shadowed their all-reduces outside any step). Read before as the one common step with a warning that
    training ended after 4 steps (rank 0's count, said of the run); with Kineto, refused as mismatched collectives."""
    with pytest.raises(DagprofError, match=r"different numbers of steps \(rank 0 4, rank 1 6\).*Join.*--steps 0:4"):
        read_run(FRESH / "join-past")
    assert main(["analyze", str(FRESH / "join-past")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "uneven inputs" in err


def test_a_dp_x_tp_jobs_tensor_parallel_all_reduces_are_said_too():
    """hybrid-dp-tp-dagprof: DDP over a 2-way tensor-parallel model; the TP layers' all-reduces run inside their ops,
    unsaid before (the groups showed DDP's only)."""
    par = open_run(DATA / "hybrid-dp-tp-dagprof").graph.meta.parallel
    assert dict(par.in_ops_kinds) == {CommKind.ALL_REDUCE: 3} and par.in_ops_text() in par.notes


def test_a_users_own_trace_keeps_the_loss_all_gathers_apart_from_the_gradients(capsys):
    """The same CLIP job traced by plain torch.profiler with record_shapes (no dagprof hooks): gloo puts every
    collective in one group, where the gradient all-reduces made the forward all-gathers and their backward scatters
    "DP" by their group, sized, and ``--workers`` answered as if they were gradients. They stay unknown, said why."""
    from dagprof.traces.parallelism import Dim

    g = open_run(FRESH / "clip-kineto").graph
    comm = g.kind == Kind.COMM
    assert (comm & (g.dim == Dim.DP)).any()
    group = g.meta.parallel.groups[0]
    assert group.dims == {"unknown": 6 * 3 * 2, "DP": 2 * 3 * 2}  # a step and rank: 2 all-gathers + 2 x 2 scatters; 2 all-reduces
    assert {w.split(" ")[0] for w in group.evidence if "in a data-parallel group, no gradient exchange" in w} == {"all_gather", "scatter"}
    assert main(["whatif", str(FRESH / "clip-kineto"), "--workers", "4", "--allow-model-error", "--no-trace"]) == 2
    assert "--workers is not modelled here" in capsys.readouterr().err
    assert "scatter in a data-parallel group, no gradient exchange (in the backward op 'autograd::engine::evaluate_function: " \
        "_AllGatherBackward')" in group.evidence  # what the trace shows around them, not a guess


def test_a_dcp_saves_collectives_are_the_jobs_own_after_the_optimizer_step(capsys):
    """dcp-kineto: a user's own trace of a DDP job saving with DCP twice, once inside a ``record_function("checkpoint")``
    range, once bare, each after ``opt.step()``. Its object gathers and scatters were unknown and its all-gathers and
    broadcasts "DP" by their group (26 DP of 42), fitted into the link and scaled by ``--workers`` as gradients: now all
    18 a rank are the job's own (issued after the step's optimizer step), said with the range the user named or plainly
    that the trace cannot tell; out of the link fit, re-priced by link what-ifs, kept as profiled by worker what-ifs."""
    from dagprof.passes.comm import job_comm
    from dagprof.passes.link_fit import priced_comm
    from dagprof.traces.parallelism import Aside, Dim

    g = open_run(FRESH / "dcp-kineto").graph
    par = g.meta.parallel
    group = par.groups[0]
    assert group.dims == {"DP": 3 * 2, "job-own": 18 * 2}  # 3 gradient all-reduces a rank; 2 saves x 9 collectives a rank
    assert {(x.why, x.around, x.count) for x in group.no_gradients} == {
        (Aside.JOB_OWN, "in the range 'checkpoint'", 18),
        (Aside.JOB_OWN, "no backward op nor named range around it: what issued it the trace cannot tell", 18)}
    assert not par.hybrid and par.describe() == "DP x2" and not any("loss" in w for w in group.evidence)
    job = (g.kind == Kind.COMM) & (g.rank < 0) & (g.dim == Dim.JOB)
    assert job.sum() == 18 and not (priced_comm(g) & job).any()  # no gradient traffic in the link fit
    nodes, ranks = job_comm(g)
    assert len(nodes) == 18 and set(ranks.tolist()) == {2}  # re-priced by link what-ifs in their 2-rank group
    assert main(["analyze", str(FRESH / "dcp-kineto")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "job-own 6.0 collectives" in out and "issued between an optimizer step and the next forward pass" in out
    assert main(["whatif", str(FRESH / "dcp-kineto"), "--bandwidth", "200Mbit", "--no-trace"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "18 collectives in the 3 profiled steps ran between an optimizer step and the next forward pass (in the range 'checkpoint'; no " \
        "backward op nor named range" in out and "link what-ifs re-price the 18 of known size and group" in out
    assert main(["whatif", str(FRESH / "dcp-kineto"), "--workers", "4", "--no-trace"]) == 0  # refused while they were unknown
    out = " ".join(capsys.readouterr().out.split())
    assert "--workers keeps them at their profiled size and time" in out


def test_only_what_follows_the_optimizer_step_is_the_jobs_own():
    """The other vendored user traces keep their labels: CLIP's in-pass gathers stay activations (unknown), and the
    FSDP x TP job's scalar loss all-reduce after its optimizer step stays in the TP group its description names."""
    from dagprof.traces.parallelism import Dim

    for path in (FRESH / "clip-kineto", DATA / "tp-fresh" / "fsdp-tp"):
        g = open_run(path).graph
        assert not ((g.kind == Kind.COMM) & (g.dim == Dim.JOB)).any() and "job-own" not in g.meta.parallel.describe()
