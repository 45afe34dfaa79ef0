"""A one-way flag that the main thread can wait on while signal handlers raise in it.

The task entry points turn SIGTERM into an exception raised in the main thread
(:func:`cluster.lifecycle.install_termination_handlers`). Raised inside ``threading.Event.wait``
it can land in the Condition's bookkeeping and surface as ``RuntimeError: release unlocked
lock`` instead of the signal's exception. :class:`Latch` waits on a bare lock: an exception
raised during ``acquire`` leaves nothing half done. And it waits in slices of
:data:`SIGNAL_LATENCY`: a process-directed signal that the kernel hands to another thread does
not interrupt the main thread's blocked ``acquire``, and CPython only runs the Python handler
when the main thread next runs bytecode; an unbounded wait would defer SIGTERM indefinitely.
"""

from __future__ import annotations

import threading
import time

__all__ = ["SIGNAL_LATENCY", "Latch"]

SIGNAL_LATENCY = 0.2  # s: the most a waiting main thread takes to run a pending signal handler


class Latch:
    """Set once, never cleared; :meth:`wait` returns once set (any number of waiters)."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()  # held until set(): waiters block on it
        self._guard = threading.Lock()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._guard:
            if self._set:
                return
            self._set = True
            self._gate.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set, or ``timeout`` seconds (``None``: no limit); whether it is set."""
        end = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while not self._set:
            left = SIGNAL_LATENCY if end is None else min(SIGNAL_LATENCY,
                                                          end - time.monotonic())
            if left <= 0:
                break
            if self._gate.acquire(timeout=left):
                self._gate.release()  # open for the next waiter
        return self._set
