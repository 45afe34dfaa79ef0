"""Asynchronous collectives: a future-like :class:`Work` per call, one :class:`CollectiveStream`
per group that runs the calls one at a time in issue order.

Why one stream per group: every rank must run a group's collectives in the same order (the n-th
call is collective ``#n`` everywhere). A single issuing thread per group keeps the order in which
calls were *issued*, so ranks that issue in the same order (the contract of
:class:`~cluster.collectives.CollectiveGroup`) agree, however long each call takes.

Synchronous calls share the stream: when nothing is queued, a synchronous call runs at once on
the caller's thread (no thread hand-off, so a small all-reduce costs what it did before there was
a stream); otherwise it queues behind the asynchronous calls issued before it and waits. Either
way the group's calls run one at a time, in issue order.

>>> stream = CollectiveStream("default")
>>> work = stream.submit(lambda: 42, "answer #0")
>>> work.wait()
42
>>> stream.run(lambda: 43)
43
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from cluster.errors import CollectiveTimeoutError

__all__ = ["CollectiveStream", "Work"]


class Work:
    """The handle of one asynchronous collective (``CollectiveGroup.*_async``): a future.

    - :meth:`wait` blocks until the collective finished and returns its result (as the
      synchronous call would have), or raises its error (the group's typed errors, or the
      ``TypeError``/``ValueError`` of an input that was rejected).
    - :meth:`done` says whether it finished, without blocking; :meth:`result` is :meth:`wait`.
    - Deadline: the collective itself has its group's or call's ``timeout_seconds``, counted
      from when it starts (after the calls issued before it); ``wait(timeout)`` gives up
      waiting after ``timeout`` seconds with :class:`~cluster.errors.CollectiveTimeoutError`
      and leaves the collective running (wait again later).
    - Inputs: the collective reads its input when it runs, so the caller must not modify an
      input until the work is done (as with ``torch.distributed``'s ``async_op``).
    - A failed collective aborts the group on every rank (as a synchronous one does), so every
      later work of the group fails too, with an error naming the first failure.
    """

    __slots__ = ("_future", "description")

    def __init__(self, description: str) -> None:
        self.description = description
        self._future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Any:
        """The collective's result, once it finished; raises its error.

        Raises:
          CollectiveTimeoutError: not finished within ``timeout`` seconds (it keeps running).
        """
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise CollectiveTimeoutError(
                f"{self.description} has not finished after waiting {timeout} s (it is still "
                "running; wait() again, or give the collective itself a deadline with "
                "CommunicationOptions(timeout_seconds=...))"
            ) from None

    def result(self, timeout: float | None = None) -> Any:
        """Same as :meth:`wait` (the name ``concurrent.futures.Future`` uses)."""
        return self.wait(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The collective's error, or None once it succeeded (waits like :meth:`wait`)."""
        try:
            self.wait(timeout)
        except CollectiveTimeoutError:
            if not self._future.done():
                raise
            return self._future.exception()
        except BaseException as error:  # the collective's own error, handed to the caller
            return error
        return None

    def __repr__(self) -> str:
        state = "pending" if not self.done() else (
            "failed" if self._future.exception() is not None else "done")
        return f"<Work {self.description}: {state}>"

    # -- for the stream --

    def _run(self, job: Callable[[], Any]) -> None:
        if not self._future.set_running_or_notify_cancel():  # pragma: no cover - never cancelled
            return
        try:
            result = job()
        except BaseException as error:  # handed to whoever waits on the work
            self._future.set_exception(error)
        else:
            self._future.set_result(result)


class CollectiveStream:
    """Runs one group's collectives one at a time, in the order they were issued.

    :meth:`submit` queues a job and returns its :class:`Work`; :meth:`run` runs a job for a
    synchronous call (at once on the caller's thread when nothing is queued, else after the
    queued ones) and returns its result or raises its error. The stream's thread is started by
    the first :meth:`submit` (groups that never go asynchronous have none) and ends with the
    interpreter or :meth:`close`.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()  # guards _pending and _executor
        self._running = threading.Lock()  # held by whoever runs a collective of the group now
        self._pending = 0  # submitted jobs not finished yet
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def pending(self) -> int:
        """Submitted jobs that have not finished yet."""
        return self._pending

    def submit(self, job: Callable[[], Any], description: str) -> Work:
        """Queue ``job`` after everything issued before it; return its :class:`Work`."""
        work = Work(description)
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"collectives-{self._name}")
            self._pending += 1
            self._executor.submit(self._execute, work, job)
        return work

    def run(self, job: Callable[[], Any]) -> Any:
        """Run ``job`` after everything issued before it; its result, or its error raised."""
        with self._lock:
            inline = self._pending == 0
            if inline:
                # Nothing queued: the stream's thread is idle (a job releases _running before
                # it stops counting as pending), so this takes _running without waiting unless
                # another thread is inside a synchronous call right now.
                self._running.acquire()
        if inline:
            try:
                return job()
            finally:
                self._running.release()
        return self.submit(job, "a synchronous collective").wait()

    def close(self) -> None:
        """Let queued jobs finish (each bounded by its collective's deadline), then end the
        thread. Later submissions start a new one."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _execute(self, work: Work, job: Callable[[], Any]) -> None:
        try:
            with self._running:
                work._run(job)
        finally:
            with self._lock:
                self._pending -= 1
