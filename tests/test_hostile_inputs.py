"""Hostile and damaged inputs (issue 17, items 5, 6, 10-12): each is refused in one line with exit status 2,
or handled correctly; nothing is half-written. Every case is built from the vendored data in tests/data."""
from __future__ import annotations

import json
import pathlib

import pytest

DATA = pathlib.Path(__file__).parent / "data"
STRATEGY = DATA / "strategy" / "v1.json"  # model a.weight (6), a.bias (2); recomputes blocks.1; PowerSGD, 2 micro-batches


# --- item 6: dagprof.apply validates the whole strategy file against the model before changing it ----------

@pytest.fixture
def one_rank_group(tmp_path):
    """A real single-process gloo group, so DDP runs in this process."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    """The model the vendored strategy file was written for: ``a`` = Linear(3, 2), ``blocks.1`` to recompute."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(3, 2)
            self.blocks = torch.nn.Sequential(torch.nn.Identity(), torch.nn.ReLU())

        def forward(self, x):
            return self.blocks(self.a(x))

    torch.manual_seed(0)
    return Net()


def _hostile(tmp_path, change) -> str:
    doc = json.loads(STRATEGY.read_text())
    change(doc)
    path = tmp_path / "strategy.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _set(**kw):
    return lambda d: d.update(kw)


@pytest.mark.parametrize("change,message", [
    (_set(accumulate=0), "invalid strategy: accumulate is 0, expected 1..1024"),
    (_set(accumulate=-1), "invalid strategy: accumulate is -1"),
    (_set(partition=0), "invalid strategy: partition is 0"),
    (_set(partition=10**9), "invalid strategy: partition is 1000000000, expected 1..1024"),
    (_set(world_size=0), "invalid strategy: world_size is 0"),
    (lambda d: d["buckets"][0]["params"].append("a.nope"), "bucket 0 names parameter 'a.nope', which is not in the strategy's model"),
    (lambda d: d["buckets"].pop(), "the buckets leave out 1 of 2 parameters, e.g. 'a.weight'"),
    (lambda d: d["buckets"][1]["params"].append("a.bias"), "parameter 'a.bias' is in more than one bucket (again in bucket 1)"),
    (lambda d: d["buckets"][0].update(params=[]), "bucket 0 holds no parameter"),
    (lambda d: d["buckets"][0].update(nbytes=-8), "bucket 0 has -8 bytes"),
    (lambda d: d["model"][0].__setitem__(1, -6), "parameter 'a.weight' has -6 elements"),
    (lambda d: d["model"].append(["a.bias", 2]), "parameter 'a.bias' is listed twice"),
    (lambda d: d["model"].append(["b.weight", 4]), "strategy does not match the model: parameter 'b.weight' is not in this model"),
    (lambda d: d["model"][1].__setitem__(1, 3), "parameter 'a.bias' has 3 elements in the strategy, 2 here"),
    (lambda d: d["compression"].update(rank=0), "PowerSGD rank is 0"),
    (_set(recompute=["blocks.7"]), "it recomputes module 'blocks.7', which this model does not have"),
    (_set(recompute=["blocks.1", "blocks.1"]), "module 'blocks.1' is recomputed twice"),
])
def test_apply_refuses_a_strategy_that_does_not_fit_before_changing_anything(tmp_path, one_rank_group, change, message):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import apply
    from dagprof.errors import DagprofError

    path = _hostile(tmp_path, change)
    model = _model()
    ddp = DDP(model)
    config, reducer = ddp._bucket_config, ddp.reducer
    with pytest.raises(DagprofError) as err:
        apply(ddp, path)
    text = str(err.value)
    assert text.startswith(path + ": ") and message in text and "\n" not in text
    # nothing changed: no plan, the same bucket limits and reducer, no checkpointed forward, no comm hook
    assert getattr(ddp, "_dagprof_applied", None) is None
    assert ddp._bucket_config is config and ddp.reducer is reducer and not ddp._comm_hooks
    assert "forward" not in model.blocks[1].__dict__


def test_apply_accepts_the_vendored_strategy_and_trains(tmp_path, one_rank_group):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof import apply

    model = _model()
    ddp = DDP(model)
    with pytest.warns(RuntimeWarning, match="found for 2 ranks, this job has 1"):
        plan = apply(ddp, str(STRATEGY))
    assert plan.micro_batches == 2 and "forward" in model.blocks[1].__dict__ and len(ddp._comm_hooks) == 1
    for _ in range(3):
        for i in range(plan.micro_batches):
            with plan.sync(i):
                ddp(torch.randn(4, 3)).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    del ddp, plan
