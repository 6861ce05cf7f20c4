"""A stock trace recorded with ``with_stack=True`` is said: its Python-call events are counted and the profiler's cost,
which no stock trace measures, named (a user's CRF tagger traced so ran 442-617 ms a step against ~108 unprofiled)."""
from __future__ import annotations

import pytest

from dagprof.traces.kineto import read_kineto

torch = pytest.importorskip("torch")


def _trace(path, with_stack: bool) -> str:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=with_stack) as prof:
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    prof.export_chrome_trace(str(path))
    return str(path)


def test_python_call_events_are_counted_and_said(tmp_path):
    t = read_kineto(_trace(tmp_path / "stack.json", True))
    said = [str(w) for w in t.meta.warnings if "Python-call events" in w.what]
    assert len(said) == 1 and said[0].startswith("stack.json: ") and "with_stack=True" in said[0]
    assert int(said[0].split(": ")[1].split()[0]) > 0


def test_a_trace_without_them_says_nothing(tmp_path):
    t = read_kineto(_trace(tmp_path / "plain.json", False))
    assert not [w for w in t.meta.warnings if "Python-call events" in w.what]
