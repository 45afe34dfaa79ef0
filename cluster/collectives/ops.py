"""Reduction operations: the ``ReduceOp`` enum and in-place NumPy reducers.

Reducers write into their first argument (``np.add(acc, x, out=acc)``): the collectives reduce
straight from a received buffer into a working copy, with no temporary arrays.

``MEAN`` is ``SUM`` followed by a division by the number of ranks, in the input's dtype. For
integer dtypes the division truncates toward zero, as TensorFlow's collective all-reduce
(``MultiWorkerMirroredStrategy``, final op ``Div``) does: the mean of ``[-5, 0]`` over 2 ranks
is ``-2``, the dtype stays ``int32``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np

from cluster._family import xp_of

__all__ = [
    "SUPPORTED_DTYPES",
    "ReduceOp",
    "check_int",
    "check_plain_dtype",
    "check_reducible",
    "combine_into",
    "finalize",
    "reduce_into",
]

try:  # bfloat16 is supported where ml_dtypes happens to be installed; never a dependency.
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None


class ReduceOp(enum.Enum):
    """How values are combined across ranks (``tf.distribute.ReduceOp`` plus ``MAX``/``MIN``)."""

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    MIN = "MIN"

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        """``op`` as a ``ReduceOp``; strings are accepted in any case, as tf.distribute does.

        Raises ``ValueError`` for an unknown name, ``TypeError`` for anything else.
        """
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            try:
                return cls(op.upper())
            except ValueError:
                raise ValueError(
                    f"unknown reduce op {op!r}; use one of {', '.join(m.value for m in cls)}"
                ) from None
        raise TypeError(f"reduce op must be a ReduceOp or its name, got {op!r}")


def _supported() -> tuple[np.dtype, ...]:
    names = ["float16", "float32", "float64", "int32", "int64"]
    dtypes = [np.dtype(n) for n in names]
    if _ml_dtypes is not None:
        dtypes.append(np.dtype(_ml_dtypes.bfloat16))
    return tuple(dtypes)


SUPPORTED_DTYPES: tuple[np.dtype, ...] = _supported()
"""The dtypes the reducing collectives accept (bfloat16 only when ``ml_dtypes`` is importable)."""


def check_reducible(dtype: np.dtype, what: str = "reduction") -> None:
    """Raise ``TypeError`` naming ``dtype`` and the supported list unless it can be reduced."""
    if np.dtype(dtype) not in SUPPORTED_DTYPES:
        supported = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        hint = "" if _ml_dtypes is not None else " (bfloat16 needs the ml_dtypes package)"
        raise TypeError(
            f"{what} does not support dtype {np.dtype(dtype)}; supported dtypes: "
            f"{supported}{hint}. Cast the value first, e.g. value.astype(np.float32)"
        )


_BINARY: dict[ReduceOp, Callable[..., np.ndarray]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.MEAN: np.add,
    ReduceOp.MAX: np.maximum,
    ReduceOp.MIN: np.minimum,
}


def reduce_into(
    op: ReduceOp, acc: np.ndarray, other: np.ndarray, *, other_first: bool = False
) -> None:
    """``acc = op(acc, other)`` in place; ``other`` may be a read-only view of received bytes.

    ``other_first=True`` computes ``op(other, acc)``. Algorithms in which two ranks combine the
    same pair of values use it to evaluate every pair in one canonical order (lower rank's
    value first): ``maximum(-0.0, 0.0)`` and ``maximum(0.0, -0.0)`` differ in sign, and NaN
    payloads depend on operand order, so only a canonical order gives bitwise-identical results.
    """
    ufunc = _BINARY[op]
    if other_first:
        ufunc(other, acc, out=acc)
    else:
        ufunc(acc, other, out=acc)


def combine_into(op: ReduceOp, out: np.ndarray, mine: np.ndarray, other: np.ndarray) -> None:
    """``out = op(mine, other)``: :func:`reduce_into` with the result written elsewhere."""
    _BINARY[op](mine, other, out=out)


def finalize(op: ReduceOp, acc: Any, count: int | float) -> None:
    """Apply the op's final step in place: ``MEAN`` divides by ``count``; the others do nothing.

    The one place MEAN is finished, for every array family: NumPy here, CuPy on the GPU
    (``acc`` on the current stream; NCCL's MEAN, and strategies' for floating values).
    Integers are divided with truncation toward zero (TensorFlow's ``Div``), computed exactly in
    the integer dtype: for NumPy, ``acc - fmod(acc, count)`` is a multiple of ``count`` and no
    farther from zero than ``acc``, so neither step can overflow; for CuPy (whose integer
    ``fmod`` goes through ``double``, inexact beyond 2**53), the floor quotient is one too small
    exactly when ``acc`` is negative and not a multiple of ``count``, and ``quotient * count``
    lies between ``acc`` and zero.
    """
    if op is not ReduceOp.MEAN or count == 1:
        return
    xp = xp_of(acc)
    if np.issubdtype(acc.dtype, np.integer):
        n = acc.dtype.type(count)
        if xp is np:
            remainder = np.fmod(acc, n)
            np.subtract(acc, remainder, out=acc)
            np.floor_divide(acc, n, out=acc)
            return
        quotient = xp.floor_divide(acc, n)
        low = xp.logical_and(xp.less(acc, 0), xp.not_equal(xp.multiply(quotient, n), acc))
        xp.add(quotient, low.astype(acc.dtype), out=acc)
    else:
        xp.true_divide(acc, acc.dtype.type(count), out=acc)


def check_int(name: str, value: Any, *, minimum: int) -> None:
    """``TypeError`` unless ``value`` is an int (NumPy's too, not a bool); ``ValueError`` naming
    ``name`` when it is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_plain_dtype(dtype: np.dtype, what: str) -> None:
    """``TypeError`` for a dtype holding Python objects (nothing a collective can send)."""
    if dtype.hasobject:
        raise TypeError(f"{what} cannot send dtype {dtype} (Python objects); use a numeric dtype")
