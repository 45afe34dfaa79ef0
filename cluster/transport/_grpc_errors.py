"""The one place where grpc.RpcError becomes a cluster error (STYLE.md: translate at the edge)."""

from __future__ import annotations

import grpc

from cluster.errors import ClusterError, PeerUnavailableError, UnauthenticatedError
from cluster.transport.api import PeerInfo

__all__ = ["translate"]

_UNREACHABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}


def translate(error: grpc.RpcError, peer: PeerInfo, activity: str) -> ClusterError:
    """A typed error naming ``peer`` and ``activity`` for a failed call to that peer."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(
            f"{peer} refused {activity}: missing or wrong cluster token (CLUSTER_TOKEN must be "
            "the same on every task)"
        )
    if code in _UNREACHABLE or code is None:
        name = code.name if code is not None else "error"
        return PeerUnavailableError(
            f"{peer} unreachable during {activity}: {name}: {details}",
            task=peer.task,
            address=peer.address,
        )
    return ClusterError(f"{peer} failed {activity}: {code.name}: {details}")
