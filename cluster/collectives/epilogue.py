"""A fused epilogue for all-reduces: apply an elementwise update where a reduction completes.

``optimizer.apply_gradients`` is an all-reduce of the gradients followed by an update of every
parameter, on every rank, from identical reduced gradients. Done one after the other, the
update reads back the whole reduced gradient from memory on every rank. Fused, the rank that
completes the reduction of a segment (the shared-memory reduce-scatter's owner, or the ring's
last combining rank) applies the update to that segment of the parameter while the reduced
values are still in cache, and the all-gather then carries the updated parameter instead of the
reduced gradient. Each element is updated once in the group, by one rank, and copied to the
others: every rank ends with the bytes the unfused path would have given it, and the update's
cost is divided by the number of ranks.

The contract that makes this exact:

- ``update(target, reduced)`` is elementwise: the new ``target[i]`` depends only on
  ``target[i]``, ``reduced[i]`` and constants, so applying it to parts equals applying it to
  the whole. It writes ``target`` in place, may use ``reduced`` as scratch (it is always the
  collective's own buffer, never the caller's value), and must not keep either array.
- Every rank's target holds the same bytes on entry (mirrored variables do).
- A collective that fails part way leaves each element of the target either updated or not.

:class:`AddScaled` (SGD's rule) is the update the collectives can also run as one compiled
pass with the reduction (:mod:`cluster.collectives.kernels`); any other callable runs as given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cluster._family import is_cupy, stage
from cluster.collectives._jobs import on_gpu
from cluster.collectives.ops import check_reducible

__all__ = ["AddScaled", "Update", "apply_whole", "check_apply", "check_target"]

Update = Callable[[np.ndarray, np.ndarray], None]
"""``update(target_part, reduced_part)``: flat, equal-length NumPy views; updates the first,
may overwrite the second (scratch)."""


@dataclass(frozen=True)
class AddScaled:
    """The update ``target += reduced * scale`` (SGD's ``w -= lr * g`` is ``scale = -lr``).

    An :data:`Update` like any other, and one the collectives know: where the reduction is a
    SUM of float32 or float64 values, the rank that completes it sums, scales and adds in one
    pass over memory (:mod:`cluster.collectives.kernels`), bitwise equal to this call.
    ``scale`` is rounded to the target's dtype first, as NumPy does for a Python float.
    """

    scale: float

    def __call__(self, target: np.ndarray, reduced: np.ndarray) -> None:
        np.multiply(reduced, target.dtype.type(self.scale), out=reduced)
        np.add(target, reduced, out=target)


def apply_whole(update: Update, target: np.ndarray, reduced: np.ndarray) -> None:
    """The unfused epilogue: ``update`` over the whole flat ``target`` with ``reduced``."""
    update(target.reshape(-1), reduced.reshape(-1))


def check_apply(values: Any, targets: Any,
                update: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The arguments of ``all_reduce_apply`` checked: ``(values as NumPy, flat targets)``.

    Raises ``TypeError``/``ValueError`` naming the argument (and index) that is wrong.
    """
    if isinstance(values, str | bytes) or not isinstance(values, Sequence) \
            or not isinstance(targets, Sequence) or len(values) != len(targets):
        raise TypeError("all_reduce_apply takes two lists of equal length: values and their "
                        "targets")
    if not callable(update):
        raise TypeError(f"all_reduce_apply: update must be callable, got {update!r:.80}")
    arrays = []
    for value in values:
        if is_cupy(value) or on_gpu(value):
            raise TypeError("all_reduce_apply takes host (NumPy) values; reduce GPU values "
                            "with all_reduce_many")
        array = stage(value, "all_reduce_apply").array
        check_reducible(array.dtype, "all_reduce_apply")
        arrays.append(array)
    pairs = enumerate(zip(targets, arrays, strict=True))
    return arrays, [check_target(t, a, i) for i, (t, a) in pairs]


def check_target(target: object, value: np.ndarray, index: int) -> np.ndarray:
    """``target`` as the flat array an update writes, checked against its ``value``.

    Raises ``TypeError``/``ValueError`` naming ``index`` when it is not a writeable,
    C-contiguous NumPy array of the value's shape and dtype, or when it shares memory with it.
    """
    if not isinstance(target, np.ndarray):
        raise TypeError(f"all_reduce_apply: target {index} must be a NumPy array, got "
                        f"{type(target).__name__}")
    if target.shape != value.shape or target.dtype != value.dtype:
        raise ValueError(
            f"all_reduce_apply: target {index} is {target.dtype}{list(target.shape)} but its "
            f"value is {value.dtype}{list(value.shape)}; they must match"
        )
    if not (target.flags.c_contiguous and target.flags.writeable):
        raise ValueError(f"all_reduce_apply: target {index} must be writeable and C-contiguous")
    if np.shares_memory(target, value):
        raise ValueError(f"all_reduce_apply: target {index} overlaps its value; pass the "
                         "gradient and the parameter as separate arrays")
    return target.reshape(-1)
