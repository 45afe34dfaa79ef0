"""The one place that reads ``grpc.StatusCode``: failed calls become typed cluster errors.

Everything else in the package asks this module (STYLE.md: translate foreign errors at the edge,
never classify an error by its message text): :func:`translate` turns a failed call to a peer into
an error naming the peer and the activity; :func:`status_name` gives a status for messages that
list what each peer answered; the predicates say how a caller should react.
"""

from __future__ import annotations

import grpc

from cluster.errors import (
    ClusterError,
    ClusterSpecMismatchError,
    PeerUnavailableError,
    UnauthenticatedError,
)
from cluster.transport.api import PeerInfo

__all__ = [
    "fails_at_connect",
    "is_cancelled",
    "is_unauthenticated",
    "spec_mismatch",
    "status_name",
    "translate",
]

_UNREACHABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}
_TOKEN_HINT = "missing or wrong cluster token (CLUSTER_TOKEN must be the same on every task)"
_SPEC_HINT = ("the cluster spec differs between tasks: give every task the same cluster "
              "(TF_CONFIG's \"cluster\")")


def _code(error: BaseException) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def status_name(error: BaseException) -> str:
    """The call's status (``"UNAVAILABLE"``...), or ``"error"`` when it has none."""
    code = _code(error)
    return code.name if code is not None else "error"


def is_cancelled(error: BaseException) -> bool:
    """The call was cancelled (by us: a stream we closed)."""
    return _code(error) == grpc.StatusCode.CANCELLED


def is_unauthenticated(error: BaseException) -> bool:
    """The peer refused our token."""
    return _code(error) == grpc.StatusCode.UNAUTHENTICATED


def fails_at_connect(error: BaseException) -> bool:
    """A Hello failure that retrying cannot cure (wrong token, a different cluster spec)."""
    return _code(error) in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)


def spec_mismatch(message: str) -> ClusterSpecMismatchError:
    """The error for a peer that sees another cluster; ``message`` says what differs."""
    return ClusterSpecMismatchError(f"{message}: {_SPEC_HINT}")


def translate(error: grpc.RpcError, peer: PeerInfo | str, activity: str) -> ClusterError:
    """A typed error naming ``peer`` and ``activity`` for a failed call to that peer.

    UNAUTHENTICATED -> :class:`UnauthenticatedError`; FAILED_PRECONDITION (a Hello refused
    because the peer sees another group) -> :class:`ClusterSpecMismatchError`; unreachable
    (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ...) -> :class:`PeerUnavailableError`; anything
    else -> :class:`ClusterError`.
    """
    code = _code(error)
    details = error.details() if hasattr(error, "details") else str(error)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(f"{peer} refused {activity}: {_TOKEN_HINT}")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return spec_mismatch(f"{peer} refused {activity}: {details}")
    if code in _UNREACHABLE or code is None:
        name = code.name if code is not None else "error"
        task = peer.task if isinstance(peer, PeerInfo) else peer
        address = peer.address if isinstance(peer, PeerInfo) else ""
        return PeerUnavailableError(
            f"{peer} unreachable during {activity}: {name}: {details}",
            task=task, address=address,
        )
    return ClusterError(f"{peer} failed {activity}: {code.name}: {details}")
