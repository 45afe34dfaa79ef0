"""In-process transport: ranks are threads of one process. For tests and single-process groups."""

from __future__ import annotations

import threading

from cluster.deadline import Deadline
from cluster.errors import CollectiveAbortedError, PeerUnavailableError, TransportClosedError
from cluster.transport._mailbox import Mailbox
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport

__all__ = ["InProcessHub", "InProcessTransport"]


class InProcessHub:
    """Creates the connected transports of one in-process group and can simulate failures.

    >>> hub = InProcessHub(3)
    >>> t0, t1, t2 = hub.transports
    """

    def __init__(self, world_size: int, *, task_type: str = "worker") -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self._lock = threading.Lock()
        self._peers = [PeerInfo(r, f"{task_type}:{r}", "") for r in range(world_size)]
        self.transports = [InProcessTransport(self, r) for r in range(world_size)]

    @property
    def peers(self) -> list[PeerInfo]:
        return list(self._peers)

    def kill(self, rank: int) -> None:
        """Simulate the death of ``rank``: every other rank's group fails naming it."""
        dead = self._peers[rank]
        self.transports[rank]._mailbox.close()
        for t in self.transports:
            if t.rank != rank:
                t._mailbox.fail(
                    PeerUnavailableError(f"{dead} is unavailable: the peer died", task=dead.task)
                )

    def _deliver(self, src: int, dst: int, key: MessageKey, data: bytes, signature: str) -> None:
        self.transports[dst]._mailbox.put(src, key, Received(memoryview(data), signature))


class InProcessTransport(Transport):
    """One rank of an :class:`InProcessHub`; payloads are copied on send, like a real wire."""

    def __init__(self, hub: InProcessHub, rank: int) -> None:
        self._hub = hub
        self.rank = rank
        self.world_size = len(hub.peers)
        self._mailbox = Mailbox(lambda r: str(hub.peers[r]))
        self._closed = False

    @property
    def peers(self) -> list[PeerInfo]:
        return self._hub.peers

    def send(self, dst, key, payload, *, deadline: Deadline, signature: str = "") -> None:
        self._check_open()
        self._mailbox.check()
        self._hub._deliver(self.rank, dst, key, bytes(payload), signature)

    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        self._check_open()
        return self._mailbox.get(src, key, deadline)

    def abort(self, reason: str) -> None:
        me = self._hub.peers[self.rank]
        for t in self._hub.transports:
            if t.rank != self.rank:
                t._mailbox.fail(CollectiveAbortedError(f"{me} aborted: {reason}", task=me.task))
        self._mailbox.fail(CollectiveAbortedError(f"{me} aborted: {reason}", task=me.task))

    def check(self) -> None:
        self._mailbox.check()

    def close(self) -> None:
        self._closed = True
        self._mailbox.close()

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosedError(f"{self._hub.peers[self.rank]}: transport is closed")
