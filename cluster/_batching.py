"""Splitting one global batch into per-replica pieces: TF's rule, as pure functions.

A batch is a nest (:mod:`cluster._nest`: tuples, namedtuples, lists and mappings, nested freely)
whose leaves are arrays with a leading batch axis: NumPy, CuPy, or anything with ``.shape`` and
basic slicing. Pieces are basic slices of the leaves (views, not copies), in the nest's structure.
:mod:`cluster.data` builds the distributed datasets on these.
"""

from __future__ import annotations

from typing import Any

from cluster import _nest

__all__ = ["empty_like", "replica_slices", "split_batch", "split_batch_at"]


def _batch_dim(path: str, leaf: Any) -> int:
    """The leading (batch) dimension of one leaf; ``TypeError`` when it has none."""
    shape = getattr(leaf, "shape", None)
    if shape is None or not hasattr(leaf, "__getitem__") or isinstance(leaf, (str, bytes)):
        kind = "None" if leaf is None else f"type {type(leaf).__name__}"
        raise TypeError(
            f"{path} ({kind}) is not batchable: every leaf of a batch must be an array "
            "with a leading batch axis (NumPy, CuPy, or anything with .shape and slicing). "
            "Convert it with np.asarray(...) and give it a batch axis, or move it out of the "
            "dataset."
        )
    if len(shape) == 0:
        raise TypeError(
            f"{path} is a 0-d array (shape ()), which has no batch axis to split: give every "
            "array of a batch a leading batch axis (e.g. value[None] or batch several elements "
            "with np.stack)."
        )
    return int(shape[0])


def _leaves_and_batch_size(batch: Any, where: str) -> tuple[list[Any], int]:
    """Flatten ``batch`` and check every leaf has the same leading dimension."""
    flat = _nest.flatten_with_paths(batch, where)
    if not flat:
        raise ValueError(
            f"{where} holds no arrays (an empty tuple, list or dict), so it has no batch size "
            "to split; every batch needs at least one array with a leading batch axis."
        )
    first_path, first = flat[0]
    size = _batch_dim(first_path, first)
    for path, leaf in flat[1:]:
        dim = _batch_dim(path, leaf)
        if dim != size:
            raise ValueError(
                f"the arrays of one batch disagree on the batch size (axis 0): {first_path} has "
                f"{size} rows but {path} has {dim}; every array of a batch must have the same "
                "leading dimension."
            )
    return [leaf for _, leaf in flat], size


def replica_slices(batch_size: int, num_replicas: int) -> list[tuple[int, int]]:
    """``[start, stop)`` rows of each replica's piece of a batch of ``batch_size`` rows.

    TF's rule (legacy rebatching, what ``experimental_distribute_dataset`` does for input that it
    shards by data): every replica gets ``ceil(batch_size / num_replicas)`` rows, in replica
    order, until the rows run out; the rest get what is left, then nothing. E.g. 5 rows over 4
    replicas are ``2, 2, 1, 0``; 6 over 4 are ``2, 2, 2, 0``; 1 over 4 is ``1, 0, 0, 0``.
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    per = -(-batch_size // num_replicas)
    return [
        (min(i * per, batch_size), min((i + 1) * per, batch_size)) for i in range(num_replicas)
    ]


def split_batch_at(batch: Any, num_replicas: int, where: str) -> list[Any]:
    """:func:`split_batch`, with ``where`` (e.g. ``"dataset element 3"``) naming the batch in
    errors."""
    leaves, size = _leaves_and_batch_size(batch, where)
    return [
        _nest.pack_sequence_as(batch, [leaf[start:stop] for leaf in leaves])
        for start, stop in replica_slices(size, num_replicas)
    ]


def split_batch(batch: Any, num_replicas: int) -> list[Any]:
    """Split one global batch into ``num_replicas`` per-replica batches of the same structure.

    Rows are dealt by ``replica_slices`` (TF's rule, partial and tiny batches included: trailing
    replicas may get empty pieces with batch axis 0). Pieces are basic slices of the leaves, so
    NumPy and CuPy pieces are views, not copies. Raises ``TypeError`` for a leaf that is not
    batchable (Python scalar, string, ``None``, 0-d array) and ``ValueError`` when the leaves
    disagree on the batch size or the nest holds no arrays.

    >>> import numpy as np
    >>> [p.tolist() for p in split_batch(np.arange(5), 4)]
    [[0, 1], [2, 3], [4], []]
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    return split_batch_at(batch, num_replicas, "batch")


def empty_like(element: Any, where: str) -> Any:
    """``element`` with every leaf cut to 0 rows: the batch a replica gets when input ran out.
    ``TypeError`` when a leaf has no batch axis."""
    flat = _nest.flatten_with_paths(element, where)
    try:
        for path, leaf in flat:
            _batch_dim(path, leaf)
    except TypeError as e:
        raise TypeError(
            f"a replica ran out of input and gets an empty batch built from a sibling's "
            f"element, which needs a batch axis on every leaf: {e}"
        ) from e
    return _nest.pack_sequence_as(element, [leaf[0:0] for _, leaf in flat])
