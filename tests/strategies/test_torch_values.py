"""Torch tensors through the strategies: 0-d stays 0-d, and one module shared by
MirroredStrategy's replica threads gets a short error that says what to do."""

from __future__ import annotations

import pytest

import cluster
from tests._requires import require

torch = require("torch")


def test_a_0d_loss_stays_0d_through_reduce_and_all_reduce() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        losses = strategy.run(lambda: torch.tensor(1.5))
        total = strategy.reduce("SUM", losses, axis=None)
        mean = strategy.run(lambda: cluster.get_replica_context().all_reduce(
            "MEAN", torch.tensor(2.0)))
    assert isinstance(total, torch.Tensor) and total.shape == () and total.item() == 3.0
    for m in strategy.experimental_local_results(mean):
        assert isinstance(m, torch.Tensor) and m.shape == () and m.item() == 2.0


def test_one_module_shared_by_the_replica_threads_gets_a_short_error() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = torch.nn.Linear(200, 100)

    def step():
        model(torch.ones(4, 200)).sum().backward()
        ctx = cluster.get_replica_context()
        return [ctx.all_reduce("MEAN", p.grad) for p in model.parameters()]

    with strategy.scope(), pytest.raises(ValueError) as info:
        strategy.run(step)
    message = str(info.value)
    assert "same torch.Tensor object" in message and "copy.deepcopy" in message
    assert len(message) < 600 and "tensor(" not in message


def test_the_same_tensor_returned_by_every_replica_is_named_in_reduce() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    shared = torch.ones(50, 50)
    with strategy.scope(), pytest.raises(ValueError, match="same torch.Tensor object") as info:
        strategy.reduce("SUM", strategy.run(lambda: shared), axis=None)
    assert "tensor(" not in str(info.value)
