"""The autograd graph's host memory on CPU jobs: the collector counts the nodes each layer's forward made (by sequence
number), and the memory models price them at the torch version's measured bytes per node (``search.memory.autograd_host``)."""
from __future__ import annotations

import dataclasses
import os

import pytest

from dagprof.graph.build import build_graph
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.search.memory import AUTOGRAD_NODE_BYTES, autograd_host
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.run_schema import LOSS_FORWARD, PREVIOUS_GRAPH, SAVED_OUTSIDE_LAYERS

DATA = os.path.join(os.path.dirname(__file__), "data")
HELD, SHELL = AUTOGRAD_NODE_BYTES["2.13"]


def with_nodes(g, nodes, torch="2.13.0+cpu"):
    g.meta = dataclasses.replace(g.meta, layer_autograd_nodes=nodes, torch=torch)
    return g


def walk(t):
    """Nodes behind ``t`` that the forward made (a parameter's ``AccumulateGrad`` has no sequence number of its own)."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        n = stack.pop()
        if n is not None and n not in seen:
            seen.add(n)
            stack.extend(f for f, _ in n.next_functions)
    return sum(type(n).__name__ != "AccumulateGrad" for n in seen)


def counted(tmp_path, keep_loss: bool) -> tuple[dict[str, int], int]:
    """The nodes a profile counted of two equal ``Linear`` layers with ``x * 2 + 1`` between them, and those backward
    walks; ``keep_loss``: the loss is a loop variable (else a function's, gone with the step)."""
    torch = pytest.importorskip("torch")
    from dagprof.collect import profile

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.b(self.a(x) * 2 + 1)

    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    walked = []

    def step() -> torch.Tensor:
        loss = model(x).pow(2).mean()
        walked.append(walk(loss))
        loss.backward()
        return loss.detach()

    with profile(tmp_path, steps="1:3", model=model, kineto=False) as prof:
        for _ in range(4):
            loss = step() if not keep_loss else model(x).pow(2).mean()
            if keep_loss:
                walked.append(walk(loss))
                loss.backward()
            prof.step()
    return read_run(tmp_path).ranks[0].meta.layer_autograd_nodes, walked[-1]


def test_the_collector_counts_each_layers_nodes_and_the_ops_before_it(tmp_path):
    """The second layer's count has the two nodes between them more; the loss's are outside the layers; together they
    are the nodes backward walks. A loss that goes with its step leaves no graph to the next."""
    nodes, walked = counted(tmp_path, keep_loss=False)
    assert nodes["b"] - nodes["a"] == 2 and nodes[SAVED_OUTSIDE_LAYERS] == 2  # pow, mean
    assert sum(nodes.values()) == walked and PREVIOUS_GRAPH not in nodes


def test_a_loss_kept_into_the_next_step_holds_its_graph_as_the_forward_begins(tmp_path):
    nodes, walked = counted(tmp_path, keep_loss=True)
    assert nodes[PREVIOUS_GRAPH] == walked == sum(n for k, n in nodes.items() if k != PREVIOUS_GRAPH)


def test_an_fsdp_peak_adds_the_nodes_held_and_their_shells():
    """Nodes outside the layers are held to the step's end: the fullest moment of backward gains every one's held
    bytes; the optimizer step, after backward, their shells only (a profile with the model's output recorded: without,
    what was saved outside the layers stood in for it too)."""
    g = build_graph(read_run(os.path.join(DATA, "fsdp", "loss-vocab")))
    base = {r: m.total for r, m in fsdp_peak(g).items()}
    with_nodes(g, {SAVED_OUTSIDE_LAYERS: 1000})
    got = fsdp_peak(g)
    for r, m in got.items():
        assert m.autograd == 1000 * SHELL
        assert m.total - base[r] == pytest.approx(1000 * HELD) if m.at != "optimizer step" else 1000 * SHELL
    assert autograd_host(g).note is None


def test_a_layers_held_bytes_go_with_its_activations_at_its_backward():
    """A layer's nodes free their held bytes when its backward runs, as its saved tensors: the fullest moment gains at
    most all of them, at least the shells."""
    g = build_graph(read_run(os.path.join(DATA, "fsdp", "reshard")))
    base = max(m.total for m in fsdp_peak(g).values())
    layer = next(n for n in g.meta.fsdp.layer_saved_bytes if n in g.layers)
    with_nodes(g, {layer: 1000})
    got = max(m.total for m in fsdp_peak(g).values())
    assert base + 1000 * SHELL <= got <= base + 1000 * HELD


def test_a_torch_version_not_measured_is_said_not_priced():
    g = with_nodes(build_graph(read_run(os.path.join(DATA, "fsdp", "reshard"))), {SAVED_OUTSIDE_LAYERS: 1000}, torch="1.13.1")
    base = autograd_host(g)
    assert base.shell == 0 and not base.freed and "not measured for torch 1.13.1" in base.note and "1000 nodes" in base.note


def test_the_ddp_model_of_an_fsdp_job_counts_them_too():
    """``whatif --data-parallel ddp``'s peak (``MemoryModel``): the shells through the step, the held bytes in backward."""
    from dagprof.search.fsdp_memory import ddp_peak_of_fsdp

    g = build_graph(read_run(os.path.join(DATA, "fsdp", "loss-vocab")))
    base = {r: m.total for r, m in ddp_peak_of_fsdp(g).items()}
    with_nodes(g, {SAVED_OUTSIDE_LAYERS: 1000})
    for r, m in ddp_peak_of_fsdp(g).items():
        assert m.autograd == 1000 * SHELL and m.total - base[r] == pytest.approx(1000 * (HELD if not m.step else SHELL))


def test_the_step_befores_shells_make_the_loss_forward_the_fullest():
    """A script that keeps its loss: as its next loss's forward ends, the step before's shells are alive beside this
    step's whole graph, every activation and what the loss saved. Where the loss saved nothing the root's forward end,
    a moment before, holds as much and FSDP2's last all-gather output too: the shells are counted there."""
    g = build_graph(read_run(os.path.join(DATA, "fsdp", "loss-vocab")))
    g.meta.fsdp.layer_saved_bytes[LOSS_FORWARD] = 0
    with_nodes(g, {SAVED_OUTSIDE_LAYERS: 1000, PREVIOUS_GRAPH: 100000})
    m = max(fsdp_peak(g).values(), key=lambda m: m.total)
    assert m.at.startswith("forward end") and m.autograd == 101000 * SHELL
    g.meta.fsdp.layer_saved_bytes[LOSS_FORWARD] = 10 * 2**20  # what the loss saved outweighs that output
    m = max(fsdp_peak(g).values(), key=lambda m: m.total)
    assert m.at == "loss forward" and m.autograd == 101000 * SHELL


def test_the_ddp_models_loss_forward_holds_every_activation_and_the_step_befores_shells():
    """``MemoryModel``: no gradient yet (set to None), every layer's saved activations, what the loss saved, this step's
    shells and the step before's; without the last two the loss's backward, which holds as much and more, stays the peak."""
    from dagprof.search.memory import MemoryModel

    m = MemoryModel(100.0, {0: 40.0, 1: 60.0}, 10.0, 0.0, output=5.0, backward=((1, 50.0), (0, 50.0)), loss=30.0,
                    shell=7.0, previous=0.0, loss_forward=0.0)
    assert m.peak().grads > 0  # backward's
    kept = dataclasses.replace(m, previous=1000.0, loss_forward=20.0)
    p = kept.peak()
    assert p.grads == 0 and p.activations == 100 + 10 + 5 + 20 and p.autograd == 1007.0
