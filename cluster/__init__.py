"""cluster-runtime: tf.distribute's programming model over processes, gRPC and NCCL.

>>> import cluster
>>> strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
>>> with strategy.scope():
...     w = cluster.Variable(1.0)
>>> strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)
np.float32(4.0)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from cluster import _context  # the standard library only

# Names resolved on first use (PEP 562), so `import cluster.ctl.cli` (clusterctl --help) does not
# pay for grpc and numpy: importing every strategy takes ~2 s on a loaded 2-core machine.
_SUBMODULES = ("coordinator", "elastic", "metrics", "optimizers", "runtime")
_ATTRIBUTES = {
    "get_replica_context": "cluster._context",
    "get_strategy": "cluster._context",
    "has_strategy": "cluster._context",
    "in_cross_replica_context": "cluster._context",
    "ReduceOp": "cluster.collectives.ops",
    "CommunicationImplementation": "cluster.collectives.options",
    "CommunicationOptions": "cluster.collectives.options",
    "InputContext": "cluster.data",
    "InputReplicationMode": "cluster.data",
    "CentralStorageStrategy": "cluster.strategies",
    "MirroredStrategy": "cluster.strategies",
    "MultiWorkerMirroredStrategy": "cluster.strategies",
    "OneDeviceStrategy": "cluster.strategies",
    "ParameterServerStrategy": "cluster.strategies",
    "ReplicaContext": "cluster.strategies",
    "Strategy": "cluster.strategies",
    "StrategyExtended": "cluster.strategies",
    "Mirrored": "cluster.values",
    "PerReplica": "cluster.values",
    "Variable": "cluster.variables",
    "VariableAggregation": "cluster.variables",
    "VariableSynchronization": "cluster.variables",
}

if TYPE_CHECKING:
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


def _default_frame() -> _context.Frame:
    """The default strategy's frame, built when a thread outside every strategy first needs it.

    Installed here, in the package root, because Python runs this file before any module of the
    package: every caller of :mod:`cluster._context` finds the default strategy whatever was
    imported first, and the strategies are imported only then, not by ``import cluster``.
    """
    from cluster.strategies.default import default_frame

    return default_frame()


_context.set_default_frame(_default_frame)


def _wire_frameworks(strategy: object) -> None:
    """On entering a strategy's scope: a program that imported Keras gets :mod:`cluster.keras`
    (which makes ``model.compile`` in the scope distribute the model), so the program needs no
    import of its own. Keras is never imported here: only a program that uses it has it."""
    if "keras" in sys.modules and "cluster.keras" not in sys.modules:
        importlib.import_module("cluster.keras")


_context.add_scope_hook(_wire_frameworks)


def __getattr__(name: str) -> Any:
    """The public names above, imported on first use (then cached in the module)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"cluster.{name}")
    if name not in _ATTRIBUTES:
        # Any other public submodule (cluster.timeline, cluster.checkpoint, cluster.torch...):
        # `import cluster` once made most of them attributes as a side effect; keep that.
        if not name.startswith("_") and importlib.util.find_spec(f"cluster.{name}") is not None:
            return importlib.import_module(f"cluster.{name}")
        raise AttributeError(f"module 'cluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
