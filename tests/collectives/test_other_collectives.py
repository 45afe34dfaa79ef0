"""all_gather, broadcast, reduce_scatter, barrier, all_reduce_many over the in-process transport."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cluster.collectives import CommunicationOptions, ReduceOp

from ._threads import make_groups, run_ranks
from .test_all_reduce import ALGORITHMS, check, rank_input

# -- all_gather ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_all_gather_concatenates_in_rank_order(world: int, axis: int) -> None:
    hub, groups = make_groups(world, chunk_bytes=8)
    inputs = [rank_input(4, r, "float32", (3, 2)) for r in range(world)]
    results = run_ranks(lambda r: groups[r].all_gather(inputs[r], axis=axis), world)
    want = np.concatenate(inputs, axis=axis)
    for got in results:
        assert got.dtype == want.dtype and got.flags.c_contiguous
        assert np.array_equal(got, want)


def test_all_gather_allows_different_sizes_along_the_axis_like_tf() -> None:
    hub, groups = make_groups(4, chunk_bytes=16)
    inputs = [np.full((2, r, 3), r, np.int16) for r in range(4)]  # rank 0 contributes nothing
    results = run_ranks(lambda r: groups[r].all_gather(inputs[r], axis=1), 4)
    want = np.concatenate(inputs, axis=1)
    assert want.shape == (2, 6, 3)
    for got in results:
        assert np.array_equal(got, want)


def test_all_gather_takes_any_plain_dtype() -> None:
    hub, groups = make_groups(3)
    inputs = [np.array([r % 2 == 0, True]) for r in range(3)]
    results = run_ranks(lambda r: groups[r].all_gather(inputs[r]), 3)
    assert results[0].tolist() == [True, True, False, True, True, True]


def test_all_gather_of_a_scalar_is_an_error_with_a_fix() -> None:
    hub, groups = make_groups(1)
    with pytest.raises(ValueError, match=r"rank >= 1.*reshape"):
        groups[0].all_gather(np.float32(1))


def test_all_gather_axis_out_of_range() -> None:
    hub, groups = make_groups(1)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        groups[0].all_gather(np.zeros((2, 2)), axis=2)


# -- broadcast -----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 33)], ids=str)
def test_broadcast_copies_the_roots_value_everywhere(world: int, shape: tuple[int, ...]) -> None:
    root = world - 1
    hub, groups = make_groups(world, chunk_bytes=12)
    inputs = [rank_input(5, r, "float64", shape) for r in range(world)]
    originals = [x.copy() for x in inputs]
    results = run_ranks(lambda r: groups[r].broadcast(inputs[r], root=root), world)
    for got in results:
        assert got.shape == shape and got.tobytes() == inputs[root].tobytes()
    assert all(x.tobytes() == o.tobytes() for x, o in zip(inputs, originals, strict=True))


def test_broadcast_rejects_a_root_outside_the_group() -> None:
    hub, groups = make_groups(1)
    with pytest.raises(ValueError, match="root 1 is not a rank"):
        groups[0].broadcast(np.zeros(1), root=1)


# -- reduce_scatter ------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("rows", [0, 1, 4, 7])
def test_reduce_scatter_returns_this_ranks_rows(world: int, rows: int, algorithm: str) -> None:
    hub, groups = make_groups(world, **ALGORITHMS[algorithm])
    inputs = [rank_input(6, r, "int32", (rows, 3)) for r in range(world)]
    results = run_ranks(lambda r: groups[r].reduce_scatter(inputs[r], ReduceOp.MEAN), world)
    total = np.stack([x.astype(np.int64) for x in inputs]).sum(axis=0)
    mean = (np.sign(total) * (np.abs(total) // world)).astype(np.int32)
    for rank, (got, want) in enumerate(
        zip(results, np.array_split(mean, world, axis=0), strict=True)
    ):
        assert got.dtype == np.int32 and got.shape == want.shape, rank
        assert np.array_equal(got, want), rank


# -- barrier -------------------------------------------------------------------------------------


def test_barrier_returns_only_after_every_rank_entered() -> None:
    world = 5
    hub, groups = make_groups(world)
    entered = [threading.Event() for _ in range(world)]
    late = world - 1

    def body(rank: int) -> bool:
        if rank == late:  # enter only once rank 0 is already inside the barrier
            entered[0].wait(5)
        entered[rank].set()
        groups[rank].barrier()
        return all(e.is_set() for e in entered)

    assert run_ranks(body, world, transports=hub.transports) == [True] * world


# -- all_reduce_many -----------------------------------------------------------------------------


MIXED = [
    ("float32", (3, 4)),
    ("float64", ()),
    ("float32", (0,)),
    ("int64", (5,)),
    ("float32", (2, 2, 2)),
    ("int32", (1,)),
    ("float64", (40,)),
    ("float32", (100,)),
]


@pytest.mark.parametrize("bytes_per_pack", [0, 1, 16, 64, 1 << 20])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_all_reduce_many_round_trips_mixed_shapes(world: int, bytes_per_pack: int) -> None:
    options = CommunicationOptions(bytes_per_pack=bytes_per_pack)
    hub, groups = make_groups(world, options=options, small_message_bytes=256, chunk_bytes=32)
    inputs = [
        [rank_input(i, r, dtype, shape) for i, (dtype, shape) in enumerate(MIXED)]
        for r in range(world)
    ]
    results = run_ranks(lambda r: groups[r].all_reduce_many(inputs[r], ReduceOp.SUM), world)
    for i in range(len(MIXED)):
        check([res[i] for res in results], [xs[i] for xs in inputs], ReduceOp.SUM)


def test_all_reduce_many_returns_scalars_for_scalars_and_handles_an_empty_list() -> None:
    hub, groups = make_groups(3)
    results = run_ranks(
        lambda r: (
            groups[r].all_reduce_many([1.0, np.float32(r), 2], "max"),
            groups[r].all_reduce_many([]),
        ),
        3,
    )
    for many, empty in results:
        assert many == [1.0, 2.0, 2] and [type(v) for v in many] == [
            np.float32,  # a Python float: float32, as tf.convert_to_tensor
            np.float32,
            np.int32,
        ]
        assert empty == []


def test_all_reduce_many_rejects_a_bare_array() -> None:
    hub, groups = make_groups(1)
    with pytest.raises(TypeError, match="list of values"):
        groups[0].all_reduce_many(np.ones(3))  # type: ignore[arg-type]
