"""Asynchronous collectives: ``Work`` handles, one stream per group, order kept with sync calls.

Thread-based tests run on both paths (see conftest); one test launches real processes.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cluster.collectives import CollectiveGroup, CommunicationOptions, Work
from cluster.errors import (
    ClusterError,
    CollectiveAbortedError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
)
from cluster.settings import TaskSettings
from cluster.testing import run_group

from ._threads import make_groups, run_ranks


def test_works_complete_in_issue_order_with_sync_calls_between() -> None:
    hub, groups = make_groups(3)

    def rank(r: int) -> object:
        g = groups[r]
        works = [g.all_reduce_async(np.full(n, r + 1, np.float32)) for n in (1, 5000, 70_000)]
        middle = g.all_reduce(np.int64(r))  # queued behind the three works
        many = g.all_reduce_many_async([np.ones(3, np.float32), np.full(2, r, np.int32)], "MAX")
        last = g.all_reduce_async(np.float64(r), "MEAN")
        assert isinstance(last, Work)
        results = [w.wait(timeout=30) for w in works]
        return results, middle, many.wait(timeout=30), last.result(timeout=30), works[0].done()

    for results, middle, many, last, done in run_ranks(rank, 3, transports=hub.transports,
                                                      timeout=60):
        assert [x.shape for x in results] == [(1,), (5000,), (70_000,)]
        assert all((x == 6.0).all() and x.dtype == np.float32 for x in results)
        assert middle == 3 and isinstance(middle, np.int64)
        assert [m.tolist() for m in many] == [[1.0] * 3, [2, 2]]
        assert last == 1.0 and done


def test_wait_with_a_timeout_gives_up_and_the_work_goes_on() -> None:
    """Rank 1 issues only after rank 0's short wait gave up (an event, no sleeps)."""
    hub, groups = make_groups(2)
    gave_up = threading.Event()

    def rank(r: int) -> object:
        if r == 1:
            assert gave_up.wait(30)
            return groups[1].all_reduce_async(np.ones(2)).wait(timeout=30)
        work = groups[0].all_reduce_async(np.ones(2))
        with pytest.raises(CollectiveTimeoutError, match="has not finished"):
            work.wait(timeout=0.05)
        assert not work.done()
        gave_up.set()
        return work.wait(timeout=30)

    for result in run_ranks(rank, 2, transports=hub.transports, timeout=60):
        assert result.tolist() == [2.0, 2.0]


def test_a_failed_work_fails_the_later_ones_clearly() -> None:
    hub, groups = make_groups(2)
    options = CommunicationOptions(timeout_seconds=60)

    def rank(r: int) -> object:
        g = groups[r]
        first = g.all_reduce_async(np.ones(3 + r, np.float32), options=options)  # a mismatch
        later = g.all_reduce_async(np.ones(3, np.float32), options=options)
        errors = []
        for work in (first, later):
            try:
                work.wait(timeout=30)
            except ClusterError as e:
                errors.append(e)
        return errors

    for first, later in run_ranks(rank, 2, transports=hub.transports, timeout=60):
        assert isinstance(first, CollectiveMismatchError | CollectiveAbortedError)
        assert isinstance(later, CollectiveAbortedError)
        assert "all_reduce #1" in str(later) and "all_reduce #0" in str(later), later


def test_issued_from_another_thread_then_waited_on_by_the_caller() -> None:
    """What cluster.torch needs: a bucket's all-reduce started from an autograd hook thread."""
    hub, groups = make_groups(2)

    def rank(r: int) -> object:
        works: list[Work] = []
        hook = threading.Thread(target=lambda: works.extend(
            groups[r].all_reduce_async(np.full(4, i + r, np.float32)) for i in range(3)))
        hook.start()
        hook.join(30)
        after = groups[r].all_reduce(np.ones(1))  # issued after the hook's three
        return [w.wait(timeout=30).tolist() for w in works], after.tolist()

    for results, after in run_ranks(rank, 2, transports=hub.transports, timeout=60):
        assert results == [[1.0] * 4, [3.0] * 4, [5.0] * 4] and after == [2.0]


def test_close_ends_the_stream_thread_and_the_group_stays_usable() -> None:
    hub, groups = make_groups(1, name="closing")
    g = groups[0]
    assert g.all_reduce_async(np.ones(1)).wait(timeout=10).tolist() == [1.0]
    assert [t for t in threading.enumerate() if t.name.startswith("collectives-closing")]
    g.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("collectives-closing")]
    assert g.all_reduce_async(np.ones(1)).wait(timeout=10).tolist() == [1.0]
    g.close()


def _async_battery(transport):
    group = CollectiveGroup(transport, name="async", settings=TaskSettings.from_env().collectives)
    r = transport.rank
    works = []
    for i, n in enumerate((0, 1, 1000, 40_000, 300_001)):
        works.append(group.all_reduce_async(np.full(n, r + i, np.float32), "SUM"))
        if i == 2:
            works.append(group.broadcast(np.full(3, r, np.int64), root=1))  # sync, in between
    many = group.all_reduce_many_async([np.full(5, r, np.float64), np.ones((2, 2), np.int32)])
    out = [w if isinstance(w, np.ndarray) else w.wait(timeout=60) for w in works]
    out.extend(many.wait(timeout=60))
    group.close()
    return [(x.dtype.str, x.shape, x.tobytes()) for x in out], group.route_counts


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_async_collectives_across_processes(collective_path: str) -> None:
    outcomes = run_group(_async_battery, 3, timeout=100)
    assert all(o.ok for o in outcomes), [o.traceback for o in outcomes if not o.ok]
    first, routes = outcomes[0].result
    assert all(o.result[0] == first for o in outcomes[1:])  # bitwise identical everywhere
    arrays = [np.frombuffer(raw, np.dtype(d)).reshape(s) for d, s, raw in first]
    sums = [3 * i + 3 for i in range(5)]  # sum over ranks of (r + i)
    assert [float(a.flat[0]) if a.size else None for a in arrays[:3]] == [None, sums[1], sums[2]]
    assert arrays[3].tolist() == [1, 1, 1]  # broadcast from rank 1, between the works
    assert (arrays[4] == sums[3]).all() and (arrays[5] == sums[4]).all()
    assert arrays[6].tolist() == [3.0] * 5 and arrays[7].tolist() == [[3, 3], [3, 3]]
    expected = "local" if collective_path == "shm" else "network"
    assert routes.get(f"all_reduce/{expected}", 0) >= 5, routes
