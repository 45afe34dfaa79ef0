"""The transport interface: point-to-point messages between the ranks of one group.

Collectives are written against :class:`Transport` only, so the same ring runs over gRPC between
processes and over the in-process transport in unit tests (``tests/transport/test_contract.py``
runs one contract suite against both).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import NamedTuple

from cluster.deadline import Deadline

__all__ = ["MessageKey", "PeerInfo", "Received", "Transport"]


class MessageKey(NamedTuple):
    """Names one message: which collective (``group``, ``seq``) and where in its algorithm.

    ``step`` is the algorithm step (ring step, doubling round), ``chunk`` the sub-chunk inside
    it. A receiver matches on (source rank, key), never on arrival order.
    """

    group: str
    seq: int
    step: int
    chunk: int = 0


@dataclass(frozen=True)
class PeerInfo:
    """A rank of the group and the task behind it, for error messages and connections."""

    rank: int
    task: str  # "worker:1"
    address: str  # "127.0.0.1:41231"; "" for in-process peers

    def __str__(self) -> str:
        return f"{self.task} ({self.address})" if self.address else self.task


class Received(NamedTuple):
    """A received message: its bytes (read-only, valid until dropped) and sender's signature."""

    payload: memoryview
    signature: str


class Transport(abc.ABC):
    """Point-to-point, tagged, deadline-bounded messages between ``world_size`` ranks.

    Contract (every implementation):

    - ``send`` returns once ``payload`` may be reused by the caller; delivery is asynchronous.
      Any size is accepted (implementations split large payloads into frames themselves).
    - ``recv(src, key)`` returns the message ``src`` sent with ``key``, whatever order messages
      arrived in. Each (src, key) is received at most once.
    - Failure poisons the group: once a peer is found dead or unreachable, or a peer aborts, every
      pending and later ``send``/``recv`` raises that error (``PeerUnavailableError`` naming the
      peer, ``CollectiveAbortedError`` carrying the aborting task's reason). A group never mixes
      data after a failure; a new transport is needed.
    - ``recv`` raises ``CollectiveTimeoutError`` when ``deadline`` passes first, naming the peer
      and key; ``send`` may block against the deadline when too much data is in flight.
    - After ``close()`` every call raises ``TransportClosedError``.
    """

    rank: int
    world_size: int

    @property
    @abc.abstractmethod
    def peers(self) -> list[PeerInfo]:
        """Every rank of the group, this one included, indexed by rank."""

    @abc.abstractmethod
    def send(
        self,
        dst: int,
        key: MessageKey,
        payload: bytes | bytearray | memoryview,
        *,
        deadline: Deadline,
        signature: str = "",
    ) -> None:
        """Send ``payload`` to rank ``dst`` under ``key``."""

    @abc.abstractmethod
    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        """Wait for the message rank ``src`` sent under ``key``."""

    def post_recv(self, src: int, key: MessageKey, into: memoryview) -> None:
        """Offer ``into`` (a writable byte view) as the landing place of ``(src, key)``'s payload.

        A hint that saves a copy: an implementation that honours it writes a payload of exactly
        ``len(into)`` bytes straight into ``into``, and ``recv`` then returns ``into`` itself as
        the payload (test with ``is``). The caller must neither read nor write ``into`` until
        that ``recv`` returns, and must ``recv`` the key. Implementations may ignore it (the
        default does).
        """
        return  # a hint: ignoring it is always correct

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """Fail the group on every rank: peers' pending and later calls raise with ``reason``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and threads; idempotent."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise the group's failure, if any, without waiting."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
