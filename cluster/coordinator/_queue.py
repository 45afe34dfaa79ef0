"""The coordinator's closure queue: a pure state machine, no sockets, no threads of its own.

It holds the functions waiting for a worker, counts those running, keeps the first error, and
knows which workers serve. Every change notifies one condition, so each waiter (a dispatcher in
:meth:`ClosureQueue.get`, the chief in :meth:`~ClosureQueue.join` or a ``RemoteValue.fetch``,
the starvation watch in :meth:`~ClosureQueue.wait_starved`) wakes on the change it waits for;
nothing polls.

Contract:

- Asynchronous: closures run in schedule order; one whose worker died goes back to the front.
- Synchronous: closures carry a :class:`~cluster.strategies._ps_variables.SyncSlot`; round
  ``r + 1`` is handed out only when every closure of round ``r`` finished, and contributor ``c``
  of a round goes to worker ``c`` (each worker's iterator feeds the same steps in every run)
  unless worker ``c`` is down, when any worker may take it.
- Errors: the first function error cancels what is queued (each such closure fails with
  :class:`~cluster.errors.FunctionCancelledError`) and is raised once, by the next ``put``,
  ``join``, ``idle`` or ``raise_error``; the queue is usable again afterwards. Failures of
  functions dispatched before that raise are its echoes and are dropped. A *fatal* error (a lost
  parameter server, a refused token) fails every queued closure with itself and is raised by
  every call from then on.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Protocol

from cluster.errors import FunctionCancelledError
from cluster.strategies._ps_variables import SyncSlot

__all__ = ["ClosureQueue", "Item"]


class Item(Protocol):
    """What the queue needs of a closure."""

    sync: SyncSlot | None
    generation: int  # set by the queue when handed out

    def fail(self, error: BaseException) -> None:
        """Complete the closure's result with ``error`` (at most once)."""


def _round(item: Item) -> int:
    return item.sync.step if item.sync is not None else 0


class ClosureQueue:
    """Closures waiting for one of ``num_workers`` workers; thread-safe.

    Every worker starts down (:meth:`set_up` tells the queue otherwise). ``clock`` is the
    monotonic clock of :meth:`wait_starved` (injected by tests).
    """

    def __init__(self, synchronous: bool, num_workers: int = 1, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._synchronous = synchronous
        self._num_workers = num_workers
        self._clock = clock
        self._cond = threading.Condition()
        self._items: collections.deque[Item] = collections.deque()
        self._inflight = 0
        self._per_round: collections.Counter[int] = collections.Counter()
        self._error: BaseException | None = None  # raised once by join/schedule/done
        self._fatal: BaseException | None = None  # raised by every call from then on
        self._generation = 0  # +1 each time an error is raised to the caller
        self._closing = False
        now = clock()
        self._down_since: dict[int, float] = {w: now for w in range(num_workers)}

    # -- workers -------------------------------------------------------------------------------

    def set_up(self, worker: int, up: bool) -> None:
        """Record whether ``worker`` serves; wakes dispatchers waiting on its pinned closures."""
        with self._cond:
            if up:
                self._down_since.pop(worker, None)
            else:
                self._down_since.setdefault(worker, self._clock())
            self._cond.notify_all()

    def is_up(self, worker: int) -> bool:
        with self._cond:
            return worker not in self._down_since

    # -- closures ------------------------------------------------------------------------------

    def put(self, item: Item) -> None:
        """Queue ``item``; first raises the pending error, if any."""
        with self._cond:
            self._raise_error()
            self._items.append(item)
            self._per_round[_round(item)] += 1
            self._cond.notify_all()

    def _eligible(self, worker: int) -> Item | None:
        if not self._items or self._error is not None or self._fatal is not None:
            return None
        if not self._synchronous:
            return self._items[0]
        current = min(self._per_round)
        fallback = None
        for item in self._items:
            if _round(item) != current:
                break  # the previous round is still running
            contributor = item.sync.contributor
            if contributor == worker:
                return item
            if fallback is None and contributor in self._down_since:
                fallback = item
        return fallback

    def get(self, worker: int = 0) -> Item | None:
        """The next closure for ``worker``, blocking until there is one; ``None`` once closing."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._closing or self._eligible(worker) is not None)
            if self._closing:
                return None
            item = self._eligible(worker)
            assert item is not None
            self._items.remove(item)
            self._inflight += 1
            item.generation = self._generation
            return item

    def requeue(self, item: Item) -> None:
        """Put a closure whose worker died back in front, to run elsewhere (or cancel it, after
        an error)."""
        with self._cond:
            self._inflight -= 1
            if self._error is not None or self._fatal is not None:
                self._forget(item)
                item.fail(FunctionCancelledError("not run: an earlier function failed"))
            else:
                self._items.appendleft(item)
            self._cond.notify_all()

    def _forget(self, item: Item) -> None:
        r = _round(item)
        self._per_round[r] -= 1
        if not self._per_round[r]:
            del self._per_round[r]

    def finished(self, item: Item, error: BaseException | None = None) -> None:
        """``item`` ended; its result is already set, or ``error`` is its failure."""
        with self._cond:
            self._inflight -= 1
            self._forget(item)
            # An error already raised to the caller ends its generation: failures of functions
            # dispatched before that are its echoes, not news.
            if error is not None and item.generation == self._generation:
                self._set_error(error)
            self._cond.notify_all()

    # -- errors --------------------------------------------------------------------------------

    def _set_error(self, error: BaseException, fatal: bool = False) -> None:
        if fatal and self._fatal is None:
            self._fatal = error
        elif not fatal and self._error is None and self._fatal is None:
            self._error = error
        while self._items:
            item = self._items.popleft()
            self._forget(item)
            item.fail(error if fatal else FunctionCancelledError(
                f"not run: an earlier function failed: {type(error).__name__}: {error}"))
        self._cond.notify_all()

    def fail(self, error: BaseException, fatal: bool = False) -> None:
        """Cancel what is queued with ``error`` (see the module docstring)."""
        with self._cond:
            self._set_error(error, fatal)

    def _raise_error(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        error, self._error = self._error, None
        if error is not None:
            self._generation += 1
            raise error

    def raise_error(self) -> None:
        with self._cond:
            self._raise_error()

    # -- waiting -------------------------------------------------------------------------------

    def idle(self) -> bool:
        """True when nothing is queued or running; raises the pending error first."""
        with self._cond:
            self._raise_error()
            return not self._items and not self._inflight

    def join(self) -> None:
        """Until nothing is queued or running; after a function's error, until the functions
        already running ended too (the queued ones were cancelled), then raise it."""
        with self._cond:
            self._cond.wait_for(
                lambda: (not self._items and not self._inflight) or self._fatal is not None)
            self._raise_error()

    def wait(self, done: Callable[[], bool]) -> None:
        """Until ``done()`` (a closure's result is set: its setter then calls :meth:`finished`,
        :meth:`fail` or :meth:`requeue`, which notify); raises the fatal error meanwhile."""
        with self._cond:
            self._cond.wait_for(lambda: done() or self._fatal is not None)
            if not done():
                raise self._fatal

    def wait_starved(self, budget: float) -> list[int] | None:
        """Block until work has waited while no worker served for ``budget`` seconds (counted
        from the first worker going down); returns the down workers, or ``None`` once closing.
        Sleeps until a change of the queue or that deadline, never longer."""
        with self._cond:
            while not self._closing:
                timeout = None
                pending = (self._items and self._error is None and self._fatal is None)
                if pending and self._down_since and len(self._down_since) == self._num_workers:
                    left = min(self._down_since.values()) + budget - self._clock()
                    if left < 0:
                        return sorted(self._down_since)
                    timeout = left
                self._cond.wait(timeout)
            return None

    def close(self) -> None:
        """Wake every waiter: dispatchers get ``None``, the starvation watch returns."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
