"""``RemoteValue`` (a scheduled function's eventual result) and per-worker values."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cluster.coordinator._calls import ResourceRef

if TYPE_CHECKING:
    from cluster.coordinator._resources import Resources

__all__ = ["PerWorkerDataset", "PerWorkerIterator", "PerWorkerValues", "RemoteValue"]


class RemoteValue:
    """The result of a function scheduled with ``ClusterCoordinator.schedule``.

    :meth:`fetch` (or :meth:`get`) blocks until the function ran, then returns its result or
    raises its error: the function's own exception (with the worker's traceback as a note),
    :class:`~cluster.errors.FunctionCancelledError` when it never ran because an earlier
    function failed, or :class:`~cluster.errors.PsUnavailableError` when a parameter server died.
    """

    def __init__(self, wait: Callable[[Callable[[], bool]], None] | None = None) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        # The coordinator's wait: until the predicate holds, raising a fatal error meanwhile.
        self._wait = wait

    def _set(self, value: Any) -> None:
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def fetch(self) -> Any:
        """The function's return value (NumPy arrays stay NumPy); blocks until it ran."""
        if self._wait is not None:
            self._wait(self._done.is_set)
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def get(self) -> Any:
        """Same as :meth:`fetch` (TF distinguishes tensors from NumPy; there is no such split
        here)."""
        return self.fetch()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "ready")
        return f"<RemoteValue {state}>"


class PerWorkerValues:
    """A value that exists once on every worker (a dataset, an iterator), made by a function
    the coordinator runs on each worker before it first needs it there (again after the worker
    restarts). Pass it to ``schedule``: the function receives the running worker's own value.
    """

    def __init__(self, resources: Resources, rid: int) -> None:
        self._resources = resources
        self._rid = rid

    def _ref(self) -> ResourceRef:
        return ResourceRef(self._rid)

    def __reduce__(self) -> tuple:
        raise TypeError("per-worker values only travel as arguments of "
                        "ClusterCoordinator.schedule(fn, args=...), not inside other objects")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self._rid}>"


class PerWorkerDataset(PerWorkerValues):
    """What ``create_per_worker_dataset`` returns; ``iter()`` gives a :class:`PerWorkerIterator`."""

    def __iter__(self) -> PerWorkerIterator:
        rid = self._resources.add(iter, (self._ref(),))
        return PerWorkerIterator(self._resources, rid)


class PerWorkerIterator(PerWorkerValues):
    """One iterator per worker over that worker's dataset; in a scheduled function it is the
    worker's own iterator (``next(iterator)``)."""

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self) -> Any:
        raise TypeError("a per-worker iterator is read on the workers: pass it to "
                        "coordinator.schedule(fn, args=(iterator,)) and call next() in fn")


# The coordinator's modules settle remote values and pass per-worker values through these;
# they are not exported.


def set_result(value: RemoteValue, result: Any) -> None:
    """Complete ``value`` with ``result`` (no effect once it is done)."""
    value._set(result)


def set_error(value: RemoteValue, error: BaseException) -> None:
    """Complete ``value`` with ``error`` (no effect once it is done)."""
    value._fail(error)


def resource_ref(values: PerWorkerValues) -> ResourceRef:
    """How ``values`` travels to a worker: a reference to its resource there."""
    return values._ref()
