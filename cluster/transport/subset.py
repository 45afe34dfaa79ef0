"""A transport over a subset of another transport's ranks (e.g. one leader per host).

Ranks are renumbered ``0..len(ranks)-1`` in the order given; messages, failures and aborts are
the parent's, so a failure anywhere still fails the whole group. Callers use a group name of
their own so keys never collide with the parent group's messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.deadline import Deadline
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport

__all__ = ["SubsetTransport"]


class SubsetTransport(Transport):
    """The ranks ``ranks`` of ``parent`` (which must include the parent's own rank)."""

    def __init__(self, parent: Transport, ranks: Sequence[int]) -> None:
        if parent.rank not in ranks:
            raise ValueError(f"rank {parent.rank} is not in the subset {list(ranks)}")
        self._parent = parent
        self._ranks = list(ranks)
        self.rank = self._ranks.index(parent.rank)
        self.world_size = len(self._ranks)
        peers = parent.peers
        self._peers = [PeerInfo(i, peers[r].task, peers[r].address)
                       for i, r in enumerate(self._ranks)]

    @property
    def peers(self) -> list[PeerInfo]:
        return list(self._peers)

    def send(self, dst: int, key: MessageKey, payload: bytes | bytearray | memoryview, *,
             deadline: Deadline, signature: str = "") -> None:
        self._parent.send(self._ranks[dst], key, payload, deadline=deadline, signature=signature)

    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        return self._parent.recv(self._ranks[src], key, deadline=deadline)

    def post_recv(self, src: int, key: MessageKey, into: memoryview) -> None:
        self._parent.post_recv(self._ranks[src], key, into)

    def abort(self, reason: str) -> None:
        self._parent.abort(reason)

    def close(self) -> None:
        """Nothing to release: the parent owns the connections."""

    def check(self) -> None:
        self._parent.check()
