"""Where a cluster's coordination service runs, and how each side of it is built from the
cluster's tasks and a task's settings, so that a task and the service's own process
(``python -m coordination_service``) derive the same timing, digest and coordinator name.

By default the chief's task hosts the service (worker 0 without a chief:
:func:`~cluster.transport.coordination.coordinator_task`); with ``CLUSTER_COORDINATION_SERVICE``
it runs in a process of its own at that address (an elastic job whose chief may die), and is
named :data:`~cluster.transport.coordination.SERVICE_HOST`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.errors import PeerUnavailableError
from cluster.settings import TaskSettings
from cluster.transport.auth import Token
from cluster.transport.coordination import (
    SERVICE_HOST,
    CoordinationService,
    cluster_digest,
    coordination_timing,
    coordinator_task,
)
from cluster.transport.coordination_client import CoordinationClient
from cluster.transport.membership import Event

__all__ = ["CoordinationPlan"]


@dataclass(frozen=True)
class CoordinationPlan:
    """The service of a cluster of ``tasks`` (``(task, address)``, cluster order) with
    collective ``group`` (chief and workers, rank order), as ``settings`` configure it."""

    tasks: tuple[tuple[str, str], ...]
    group: tuple[str, ...]
    settings: TaskSettings

    @property
    def coordinator(self) -> str:
        """The service's name: its task's, or ``SERVICE_HOST`` in a process of its own."""
        if self.settings.coordination_service is not None:
            return SERVICE_HOST
        return coordinator_task([t for t, _ in self.tasks])

    @property
    def address(self) -> str:
        if self.settings.coordination_service is not None:
            return self.settings.coordination_service
        return dict(self.tasks)[self.coordinator]

    @property
    def timing(self) -> tuple[float, float]:
        """(heartbeat interval, timeout) for this cluster's size."""
        return coordination_timing(len(self.tasks), self.settings.heartbeat_interval,
                                   self.settings.heartbeat_timeout)

    def service(self) -> CoordinationService:
        """The service (not started), hosted by :attr:`coordinator`."""
        interval, timeout = self.timing
        return CoordinationService(
            self.coordinator, [t for t, _ in self.tasks], cluster_digest(self.tasks),
            interval=interval, timeout=timeout, startup_timeout=self.settings.connect_timeout,
            addresses=dict(self.tasks), stall_timeout=self.settings.stall_timeout,
            elastic=self.settings.elastic, group=self.group)

    def client(self, task: str, incarnation: int, token: Token, *,
               on_event: Callable[[Event], None],
               on_coordinator_lost: Callable[[PeerUnavailableError], None]
               ) -> CoordinationClient:
        """``task``'s side of the service (not registered yet)."""
        interval, timeout = self.timing
        return CoordinationClient(
            task, incarnation, (self.coordinator, self.address), cluster_digest(self.tasks),
            token, interval=interval, timeout=timeout,
            startup_timeout=self.settings.connect_timeout, cluster_size=len(self.tasks),
            stall_timeout=self.settings.stall_timeout, on_event=on_event,
            on_coordinator_lost=on_coordinator_lost)
