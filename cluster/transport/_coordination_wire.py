"""The coordination service's wire form: its name and events as protobuf messages (shared by
the service, :mod:`~cluster.transport.coordination`, and its client,
:mod:`~cluster.transport.coordination_client`)."""

from __future__ import annotations

from cluster.transport._pb import coordination_pb2
from cluster.transport.membership import Event, EventKind

__all__ = ["SERVICE", "from_wire", "to_wire"]

SERVICE = "cluster_runtime.v1.Coordination"
_KINDS = {
    EventKind.LOST: coordination_pb2.ClusterEvent.LOST,
    EventKind.FAILED: coordination_pb2.ClusterEvent.FAILED,
    EventKind.LEFT: coordination_pb2.ClusterEvent.LEFT,
    EventKind.ABORTED: coordination_pb2.ClusterEvent.ABORTED,
    EventKind.PREEMPTED: coordination_pb2.ClusterEvent.PREEMPTED,
}
_FROM_WIRE = {v: k for k, v in _KINDS.items()}


def to_wire(event: Event) -> coordination_pb2.ClusterEvent:
    return coordination_pb2.ClusterEvent(
        kind=_KINDS[event.kind], task=event.task, reporter=event.reporter,
        error_type=event.error_type, message=event.message, exit_code=event.exit_code,
        generation=event.generation)


def from_wire(event: coordination_pb2.ClusterEvent) -> Event | None:
    """The event, or ``None`` for a kind this version does not know (a newer peer's): ignored,
    never mistaken for a loss."""
    kind = _FROM_WIRE.get(event.kind)
    if kind is None:
        return None
    return Event(kind, event.task, event.reporter, event.error_type, event.message,
                 event.exit_code, event.generation)
