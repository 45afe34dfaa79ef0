"""Strategies: how a step runs on replicas and how their values are combined, and the
distributed variables they create."""

from __future__ import annotations

from cluster.strategies._variables import (
    CentralVariable,
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
)
from cluster.strategies.base import Strategy, StrategyExtended, ValueContext
from cluster.strategies.default import OneDeviceStrategy
from cluster.strategies.mirrored import CentralStorageStrategy, MirroredStrategy
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.strategies.parameter_server import ParameterServerStrategy
from cluster.strategies.replica import ReplicaContext

__all__ = [
    "CentralStorageStrategy",
    "CentralVariable",
    "DistributedVariable",
    "MirroredStrategy",
    "MirroredVariable",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "ParameterServerStrategy",
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "SyncOnReadVariable",
    "ValueContext",
]
