"""The ring over several arrays at once (``ring.all_reduce_many``): its message table, and exact
results through ``all_reduce_many`` / ``all_reduce_apply`` on the network path."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.collectives.ops import ReduceOp, combine_into, finalize
from cluster.collectives.ring import RingArray, _chunk_table, _combine_update
from cluster.collectives.schedule import segments

from ._threads import make_groups, run_ranks

pytestmark = [pytest.mark.timeout(60), pytest.mark.network_path]


@pytest.mark.parametrize("sizes", [[10], [3, 0, 8, 1, 20], [1, 1], [5] * 30, [100_003, 7, 65_537]])
@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("chunk_bytes", [4, 64, 1 << 20])
def test_table_covers_every_element_once_in_few_messages(sizes, world, chunk_bytes) -> None:
    arrays = [RingArray(np.empty(n, np.float32)) for n in sizes]
    bounds = segments(sum(sizes), world)
    table = _chunk_table(arrays, bounds, chunk_bytes)
    assert len(table) == world
    seen = [np.zeros(n, np.int64) for n in sizes]
    for (seg_lo, seg_hi), pieces in zip(bounds, table, strict=True):
        assert pieces  # every step sends at least one (maybe empty) message
        for a, lo, hi in pieces:
            seen[a][lo:hi] += 1
            assert (hi - lo) * 4 <= max(chunk_bytes, 4)
        # Whole arrays are not split per segment: a segment touches only the arrays it overlaps,
        # so a step sends about len(arrays) / world messages, not len(arrays).
        if chunk_bytes == 1 << 20:
            touched = {a for a, lo, hi in pieces if hi > lo}
            assert len([p for p in pieces if p[2] > p[1]]) == len(touched)
            starts = np.cumsum([0, *sizes])
            overlapping = {a for a in range(len(sizes))
                           if min(seg_hi, starts[a + 1]) > max(seg_lo, starts[a])}
            assert touched == overlapping
    assert all((s == 1).all() for s in seen)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_many_arrays_sum_exactly_and_alike_on_every_rank(world) -> None:
    # Sizes that put segment boundaries inside arrays; integer values, so any order is exact.
    sizes = [300_001, 262_144, 5, 400_000, 333_333]
    values = [[np.full(n, r + 1 + i, np.float32) for i, n in enumerate(sizes)]
              for r in range(world)]
    hub, groups = make_groups(world)
    got = run_ranks(lambda r: groups[r].all_reduce_many(values[r], "SUM"), world, timeout=50)
    want = [sum(range(1, world + 1)) + world * i for i in range(len(sizes))]
    for results in got:
        for result, n, w in zip(results, sizes, want, strict=True):
            assert result.shape == (n,) and (result == w).all()


def test_arrays_of_several_dtypes_each_get_their_ring_run() -> None:
    # One ring run per dtype, one after the other in the same exchange.
    world = 3
    sizes_dtypes = [(300_001, np.float64), (262_145, np.float32), (9, np.int32),
                    (400_003, np.float32), (131_073, np.float64), (5, np.int64)]
    values = [[np.full(n, r + 2 * i, dt) for i, (n, dt) in enumerate(sizes_dtypes)]
              for r in range(world)]
    hub, groups = make_groups(world)
    got = run_ranks(lambda r: groups[r].all_reduce_many(values[r], "SUM"), world, timeout=50)
    for results in got:
        for i, (result, (n, dt)) in enumerate(zip(results, sizes_dtypes, strict=True)):
            assert result.dtype == dt and result.shape == (n,)
            assert (result == sum(r + 2 * i for r in range(world))).all()


def _scaled_step(target: np.ndarray, reduced: np.ndarray) -> None:
    np.multiply(reduced, np.float32(-0.3), out=reduced)  # scribbles on its scratch, as SGD does
    np.add(target, reduced, out=target)


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MAX])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("n,block", [(1, 7), (7, 7), (50, 7), (49, 7), (1000, 1024)])
def test_a_fused_last_combine_in_blocks_gives_the_whole_chunk_bytes(op, in_place, n,
                                                                    block) -> None:
    rng = np.random.default_rng(n + block)
    local, incoming, target = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    want_sums = np.empty(n, np.float32)
    combine_into(op, want_sums, local, incoming)
    finalize(op, want_sums, 3)
    want = target.copy()
    _scaled_step(want, want_sums)
    kept_local, kept_incoming = local.copy(), incoming.copy()
    mine = local.copy() if in_place else np.full(n, np.nan, np.float32)
    got = target.copy()
    scratch = np.full(block, np.nan, np.float32)
    _combine_update(op, 3, mine, None if in_place else local, incoming, got, _scaled_step,
                    scratch)
    assert got.tobytes() == want.tobytes()
    assert incoming.tobytes() == kept_incoming.tobytes()
    assert local.tobytes() == kept_local.tobytes()  # the caller's values are only read
    if not in_place:
        assert np.isnan(mine).all()  # work is scratch: not even written


def test_the_rings_scratch_comes_from_the_groups_buffer_pool(monkeypatch) -> None:
    # Segments travel in chunks of up to 32 MiB: a scratch chunk from np.empty would be fresh
    # pages on every call, so the ring takes it from the group's pool (which reuses them).
    from cluster.collectives._buffers import BufferPool

    asked: list[tuple[int, np.dtype]] = []
    plain = BufferPool.empty

    def recording(self, size, dtype):
        asked.append((size, np.dtype(dtype)))
        return plain(self, size, dtype)

    monkeypatch.setattr(BufferPool, "empty", recording)
    world, n = 3, 300_001
    values = [np.full(n, r + 1, np.float32) for r in range(world)]
    hub, groups = make_groups(world)
    got = run_ranks(lambda r: groups[r].all_reduce(values[r], "SUM"), world, timeout=50)
    assert all((g == 6).all() for g in got)
    chunk = max(hi - lo for lo, hi in segments(n, world))  # 400 KB segments: one chunk each
    assert (chunk, np.dtype(np.float32)) in asked
