"""The pure schedules: table tests and properties, no transport involved."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.collectives.schedule import (
    DoublingPlan,
    RingStep,
    TreePlan,
    chunk_ranges,
    doubling_plan,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    segments,
    tree_plan,
)

pytestmark = pytest.mark.path_independent

# -- segments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "parts", "expected"),
    [
        (12, 4, [(0, 3), (3, 6), (6, 9), (9, 12)]),  # divisible
        (10, 4, [(0, 3), (3, 6), (6, 8), (8, 10)]),  # n % N = 2: the first two are longer
        (7, 3, [(0, 3), (3, 5), (5, 7)]),
        (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),  # n < N: trailing empty segments
        (0, 3, [(0, 0), (0, 0), (0, 0)]),  # empty tensor
        (5, 1, [(0, 5)]),  # one rank
        (1, 2, [(0, 1), (1, 1)]),
    ],
)
def test_segments_table(n: int, parts: int, expected: list[tuple[int, int]]) -> None:
    assert segments(n, parts) == expected


@pytest.mark.parametrize(("n", "parts"), [(3, 0), (-1, 2)])
def test_segments_rejects_bad_arguments(n: int, parts: int) -> None:
    with pytest.raises(ValueError):
        segments(n, parts)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_segments_cover_the_range_exactly_without_overlap(n: int, parts: int) -> None:
    got = segments(n, parts)
    assert len(got) == parts
    assert got[0][0] == 0 and got[-1][1] == n
    for (_, stop), (start, _) in zip(got, got[1:], strict=False):
        assert stop == start  # contiguous: no gap, no overlap
    lengths = [b - a for a, b in got]
    assert min(lengths) >= 0 and max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # longer ones first, like np.array_split


# -- pipelining sub-chunks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "itemsize", "chunk_bytes", "expected"),
    [
        (10, 4, 16, [(0, 4), (4, 8), (8, 10)]),
        (8, 4, 16, [(0, 4), (4, 8)]),  # exact multiple: no empty tail chunk
        (3, 4, 1 << 20, [(0, 3)]),  # one chunk when the segment fits
        (3, 8, 4, [(0, 1), (1, 2), (2, 3)]),  # chunk smaller than an item: one item each
        (0, 4, 16, [(0, 0)]),  # an empty segment still has one (empty) message
        (5, 2, 5, [(0, 2), (2, 4), (4, 5)]),  # chunk_bytes not a multiple of itemsize
    ],
)
def test_chunk_ranges_table(
    length: int, itemsize: int, chunk_bytes: int, expected: list[tuple[int, int]]
) -> None:
    assert chunk_ranges(length, itemsize, chunk_bytes) == expected


@given(st.integers(0, 5000), st.sampled_from([1, 2, 4, 8]), st.integers(1, 4096))
def test_chunk_ranges_cover_the_segment_within_the_byte_budget(
    length: int, itemsize: int, chunk_bytes: int
) -> None:
    got = chunk_ranges(length, itemsize, chunk_bytes)
    assert got[0][0] == 0 and got[-1][1] == length
    for (_, stop), (start, _) in zip(got, got[1:], strict=False):
        assert stop == start
    for a, b in got:
        assert (b - a) * itemsize <= max(chunk_bytes, itemsize)
        assert b > a or length == 0


# -- ring ----------------------------------------------------------------------------------------


def test_ring_reduce_scatter_table_for_four_ranks() -> None:
    # (send, recv) per step; rank r ends owning segment r.
    expected = {
        0: [(3, 2), (2, 1), (1, 0)],
        1: [(0, 3), (3, 2), (2, 1)],
        2: [(1, 0), (0, 3), (3, 2)],
        3: [(2, 1), (1, 0), (0, 3)],
    }
    for rank, pairs in expected.items():
        assert ring_reduce_scatter(rank, 4) == [RingStep(s, r, True) for s, r in pairs]


def test_ring_all_gather_table_for_three_ranks() -> None:
    expected = {0: [(0, 2), (2, 1)], 1: [(1, 0), (0, 2)], 2: [(2, 1), (1, 0)]}
    for rank, pairs in expected.items():
        assert ring_all_gather(rank, 3) == [RingStep(s, r, False) for s, r in pairs]


def test_ring_with_one_rank_has_no_steps() -> None:
    assert ring_all_reduce(0, 1) == []


def test_ring_all_reduce_is_reduce_scatter_then_all_gather() -> None:
    assert ring_all_reduce(1, 3) == ring_reduce_scatter(1, 3) + ring_all_gather(1, 3)


@given(st.integers(1, 40))
def test_ring_schedule_properties(size: int) -> None:
    tables = [ring_all_reduce(r, size) for r in range(size)]
    for r, steps in enumerate(tables):
        left = tables[(r - 1) % size]
        for s, step in enumerate(steps):
            # What I receive at step s is what my left neighbour sends at step s.
            assert step.recv == left[s].send
            # What I receive now is what I forward next (pipelining across the phase boundary).
            if s + 1 < len(steps):
                assert steps[s + 1].send == step.recv
        rs, ag = steps[: size - 1], steps[size - 1 :]
        # Reduce-scatter: I combine every segment but the one I start with; I end owning mine.
        assert sorted(st.recv for st in rs) == sorted(set(range(size)) - {(r - 1) % size})
        if rs:
            assert rs[-1].recv == r
        # All-gather: I receive every segment but my own.
        assert sorted(st.recv for st in ag) == sorted(set(range(size)) - {r})


# -- recursive doubling --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "size", "plan"),
    [
        (0, 1, DoublingPlan(1, None, False, ())),
        (0, 2, DoublingPlan(2, None, False, (1,))),
        (1, 2, DoublingPlan(2, None, False, (0,))),
        (0, 3, DoublingPlan(2, 2, False, (1,))),  # rank 0 absorbs extra rank 2
        (1, 3, DoublingPlan(2, None, False, (0,))),
        (2, 3, DoublingPlan(2, 0, True, ())),
        (3, 4, DoublingPlan(4, None, False, (2, 1))),
        (0, 5, DoublingPlan(4, 4, False, (1, 2))),
        (4, 5, DoublingPlan(4, 0, True, ())),
        (1, 6, DoublingPlan(4, 5, False, (0, 3))),
        (5, 6, DoublingPlan(4, 1, True, ())),
        (2, 7, DoublingPlan(4, 6, False, (3, 0))),
        (3, 7, DoublingPlan(4, None, False, (2, 1))),
        (5, 8, DoublingPlan(8, None, False, (4, 7, 1))),
    ],
)
def test_doubling_plan_table(rank: int, size: int, plan: DoublingPlan) -> None:
    assert doubling_plan(rank, size) == plan


@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 3), (0, 0)])
def test_doubling_plan_rejects_ranks_outside_the_group(rank: int, size: int) -> None:
    with pytest.raises(ValueError):
        doubling_plan(rank, size)


@given(st.integers(1, 100))
def test_doubling_plan_properties(size: int) -> None:
    plans = [doubling_plan(r, size) for r in range(size)]
    core = plans[0].core
    assert core & (core - 1) == 0 and core <= size < 2 * core
    # Folds pair each extra rank with exactly one core rank, both ways.
    for r, plan in enumerate(plans):
        assert plan.extra == (r >= core)
        if plan.fold is not None:
            assert plans[plan.fold].fold == r and plans[plan.fold].extra != plan.extra
    # Partners are symmetric in every round.
    for r, plan in enumerate(plans):
        for k, partner in enumerate(plan.partners):
            assert plans[partner].partners[k] == r
    # After fold-in and all rounds, every core rank's value includes every rank's.
    reach = [{r} for r in range(size)]
    for r, plan in enumerate(plans):
        if not plan.extra and plan.fold is not None:
            reach[r] |= reach[plan.fold]
    for k in range(core.bit_length() - 1):
        reach = [
            reach[r] | reach[plans[r].partners[k]] if not plans[r].extra else reach[r]
            for r in range(size)
        ]
    for r, plan in enumerate(plans):
        if not plan.extra:
            assert reach[r] == set(range(size))


# -- binomial tree -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "size", "plan"),
    [
        (0, 1, TreePlan(None, ())),
        (0, 2, TreePlan(None, (1,))),
        (1, 2, TreePlan(0, ())),
        (0, 3, TreePlan(None, (1, 2))),
        (2, 3, TreePlan(0, ())),  # its child 3 is outside the group
        (0, 5, TreePlan(None, (1, 2, 4))),
        (4, 5, TreePlan(0, ())),
        (0, 8, TreePlan(None, (1, 2, 4))),
        (4, 8, TreePlan(0, (5, 6))),
        (6, 8, TreePlan(4, (7,))),
        (7, 8, TreePlan(6, ())),
        (0, 9, TreePlan(None, (1, 2, 4, 8))),
        (8, 12, TreePlan(0, (9, 10))),
        (12, 100, TreePlan(8, (13, 14))),
        (64, 65, TreePlan(0, ())),
    ],
)
def test_tree_plan_table(rank: int, size: int, plan: TreePlan) -> None:
    assert tree_plan(rank, size) == plan


@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 3), (0, 0)])
def test_tree_plan_rejects_ranks_outside_the_group(rank: int, size: int) -> None:
    with pytest.raises(ValueError):
        tree_plan(rank, size)


@given(st.integers(1, 300))
def test_tree_plan_properties(size: int) -> None:
    plans = [tree_plan(r, size) for r in range(size)]
    # Parent and child links agree; rank 0 is the only root; children come in increasing order.
    assert [r for r, p in enumerate(plans) if p.parent is None] == [0]
    for r, plan in enumerate(plans):
        assert list(plan.children) == sorted(plan.children)
        for child in plan.children:
            assert plans[child].parent == r
        if plan.parent is not None:
            assert r in plans[plan.parent].children
    # Each subtree is a contiguous block of ranks following its root, so folding the children
    # in order after our own value combines ranks in increasing order.
    def subtree(r: int) -> list[int]:
        out = [r]
        for child in plans[r].children:
            out += subtree(child)
        return out

    assert subtree(0) == list(range(size))
    for r in range(size):
        block = subtree(r)
        assert block == list(range(r, r + len(block)))
    # With one message received per step, the root holds the sum after ceil(log2(size)) steps
    # (the model's latency_steps counts that twice: up, then down); size - 1 messages each way.
    def finished(r: int) -> int:
        t = 0
        for child in plans[r].children:
            t = max(t, finished(child)) + 1
        return t

    assert finished(0) == (size - 1).bit_length()
    assert sum(len(p.children) for p in plans) == size - 1
