"""``nn.MultiheadAttention`` computes its attention itself and uses its ``out_proj``'s weights without calling it: timed as
leaves, its attention was no layer's (``other:forward``) and ``out_proj`` a layer that never ran. The collector times it
as one layer; a profile from before (tests/data/ddp-fresh/mha-accum) names it in the finding its gap leads. A parametrized
module (``weight_norm``, ``spectral_norm``) is one layer alike: as leaves only its parametrization was timed."""
from __future__ import annotations

import json

import pytest
from testdata import DATA

from dagprof.analysis import analyze
from dagprof.analysis.findings import findings
from dagprof.graph.build import build_graph
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind


def _profiled(tmp_path, net, shape: tuple) -> None:
    """``net`` under DDP on one gloo rank, 4 steps of SGD on random batches of ``shape``, steps 1-2 profiled (hooks only)
    into ``tmp_path / "run"``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import profile

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = DDP(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(tmp_path / "run", steps=range(1, 3), model=model, kineto=False) as prof:
            for _ in range(4):
                opt.zero_grad()
                model(torch.randn(*shape)).sum().backward()
                opt.step()
                prof.step()
    finally:
        dist.destroy_process_group()


def test_attention_is_one_timed_layer_with_its_out_projection(tmp_path):
    torch = pytest.importorskip("torch")


    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(8, 16)
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.head = torch.nn.Linear(16, 2)

        def forward(self, x):
            return self.head(self.encoder(self.embed(x)))

    _profiled(tmp_path, Encoder(), (2, 4, 8))
    rank = json.loads((tmp_path / "run" / "rank0.json").read_text())
    attn = "encoder.layers.0.self_attn"
    assert attn in rank["layers"] and f"{attn}.out_proj" not in rank["layers"]
    assert rank["layer_grad_bytes"][attn] == 4 * (4 * 16 * 16 + 4 * 16)  # in_proj (3 x 16 x 16 + 48) and out_proj (16 x 16 + 16)
    g = build_graph(read_run(tmp_path / "run"))  # called as (x, x, x): one backward-end record, not three alike
    k = g.layers.index(attn)
    for kind in (Kind.FORWARD, Kind.BACKWARD):
        assert (g.dur[(g.layer == k) & (g.kind == kind)] > 0).sum() == len(g.meta.steps)


def test_a_parametrized_conv_is_one_timed_layer_with_its_parametrization(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm


    net = torch.nn.Sequential(weight_norm(torch.nn.Conv2d(3, 4, 3)), torch.nn.ReLU(), torch.nn.Flatten(),
                              spectral_norm(torch.nn.Linear(36, 2)))
    _profiled(tmp_path, net, (2, 3, 5, 5))
    rank = json.loads((tmp_path / "run" / "rank0.json").read_text())
    assert rank["layers"] == ["0", "1", "2", "3"]  # no layer inside a parametrization
    assert rank["layer_grad_bytes"]["0"] == 4 * (4 * 3 * 3 * 3 + 4 + 4)  # v, g (one per output channel) and the bias
    g = build_graph(read_run(tmp_path / "run"))
    for layer in ("0", "3"):
        k = g.layers.index(layer)
        for kind in (Kind.FORWARD, Kind.BACKWARD):
            assert (g.dur[(g.layer == k) & (g.kind == kind)] > 0).sum() == len(g.meta.steps)


def test_a_profile_with_untimed_attention_names_it_where_its_gap_leads_the_path():
    a = analyze(build_graph(read_run(DATA / "ddp-fresh" / "mha-accum")))
    (top,) = [f for f in findings(a) if f.title == "largest op on the critical path"]
    assert top.detail.startswith("forward between timed layers: ")  # other:forward, in words
    assert "the root Classifier's forward" in top.detail  # the model's own parameters: its forward's lines, said apart
    assert "the code of encoder.layers.0.self_attn, encoder.layers.0.self_attn.out_proj, whose parameters" in top.detail


def test_a_gap_in_a_block_s_own_code_says_where_it_is(tmp_path):
    """Every layer ran, yet the path's largest op is ``other:forward``: a block's own arithmetic between its leaves (a
    Llama block's rotary and attention) is no layer's; the finding says so and how to time it."""
    torch = pytest.importorskip("torch")


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = torch.nn.Linear(4, 64), torch.nn.Linear(64, 2)

        def forward(self, x):
            h = self.inp(x)
            m = torch.eye(64) + 0.001 * torch.ones(64, 64)
            for _ in range(300):  # the block's own code, far longer than its two small leaves
                h = torch.tanh(h @ m)
            return self.out(h)

    _profiled(tmp_path, Block(), (8, 4))
    a = analyze(build_graph(read_run(tmp_path / "run")))
    gaps = [f.detail for f in findings(a) if f.title == "largest op on the critical path"]
    assert gaps and gaps[0].startswith(("forward between timed layers: ", "backward between timed layers: "))
    assert "code in modules with children outside their leaf modules" in gaps[0] and "timed as a layer" in gaps[0]


def test_a_module_s_own_parameters_beside_its_children_are_said_untimed(tmp_path):
    """A module with parameters of its own beside its children (a hand-written graph attention's score vectors beside its
    ``lin``: ``bench/ddp_fresh/gat_edges.py``) is no layer: its own arithmetic is the gap, and the finding says so
    instead of telling a fresh profile to profile again."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = torch.nn.Linear(4, 64), torch.nn.Linear(64, 2)
            self.score = torch.nn.Parameter(torch.full((64,), 0.01))

        def forward(self, x):
            h = self.inp(x) * self.score
            w, m = torch.ones(8, 128), torch.eye(128) + 0.001
            with torch.no_grad():  # its own arithmetic between its children, far longer than they (no backward)
                for _ in range(300):
                    w = torch.tanh(w @ m)
            return self.out(h * w.mean())

    class Net(torch.nn.Module):  # not the root: the root's own code is said apart
        def __init__(self):
            super().__init__()
            self.att = Attention()

        def forward(self, x):
            return self.att(x)

    _profiled(tmp_path, Net(), (8, 4))
    a = analyze(build_graph(read_run(tmp_path / "run")))
    gaps = [f.detail for f in findings(a) if f.title == "largest op on the critical path"]
    assert gaps and gaps[0].startswith("forward between timed layers: ")
    assert "the code of att, whose parameters no timed layer ran: a module's own arithmetic" in gaps[0]
    assert "profiled again" not in gaps[0]
