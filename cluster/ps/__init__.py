"""Parameter-server training: the variable store, partitioners and placement, the client.

``cluster.ps.store`` and ``cluster.ps.partitioners`` are pure (no gRPC) and testable in-process;
``cluster.transport.ps_client`` talks to the ``ParameterServer`` service of ``python -m ps``.
"""

from cluster.ps.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    Placement,
    Placer,
    Shard,
    concat,
    place,
    shard_sizes,
    split,
)
from cluster.ps.store import AssignMode, OptimizerSpec, Pulled, VariableStore

__all__ = [
    "AssignMode",
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "OptimizerSpec",
    "Partitioner",
    "Placement",
    "Placer",
    "Pulled",
    "Shard",
    "VariableStore",
    "concat",
    "place",
    "shard_sizes",
    "split",
]
