"""CommunicationOptions validation, ReduceOp, the in-place reducers and the dtype check."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.collectives import SUPPORTED_DTYPES, CommunicationImplementation, CommunicationOptions
from cluster.collectives.ops import ReduceOp, check_reducible, finalize, reduce_into
from cluster.collectives.options import (
    ALGORITHM_ENV,
    LANES_ENV,
    Algorithm,
    CollectiveSettings,
    algorithm_from_env,
    lanes_from_env,
)
from tests._requires import require

pytestmark = pytest.mark.path_independent

# -- CommunicationOptions ------------------------------------------------------------------------


def test_defaults_mirror_tensorflow() -> None:
    o = CommunicationOptions()
    assert (o.bytes_per_pack, o.timeout_seconds, o.implementation) == (
        0,
        None,
        CommunicationImplementation.AUTO,
    )
    assert [m.value for m in CommunicationImplementation] == ["AUTO", "RING", "NCCL"]


def test_implementation_accepts_names_in_any_case_like_tensorflow() -> None:
    assert CommunicationOptions(implementation="ring").implementation is (
        CommunicationImplementation.RING
    )


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        CommunicationOptions().bytes_per_pack = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "fix"),
    [
        ({"bytes_per_pack": -1}, ValueError, "must be >= 0, got -1; use 0"),
        ({"bytes_per_pack": 1.5}, TypeError, "bytes_per_pack must be an int"),
        ({"bytes_per_pack": True}, TypeError, "bytes_per_pack must be an int"),
        ({"timeout_seconds": -2.0}, ValueError, r"must be > 0 \(or None / 0 for no timeout\)"),
        ({"timeout_seconds": float("nan")}, ValueError, "timeout_seconds must be > 0"),
        ({"timeout_seconds": "10"}, TypeError, "number of seconds or None"),
        ({"implementation": "tree"}, ValueError, "use one of CommunicationImplementation.AUTO"),
        ({"implementation": 1}, ValueError, "must be a CommunicationImplementation"),
    ],
)
def test_bad_options_say_how_to_fix(kwargs: dict, error: type, fix: str) -> None:
    with pytest.raises(error, match=fix):
        CommunicationOptions(**kwargs)


@pytest.mark.parametrize(("timeout", "deadline"), [(None, None), (0, None), (2.5, 2.5)])
def test_zero_timeout_disables_the_deadline_as_in_tensorflow(timeout, deadline) -> None:
    assert CommunicationOptions(timeout_seconds=timeout).deadline_seconds == deadline


@pytest.mark.parametrize(
    ("value", "algorithm"),
    [
        (None, Algorithm.AUTO),
        ("", Algorithm.AUTO),
        ("RING", Algorithm.RING),
        (" doubling ", Algorithm.DOUBLING),
    ],
)
def test_algorithm_from_env(value: str | None, algorithm: Algorithm) -> None:
    env = {} if value is None else {ALGORITHM_ENV: value}
    assert algorithm_from_env(env) is algorithm


# -- ReduceOp and reducers -----------------------------------------------------------------------


def test_reduce_op_values_are_tensorflows_strings() -> None:
    assert [op.value for op in ReduceOp] == ["SUM", "MEAN", "MAX", "MIN"]
    assert ReduceOp.parse("mean") is ReduceOp.MEAN and ReduceOp.parse(ReduceOp.MAX) is ReduceOp.MAX
    with pytest.raises(TypeError):
        ReduceOp.parse(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (ReduceOp.SUM, [5, -1, 6]),
        (ReduceOp.MEAN, [5, -1, 6]),
        (ReduceOp.MAX, [4, 2, 3]),
        (ReduceOp.MIN, [1, -3, 3]),
    ],
)
def test_reduce_into_writes_the_first_argument(op: ReduceOp, expected: list[int]) -> None:
    acc = np.array([1, 2, 3], np.int64)
    other = np.frombuffer(np.array([4, -3, 3], np.int64).tobytes(), np.int64)  # read-only
    reduce_into(op, acc, other)
    assert acc.tolist() == expected


def test_reduce_into_other_first_fixes_the_operand_order() -> None:
    # NumPy's maximum of two equal zeros returns its second operand: the order shows in the sign.
    assert np.signbit(np.maximum(0.0, -0.0)) != np.signbit(np.maximum(-0.0, 0.0))
    for other_first in (False, True):
        acc, other = np.array([0.0]), np.array([-0.0])
        reduce_into(ReduceOp.MAX, acc, other, other_first=other_first)
        want = np.maximum(-0.0, 0.0) if other_first else np.maximum(0.0, -0.0)
        assert np.signbit(acc[0]) == np.signbit(want)


@pytest.mark.parametrize(
    ("dtype", "total", "count", "expected"),
    [
        ("int32", [-5, 5, 7, -7, 0, 6], 2, [-2, 2, 3, -3, 0, 3]),  # truncation, like TF's Div
        ("int64", [-1, 1, -3], 3, [0, 0, -1]),
        (
            "int64",
            [np.iinfo(np.int64).min, np.iinfo(np.int64).max],
            2,
            [np.iinfo(np.int64).min // 2, np.iinfo(np.int64).max // 2],
        ),  # no overflow
        ("float32", [3.0, -1.5], 3, [1.0, -0.5]),
    ],
)
def test_finalize_mean(dtype: str, total: list, count: int, expected: list) -> None:
    acc = np.array(total, dtype)
    finalize(ReduceOp.MEAN, acc, count)
    assert acc.dtype == np.dtype(dtype) and acc.tolist() == expected


def test_finalize_leaves_other_ops_alone() -> None:
    acc = np.array([7, 8])
    for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN):
        finalize(op, acc, 4)
    assert acc.tolist() == [7, 8]


def test_supported_dtypes() -> None:
    names = {str(d) for d in SUPPORTED_DTYPES}
    assert {"float16", "float32", "float64", "int32", "int64"} <= names
    for d in SUPPORTED_DTYPES:
        check_reducible(d)


@pytest.mark.parametrize("dtype", ["int8", "uint32", "bool", "complex64", "object"])
def test_unsupported_dtype_is_a_type_error_naming_it_and_the_list(dtype: str) -> None:
    with pytest.raises(
        TypeError,
        match=rf"does not support dtype {dtype}; supported dtypes: "
        r"float16, float32, float64, int32, int64",
    ):
        check_reducible(np.dtype(dtype), "all_reduce")


def test_bfloat16_when_ml_dtypes_is_present() -> None:
    ml_dtypes = require("ml_dtypes")
    check_reducible(np.dtype(ml_dtypes.bfloat16))
    acc = np.array([1.5, 2.0], ml_dtypes.bfloat16)
    reduce_into(ReduceOp.SUM, acc, np.array([0.5, 1.0], ml_dtypes.bfloat16))
    finalize(ReduceOp.MEAN, acc, 2)
    assert acc.astype(np.float32).tolist() == [1.0, 1.5]


@pytest.mark.parametrize(("value", "lanes"), [(None, None), ("", None), ("auto", None),
                                              (" AUTO ", None), ("1", 1), ("2", 2)])
def test_lanes_from_env(value: str | None, lanes: int | None) -> None:
    env = {} if value is None else {LANES_ENV: value}
    assert lanes_from_env(env) == lanes
    assert CollectiveSettings.from_env(env).lanes == lanes


@pytest.mark.parametrize("value", ["0", "3", "two", "-1", "1.5"])
def test_bad_lanes_name_the_variable_and_the_choices(value: str) -> None:
    with pytest.raises(ValueError, match=r"CLUSTER_RING_LANES=.*auto, 1, 2"):
        lanes_from_env({LANES_ENV: value})


@pytest.mark.parametrize("lanes", [0, 3, True, 1.0, "2"])
def test_collective_settings_refuse_other_lanes(lanes: object) -> None:
    with pytest.raises(ValueError, match="lanes must be None"):
        CollectiveSettings(lanes=lanes)  # type: ignore[arg-type]
