"""The life of one collective call: sequence number, deadline, and failing the group on error.

Every error escaping a collective aborts the group first (``Transport.abort``), so the peers fail
at once instead of waiting for their deadlines, and is re-raised naming the collective:
``PeerUnavailableError: worker:2 is unavailable: the peer died (during all_reduce #118 of group
'default' on worker:0)``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cluster.collectives.options import CommunicationOptions
from cluster.deadline import Deadline
from cluster.errors import (
    CollectiveAbortedError,
    CollectiveTimeoutError,
    PeerUnavailableError,
    TransportClosedError,
)
from cluster.transport.api import Transport

__all__ = ["Call", "CallCounter"]


@dataclass(frozen=True)
class Call:
    """One collective call: what it is, its number in the group, its deadline and options."""

    kind: str
    seq: int
    deadline: Deadline
    options: CommunicationOptions


class CallCounter:
    """Numbers the collective calls of one group (the n-th call is ``#n``) and runs each one."""

    def __init__(self, transport: Transport, group: str) -> None:
        self._transport = transport
        self._group = group
        self.on_abort: list[Callable[[str], None]] = []  # more places to abort (shared memory)
        self._next = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def call(self, kind: str, options: CommunicationOptions) -> Iterator[Call]:
        """Number the call, start its deadline; on any error abort the group and re-raise it.

        The number is taken before anything can fail, so a call that fails validation on one
        rank still keeps every rank's numbering in step.
        """
        with self._lock:
            seq = self._next
            self._next += 1
        try:
            if not isinstance(options, CommunicationOptions):
                raise TypeError(f"options must be a CommunicationOptions, got {options!r}")
            if self._transport.world_size > 1:
                self._transport.check()  # a failed group fails at once, not at a deadline
            yield Call(kind, seq, Deadline.after(options.deadline_seconds), options)
        except BaseException as error:
            contextual = self._fail(kind, seq, error, options)
            if contextual is error:
                raise
            raise contextual from error

    def _fail(self, kind: str, seq: int, error: BaseException, options: object) -> BaseException:
        """Abort the group for ``error`` (unless it is the group's failure already); return the
        error to raise, with this collective named in its message."""
        t = self._transport
        activity = f"{kind} #{seq} of group {self._group!r} on {t.peers[t.rank]}"
        if t.world_size > 1 and not isinstance(
            error, CollectiveAbortedError | TransportClosedError
        ):
            reason = f"{activity} failed: {type(error).__name__}: {error}"
            for abort in (*self.on_abort, t.abort):
                try:
                    abort(reason)
                except Exception as abort_error:  # the collective's own error is the one to report
                    error.add_note(f"aborting the group also failed: {abort_error!r}")
        if isinstance(error, PeerUnavailableError):
            return PeerUnavailableError(
                f"{error} (during {activity})", task=error.task, address=error.address
            )
        if isinstance(error, CollectiveAbortedError):
            return CollectiveAbortedError(f"{activity}: {error}", task=error.task)
        if isinstance(error, CollectiveTimeoutError):
            timeout = getattr(options, "timeout_seconds", None)
            return CollectiveTimeoutError(f"{activity} timed out after {timeout} s: {error}")
        if isinstance(error, TransportClosedError):
            return TransportClosedError(f"{activity}: {error}")
        return error
