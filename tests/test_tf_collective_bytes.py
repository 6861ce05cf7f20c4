"""A TensorFlow job's collectives sized from their own tensors, and a stalled collective kept in its own step."""

import numpy as np
import pytest
from testdata import DATA, copy_fixture, edit_json

from dagprof.analysis.interval import step_times
from dagprof.passes.comm import current_topology, set_link, set_topology
from dagprof.passes.link_fit import link_fit, priced_comm
from dagprof.pipeline import open_run
from dagprof.replay import replay
from dagprof.traces.events import Kind
from dagprof.traces.load import load


def test_every_collective_of_a_keras_fit_step_is_sized_from_its_own_tensor():
    """``tf/widedeep-sized`` (``bench/frameworks/tf_widedeep_fit.py``, batch 32 per worker, the collector's Keras callback
    reading each collective's input from ``fit``'s traced step): the embeddings' sparse gradients are all-gathered (a row
    count, then rows and indices in a lowered ``cond``), which the memory tracer never saw (``tf/widedeep``: 4 unsized a
    step, the link fitted to 1 sized collective of 17). Every one now has its bytes, the same on both workers: an
    all-gather its group's inputs (2 x 416 item rows of 32 float32, 2 x 416 int32 indices), the metrics' reductions
    their 1 or 200 floats, the dense gradients 18,881 floats."""
    run = load(str(DATA / "tf" / "widedeep-sized"))
    per_rank = []
    for t in run.ranks:
        ev = t.events
        step = {ev.name_of(i): int(ev.nbytes[i]) for i in np.flatnonzero((ev.kind == Kind.COMM) & (ev.step == 7))}
        assert len(step) == 17 and min(step.values()) > 0
        assert not any("have no size" in str(w) for w in t.meta.warnings)
        per_rank.append(step)
    step = per_rank[0]
    assert per_rank[1] == step
    assert step["CollectiveReduceV2"] == 75524
    assert step["cond_1/then/_18/cond_1/CollectiveGatherV2"] == 2 * 416 * 32 * 4
    assert step["cond_1/then/_18/cond_1/CollectiveGatherV2_1"] == 2 * 416 * 4
    assert step["CollectiveGatherV2"] == 2 * 4 and step["Add/CollectiveReduceV2"] == 800


def test_sized_gathers_are_priced_by_a_link_change():
    """The rows' all-gather moves 106 kB a step, more than the dense all-reduce: at a tenth of the fitted link it now
    grows with it (at 0 B it kept its profiled time), and a scalar's reduction does not."""
    g = open_run(str(DATA / "tf" / "widedeep-sized")).graph
    model = set_topology(g, current_topology(g))
    slow = set_link(model, current_topology(model).inter.bandwidth_bytes_per_s / 10)
    rows = priced_comm(g) & np.array(["cond_1/then/_18/cond_1/CollectiveGatherV2." in g.node_name(int(v)) for v in range(len(g))])
    assert rows.sum() == 4
    assert (slow.dur[rows] > 3 * model.dur[rows]).all()  # 0.9 -> 3.8 ms: its latency stays
    scalar = priced_comm(g) & (g.nbytes == 4)
    assert (slow.dur[scalar] < 1.05 * model.dur[scalar]).all()


def test_a_stalled_collective_stays_in_its_own_step():
    """``tf/widedeep`` (4 steps of 57.6-115.5 ms): one of its 68 collectives took 23.5 ms beyond the link fitted to the
    others (a loaded host). Spread over all 68 as latency, the model put the fast step at 75.7 ms (+31 %) and the slow
    ones under their time, the mean right; now each stall is kept before its own transfer, and every step is replayed
    within 6 % of itself, the mean within 0.1 %."""
    g = open_run(str(DATA / "tf" / "widedeep")).graph
    fit = link_fit(g)
    assert fit.stalls is not None and fit.stalls.max() == pytest.approx(23.5e3, rel=0.01)
    model = set_topology(g, current_topology(g))
    measured, modelled = step_times(g, replay(g)), step_times(model, replay(model))
    assert np.abs(modelled / measured - 1).max() < 0.06
    assert modelled.mean() == pytest.approx(measured.mean(), rel=1e-3)


def _sparse_gathers(run) -> list[dict[str, int]]:
    """Per rank and profiled step: the sparse gradient's all-gathers (in the lowered ``cond``) by name, their bytes."""
    out = []
    for t in run.ranks:
        ev = t.events
        for step in sorted(set(ev.step[ev.step >= 0].tolist())):
            rows = np.flatnonzero((ev.kind == Kind.COMM) & (ev.step == step))
            out.append({ev.name_of(i): int(ev.nbytes[i]) for i in rows if "cond/then" in ev.name_of(i)})
    return out


def test_a_sparse_gradient_of_a_dynamic_row_count_is_sized_in_each_step_from_the_run(tmp_path):
    """``tf/bilstm-rows`` (``bench/frameworks/tf_bilstm_tagger_fit.py --maxlen 10 --batch 64``: an ``Embedding`` over
    ``Input((None,))``, ``padded_batch``): its sparse gradient's shape is not static in ``fit``'s traced step, so the
    collector cannot size its all-gathers; it records their bytes per row instead (64 float32 rows, int64 ids:
    ``collective_row_bytes``). In each step, the rows' gather takes the memory tracer's allocation of its result in that
    step (1280 rows x 64 float32: 64 ids x 10 tokens per worker, 2 workers), and the indices' gather, which the tracer
    never sees, one int64 per gathered row; it was priced one int32 each, half its bytes, as runs recorded before still are."""
    run = load(str(DATA / "tf" / "bilstm-rows"))
    steps = _sparse_gathers(run)
    assert len(steps) == 4  # 2 ranks x steps 3, 4
    for step in steps:
        assert step == {"cond/then/_0/cond/CollectiveGatherV2": 1280 * 64 * 4, "cond/then/_0/cond/CollectiveGatherV2_1": 1280 * 8}
    notes = " ".join(map(str, run.meta.warnings))
    assert "have no size" not in notes and "int32" not in notes

    older = copy_fixture(tmp_path, "tf/bilstm-rows")  # the same run as the collector wrote it before it read the bytes per row
    for r in (0, 1):
        edit_json(older / f"rank{r}.json", lambda info: info.pop("collective_row_bytes"))
    run = load(str(older))
    assert all(step["cond/then/_0/cond/CollectiveGatherV2_1"] == 1280 * 4 for step in _sparse_gathers(run))
    assert "sized as one int32 per row" in " ".join(map(str, run.meta.warnings))


def test_a_sparse_gradient_under_the_memory_tracers_floor_is_sized_from_its_lookups_ids(tmp_path):
    """``tf/bilstm-ids`` (``bench/frameworks/tf_bilstm_tagger_fit.py --batch 8 --maxlen 10``): 160 gathered rows of 64
    float32 (40 kB) a step, under the 256 KiB the memory tracer records, so main left both all-gathers unsized (0 B, a
    warning). The collector now names the lookup whose ids the gathered indices hold (``collective_lookups``: walked back
    from the ``cond``'s argument through the gradient's reshape), and each step's profile counts that lookup's ids (the
    ``ParallelFor`` its kernel shards them in: 80 on each worker, 8 sentences of 10); TF's branch of equal row counts
    gathers as many from each worker: 160 rows of 256 B, 160 int64 ids. (On the larger runs both are recorded, the
    lookups' count times the workers was the memory tracer's gathered rows in 20 of 20 rank-steps.)"""
    run = load(str(DATA / "tf" / "bilstm-ids"))
    steps = _sparse_gathers(run)
    assert len(steps) == 4  # 2 ranks x steps 3, 4
    for step in steps:
        assert step == {"cond/then/_0/cond/CollectiveGatherV2": 160 * 64 * 4, "cond/then/_0/cond/CollectiveGatherV2_1": 160 * 8}
    assert "have no size" not in " ".join(map(str, run.meta.warnings))

    older = copy_fixture(tmp_path, "tf/bilstm-ids")  # without the lookups, as the collector wrote it before: unsized, and said
    for r in (0, 1):
        edit_json(older / f"rank{r}.json", lambda info: info.pop("collective_lookups"))
    run = load(str(older))
    assert all(not any(step.values()) for step in _sparse_gathers(run))
    assert any(str(w).startswith("4 of 4 all-gathers of a sparse gradient") for w in run.meta.warnings)



def test_a_gradient_pack_of_no_static_shape_carries_the_gradients():
    """``tf/translator-pack`` (``bench/frameworks/tf_translator_fit.py``: an encoder-decoder Transformer under Keras
    ``fit`` on bucketed ``Input((None,))`` batches): TF packs every dense gradient into one all-reduce whose traced shape
    is ``[?]`` (a gradient in it lost its static shape), so the collector kept one row of 4 bytes and no lookups; with
    nothing to count the rows by it went at 0 B while it took most of the step's collective time. It now carries the
    model's dense gradient bytes (the collector's ``grad_bytes``: 213,712 float32, the two 2000 x 64 embeddings left
    out) in every step on both workers, and a slower link grows it; the embeddings' all-gathers keep their own sizes."""
    pack_bytes = 854848
    run = load(str(DATA / "tf" / "translator-pack"))
    for t in run.ranks:
        ev = t.events
        comm = np.flatnonzero((ev.kind == Kind.COMM) & (ev.step >= 0))
        pack = [i for i in comm if ev.name_of(i) == "CollectiveReduceV2_1"]
        assert len(pack) == len(t.meta.steps_profiled) and (ev.nbytes[pack] == pack_bytes).all()
        rows = [i for i in comm if "/then/" in ev.name_of(i)]
        assert rows and all(0 < ev.nbytes[i] < pack_bytes for i in rows)
    g = open_run(str(DATA / "tf" / "translator-pack")).graph
    model = set_topology(g, current_topology(g))
    slow = set_link(model, current_topology(model).inter.bandwidth_bytes_per_s / 10)
    packs = priced_comm(g) & (g.nbytes == pack_bytes)
    assert packs.sum() >= 2 and (slow.dur[packs] > 2 * model.dur[packs]).all()
