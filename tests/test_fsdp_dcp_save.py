"""An FSDP2 job that saves with ``torch.distributed.checkpoint`` inside the profiled window (``bench/fsdp_fresh/unet_dcp.py
--save-every 2``: ``get_model_state_dict`` / ``get_optimizer_state_dict`` then ``dcp.save``; ``tests/data/fsdp-fresh/unet-dcp``,
saves in steps 4 and 6). DCP's object collectives (``all_gather_object``, ``gather_object``, ``broadcast_object_list``,
``scatter_object_list``) run 9 blocking gloo collectives a save, which were host time: not joined to the peer, not priced
by the link. Now the collector records each (``collect.hooks.fsdp.JOB_CALLS``) as a collective of no unit, joined across
ranks and priced as the kind it runs; FSDP's passes leave them alone and ``--template`` averages a saving step only with
the other saving step."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json

from dagprof.errors import DagprofError
from dagprof.graph.build_fsdp import allreduce_equivalent_bytes, check_fsdp_edges, fsdp_collectives, issuers, job_collective_steps
from dagprof.passes.average_steps import average_steps
from dagprof.passes.comm import current_topology, set_link
from dagprof.passes.fsdp import set_reshard
from dagprof.pipeline import open_run
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind
from dagprof.traces.run_schema import JOB_CALL

RUN = DATA / "fsdp-fresh" / "unet-dcp"
SAVES = (4, 6)
PER_SAVE = Counter({"all_gather": 2, "gather": 2, "broadcast": 3, "scatter": 2})  # torch 2.13's DCP, gloo


@pytest.fixture(scope="module")
def opened():
    return open_run(RUN)


def _own(g) -> np.ndarray:
    return np.array([v for v in np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0)).tolist()
                     if g.node_name(v).startswith(f"{JOB_CALL} ")], dtype=np.int64)


def test_each_save_records_its_collectives_on_every_rank():
    ranks = read_run(RUN).ranks
    own = [[c for c in t.meta.fsdp.collectives if c.phase == JOB_CALL] for t in ranks]
    assert [(c.kind, c.group) for c in own[0]] == [(c.kind, c.group) for c in own[1]]  # one order on both ranks: joinable
    assert Counter(c.kind for c in own[0]) == Counter({k: n * len(SAVES) for k, n in PER_SAVE.items()})
    assert all(c.unit == -1 for c in own[0])
    # a gather's bytes are the group's tensors (its root receives both ranks' padded pickles), a broadcast's its own
    gathers = [c for c in own[0] if c.kind == "gather"]
    assert all(c.nbytes % 2 == 0 and c.nbytes > 0 for c in gathers)


def test_joined_across_ranks_priced_as_their_kind_and_left_to_fsdp(opened):
    g = opened.graph
    own = _own(g)
    assert len(own) == sum(PER_SAVE.values()) * len(SAVES)
    assert all(sorted(issuers(g, int(v))) == [0, 1] for v in own)  # a join of both ranks, not host time
    assert Counter(g.step[own].tolist()) == Counter({s: len(own) // 2 for s in SAVES})
    assert job_collective_steps(g).tolist() == list(SAVES)
    assert not set(own.tolist()) & {c.node for c in fsdp_collectives(g)}
    check_fsdp_edges(g)
    names = [g.node_name(int(v)).rpartition(".")[0] for v in own]
    gathered = np.array([n.startswith("job all_gather") for n in names])  # all_gather, and gather / scatter priced so
    assert np.allclose(allreduce_equivalent_bytes(g, own[gathered]), g.nbytes[own[gathered]] / 2)
    assert np.allclose(allreduce_equivalent_bytes(g, own[~gathered]), g.nbytes[own[~gathered]])  # a broadcast on 2 ranks
    assert len(_own(set_reshard(g, False))) == len(own)


def test_link_prices_them(opened):
    g = opened.graph
    own = _own(g)
    beta = current_topology(g).inter.beta_us_per_byte
    grew = set_link(g, 1e5 / beta).dur[own] - set_link(g, 1e6 / beta).dur[own]
    wire = allreduce_equivalent_bytes(g, own) * beta * 9
    assert np.all(grew >= 0) and grew.sum() == pytest.approx(wire.sum(), rel=0.05)


def test_template_averages_saving_steps_apart(opened):
    g = opened.graph
    avg = average_steps(g)
    own = _own(g)
    first = {s: own[g.step[own] == s] for s in SAVES}
    assert np.allclose(avg.dur[first[4]], (g.dur[first[4]] + g.dur[first[6]]) / 2)  # twins of each other only


def test_said_which_steps_saved(opened):
    said = [w for w in opened.warnings if "blocking torch.distributed calls" in w]
    assert len(said) == 1 and "2 of 4 profiled steps (step 4, 6) ran 18" in said[0] and "--template averages those steps only" in said[0]
    assert "(4 all_gather, 6 broadcast, 4 gather, 4 scatter: " in said[0]  # the kinds, as an evaluation's one all_reduce is told apart
    # where they ran, which is all the record tells: after the backward (the save), no guessed cause
    assert "18 outside them (the loop's own); which call issued them the record cannot tell" in said[0] and "?" not in said[0]


def test_a_loss_gather_is_said_inside_the_passes():
    """fsdp-fresh/dual-negatives: an HSDP dual encoder's differentiable all_gather of in-batch negatives
    (``torch.distributed.nn.functional``) and its backward's scatters were guessed "an evaluation's or a logged metric, a
    DCP save's"; they ran within the forward and backward passes, and the warning says that and no guess."""
    said = [w for w in open_run(DATA / "fsdp-fresh" / "dual-negatives").warnings if "blocking torch.distributed calls" in w]
    assert len(said) == 1 and "(8 all_gather, 32 scatter: 40 during the forward and backward passes (the model's or its loss's own); " \
        "which call issued them the record cannot tell)" in said[0]
    assert "DCP" not in said[0] and "evaluation" not in said[0] and "outside them" not in said[0]


def test_worker_what_ifs_say_the_in_pass_gathers_they_keep_at_the_profiled_size(opened, capsys):
    """The dual encoder's in-batch negatives are gathered from every rank (and its loss scores B x (B x W)), so at 8
    workers they grow 2x; ``--workers 8`` answered at the profiled size without a word. Now counted and said, a lower
    bound; a DCP save's calls outside the passes are none of them, and the profiled size says nothing."""
    from dagprof.cli.main import main
    from dagprof.passes.workers import in_pass_gathers, in_pass_gathers_note

    dual = DATA / "fsdp-fresh" / "dual-negatives"
    g = open_run(dual).graph
    assert len(in_pass_gathers(g)) == 40 and len(in_pass_gathers(opened.graph)) == 0  # 2 steps: 4 gathers, 16 scatters each
    assert in_pass_gathers_note(g, 4) is None
    assert main(["whatif", str(dual), "--workers", "8", "--no-trace", "--allow-model-error"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--workers 8: 40 collectives of the job's own in the 2 profiled steps ran within the forward and backward passes " \
        "(job all_gather x8, job all_gather (scatter) x32)" in out and "at the profiled 4 ranks'" in out and "a lower bound" in out


def test_damaged_group_refused(tmp_path):
    run = copy_fixture(tmp_path, "fsdp-fresh/unet-dcp")

    def outside(doc):
        k = next(i for i, c in enumerate(doc["fsdp"]["collectives"]) if c["phase"] == JOB_CALL)
        doc["fsdp"]["collectives"][k]["group"] = "0,7"

    edit_json(run / "rank0.json", outside)
    with pytest.raises(DagprofError, match="job.*0,7.*damaged"):
        read_run(run)


@pytest.mark.parametrize("kind, group_times", [("all_gather", 4), ("gather", 4), ("scatter", 4), ("broadcast", 1), ("all_reduce", 1)])
def test_a_job_call_records_the_bytes_its_price_takes(kind, group_times):
    """A call priced as an all-gather (``CommKind.priced_as``: a gather, a scatter) records the group's tensors, the bytes
    the link prices; a broadcast or all-reduce its own tensor."""
    import inspect

    import torch

    from dagprof.collect.hooks.fsdp import FsdpRecorder

    class FourRanks:
        get_world_size = staticmethod(lambda group=None: 4)
        get_process_group_ranks = staticmethod(lambda group: [0, 1, 2, 3])

    def call(tensor, group=None, async_op=False):
        pass

    rec = FsdpRecorder(None, [])
    k = rec._job_record(kind, "tensor", inspect.signature(call), (torch.ones(10),), {"group": object()}, FourRanks)
    assert (rec.collectives[k].kind, rec.collectives[k].nbytes) == (kind, 40 * group_times)


def test_an_evaluation_metric_is_said_outside_the_passes():
    """fsdp-fresh/pointnet2-eval: the validation loss's ``dist.all_reduce`` after the evaluation's forwards under
    ``torch.no_grad`` (the step the next training forward follows) was said "during the forward and backward passes (the
    model's or its loss's own)": the evaluation's forwards opened the passes. Only the training's passes count now."""
    said = [w for w in open_run(DATA / "fsdp-fresh" / "pointnet2-eval").warnings if "blocking torch.distributed calls" in w]
    assert len(said) == 1 and "(1 all_reduce: 1 outside them (the loop's own); which call issued them" in said[0]
    assert "during the forward and backward passes" not in said[0]
