"""The result-buffer pool: a buffer is handed out again only once nothing can reach it."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.collectives._buffers import MIN_POOLED_BYTES, BufferPool

pytestmark = [pytest.mark.timeout(30), pytest.mark.path_independent]

N = MIN_POOLED_BYTES // 4  # float32 elements of the smallest pooled buffer


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_dropped_buffer_is_reused() -> None:
    pool = BufferPool()
    first = pool.empty(N, np.float32)
    address = _addr(first)
    del first
    assert _addr(pool.empty(N, np.float32)) == address


@pytest.mark.parametrize("derive", [
    lambda a: a[10:20],
    lambda a: a.reshape(2, -1).T,
    lambda a: a.view(np.uint8),
    lambda a: memoryview(a),
    lambda a: np.asarray(a),
], ids=["slice", "reshape", "dtype-view", "memoryview", "asarray"])
def test_a_buffer_still_reachable_through_any_view_is_never_reused(derive) -> None:
    pool = BufferPool()
    first = pool.empty(N, np.float32)
    first[:] = 7
    kept = derive(first)
    del first
    second = pool.empty(N, np.float32)
    second[:] = 0
    assert np.all(np.asarray(kept).view(np.float32) == 7)


def test_small_buffers_are_not_pooled_and_the_cap_holds() -> None:
    pool = BufferPool(max_bytes=2 * MIN_POOLED_BYTES)
    assert pool.empty(10, np.float32).size == 10
    held = [pool.empty(N, np.float32) for _ in range(3)]  # the third one exceeds the cap
    assert len({_addr(a) for a in held}) == 3
    assert sum(s.nbytes for s in pool._slabs) <= 2 * MIN_POOLED_BYTES
    del held
    bigger = pool.empty(2 * N, np.float32)  # idle buffers are evicted to make room
    assert bigger.size == 2 * N
    assert sum(s.nbytes for s in pool._slabs) <= 2 * MIN_POOLED_BYTES


def test_other_dtypes_and_sizes_get_their_own_buffers() -> None:
    pool = BufferPool()
    a = pool.empty(N, np.float32)
    b = pool.empty(N // 2, np.float64)
    c = pool.empty(N + 1, np.float32)
    assert (a.dtype, a.size, b.dtype, b.size, c.size) == (np.float32, N, np.float64, N // 2,
                                                          N + 1)
    assert len({_addr(a), _addr(b), _addr(c)}) == 3


def test_held_all_reduce_results_survive_later_calls() -> None:
    from ._threads import make_groups, run_ranks

    _, groups = make_groups(2)
    x = [np.full(N, r + 1, np.float32) for r in range(2)]

    def three_calls(rank: int):
        g = groups[rank]
        first = g.all_reduce(x[rank])
        second = g.all_reduce(x[rank] * 2)
        del second  # dropped: its buffer may serve the third call
        third = g.all_reduce(x[rank] * 3)
        return float(first[0]), float(first[-1]), float(third[0]), float(third[-1])

    for result in run_ranks(three_calls, 2, timeout=20):
        assert result == (3.0, 3.0, 9.0, 9.0)
