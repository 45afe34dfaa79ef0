"""A global batch split among the tasks: which rows each task computes on.

Every task receives the same global batch (the same arrays, the same ``PyDataset`` or
``DataLoader``, shuffled identically); task ``rank`` of ``world`` keeps the contiguous rows
``share(rows, rank, world)``. Shares differ by at most one row, so an uneven last batch is split
as evenly as it can be; a task may get no rows when the batch has fewer rows than tasks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["batch_rows", "share", "take_rows"]


def share(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of task ``rank``'s rows in a batch of ``rows`` rows: 10 rows on 3
    tasks are ``(0, 3), (3, 6), (6, 10)``; 2 rows are ``(0, 0), (0, 1), (1, 2)`` (tested in
    ``tests/keras/test_split.py``, which needs Keras)."""
    if not 0 <= rank < world:
        raise ValueError(f"share: rank {rank} is outside a world of {world} tasks")
    return rank * rows // world, (rank + 1) * rows // world


def _leaves(structure: Any) -> list[Any]:
    if isinstance(structure, dict):
        return [leaf for value in structure.values() for leaf in _leaves(value)]
    if isinstance(structure, (list, tuple)):
        return [leaf for value in structure for leaf in _leaves(value)]
    return [] if structure is None else [structure]


def batch_rows(data: Any) -> int:
    """The number of rows of a batch (its first array's first dimension).

    Raises ``ValueError`` when the leaves disagree: a batch's inputs, targets and sample weights
    have one row per sample."""
    sizes = {int(leaf.shape[0]) for leaf in _leaves(data) if getattr(leaf, "shape", ())}
    if len(sizes) != 1:
        raise ValueError(f"model.fit under a strategy: a batch's arrays have {sorted(sizes)} rows; "
                         "inputs, targets and sample weights need one row per sample")
    return sizes.pop()


def take_rows(data: Any, start: int, stop: int) -> Any:
    """``data`` (a nest of tuples, lists and dicts of arrays) with every array cut to rows
    ``[start, stop)``; ``None`` and scalars pass through."""
    if isinstance(data, dict):
        return {key: take_rows(value, start, stop) for key, value in data.items()}
    if isinstance(data, tuple):
        return tuple(take_rows(value, start, stop) for value in data)
    if isinstance(data, list):
        return [take_rows(value, start, stop) for value in data]
    if data is None or not getattr(data, "shape", ()):
        return data
    return data[start:stop]
