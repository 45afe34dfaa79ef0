"""How a global batch is split among the tasks (pure functions)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests._requires import require

require("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")  # keras picks its backend at import
require("keras")

from cluster.keras import _split  # noqa: E402  (imports keras)

pytestmark = pytest.mark.timeout(60)


@given(rows=st.integers(0, 500), world=st.integers(1, 9))
def test_shares_cover_every_row_once_and_differ_by_at_most_one(rows: int, world: int) -> None:
    shares = [_split.share(rows, rank, world) for rank in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:], strict=False))  # contiguous
    sizes = [stop - start for start, stop in shares]
    assert max(sizes) - min(sizes) <= 1


def test_the_documented_shares() -> None:
    assert [_split.share(10, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [_split.share(2, r, 3) for r in range(3)] == [(0, 0), (0, 1), (1, 2)]


def test_a_rank_outside_the_world_is_an_error() -> None:
    with pytest.raises(ValueError, match="rank 3 is outside a world of 3 tasks"):
        _split.share(10, 3, 3)


def test_take_rows_cuts_every_array_of_a_nest_and_keeps_the_rest() -> None:
    x = {"a": np.arange(10).reshape(5, 2), "b": [np.arange(5)]}
    data = (x, np.arange(5) * 10, None)
    assert _split.batch_rows(data) == 5
    part = _split.take_rows(data, 1, 3)
    np.testing.assert_array_equal(part[0]["a"], [[2, 3], [4, 5]])
    np.testing.assert_array_equal(part[0]["b"][0], [1, 2])
    np.testing.assert_array_equal(part[1], [10, 20])
    assert part[2] is None


def test_arrays_with_different_row_counts_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\[3, 4\] rows"):
        _split.batch_rows((np.zeros((4, 2)), np.zeros(3)))
