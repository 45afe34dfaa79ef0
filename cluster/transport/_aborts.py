"""How a rank of a :class:`~cluster.transport.network.NetworkTransport` tells the other ranks
that its group failed, and why: its ``Abort`` calls.

An Abort is either bare (this rank aborts, for a reason) or names a loss: this rank's group
failed because a peer died, and the receiver fails naming that peer (``lost_by_peer``), so its
own goodbye names it too. Told only "aborted", a rank waiting on one that then left would name
the rank that left, not the task that died. Calls go in parallel, each bounded, to the peers
this rank holds a channel to (a lazy transport: the ones it talked to); a peer that cannot be
told finds out by its own detection. Every call carries the group's elastic generation, and a
receiver in another generation ignores it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

import grpc

from cluster.errors import ClusterError, PeerUnavailableError
from cluster.transport._pb import collective_pb2
from cluster.transport.api import PeerInfo
from cluster.transport.auth import Token
from cluster.transport.endpoint import SERVICE

__all__ = ["Aborts", "lost_cause"]


class Aborts:
    """The Abort calls of ``me``'s transport (elastic ``generation``, authenticated with
    ``token``); ``channels()`` lists ``(rank, channel)`` for every peer it holds a channel to."""

    def __init__(self, me: PeerInfo, token: Token, generation: int,
                 channels: Callable[[], list[tuple[int, grpc.Channel]]]) -> None:
        self._me = me
        self._token = token
        self._generation = generation
        self._channels = channels
        self.told = False  # the peers were told why this group failed (the calls started)

    def bare(self, reason: str) -> collective_pb2.AbortRequest:
        """This rank aborts the group because of ``reason``."""
        return collective_pb2.AbortRequest(task=self._me.task, reason=reason,
                                           generation=self._generation)

    def loss(self, lost: PeerInfo, error: str) -> collective_pb2.AbortRequest:
        """This rank's group failed (with ``error``) because ``lost`` died."""
        return collective_pb2.AbortRequest(task=self._me.task, reason=error, lost_task=lost.task,
                                           lost_address=lost.address,
                                           generation=self._generation)

    def start(self, request: collective_pb2.AbortRequest, timeout: float,
              skip: frozenset[int] = frozenset()) -> list[grpc.Future]:
        """Start ``request`` to every peer with a channel, except the ranks in ``skip``; the
        caller waits on the calls (:meth:`wait`)."""
        self.told = True
        calls = []
        for rank, channel in self._channels():
            if rank in skip:
                continue
            method = channel.unary_unary(
                f"/{SERVICE}/Abort",
                request_serializer=collective_pb2.AbortRequest.SerializeToString,
                response_deserializer=collective_pb2.AbortReply.FromString,
            )
            calls.append(method.future(request, timeout=timeout, metadata=self._token.metadata))
        return calls

    @staticmethod
    def wait(calls: list[grpc.Future]) -> None:
        """Until every call is answered or past its timeout."""
        for call in calls:
            try:
                call.result()
            except grpc.RpcError:
                pass  # a peer that is gone cannot be told; its own detection covers it


def lost_cause(error: ClusterError | None, peers: Sequence[PeerInfo], departed: Container[int],
               rank: int) -> PeerInfo | None:
    """The peer whose death failed rank ``rank``'s group with ``error``, if that is why it
    failed: not one that ``departed`` (it left; nobody died)."""
    if not isinstance(error, PeerUnavailableError):
        return None
    lost = next((p for p in peers if p.task == error.task), None)
    if lost is None or lost.rank in departed or lost.rank == rank:
        return None
    return lost
