"""GraphMeta is the typed contract between builders and passes: a pass's output owns its meta, and a misspelt field fails."""
import dataclasses

import pytest

from dagprof.costmodel.topology import CollectiveSpec, Scheme
from dagprof.graph.meta import GraphMeta
from dagprof.graph.symmetry import fold_ranks
from dagprof.passes import expand_collectives, scale_compute, scale_workers, set_buckets, set_link
from dagprof.passes.accumulate import accumulate_gradients
from dagprof.passes.compute import share_cores
from dagprof.traces.meta import HorovodRecord

from test_passes_fixture import ddp_graph

PASSES = {
    "set_link": lambda g: set_link(g, bandwidth=1e9),  # Graph.replace with a new meta
    "scale_compute": lambda g: scale_compute(g, 2.0),  # Graph.replace of columns only
    "scale_workers": lambda g: scale_workers(g, 4),
    "set_buckets": lambda g: set_buckets(g, 3e6),  # GraphBuilder.from_graph
    "expand_collectives": expand_collectives,
    "accumulate_gradients": lambda g: accumulate_gradients(g, 2),
    "fold_ranks": lambda g: fold_ranks(g)[0],
    "share_cores": lambda g: share_cores(g, 1),  # GraphBuilder.from_graph where a collective's exit lags leave the cores
}


def _input():
    g = ddp_graph()
    g.meta.warnings.append("from the reader")
    g.meta.measured_iter_us.update({0: 1.0, 1: 2.0})
    g.meta.horovod = HorovodRecord(tensor_bytes={"a": 4})
    return g


@pytest.mark.parametrize("name", PASSES)
def test_pass_output_meta_is_independent_of_its_input(name):
    g = _input()
    before = dataclasses.asdict(g.meta)
    out = PASSES[name](g)
    assert out.meta is not g.meta
    scheme = out.meta.scheme
    out.meta.world_size = 99
    out.meta.warnings.append("added to the output")
    out.meta.steps.append(99)
    out.meta.measured_iter_us[7] = 1.0
    out.meta.horovod = None
    assert dataclasses.asdict(g.meta) == before  # neither the pass nor edits of its output touched the input
    g.meta.warnings.append("added to the input")
    g.meta.steps.clear()
    g.meta.scheme = CollectiveSpec(Scheme.TREE)
    assert "added to the input" not in out.meta.warnings and out.meta.steps and out.meta.scheme == scheme


def test_a_pass_records_what_it_changed_only_on_its_output():
    g = ddp_graph()
    acc = accumulate_gradients(g, 3)
    assert acc.meta.micro_batches == 3 and g.meta.micro_batches == 1
    ex = expand_collectives(g)
    assert ex.meta.fine and not g.meta.fine


def test_unknown_field_is_an_error():
    g = ddp_graph()
    with pytest.raises(AttributeError):
        g.meta.wrold_size = 4  # a typo must not create a new key
    with pytest.raises(AttributeError):
        g.meta.__dict__  # noqa: B018 (slots: no per-instance dict to hide keys in)
    with pytest.raises(TypeError):
        g.meta.replace(wrold_size=4)
    with pytest.raises(TypeError):
        GraphMeta(wrold_size=4)
    with pytest.raises(TypeError):
        g.meta["world_size"]  # noqa: B018 (no dict interface beside the attributes)


def test_replace_and_copy():
    m = GraphMeta(world_size=2, steps=[0, 1], ps={"keys": []})
    r = m.replace(world_size=8)
    assert (r.world_size, m.world_size) == (8, 2) and r.steps == m.steps and r.steps is not m.steps
    c = m.copy()
    assert c == m and c.ps is not m.ps
