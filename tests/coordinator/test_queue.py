"""The closure queue without a cluster: ordering, synchronous pinning, errors, cancellation."""

from __future__ import annotations

import threading

import pytest

from cluster.coordinator._closure import Closure
from cluster.coordinator._queue import ClosureQueue
from cluster.coordinator.remote_values import RemoteValue
from cluster.errors import FunctionCancelledError
from cluster.strategies._ps_variables import SyncSlot

pytestmark = pytest.mark.timeout(30)


def _closure(seq: int, workers: int | None = None) -> Closure:
    sync = None if workers is None else SyncSlot(seq // workers, seq % workers, workers)
    return Closure(seq, lambda: None, (), {}, RemoteValue(), sync, body=b"x")


def _queue(synchronous: bool, workers: int = 1, up: tuple[int, ...] | None = None,
           **kwargs) -> ClosureQueue:
    queue = ClosureQueue(synchronous, workers, **kwargs)
    for w in range(workers) if up is None else up:
        queue.set_up(w, True)
    return queue


# -- table: which closure a worker gets ---------------------------------------------------------

# (workers, queued seqs, workers up, the worker asking) -> the seq it gets (None: it waits)
PICKS = [
    # asynchronous: schedule order, any worker
    (None, [0, 1, 2], (0,), 0, 0),
    (None, [3, 1], (0,), 0, 3),
    # synchronous, 2 workers: contributor c runs on worker c while worker c serves
    (2, [0, 1], (0, 1), 0, 0),
    (2, [0, 1], (0, 1), 1, 1),
    (2, [1], (0, 1), 0, None),  # contributor 1 waits for worker 1, which is up
    (2, [1], (0,), 0, 1),  # worker 1 down: worker 0 runs contributor 1
    (2, [0, 1, 2, 3], (0, 1), 1, 1),
    # synchronous, 3 workers: the first down contributor of the round is the fallback
    (3, [1, 2], (0,), 0, 1),
    (3, [0, 1, 2], (0, 2), 0, 0),
    (3, [1, 2], (0, 2), 0, 1),
    (3, [2], (0, 1, 2), 1, None),
]


@pytest.mark.parametrize("workers, queued, up, asking, expected", PICKS)
def test_which_closure_a_worker_gets(workers, queued, up, asking, expected) -> None:
    n = workers or 1
    queue = _queue(workers is not None, max(n, asking + 1), up=up)
    for seq in queued:
        queue.put(_closure(seq, workers))
    got: list = []
    taker = threading.Thread(target=lambda: got.append(queue.get(asking)), daemon=True)
    taker.start()
    taker.join(0.3)
    if expected is None:
        assert not got
        queue.close()
        taker.join(2)
        assert got == [None]
    else:
        assert got and got[0].seq == expected


def test_a_later_round_waits_even_for_a_free_worker() -> None:
    queue = _queue(True, 2)
    for i in range(4):
        queue.put(_closure(i, workers=2))
    queue.get(0)
    got: list = []
    taker = threading.Thread(target=lambda: got.append(queue.get(0)), daemon=True)
    taker.start()
    taker.join(0.3)
    assert not got  # contributor 1 of round 0 is worker 1's; round 1 must wait
    queue.close()
    taker.join(2)


# -- moved from test_units.py (same assertions) --------------------------------------------------


def test_a_requeued_closure_runs_next():
    queue = _queue(synchronous=False)
    for i in range(3):
        queue.put(_closure(i))
    first = queue.get()
    queue.requeue(first)
    assert queue.get() is first
    assert queue.get().seq == 1


def test_synchronous_rounds_wait_for_the_previous_round():
    queue = _queue(synchronous=True, workers=2)
    closures = [_closure(i, workers=2) for i in range(4)]
    for c in closures:
        queue.put(c)
    a, b = queue.get(0), queue.get(1)
    assert (a.sync, b.sync) == (SyncSlot(0, 0, 2), SyncSlot(0, 1, 2))
    got = []
    taker = threading.Thread(target=lambda: got.append(queue.get(0)), daemon=True)
    taker.start()
    taker.join(0.3)
    assert not got  # round 1 may not start while round 0 runs
    queue.finished(a)
    taker.join(0.3)
    assert not got
    queue.requeue(b)  # b's worker died: b runs again, still in round 0
    assert queue.get(1) is b
    queue.finished(b)
    taker.join(2)
    assert got and got[0].sync == SyncSlot(1, 0, 2)


def test_synchronous_contributors_stay_on_their_worker_unless_it_is_down():
    queue = _queue(synchronous=True, workers=2)
    for i in range(2):
        queue.put(_closure(i, workers=2))
    got = []
    assert queue.get(0).sync.contributor == 0
    taker = threading.Thread(target=lambda: got.append(queue.get(0)), daemon=True)
    taker.start()
    taker.join(0.5)
    assert not got  # contributor 1 waits for worker 1 while it is up
    queue.set_up(1, False)  # wakes the waiting dispatcher: no polling
    taker.join(2)
    assert got and got[0].sync.contributor == 1  # worker 1 down: worker 0 runs it


def test_an_error_cancels_the_queue_and_is_raised_once():
    queue = _queue(synchronous=False)
    closures = [_closure(i) for i in range(3)]
    for c in closures:
        queue.put(c)
    running = queue.get()
    queue.finished(running, ValueError("boom"))
    with pytest.raises(FunctionCancelledError):
        closures[1].value.fetch()
    with pytest.raises(ValueError, match="boom"):
        queue.join()
    queue.join()  # raised once: the queue is usable again
    queue.put(_closure(5))
    assert queue.get().seq == 5


def test_a_fatal_error_is_raised_by_every_call():
    queue = _queue(synchronous=False)
    queue.put(_closure(0))
    queue.fail(RuntimeError("ps gone"), fatal=True)
    for call in (queue.join, queue.raise_error, lambda: queue.put(_closure(1))):
        with pytest.raises(RuntimeError, match="ps gone"):
            call()


# -- errors and cancellation ----------------------------------------------------------------------


def test_an_echo_of_an_error_already_raised_is_dropped() -> None:
    queue = _queue(synchronous=False)
    for i in range(2):
        queue.put(_closure(i))
    a, b = queue.get(), queue.get()
    queue.finished(a, ValueError("first"))
    with pytest.raises(ValueError, match="first"):
        queue.raise_error()
    queue.finished(b, ValueError("echo"))  # dispatched before the raise: not news
    queue.join()
    assert queue.idle()


def test_a_requeue_after_an_error_cancels_the_closure() -> None:
    queue = _queue(synchronous=False)
    for i in range(2):
        queue.put(_closure(i))
    a, b = queue.get(), queue.get()
    queue.finished(a, ValueError("boom"))
    queue.requeue(b)
    with pytest.raises(FunctionCancelledError):
        b.value.fetch()
    with pytest.raises(ValueError, match="boom"):
        queue.join()


def test_a_fetch_wakes_on_a_fatal_error_of_a_running_closure() -> None:
    queue = _queue(synchronous=False)
    c = Closure(0, lambda: None, (), {}, RemoteValue(wait=queue.wait), None, body=b"x")
    queue.put(c)
    queue.get()
    timer = threading.Timer(0.2, lambda: queue.fail(RuntimeError("ps gone"), fatal=True))
    timer.start()
    with pytest.raises(RuntimeError, match="ps gone"):
        c.value.fetch()


# -- starvation ---------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# (workers up, work queued, seconds since the first worker went down) -> down workers, or waits
STARVED = [
    ((), True, 6.0, [0, 1]),  # nobody served for longer than the budget, work waits
    ((), True, 4.0, None),  # not yet
    ((), False, 6.0, None),  # nothing waits
    ((1,), True, 6.0, None),  # a worker serves
]


@pytest.mark.parametrize("up, queued, elapsed, expected", STARVED)
def test_starvation_is_reported_after_the_budget(up, queued, elapsed, expected) -> None:
    clock = _Clock()
    queue = _queue(False, 2, up=up, clock=clock)
    if queued:
        queue.put(_closure(0))
    clock.now += elapsed
    got: list = []
    watch = threading.Thread(target=lambda: got.append(queue.wait_starved(5.0)), daemon=True)
    watch.start()
    watch.join(0.3)
    if expected is None:
        assert not got
        queue.close()
        watch.join(2)
        assert got == [None]
    else:
        assert got == [expected]


def test_starvation_wakes_on_the_deadline_without_any_change() -> None:
    queue = _queue(False, 1, up=())
    queue.put(_closure(0))
    assert queue.wait_starved(0.2) == [0]
