"""Lanes: one ring all-reduce run as two rings in opposite directions, each on a thread of its own.

A ring rank's busiest thread is the one that sends and combines: every byte it sends is a
``sendmsg`` copy, every byte it receives a combine, while a receiver thread per inbound
connection drains the socket. With cores to spare per rank (a server: 2, 4 or 8 ranks on 16
cores), that one thread bounds the all-reduce. Two lanes split the data in halves: lane 0 runs
the ring to the right as always, lane 1 runs it to the left over the other neighbour's
connections, so at ``N >= 3`` each half has its own sending thread, its own sockets and its own
receiver thread (at ``N = 2``, where both neighbours are the one peer, the TCP data plane opens
a second connection to it when the two lanes send at once). Where the cost model says a second
lane pays is :func:`~cluster.collectives.cost.ring_lanes`.

Contracts:

- :class:`LaneThreads` runs a call's lanes on persistent daemon threads of one group and returns
  once every lane has finished, or raises the first lane's error as soon as it happens (the
  group then aborts, which wakes the other lanes), or a ``CollectiveTimeoutError`` at the
  call's deadline.
- After :meth:`LaneThreads.run` returns or raises, no lane writes to any array again: lanes
  write under a :class:`Guard` that the end of the call closes (a write in progress finishes
  first). A lane still blocked in a receive when its call failed wakes with the group's
  failure and ends without touching the caller's arrays, which may by then be restored.
- :class:`LaneView` is an :class:`~cluster.collectives._exchange.Exchange` as one lane sees it;
  the lanes share the exchange's one handshake, sent before any lane starts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from cluster.collectives._exchange import Exchange
from cluster.deadline import Deadline
from cluster.errors import CollectiveTimeoutError

__all__ = ["Guard", "LaneCancelledError", "LaneThreads", "LaneView", "Lanes"]

IDLE_SECONDS = 5.0
"""A lane thread with no work for this long ends (one is started again when needed), so a
group that is dropped without being closed leaves no thread behind for long."""

LATE_SECONDS = 0.5
"""How long past the deadline a call waits for its lanes' own timeout errors, which name the
peer each lane waits for."""

Job = Callable[["Guard"], int]
"""One lane's work: given its call's guard, returns the next unused message step."""


class LaneCancelledError(Exception):
    """A lane tried to write after its call ended (the call failed on another lane)."""


class Guard:
    """Fences one call's lane writes against the end of the call.

    Lanes write at the same time (each to its own part of the arrays), so a write only counts
    itself in; :meth:`close` refuses new writes and waits out those in progress. A single lock
    around each write would be simpler and would serialise every lane's copying: with four copy
    threads that made a 16-core host's single-copy all-reduce three times slower than its
    busiest thread.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._writing = 0
        self._closed = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold while writing to the call's arrays; raises ``LaneCancelledError`` once closed.
        Never held across a wait: only around a combine or a copy."""
        with self._cond:
            if self._closed:
                raise LaneCancelledError("the collective ended; this lane writes nothing more")
            self._writing += 1
        try:
            yield
        finally:
            with self._cond:
                self._writing -= 1
                if not self._writing:
                    self._cond.notify_all()

    def close(self) -> None:
        """Refuse every later write; returns once the writes in progress have finished (each
        is a bounded combine or copy, so this wait needs no deadline)."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._writing)


class LaneView:
    """Exchange ``ex`` as one lane sees it: ``reverse`` runs the ring the other way round (this
    rank's right neighbour is its real left one, and its place on the lane's ring mirrors its
    rank), and writes take ``guard``. The lanes' messages keep distinct step numbers; the
    exchange's handshake was begun by the caller."""

    def __init__(self, ex: Exchange, *, reverse: bool, guard: Guard) -> None:
        self._ex = ex
        self._guard = guard
        self.size = ex.size
        if reverse:  # rank r sits at -r on the mirrored ring: its right neighbour is r - 1
            self.rank = (-ex.rank) % ex.size
            self.left, self.right = ex.right, ex.left
        else:
            self.rank, self.left, self.right = ex.rank, ex.left, ex.right

    def begin(self, *, piggyback_send: bool, piggyback_recv: bool) -> None:
        """Nothing: the lanes' caller began the exchange (one handshake for all lanes)."""

    def writing(self) -> contextlib.AbstractContextManager[None]:
        return self._guard.writing()

    def send(self, dst: int, step: int, chunk: int, data: np.ndarray) -> None:
        self._ex.send(dst, step, chunk, data)

    def recv(self, src: int, step: int, chunk: int, dtype: np.dtype, count: int) -> np.ndarray:
        return self._ex.recv(src, step, chunk, dtype, count)

    def post(self, src: int, step: int, chunk: int, out: np.ndarray) -> None:
        self._ex.post(src, step, chunk, out)

    def recv_into(self, src: int, step: int, chunk: int, out: np.ndarray) -> None:
        incoming = self._ex.receive_for(src, step, chunk, out)
        if incoming is not None:
            with self._guard.writing():
                np.copyto(out, incoming)


class _Run:
    """One call's lanes: results as they finish, the first error."""

    def __init__(self, lanes: int) -> None:
        self.cond = threading.Condition()
        self.results: list[int | None] = [None] * lanes
        self.left = lanes
        self.error: BaseException | None = None
        self.guard = Guard()

    def finish(self, lane: int, result: int | None, error: BaseException | None) -> None:
        with self.cond:
            self.results[lane] = result
            self.left -= 1
            if error is not None and self.error is None and not isinstance(
                    error, LaneCancelledError):
                self.error = error
            self.cond.notify_all()


class _Worker:
    """A persistent lane thread: one job at a time; ends after :data:`IDLE_SECONDS` idle."""

    def __init__(self, owner: LaneThreads, name: str) -> None:
        self._owner = owner
        self._cond = threading.Condition(owner.lock)
        self._job: tuple[Job, _Run, int] | None = None
        self.busy = False
        self.alive = True
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def give(self, job: Job, run: _Run, lane: int) -> None:
        """Hand over a job (the owner's lock held, this worker idle and alive)."""
        self._job = (job, run, lane)
        self.busy = True
        self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._job is None:
                    self._cond.wait(IDLE_SECONDS)
                if self._job is None:
                    self.alive = False
                    self._owner.forget(self)
                    return
                job, run, lane = self._job
                self._job = None
            result, error = None, None
            try:
                result = job(run.guard)
            except BaseException as e:  # reported to the caller's thread, never lost
                error = e
            with self._cond:
                self.busy = False
            run.finish(lane, result, error)


class LaneThreads:
    """The lane threads of one group's collectives (started on first use, reused)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.lock = threading.Lock()
        self._workers: list[_Worker] = []

    def forget(self, worker: _Worker) -> None:
        """A worker ends (called with :attr:`lock` held)."""
        if worker in self._workers:
            self._workers.remove(worker)

    def run(self, jobs: Sequence[Job], deadline: Deadline) -> list[int]:
        """Run every job on a lane thread of its own; their results, in order (see the module
        doc for errors and the deadline)."""
        run = _Run(len(jobs))
        idents: list[int | None] = []  # the lanes' threads: where a stall warning looks
        with self.lock:
            idle = [w for w in self._workers if w.alive and not w.busy]
            for lane, job in enumerate(jobs):
                if idle:
                    worker = idle.pop()
                else:  # a worker still busy with a failed call's lane is never waited behind
                    worker = _Worker(self, f"{self._name}-lane")
                    self._workers.append(worker)
                worker.give(job, run, lane)
                idents.append(worker.ident)
        try:
            with run.cond:
                while run.left and run.error is None:
                    if deadline.expired:
                        # The lanes wait under the same deadline, and their errors say whom
                        # they wait for: a moment for theirs before raising a vaguer one.
                        run.cond.wait_for(lambda: run.error is not None or not run.left,
                                          LATE_SECONDS)
                        if run.error is None and run.left:
                            raise CollectiveTimeoutError(
                                f"{len(jobs)} lane(s) of a ring all-reduce: {run.left} still "
                                "running at the deadline")
                        break
                    run.cond.wait(deadline.timeout())
                if run.error is not None:
                    raise run.error
        finally:
            run.guard.close()
        return [r for r in run.results if r is not None]


class Lanes(NamedTuple):
    """How a ring all-reduce runs: ``count`` lanes (1: the one ring on the calling thread) on
    ``threads``."""

    count: int
    threads: LaneThreads
