"""The elastic side of ``MultiWorkerMirroredStrategy`` (``CLUSTER_ELASTIC=MIN:MAX``).

:class:`ElasticExtended` is the strategy's ``extended`` in an elastic cluster: what
``cluster.elastic`` asks of a strategy (``_elastic_*``). A regroup swaps the collective group
under the same strategy object: afterwards ``num_replicas_in_sync``, ``worker_index`` and every
collective are the new generation's, while the variables (one replica per task: each task holds
its own copy) stay as they are, for ``cluster.elastic.State`` to restore and broadcast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cluster import timeline
from cluster._elastic_group import ElasticGroup
from cluster.collectives.group import CollectiveGroup
from cluster.collectives.options import CommunicationOptions
from cluster.cross_device_ops import CollectiveAllReduce, NcclAllReduce
from cluster.deadline import Deadline
from cluster.strategies._devices import Device
from cluster.strategies.extended import StrategyExtended
from cluster.transport.api import Transport

if TYPE_CHECKING:
    from cluster.strategies.base import Strategy

__all__ = ["ElasticExtended", "collective_ops"]


def collective_ops(transport: Transport, options: CommunicationOptions,
                   settings) -> CollectiveAllReduce:
    """The strategy's ops over a collective group on ``transport`` (``ops.group``)."""
    group = CollectiveGroup(transport, "multi_worker_mirrored", options, settings=settings)
    return CollectiveAllReduce(group, NcclAllReduce())


class ElasticExtended(StrategyExtended):
    """``strategy.extended`` of an elastic ``MultiWorkerMirroredStrategy``.

    ``elastic`` is the task's :class:`~cluster._elastic_group.ElasticGroup`; ``make_ops`` builds
    the group and ops over a generation's transport; ``local_transport`` gives the one-task
    transport a joiner trains on until it enters the group; ``regroup_timeout`` bounds a regroup.
    """

    def __init__(self, container_strategy: Strategy, devices: Sequence[Device],
                 transport: Transport | None, *, elastic: ElasticGroup,
                 make_ops: Callable[[Transport], CollectiveAllReduce],
                 local_transport: Callable[[], Transport], regroup_timeout: float,
                 options: CommunicationOptions | None = None) -> None:
        self._elastic = elastic
        self._make_ops = make_ops
        self._regroup_timeout_s = regroup_timeout
        ops = make_ops(transport if transport is not None else local_transport())
        super().__init__(container_strategy, devices, ops, num_workers=ops.group.world_size,
                         worker_index=ops.group.rank, options=options)

    def _elastic_enabled(self) -> bool:
        return True

    def _elastic_pending(self) -> bool:
        """This task heard that the group must re-form (a task waits to join, or a newer
        generation exists)."""
        return self._elastic.pending()

    def _elastic_joining(self) -> bool:
        """This task started while the group was running and is not in it yet."""
        return self._elastic.joining

    def _elastic_regroup_timeout(self) -> float:
        return self._regroup_timeout_s

    def _elastic_regroup(self, deadline: Deadline) -> None:
        """Enter the next generation (see :meth:`ElasticGroup.regroup`) and swap the collective
        group under this strategy. Raises ``ElasticGroupError`` when the run cannot go on."""
        self.collective_group.close()
        with timeline.phase("elastic regroup"):  # on the trace: how long training paused
            transport = self._elastic.regroup(deadline)
        ops = self._make_ops(transport)
        self._set_group(ops, ops.group.world_size, ops.group.rank)
