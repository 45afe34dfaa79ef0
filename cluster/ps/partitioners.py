"""Variable partitioners and placement over parameter servers, as TensorFlow does them.

The three partitioners mirror ``tf.distribute.experimental.partitioners.*`` (same arguments,
defaults, validation and arithmetic; ``__call__(shape, dtype, axis=0)`` returns the number of
partitions per axis). :class:`Placer` is ``ParameterServerStrategy``'s placement (:func:`place`
plans a list with one): variables (and each shard of a partitioned one, named
``"name/part_i"``) go round-robin over the ``ps`` tasks in creation order, so the shards of one
variable land on consecutive tasks; each piece is a :class:`Shard`. Shards split axis 0 with
TF's "div" strategy: the first ``rows % n`` shards get one more row (:func:`shard_sizes`,
:func:`split`, :func:`concat`). Pure: no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Partitioner",
    "Placement",
    "Placer",
    "Shard",
    "concat",
    "place",
    "shard_sizes",
    "split",
]


def _element_size(dtype: Any, bytes_per_string: int) -> int:
    """Bytes per element; strings (TF's ``tf.string``: ``str``, ``bytes``, ``object``) count
    ``bytes_per_string``."""
    if dtype in (str, bytes, "string"):
        return bytes_per_string
    dt = np.dtype(dtype)
    if dt.kind in ("U", "S", "O"):
        return bytes_per_string
    return dt.itemsize


def _check_axis(shape: Sequence[int], axis: int) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if not 0 <= axis < len(shape):
        # TF raises ValueError (MinSizePartitioner) or IndexError (the others); we always say why.
        raise ValueError(f"cannot partition a variable of shape {shape} along axis {axis}")
    return shape


class Partitioner:
    """Base class: ``partitioner(shape, dtype, axis=0) -> [partitions per axis]``."""

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """``num_shards`` shards along ``axis`` (fewer when the axis is shorter), as in TF.

    >>> FixedShardsPartitioner(num_shards=2)((10, 3), "float32")
    [2, 1]
    """

    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards  # TF does not validate it either

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        shape = _check_axis(shape, axis)
        result = [1] * len(shape)
        result[axis] = min(self._num_shards, shape[axis])
        return result


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least ``min_shard_bytes``, at most ``max_shards``
    (TF's ``min_max_variable_partitioner``): ``max(1, min(shape[axis], max_shards,
    ceil(total_bytes / min_shard_bytes)))``.

    >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)((10, 3), "float32")
    [2, 1]
    """

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1,
                 bytes_per_string: int = 16) -> None:
        if min_shard_bytes < 1:
            raise ValueError(f"Argument `min_shard_bytes` must be positive. Received: "
                             f"{min_shard_bytes}")
        if max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received: {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"Argument `bytes_per_string` must be positive. Received: "
                             f"{bytes_per_string}")
        self._min_shard_bytes = min_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        shape = _check_axis(shape, axis)
        total_bytes = math.prod(shape) * _element_size(dtype, self._bytes_per_string)
        partitions = total_bytes / self._min_shard_bytes
        result = [1] * len(shape)
        result[axis] = max(1, min(shape[axis], self._max_shards, int(math.ceil(partitions))))
        return result


class MaxSizePartitioner(Partitioner):
    """As few shards as keep each at most ``max_shard_bytes`` (at least one slice per shard),
    capped by ``max_shards`` (TF's ``variable_axis_size_partitioner``).

    >>> MaxSizePartitioner(max_shard_bytes=40)((10, 3), "float32")
    [4, 1]
    """

    def __init__(self, max_shard_bytes: int, max_shards: int | None = None,
                 bytes_per_string: int = 16) -> None:
        if max_shard_bytes < 1:
            raise ValueError(f"Argument `max_shard_bytes` must be positive. Received "
                             f"{max_shard_bytes}")
        if max_shards and max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"Argument `bytes_per_string` must be positive. Received: "
                             f"{bytes_per_string}")
        self._max_shard_bytes = max_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        shape = _check_axis(shape, axis)
        element_size = _element_size(dtype, self._bytes_per_string)
        bytes_per_slice = 1.0 * (math.prod(shape) / shape[axis]) * element_size
        slices_per_shard = max(1, math.floor(self._max_shard_bytes / bytes_per_slice))
        axis_shards = int(math.ceil(1.0 * shape[axis] / slices_per_shard))
        if self._max_shards:
            axis_shards = min(self._max_shards, axis_shards)
        result = [1] * len(shape)
        result[axis] = axis_shards
        return result


# ---- sharding arithmetic ----------------------------------------------------------------------

def shard_sizes(rows: int, num_shards: int) -> list[int]:
    """Rows of each shard when ``rows`` are split in ``num_shards`` (TF's "div" strategy):
    ``shard_sizes(10, 4) == [3, 3, 2, 2]``."""
    if num_shards < 1 or num_shards > max(rows, 1):
        raise ValueError(f"cannot split {rows} rows into {num_shards} shards")
    base, extra = divmod(rows, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


def split(array: np.ndarray, num_shards: int) -> list[np.ndarray]:
    """``array`` cut along axis 0 into ``num_shards`` views (first ``rows % n`` one row longer)."""
    array = np.asarray(array)
    if array.ndim == 0:
        raise ValueError("cannot split a scalar into shards")
    out, start = [], 0
    for rows in shard_sizes(array.shape[0], num_shards):
        out.append(array[start:start + rows])
        start += rows
    return out


def concat(shards: Sequence[np.ndarray]) -> np.ndarray:
    """The inverse of :func:`split`: shards joined along axis 0 (a new array)."""
    if not shards:
        raise ValueError("concat: no shards")
    return np.concatenate([np.asarray(s) for s in shards], axis=0)


# ---- placement --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """One stored piece of a variable: ``name`` on task ``ps:<ps>``, rows ``offset .. offset +
    shape[0]`` of the whole (the whole variable when unpartitioned).

    ``name`` is the stored name (``variable`` itself, or ``"variable/part_<index>"``); ``index``
    is the piece's place among the variable's ``num_shards``.
    """

    name: str
    ps: int
    offset: int
    shape: tuple[int, ...]
    variable: str = ""
    index: int = 0
    num_shards: int = 1

    def alone(self) -> Shard:
        """This piece as a whole variable of its own (a view of one shard)."""
        return Shard(self.name, self.ps, 0, self.shape, self.name)


@dataclass(frozen=True)
class Placement:
    """The plan :func:`place` returns: every shard, in creation order."""

    shards: tuple[Shard, ...]
    num_ps: int

    def shards_of(self, variable: str) -> list[Shard]:
        """The shards of ``variable`` in order (one entry when it is not partitioned)."""
        found = [s for s in self.shards if s.variable == variable]
        if not found:
            raise KeyError(f"no variable {variable!r} in this placement")
        return found

    def on_ps(self, ps: int) -> list[Shard]:
        """The shards placed on task ``ps:<ps>``, in creation order."""
        return [s for s in self.shards if s.ps == ps]


class Placer:
    """TF's round-robin over ``num_ps`` tasks: every variable or shard placed advances one
    counter (TF's ``_variable_count``), so the shards of one variable land on consecutive
    tasks and placement depends only on creation order. Not thread-safe: callers serialize.
    """

    def __init__(self, num_ps: int, partitioner: Partitioner | None = None) -> None:
        self.num_ps = num_ps
        self._partitioner = partitioner
        self._count = 0

    def place(self, name: str, shape: Sequence[int], dtype: Any = np.float32) -> tuple[Shard, ...]:
        """The shards of the next variable ``name``; rank-0 variables are never partitioned.
        Raises ``ValueError`` when the partitioner returns anything but ``[n >= 1, 1, 1, ...]``
        (TF's rule), or when there is no ps task to place on."""
        if self.num_ps < 1:
            raise ValueError(f"place: need at least one ps task, got num_ps={self.num_ps}")
        shape = tuple(int(d) for d in shape)
        num = 1
        if shape and self._partitioner is not None:
            parts = list(self._partitioner(shape, dtype))
            if not parts or parts[0] == 0 or any(p != 1 for p in parts[1:]):
                raise ValueError("variable_partitioner must return a list/tuple whose elements "
                                 f"are 1 besides the first element (non-zero), got: {parts!r}")
            num = min(parts[0], shape[0])
        if num <= 1:
            shards = (Shard(name, self._next(), 0, shape, name),)
        else:
            sizes = shard_sizes(shape[0], num)
            offsets = itertools.accumulate(sizes, initial=0)
            shards = tuple(
                Shard(f"{name}/part_{i}", self._next(), offset, (rows, *shape[1:]), name, i, num)
                for i, (offset, rows) in enumerate(zip(offsets, sizes, strict=False)))
        return shards

    def _next(self) -> int:
        ps, self._count = self._count % self.num_ps, self._count + 1
        return ps


def place(variables: Iterable[tuple], num_ps: int,
          partitioner: Partitioner | None = None) -> Placement:
    """Plan where variables go, as ``ParameterServerStrategy`` does (one :class:`Placer`).

    ``variables``: ``(name, shape)`` or ``(name, shape, dtype)`` in creation order (dtype
    defaults to float32; it only matters to size-based partitioners). Raises ``ValueError``
    when ``num_ps < 1``, names repeat, or the partitioner's answer is malformed
    (:meth:`Placer.place`).
    """
    if num_ps < 1:
        raise ValueError(f"place: need at least one ps task, got num_ps={num_ps}")
    placer = Placer(num_ps, partitioner)
    shards: list[Shard] = []
    seen: set[str] = set()
    for entry in variables:
        name, shape, dtype = (*entry, np.float32) if len(entry) == 2 else entry
        if name in seen:
            raise ValueError(f"place: variable {name!r} appears twice")
        seen.add(name)
        shards.extend(placer.place(name, shape, dtype))
    return Placement(tuple(shards), num_ps)
