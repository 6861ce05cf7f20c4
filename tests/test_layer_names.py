"""A layer an ``nn.Sequential`` numbers is said with its class: an ``nn.Sequential`` root's leaves are named ``0``, ``1``,
... by module path, and the critical path read "forward 6". The collector records the class of each numbered layer
(``RankFile.layer_types``) and the text says "forward 6 ReLU"; the label the graph's nodes carry stays the path."""
from __future__ import annotations

import torch
from testdata import DATA

from dagprof.analysis import analyze
from dagprof.analysis.critical_path import op_words
from dagprof.graph.build import build_graph
from dagprof.traces.dagprof_run import read_run


def test_numbered_layers_are_said_with_their_class(tmp_path):
    import dagprof

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with dagprof.profile(tmp_path / "run", steps=range(1, 3), model=model) as prof:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(32, 64)).pow(2).mean().backward()
            opt.step()
            prof.step()
    run = read_run(tmp_path / "run")
    assert run.ranks[0].meta.layer_types == {"0": "Linear", "1": "ReLU", "2.0": "Linear", "2.1": "Tanh", "3": "Linear"}
    a = analyze(build_graph(run))
    said = a.path.to_dict()["top_ops_words"]
    layers = [w.split() for w in said if w.split()[0] in ("forward", "backward") and w.split()[1][0].isdigit()]  # not "forward between ..."
    assert layers and all(len(w) == 3 and w[-1] in ("Linear", "ReLU", "Tanh") for w in layers)
    assert not any(name.split()[-1][0].isalpha() for name, _ in a.path.top_ops if name.startswith("forward "))  # labels: paths


def test_named_layers_and_older_files_read_as_before():
    assert op_words("forward blocks.0.attn.o", {"0": "Linear"}) == "forward blocks.0.attn.o"
    assert op_words("backward 6") == "backward 6"  # a file written before the classes were recorded
    run = read_run(DATA / "hand-dp" / "convnet-buckets")  # a ResNet built as an nn.Sequential, recorded before
    assert run.ranks[0].meta.layer_types == {} and run.ranks[0].layers[:3] == ["0", "1", "2"]
