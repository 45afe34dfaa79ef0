"""The error hierarchy of cluster-runtime.

Every error names the task and the activity, e.g.
``PeerUnavailableError: worker:2 (127.0.0.1:41231) unreachable during all_reduce #118 after 5.0 s``.
Foreign errors (grpc.RpcError, OSError) are translated at the transport boundary and chained with
``raise ... from e``; callers classify errors by type, never by message text.
"""

from __future__ import annotations

__all__ = [
    "ClusterError",
    "CollectiveAbortedError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "PeerUnavailableError",
    "TransportClosedError",
    "UnauthenticatedError",
]


class ClusterError(RuntimeError):
    """Base of every runtime error raised by cluster-runtime."""


class PeerUnavailableError(ClusterError):
    """A peer task died, closed its port, or stopped answering heartbeats.

    ``task`` is the peer's name (``"worker:1"``) and ``address`` its ``host:port``.
    """

    def __init__(self, message: str, *, task: str = "", address: str = "") -> None:
        super().__init__(message)
        self.task = task
        self.address = address


class CollectiveTimeoutError(ClusterError, TimeoutError):
    """A collective did not complete before its deadline (``timeout_seconds``)."""


class CollectiveMismatchError(ClusterError):
    """Ranks disagree on a collective (kind, op, dtype, shape, or order of calls)."""


class CollectiveAbortedError(ClusterError):
    """Another task aborted the group; the message carries that task's root cause."""

    def __init__(self, message: str, *, task: str = "") -> None:
        super().__init__(message)
        self.task = task


class UnauthenticatedError(ClusterError):
    """A peer refused our calls because the cluster token was missing or wrong."""


class TransportClosedError(ClusterError):
    """The local transport was closed while an operation was using it."""
