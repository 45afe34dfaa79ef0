"""Where received messages wait for ``recv``: matching by (source, key), failure, deadlines."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cluster.deadline import Deadline
from cluster.errors import ClusterError, CollectiveTimeoutError, TransportClosedError
from cluster.transport.api import MessageKey, Received

__all__ = ["Mailbox"]


class Mailbox:
    """Thread-safe store of delivered messages keyed by (src, key), poisoned by the first failure.

    Delivery threads call :meth:`put`; the collective's thread calls :meth:`get`, which waits on a
    condition variable against its deadline (no polling). :meth:`fail` wakes every waiter with
    the error; later ``get`` calls raise it too.
    """

    def __init__(self, describe_peer: Callable[[int], str]) -> None:
        self._cond = threading.Condition()
        self._messages: dict[tuple[int, MessageKey], Received] = {}
        self._error: ClusterError | None = None
        self._departed: dict[int, ClusterError] = {}
        self.describe_peer = describe_peer  # names a peer in errors and stall warnings

    def put(self, src: int, key: MessageKey, received: Received) -> None:
        with self._cond:
            if self._error is not None:
                return  # the group is broken: late data is dropped, never mixed
            self._messages[(src, key)] = received
            self._cond.notify_all()

    def get(self, src: int, key: MessageKey, deadline: Deadline) -> Received:
        slot = (src, key)
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                found = self._messages.pop(slot, None)
                if found is not None:
                    return found
                if src in self._departed:
                    raise self._departed[src]
                if deadline.expired:
                    raise CollectiveTimeoutError(
                        f"no message from {self.describe_peer(src)} for collective "
                        f"#{key.seq} of group {key.group!r} (step {key.step}, chunk {key.chunk}) "
                        "before the deadline"
                    )
                self._cond.wait(deadline.timeout())

    def fail(self, error: ClusterError) -> bool:
        """Poison the mailbox with ``error``; returns False if it already failed (first wins)."""
        with self._cond:
            if self._error is not None:
                return False
            self._error = error
            self._messages.clear()
            self._cond.notify_all()
            return True

    def depart(self, src: int, error: ClusterError) -> None:
        """``src`` will send nothing more: waits for it that nothing satisfies raise ``error``."""
        with self._cond:
            self._departed[src] = error
            self._cond.notify_all()

    def close(self) -> None:
        self.fail(TransportClosedError("transport closed"))

    @property
    def error(self) -> ClusterError | None:
        return self._error

    def check(self) -> None:
        if self._error is not None:
            raise self._error
