"""A PowerSGD strategy applied by ``dagprof.apply`` to a model with a scalar parameter (a learnable temperature, as
``bench/ddp_fresh/two_tower.py`` has): torch's ``powerSGD_hook`` reads every gradient's ``shape[0]`` and raised IndexError
inside DDP's backward, so the strategy's job failed; the deployed hook hands it the scalar as a 1-element view."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(64, 8)
        self.out = torch.nn.Linear(8, 4)
        self.log_temp = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, ids):
        return self.out(self.table(ids)) * self.log_temp.exp()


def test_powersgd_on_a_model_with_a_scalar_parameter_trains_and_reduces_the_scalar_exactly(one_rank_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dagprof.collect.deploy.apply import apply
    from dagprof.collect.deploy.strategy import Compression, Strategy

    torch.manual_seed(0)
    model = DDP(Scaled())
    names = tuple((n, p.numel()) for n, p in model.module.named_parameters())
    applied = apply(model, Strategy(model=names, world_size=1, compression=Compression("powersgd", rank=1, start_iter=2)))
    plain = Scaled()
    plain.load_state_dict(model.module.state_dict())
    ids = torch.arange(16) % 64
    for _ in range(5):  # past start_iter: the hook compresses the matrices and all-reduces the rest
        model.zero_grad()
        plain.zero_grad()
        model(ids).square().mean().backward()
        plain(ids).square().mean().backward()
        # one rank: the scalar's all-reduced gradient is its own, written back into the bucket through the view
        assert torch.allclose(model.module.log_temp.grad, plain.log_temp.grad)
    assert model.module.table.weight.grad is not None
    applied.remove()
