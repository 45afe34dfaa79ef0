"""Distributed input (cluster/data.py): TF's split rule, nests, views, workers, input functions.

Tables marked "TF-observed" were produced by TensorFlow 2.21 (tensorflow-cpu, logical CPU
devices): ``MirroredStrategy(["/cpu:0", ...]).experimental_distribute_dataset(
tf.data.Dataset.range(n).batch(B))`` and ``distribute_datasets_from_function``, reading
``experimental_local_results`` of every step.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.data import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
    DistributedIterator,
    InputContext,
    InputReplicationMode,
    Optional,
    OutOfRangeError,
    replica_slices,
    split_batch,
)
from tests._requires import require_cupy


def _rows(pieces):
    return [p.tolist() for p in pieces]


def _batches(n: int, batch: int) -> list[np.ndarray]:
    """tf.data.Dataset.range(n).batch(batch), as NumPy batches."""
    return [np.arange(i, min(i + batch, n)) for i in range(0, n, batch)]


def _steps(dataset) -> list[list[list[int]]]:
    return [_rows(step) for step in dataset]


# -- the split rule, checked against TF ----------------------------------------------------------

# TF-observed: MirroredStrategy with 4 CPU replicas over range(n).batch(8).
TF_FOUR_REPLICAS_BATCH_8 = {
    21: [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12, 13], [14, 15]],
         [[16, 17], [18, 19], [20], []]],                                 # last batch of 5
    19: [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12, 13], [14, 15]],
         [[16], [17], [18], []]],                                         # last batch of 3
    17: [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12, 13], [14, 15]],
         [[16], [], [], []]],                                             # last batch of 1
    22: [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12, 13], [14, 15]],
         [[16, 17], [18, 19], [20, 21], []]],                             # last batch of 6
    23: [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12, 13], [14, 15]],
         [[16, 17], [18, 19], [20, 21], [22]]],                           # last batch of 7
    8: [[[0, 1], [2, 3], [4, 5], [6, 7]]],
    5: [[[0, 1], [2, 3], [4], []]],
    3: [[[0], [1], [2], []]],
    1: [[[0], [], [], []]],
}


@pytest.mark.parametrize("n", sorted(TF_FOUR_REPLICAS_BATCH_8))
def test_partial_last_batch_splits_as_tf(n: int) -> None:
    ds = DistributedDataset(_batches(n, 8), num_replicas_in_sync=4, worker_index=0,
                            num_workers=1, local_replicas=4, wrap=list)
    assert _steps(ds) == TF_FOUR_REPLICAS_BATCH_8[n]


# TF-observed: a global batch not divisible by the replicas is not an error; TF gives each
# replica ceil(B/N) rows until they run out (static batch sizes from batch(B, drop_remainder=True)
# split the same way as dynamic ones). range(2B+1).batch(B) over 4 replicas, and 3 replicas.
@pytest.mark.parametrize(
    ("replicas", "n", "batch", "expected"),
    [
        (4, 13, 6, [[[0, 1], [2, 3], [4, 5], []], [[6, 7], [8, 9], [10, 11], []],
                    [[12], [], [], []]]),
        (4, 15, 7, [[[0, 1], [2, 3], [4, 5], [6]], [[7, 8], [9, 10], [11, 12], [13]],
                    [[14], [], [], []]]),
        (4, 11, 5, [[[0, 1], [2, 3], [4], []], [[5, 6], [7, 8], [9], []], [[10], [], [], []]]),
        (4, 7, 3, [[[0], [1], [2], []], [[3], [4], [5], []], [[6], [], [], []]]),
        (4, 5, 2, [[[0], [1], [], []], [[2], [3], [], []], [[4], [], [], []]]),
        (4, 3, 1, [[[0], [], [], []], [[1], [], [], []], [[2], [], [], []]]),
        (4, 19, 9, [[[0, 1, 2], [3, 4, 5], [6, 7, 8], []],
                    [[9, 10, 11], [12, 13, 14], [15, 16, 17], []], [[18], [], [], []]]),
        (4, 21, 10, [[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]],
                     [[10, 11, 12], [13, 14, 15], [16, 17, 18], [19]], [[20], [], [], []]]),
        (3, 17, 8, [[[0, 1, 2], [3, 4, 5], [6, 7]], [[8, 9, 10], [11, 12, 13], [14, 15]],
                    [[16], [], []]]),
        (3, 7, 8, [[[0, 1, 2], [3, 4, 5], [6]]]),
    ],
)
def test_indivisible_global_batch_splits_as_tf(replicas, n, batch, expected) -> None:
    ds = DistributedDataset(_batches(n, batch), num_replicas_in_sync=replicas, worker_index=0,
                            num_workers=1, local_replicas=replicas, wrap=list)
    assert _steps(ds) == expected


def test_variable_batch_sizes_split_each_batch_on_its_own_as_tf() -> None:
    # TF-observed: a generator of batches of 8, 3, 6, 1, 0, 4 rows over 4 replicas.
    sizes = [8, 3, 6, 1, 0, 4]
    expected = [
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[0], [1], [2], []],
        [[0, 1], [2, 3], [4, 5], []],
        [[0], [], [], []],
        [[], [], [], []],
        [[0], [1], [2], [3]],
    ]
    assert [_rows(split_batch(np.arange(b), 4)) for b in sizes] == expected


@pytest.mark.parametrize(
    ("size", "replicas", "expected"),
    [
        (8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        (5, 4, [(0, 2), (2, 4), (4, 5), (5, 5)]),
        (6, 4, [(0, 2), (2, 4), (4, 6), (6, 6)]),
        (1, 4, [(0, 1), (1, 1), (1, 1), (1, 1)]),
        (0, 3, [(0, 0), (0, 0), (0, 0)]),
        (7, 1, [(0, 7)]),
    ],
)
def test_replica_slices_table(size, replicas, expected) -> None:
    assert replica_slices(size, replicas) == expected


@pytest.mark.parametrize(("size", "replicas"), [(4, 0), (-1, 2)])
def test_replica_slices_rejects_bad_arguments(size, replicas) -> None:
    with pytest.raises(ValueError):
        replica_slices(size, replicas)


# -- nests, views, duck-typed arrays -------------------------------------------------------------


def test_tuple_with_dict_splits_every_leaf_alike() -> None:
    # TF-observed: range(7).map(lambda x: (x, {"y": 10 * x})).batch(8) over 2 replicas.
    x = np.arange(7)
    pieces = split_batch((x, {"y": x * 10}), 2)
    assert [(a.tolist(), {"y": d["y"].tolist()}) for a, d in pieces] == [
        ([0, 1, 2, 3], {"y": [0, 10, 20, 30]}),
        ([4, 5, 6], {"y": [40, 50, 60]}),
    ]


def test_structure_and_container_types_are_preserved() -> None:
    Point = namedtuple("Point", ["x", "y"])
    batch = {
        "features": [np.zeros((6, 3)), Point(np.ones(6), np.arange(6))],
        "ordered": OrderedDict(b=np.arange(6), a=np.arange(6)),
        "nested": ({"deep": (np.arange(12).reshape(6, 2),)},),
        "default": defaultdict(list, {"k": np.arange(6)}),
    }
    pieces = split_batch(batch, 4)
    assert len(pieces) == 4
    first = pieces[0]
    assert list(first) == ["features", "ordered", "nested", "default"]
    assert isinstance(first["features"], list)
    assert isinstance(first["features"][1], Point)
    assert isinstance(first["ordered"], OrderedDict) and list(first["ordered"]) == ["b", "a"]
    assert isinstance(first["nested"], tuple) and isinstance(first["nested"][0]["deep"], tuple)
    assert dict(first["default"]).keys() == {"k"}
    assert [p["features"][0].shape for p in pieces] == [(2, 3), (2, 3), (2, 3), (0, 3)]
    assert pieces[3]["nested"][0]["deep"][0].shape == (0, 2)
    assert pieces[1]["features"][1].y.tolist() == [2, 3]


def test_pieces_are_views_not_copies() -> None:
    x = np.arange(40.0).reshape(10, 4)
    y = np.arange(10)
    pieces = split_batch({"x": x, "y": y}, 3)
    for piece in pieces:
        assert not piece["x"].flags.owndata and not piece["y"].flags.owndata
        assert np.shares_memory(piece["x"], x) or piece["x"].size == 0
        assert np.shares_memory(piece["y"], y) or piece["y"].size == 0
    pieces[0]["x"][0, 0] = -1.0
    assert x[0, 0] == -1.0


def test_empty_pieces_keep_trailing_shape_and_dtype() -> None:
    x = np.ones((1, 5, 2), dtype=np.float16)
    pieces = split_batch(x, 3)
    assert [p.shape for p in pieces] == [(1, 5, 2), (0, 5, 2), (0, 5, 2)]
    assert all(p.dtype == np.float16 for p in pieces)


class _DeviceArray:
    """Stands in for a CuPy array: only .shape and basic slicing (and records each slice)."""

    def __init__(self, rows: list[int]) -> None:
        self.rows = rows
        self.shape = (len(rows),)

    def __getitem__(self, key: slice) -> _DeviceArray:
        assert isinstance(key, slice), "split_batch must use basic slicing only"
        return _DeviceArray(self.rows[key])


def test_duck_typed_arrays_are_split_by_slicing() -> None:
    pieces = split_batch((_DeviceArray([0, 1, 2, 3, 4]), np.arange(5)), 4)
    assert [p[0].rows for p in pieces] == [[0, 1], [2, 3], [4], []]


def test_cupy_arrays_split_as_views_when_available() -> None:
    cp = require_cupy()
    x = cp.arange(10)
    pieces = split_batch(x, 4)
    assert [p.get().tolist() for p in pieces] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    # Views: each piece starts inside x's memory, at its offset (no copy).
    item = x.dtype.itemsize
    assert [p.data.ptr - x.data.ptr for p in pieces] == [0, 3 * item, 6 * item, 9 * item]


def test_one_replica_gets_the_whole_batch() -> None:
    x = np.arange(3)
    (piece,) = split_batch(x, 1)
    assert piece.tolist() == [0, 1, 2] and piece.base is x


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "where", "kind"),
    [
        ((np.arange(4), 3), r"batch\[1\]", "type int"),
        ({"x": np.arange(4), "label": 1.5}, r"batch\['label'\]", "type float"),
        ({"x": np.arange(4), "name": "abc"}, r"batch\['name'\]", "type str"),
        ((np.arange(4), None), r"batch\[1\]", "None"),
        (7, "batch", "type int"),
    ],
)
def test_python_scalars_are_not_batchable(batch, where, kind) -> None:
    with pytest.raises(TypeError, match=rf"{where} \({kind}\) is not batchable.*np\.asarray"):
        split_batch(batch, 2)


def test_zero_dim_arrays_are_not_batchable() -> None:
    with pytest.raises(TypeError, match=r"batch\[0\] is a 0-d array .*leading batch axis"):
        split_batch((np.float32(1.0), np.arange(3)), 2)


def test_mismatched_leading_dimensions_name_both_arrays() -> None:
    # TF silently splits each component on its own here; we refuse, naming the arrays.
    with pytest.raises(ValueError, match=r"batch\['x'\] has 4 rows but batch\['y'\]\[0\] has 3"):
        split_batch({"x": np.zeros((4, 2)), "y": (np.zeros(3),)}, 2)


def test_empty_nest_has_no_batch_size() -> None:
    with pytest.raises(ValueError, match="holds no arrays"):
        split_batch({"a": ()}, 2)


def test_split_batch_rejects_zero_replicas() -> None:
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        split_batch(np.arange(3), 0)


def test_dataset_errors_name_the_element() -> None:
    ds = DistributedDataset([np.arange(4), (np.arange(4), 5)], num_replicas_in_sync=2,
                            worker_index=0, num_workers=1, local_replicas=2, wrap=list)
    it = iter(ds)
    next(it)
    with pytest.raises(TypeError, match=r"dataset element 1\[1\] \(type int\)"):
        next(it)


# -- InputContext, InputReplicationMode ----------------------------------------------------------


def test_input_context_defaults_and_str_as_tf() -> None:
    ctx = InputContext()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    assert str(ctx) == "InputContext(input pipeline id 0, total: 1)"


def test_input_context_properties_are_read_only() -> None:
    ctx = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (2, 1, 4)
    for name in ("num_input_pipelines", "input_pipeline_id", "num_replicas_in_sync"):
        with pytest.raises(AttributeError):
            setattr(ctx, name, 3)


# TF-observed for InputContext(2, 1, 4): 8 -> 2, 0 -> 0, 4 -> 1, -4 -> -1, 8.0 -> 2.0.
@pytest.mark.parametrize(("global_batch", "expected"),
                         [(8, 2), (0, 0), (4, 1), (-4, -1), (8.0, 2.0), (64, 16)])
def test_per_replica_batch_size(global_batch, expected) -> None:
    got = InputContext(2, 1, 4).get_per_replica_batch_size(global_batch)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("global_batch", [6, 7.5, 1])
def test_per_replica_batch_size_not_divisible_raises_as_tf(global_batch) -> None:
    with pytest.raises(ValueError, match=rf"The `global_batch_size` {global_batch} is not "
                                         r"divisible by `num_replicas_in_sync` 4"):
        InputContext(2, 1, 4).get_per_replica_batch_size(global_batch)


def test_input_replication_mode_values_as_tf() -> None:
    assert [m.value for m in InputReplicationMode] == ["PER_WORKER", "PER_REPLICA"]


# -- DistributedDataset --------------------------------------------------------------------------


def _worker_steps(batches, workers: int, local: int) -> list[list[list[list[int]]]]:
    """Every worker's steps: result[w][step] = [rows of local replica 0, 1, ...]."""
    return [
        _steps(DistributedDataset(batches, num_replicas_in_sync=workers * local, worker_index=w,
                                  num_workers=workers, local_replicas=local, wrap=list))
        for w in range(workers)
    ]


@pytest.mark.parametrize(("workers", "local"), [(2, 1), (2, 2), (3, 2), (4, 1), (1, 3)])
@pytest.mark.parametrize("n", [16, 21, 17, 1])
def test_workers_together_see_the_single_process_global_batches(workers, local, n) -> None:
    batches = _batches(n, 8)
    per_worker = _worker_steps(batches, workers, local)
    assert len({len(steps) for steps in per_worker}) == 1, "workers must stop on the same step"
    for step, batch in enumerate(batches):
        by_replica_id = [rows for w in range(workers) for rows in per_worker[w][step]]
        assert by_replica_id == _rows(split_batch(batch, workers * local))
        assert sum(by_replica_id, []) == batch.tolist()


def test_worker_owns_a_contiguous_block_of_replicas() -> None:
    # Worker 1 of 2 with 2 local replicas owns global replicas 2 and 3.
    steps = _worker_steps(_batches(21, 8), 2, 2)
    assert steps[1] == [[[4, 5], [6, 7]], [[12, 13], [14, 15]], [[20], []]]
    # TF-observed (2 workers x 2 replicas, DATA sharding, range(21).batch(8)): TF deals the
    # same pieces, but strided: worker 1's local replicas get pieces 1 and 3.
    tf_worker_1 = [[[2, 3], [6, 7]], [[10, 11], [14, 15]], [[18, 19], []]]
    tf_worker_0 = [[[0, 1], [4, 5]], [[8, 9], [12, 13]], [[16, 17], [20]]]
    for step in range(3):
        ours = sorted(map(tuple, steps[0][step] + steps[1][step]))
        theirs = sorted(map(tuple, tf_worker_0[step] + tf_worker_1[step]))
        assert ours == theirs


def test_one_replica_passes_batches_through_untouched() -> None:
    batches = [(np.arange(3), 4), "not even an array"]
    got = list(DistributedDataset(batches, num_replicas_in_sync=1, worker_index=0,
                                  num_workers=1, local_replicas=1, wrap=lambda v: v))
    assert got[0][0] is batches[0] and got[1][0] is batches[1]


def test_wrap_gets_the_local_pieces() -> None:
    seen = []
    ds = DistributedDataset([np.arange(8)], num_replicas_in_sync=4, worker_index=1,
                            num_workers=2, local_replicas=2,
                            wrap=lambda values: seen.append(values) or "wrapped")
    assert list(ds) == ["wrapped"]
    assert _rows(seen[0]) == [[4, 5], [6, 7]]


def test_each_iter_is_a_new_epoch() -> None:
    ds = DistributedDataset(_batches(5, 4), num_replicas_in_sync=4, worker_index=0,
                            num_workers=1, local_replicas=4, wrap=list)
    first, second = _steps(ds), _steps(ds)
    # TF-observed: range(5).batch(4) over 4 replicas, both epochs.
    assert first == second == [[[0], [1], [2], [3]], [[4], [], [], []]]


def test_iterator_protocol_get_next_and_optional() -> None:
    ds = DistributedDataset(_batches(5, 4), num_replicas_in_sync=4, worker_index=0,
                            num_workers=1, local_replicas=4, wrap=list)
    it = iter(ds)
    assert isinstance(it, DistributedIterator) and iter(it) is it
    assert _rows(it.get_next()) == [[0], [1], [2], [3]]
    opt = it.get_next_as_optional()
    assert opt.has_value() and _rows(opt.get_value()) == [[4], [], [], []]
    assert not it.get_next_as_optional().has_value()
    with pytest.raises(OutOfRangeError, match="End of sequence"):
        it.get_next()
    with pytest.raises(StopIteration):
        next(it)


def test_empty_optional_has_no_value() -> None:
    with pytest.raises(ValueError, match="has_value"):
        Optional.empty().get_value()


def test_a_generator_dataset_gives_one_epoch() -> None:
    ds = DistributedDataset((b for b in _batches(4, 2)), num_replicas_in_sync=2, worker_index=0,
                            num_workers=1, local_replicas=2, wrap=list)
    assert len(list(ds)) == 2 and list(ds) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_replicas_in_sync": 4, "num_workers": 2, "local_replicas": 1, "worker_index": 0},
         "same number of replicas"),
        ({"num_replicas_in_sync": 4, "num_workers": 2, "local_replicas": 2, "worker_index": 2},
         r"worker_index must be in \[0, 2\)"),
        ({"num_replicas_in_sync": 0, "num_workers": 1, "local_replicas": 1, "worker_index": 0},
         "num_replicas_in_sync must be a positive int"),
    ],
)
def test_dataset_rejects_bad_topology(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        DistributedDataset([np.arange(4)], wrap=list, **kwargs)


@pytest.mark.parametrize("dataset", [42, np.arange(8).reshape(4, 2), {"x": np.arange(4)}])
def test_dataset_must_be_an_iterable_of_batches(dataset) -> None:
    # An array would iterate its rows and a dict its keys: refused rather than split wrongly.
    with pytest.raises(TypeError, match="iterable of batches"):
        DistributedDataset(dataset, num_replicas_in_sync=2, worker_index=0, num_workers=1,
                           local_replicas=2, wrap=list)


# -- DistributedDatasetsFromFunction -------------------------------------------------------------


def _from_function(fn, *, workers=1, index=0, local=2, **kwargs):
    return DistributedDatasetsFromFunction(
        fn, num_workers=workers, worker_index=index, local_replicas=local,
        num_replicas_in_sync=workers * local, wrap=list, **kwargs)


def test_function_called_once_per_worker_at_creation_with_context() -> None:
    calls = []

    def fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return _batches(20, ctx.get_per_replica_batch_size(8))

    ds = _from_function(fn, local=2)
    assert calls == [(1, 0, 2)]  # TF-observed: called once, when the dataset is created
    # TF-observed: range(20).batch(4) over 2 replicas; replicas take successive elements and the
    # replica left without one at the end gets an empty batch. Same again for a second epoch.
    expected = [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]],
                [[16, 17, 18, 19], []]]
    assert _steps(ds) == expected and _steps(ds) == expected
    assert calls == [(1, 0, 2)]


@pytest.mark.parametrize(
    ("batch", "expected"),
    [  # TF-observed: range(5).batch(1) and range(5).batch(2) over 2 replicas.
        (1, [[[0], [1]], [[2], [3]], [[4], []]]),
        (2, [[[0, 1], [2, 3]], [[4], []]]),
    ],
)
def test_function_elements_dealt_to_replicas_in_turn(batch, expected) -> None:
    assert _steps(_from_function(lambda ctx: _batches(5, batch), local=2)) == expected


def test_function_multi_worker_contexts_and_user_sharding() -> None:
    contexts = []

    def fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        rows = np.arange(16)[ctx.input_pipeline_id::ctx.num_input_pipelines]
        return [rows[i:i + 2] for i in range(0, len(rows), 2)]

    w0 = _steps(_from_function(fn, workers=2, index=0, local=2))
    w1 = _steps(_from_function(fn, workers=2, index=1, local=2))
    assert contexts == [(2, 0, 4), (2, 1, 4)]
    assert w0 == [[[0, 2], [4, 6]], [[8, 10], [12, 14]]]
    assert w1 == [[[1, 3], [5, 7]], [[9, 11], [13, 15]]]


def test_function_padding_keeps_structure_shape_and_dtype() -> None:
    def fn(ctx):
        return [{"a": np.full((1, 2), float(i), np.float32), "b": np.array([i])} for i in range(4)]

    steps = list(_from_function(fn, local=3))
    assert len(steps) == 2
    last = steps[1]
    assert last[0]["b"].tolist() == [3]
    for empty in last[1:]:
        assert empty["a"].shape == (0, 2) and empty["a"].dtype == np.float32
        assert empty["b"].shape == (0,) and empty["b"].dtype == np.array([0]).dtype


def test_function_per_replica_mode() -> None:
    contexts = []

    def fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        start = ctx.input_pipeline_id * 100
        return _batches_from(start, 3, 2)

    ds = _from_function(fn, local=3, replication_mode=InputReplicationMode.PER_REPLICA)
    # TF-observed with PER_REPLICA on 3 replicas: one call per replica, each iterating its own.
    assert contexts == [(3, 0, 3), (3, 1, 3), (3, 2, 3)]
    assert _steps(ds) == [[[0, 1], [100, 101], [200, 201]], [[2], [102], [202]]]
    contexts.clear()
    _from_function(fn, workers=2, index=1, local=2, replication_mode="PER_REPLICA")
    assert contexts == [(4, 2, 4), (4, 3, 4)]


def _batches_from(start: int, n: int, batch: int) -> list[np.ndarray]:
    return [np.arange(start + i, start + min(i + batch, n)) for i in range(0, n, batch)]


def test_function_any_worker_has_data_pads_a_worker_that_ran_out() -> None:
    answers = iter([True, True, True, False])
    seen = []

    def any_worker_has_data(mine: bool) -> bool:
        seen.append(mine)
        return next(answers)

    ds = _from_function(lambda ctx: _batches(6, 2), local=2,
                        any_worker_has_data=any_worker_has_data)
    steps = list(ds)
    assert seen == [True, True, False, False]
    assert _rows(steps[0]) == [[0, 1], [2, 3]]
    assert _rows(steps[1]) == [[4, 5], []]
    assert [p.shape for p in steps[2]] == [(0,), (0,)]
    assert len(steps) == 3


def test_function_any_worker_has_data_without_any_local_element() -> None:
    ds = _from_function(lambda ctx: [], local=2, any_worker_has_data=lambda mine: True)
    with pytest.raises(ValueError, match="no element at all"):
        next(iter(ds))


def test_function_must_return_an_iterable() -> None:
    with pytest.raises(TypeError, match="dataset_fn must return an iterable"):
        _from_function(lambda ctx: 3)


def test_function_padding_needs_a_batch_axis() -> None:
    ds = _from_function(lambda ctx: [(1, 2), (3, 4), (5, 6)], local=2)
    it = iter(ds)
    assert next(it) == [(1, 2), (3, 4)]
    with pytest.raises(TypeError,
                       match=r"empty batch.*step 1: the per-replica batch\[0\] \(type int\)"):
        next(it)


def test_function_unbatched_elements_are_fine_without_padding() -> None:
    assert list(_from_function(lambda ctx: [1, 2, 3, 4], local=2)) == [[1, 2], [3, 4]]


# -- properties ----------------------------------------------------------------------------------

_sizes = st.integers(min_value=0, max_value=200)
_replicas = st.integers(min_value=1, max_value=17)


@settings(max_examples=150, deadline=None)
@given(size=_sizes, replicas=_replicas)
def test_split_concatenates_back_to_the_batch(size: int, replicas: int) -> None:
    x = np.arange(size * 2).reshape(size, 2)
    pieces = split_batch({"x": x, "y": (x[:, 0],)}, replicas)
    assert len(pieces) == replicas
    assert np.array_equal(np.concatenate([p["x"] for p in pieces]), x)
    assert np.array_equal(np.concatenate([p["y"][0] for p in pieces]), x[:, 0])


@settings(max_examples=150, deadline=None)
@given(size=_sizes, replicas=_replicas)
def test_split_sizes_follow_tf_rule(size: int, replicas: int) -> None:
    sizes = [stop - start for start, stop in replica_slices(size, replicas)]
    per = -(-size // replicas)
    assert sum(sizes) == size
    # ceil(size / replicas) rows each while they last, then the remainder, then empty pieces.
    full, rest = divmod(size, per) if per else (0, 0)
    expected = [per] * full + ([rest] if rest else [])
    assert sizes == expected + [0] * (replicas - len(expected))
    assert max(sizes) - min(sizes) <= per


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=60), batch=st.integers(min_value=1, max_value=16),
       workers=st.integers(min_value=1, max_value=4), local=st.integers(min_value=1, max_value=3))
def test_multi_worker_pieces_rebuild_every_global_batch(n, batch, workers, local) -> None:
    batches = _batches(n, batch)
    per_worker = _worker_steps(batches, workers, local)
    assert all(len(steps) == len(batches) for steps in per_worker)
    for step, global_batch in enumerate(batches):
        rows = [r for w in range(workers) for piece in per_worker[w][step] for r in piece]
        assert rows == global_batch.tolist()
