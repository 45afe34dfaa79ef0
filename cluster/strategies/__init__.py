"""Strategies: how a step runs on replicas and how their values are combined."""

from __future__ import annotations

from cluster.strategies.base import Strategy, StrategyExtended, ValueContext
from cluster.strategies.default import OneDeviceStrategy
from cluster.strategies.mirrored import CentralStorageStrategy, MirroredStrategy
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.strategies.parameter_server import ParameterServerStrategy
from cluster.strategies.replica import ReplicaContext

__all__ = [
    "CentralStorageStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "ParameterServerStrategy",
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "ValueContext",
]
