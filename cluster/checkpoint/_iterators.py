"""Distributed-dataset iterators as trackables: saved by position, restored by seeking.

An iterator of ``strategy.experimental_distribute_dataset(dataset)`` over a dataset that is
re-iterable in a deterministic order (a list, or an object whose ``__iter__`` yields the same
batches each time) is saved as one int64 tensor ``<path>/position``: the steps it has taken in
the current epoch. Restoring iterates the dataset again from its start and skips that many
global batches (without splitting them), so a resumed epoch continues where it stopped, with
exactly the batches the uninterrupted run would have seen.

Under MultiWorkerMirroredStrategy every worker iterates the whole dataset in lockstep (see
:mod:`cluster.data`), so every task's position is the same; the chief's is saved and every task
restores it. Iterators of one-shot inputs (generators) and of
``distribute_datasets_from_function`` cannot seek: tracking one raises ``TypeError`` when the
``Checkpoint`` is made.
"""

from __future__ import annotations

import numpy as np

from cluster.data import DistributedIterator

__all__ = ["check_iterator", "iterator_entry_parts"]

POSITION = "position"


def check_iterator(path: str, iterator: DistributedIterator) -> None:
    """``TypeError`` unless ``iterator`` can be restored by position."""
    if not iterator.seekable:
        raise TypeError(
            f"Checkpoint: {path} is a distributed iterator that cannot be restored by position: "
            "its input is a one-shot iterator or comes from distribute_datasets_from_function; "
            "distribute a re-iterable dataset (e.g. a list of batches) with "
            "experimental_distribute_dataset")


def iterator_entry_parts(path: str, iterator: DistributedIterator):
    """``(name, dtype, shape, read, apply)`` of the iterator's one tensor."""

    def read() -> np.ndarray:
        return np.array(iterator.position, np.int64)

    def apply(array: np.ndarray) -> None:
        iterator.seek(int(array))

    return f"{path}/{POSITION}", np.dtype(np.int64), (), read, apply
