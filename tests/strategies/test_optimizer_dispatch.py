"""The optimizer asks the variables' strategy where an update happens (``apply_gradients``)."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster.strategies import StrategyExtended
from cluster.strategies.mirrored import MirroredStrategy


class _RecordingExtended(StrategyExtended):
    """Applies nothing; records what the optimizer handed over."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []

    def apply_gradients(self, optimizer, pairs, aggregate):
        self.calls.append((optimizer, [v for _, v in pairs], aggregate))
        return 41


def _recording_strategy() -> MirroredStrategy:
    strategy = MirroredStrategy(["/cpu:0"])
    base = strategy.extended
    strategy._extended = _RecordingExtended(strategy, base._devices, base._cross_device_ops)
    return strategy


@pytest.mark.parametrize("aggregate", [True, False])
def test_apply_gradients_goes_to_the_variables_strategy_in_any_context(aggregate) -> None:
    strategy = _recording_strategy()
    with strategy.scope():
        w = cluster.Variable([1.0, 2.0])
    optimizer = cluster.optimizers.SGD(0.5)
    # Cross-replica context: the strategy decides, so no "cannot be called" error here.
    result = optimizer.apply_gradients([(np.ones(2), w)],
                                       experimental_aggregate_gradients=aggregate)
    assert result == 41
    assert strategy.extended.calls == [(optimizer, [w], aggregate)]
    assert w.numpy().tolist() == [1.0, 2.0]


def test_a_plain_variable_is_updated_in_the_current_replica_context() -> None:
    w = cluster.Variable([1.0, 2.0])
    assert cluster.optimizers.SGD(0.5).apply_gradients([(np.ones(2), w)]) == 1
    assert w.numpy().tolist() == [0.5, 1.5]


def test_the_default_extended_refuses_cross_replica_context() -> None:
    strategy = MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = cluster.Variable([1.0])
    with strategy.scope(), pytest.raises(RuntimeError, match="cross-replica context"):
        cluster.optimizers.SGD(0.5).apply_gradients([(np.ones(1), w)])
