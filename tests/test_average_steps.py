import numpy as np

from dagprof.graph.build import build_graph
from dagprof.passes.average_steps import average_steps
from dagprof.traces.events import Kind

from synthetic import ddp_run


def test_each_op_takes_its_mean_over_steps():
    g = build_graph(ddp_run(steps=3))
    fw = np.flatnonzero((g.kind == Kind.FORWARD) & (g.rank == 0))
    g2 = g.replace(dur=np.where(np.isin(np.arange(len(g)), fw[:1]), 100.0, g.dur))  # step 0's first op is slow
    avg = average_steps(g2)
    first_of_each_step = [v for v in fw if g.layers[g.layer[v]] == "layer0"]
    assert np.allclose(avg.dur[first_of_each_step], (100.0 + 10.0 + 10.0) / 3)
    assert np.allclose(avg.dur[fw[1:4]], 10.0)


def test_structure_is_unchanged():
    g = build_graph(ddp_run())
    avg = average_steps(g)
    assert np.array_equal(avg.succ, g.succ) and np.array_equal(avg.kind, g.kind)
