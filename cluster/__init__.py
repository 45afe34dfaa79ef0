"""cluster-runtime: tf.distribute's programming model over processes, gRPC and NCCL.

>>> import cluster
>>> strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
>>> with strategy.scope():
...     w = cluster.Variable(1.0)
>>> strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)
np.float32(4.0)
"""

from __future__ import annotations

from cluster import coordinator, metrics, optimizers, runtime
from cluster._context import (
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from cluster.collectives.ops import ReduceOp
from cluster.collectives.options import CommunicationImplementation, CommunicationOptions
from cluster.data import InputContext, InputReplicationMode
from cluster.strategies import (
    CentralStorageStrategy,
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    ParameterServerStrategy,
    ReplicaContext,
    Strategy,
    StrategyExtended,
)
from cluster.values import Mirrored, PerReplica
from cluster.variables import Variable, VariableAggregation, VariableSynchronization

__all__ = [
    "CentralStorageStrategy",
    "CommunicationImplementation",
    "CommunicationOptions",
    "InputContext",
    "InputReplicationMode",
    "MirroredStrategy",
    "Mirrored",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "ParameterServerStrategy",
    "PerReplica",
    "ReduceOp",
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "metrics",
    "coordinator",
    "runtime",
    "optimizers",
]
