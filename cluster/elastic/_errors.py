"""The errors of elastic training, in :mod:`cluster.errors`' hierarchy (``ClusterError``).

``ElasticGroupError`` (the group cannot re-form: below the minimum, naming who is gone) is the
strategy's, defined in :mod:`cluster.errors` and exported here too."""

from __future__ import annotations

from cluster.errors import (
    ClusterError,
    CollectiveAbortedError,
    ElasticGroupError,
    PeerFailedError,
    PeerUnavailableError,
    TransportClosedError,
)

__all__ = [
    "MEMBERSHIP_FAILURES",
    "ElasticGroupError",
    "MembershipChanged",
    "RegroupLimitError",
]


class MembershipChanged(ClusterError):
    """A task waits to join, or has left: every member raises it at the same ``commit()`` (the
    decision is a collective), so that :func:`cluster.elastic.run` regroups there.

    ``commits`` is how many commits the raising :class:`~cluster.elastic.State` had made (its
    construction counts as the first)."""

    def __init__(self, message: str, *, commits: int = 0) -> None:
        super().__init__(message)
        self.commits = commits


class RegroupLimitError(ClusterError):
    """The group re-formed this many times in a row without a single commit between: training
    cannot progress (every attempt fails before it commits), so the job fails rather than loop.
    Chained from the last membership failure."""


MEMBERSHIP_FAILURES: tuple[type[BaseException], ...] = (
    PeerUnavailableError,    # a peer died, closed its port, or stopped answering heartbeats
    CollectiveAbortedError,  # another task aborted the group (its root cause in the message)
    PeerFailedError,         # another task reported a failure and this one stops because of it
    TransportClosedError,    # the local transport closed under a collective (a regroup began)
    MembershipChanged,       # a task waits to join or left, agreed at a commit
)
"""The errors after which :func:`cluster.elastic.run` rolls back and regroups; anything else
propagates unchanged."""
