"""A TensorFlow job's collectives sized from their own tensors."""
import pathlib

import numpy as np

from dagprof.passes.comm import current_topology, priced_comm, set_link, set_topology
from dagprof.pipeline import open_run
from dagprof.traces.events import Kind
from dagprof.traces.load import load

DATA = pathlib.Path(__file__).parent / "data"


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

