"""``cluster.coordinator``: TF 2's single-client parameter-server training.

``ClusterCoordinator(strategy)`` on the chief schedules functions on the workers of a
:class:`~cluster.ParameterServerStrategy`; see :mod:`cluster.coordinator.coordinator`.
"""

from cluster.coordinator.coordinator import ClusterCoordinator
from cluster.coordinator.remote_values import (
    PerWorkerDataset,
    PerWorkerIterator,
    PerWorkerValues,
    RemoteValue,
)

__all__ = [
    "ClusterCoordinator",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "PerWorkerValues",
    "RemoteValue",
]
