"""How collective payloads travel between the ranks of a network transport: the ``DataPlane``.

Two planes implement it: :class:`~cluster.transport.tcp.TcpDataPlane` (raw, authenticated TCP
connections; the default) and :class:`~cluster.transport._grpc_plane.GrpcDataPlane` (frames on
persistent gRPC Exchange streams). A :class:`~cluster.transport.network.NetworkTransport` routes
each peer through exactly one plane for sending, and receives on every plane, so that tasks
configured with different planes interoperate. The control plane (Hello, heartbeats, Abort)
is gRPC whatever the data plane; planes carry bytes only. The TCP plane runs mutual TLS after its
token handshake when given a :class:`~cluster.transport._tcp_tls.DataPlaneTls`.

Inbound, a plane hands what it received to the callbacks it was built with:
``on_message(src, key, received)`` files a whole message, ``on_lost(src, why)`` reports a peer
whose connection broke, ``on_departed(src)`` one that said goodbye (on every connection it
opened).
"""

from __future__ import annotations

from typing import Protocol

from cluster.deadline import Deadline
from cluster.transport.api import MessageKey

__all__ = ["DataPlane"]


class DataPlane(Protocol):
    """The sending side of one data plane, and the receive buffers offered to it."""

    name: str
    """``"tcp"`` or ``"grpc"``."""

    def routes(self) -> set[int]:
        """Ranks this plane can send to (connected, not dropped)."""
        ...

    def send(self, dst: int, key: MessageKey, payload: bytes | memoryview, signature: str,
             deadline: Deadline) -> None:
        """Send one message to ``dst``; return once ``payload`` may be reused.

        Raises a :class:`~cluster.errors.ClusterError`: ``PeerUnavailableError`` naming the
        peer when it is gone, ``CollectiveTimeoutError`` when ``deadline`` passes first.
        """
        ...

    def post(self, src: int, key: MessageKey, into: memoryview) -> None:
        """Offer ``into`` for the message ``(src, key)`` (a plane may ignore the offer)."""
        ...

    def unpost(self, src: int, key: MessageKey) -> None:
        """Withdraw an offer the message did not use."""
        ...

    def clear_posted(self) -> None:
        """Withdraw every offer (the group failed: nothing more may land in its buffers)."""
        ...

    def drop(self, rank: int) -> None:
        """Cut the route to a peer found lost, waking a send blocked on it."""
        ...

    def close(self, deadline: Deadline, lost: str = "") -> None:
        """Say goodbye to every peer, stop receiving, end every thread by ``deadline``;
        ``lost`` names the task this rank leaves because of (a plane that can say so in its
        goodbye does; the others rely on the transport's Abort)."""
        ...
