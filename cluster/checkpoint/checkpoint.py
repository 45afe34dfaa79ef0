"""``Checkpoint``: save and restore a nest of trackables (``tf.train.Checkpoint``'s shape)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from cluster._family import to_host
from cluster.checkpoint import _format, _group, _trackables
from cluster.checkpoint._directory import record_checkpoint
from cluster.errors import CheckpointCorruptError

__all__ = ["Checkpoint"]


class Checkpoint:
    """Groups trackables under names, and saves or restores them all at once.

    >>> ckpt = Checkpoint(step=step_var, optimizer=opt, model=[w, b], metric=acc)  # doctest: +SKIP
    >>> path = ckpt.save("/ckpts/run")      # "/ckpts/run-1", then "-2", ...   # doctest: +SKIP
    >>> ckpt.restore(path)                                                    # doctest: +SKIP

    Trackables: ``cluster.Variable`` (plain or distributed), optimizers, metrics,
    distributed-dataset iterators, ``numpy.random.Generator``, ``random.Random`` and
    dicts/lists/tuples of them (see :mod:`cluster.checkpoint._trackables` for tensor names).
    ``save_counter`` counts the saves (restored by :meth:`restore`). Restoring is strict and
    all-or-nothing: every tensor is read and checked before any value changes, and a checkpoint
    that does not hold exactly the tracked objects raises ``ValueError``.
    """

    def __init__(self, **trackables: Any) -> None:
        if _trackables.SAVE_COUNTER in trackables:
            raise ValueError(f"Checkpoint: {_trackables.SAVE_COUNTER!r} is reserved")
        self._root = dict(trackables)
        self._leaves = _trackables.check_nest(self._root)
        self._strategy = _group.group_strategy(_trackables.variables_of(self._leaves))
        self.save_counter = 0

    def _tensors(self) -> dict[str, np.ndarray]:
        tensors = {e.name: to_host(e.read())
                   for e in _trackables.save_entries(self._leaves)}
        tensors[_trackables.SAVE_COUNTER] = np.array(self.save_counter, np.int64)
        return tensors

    def write(self, path: str | os.PathLike, *, step: int | None = None) -> str:
        """Write a checkpoint at exactly ``path`` (a directory; replaced if it exists),
        atomically; ``step`` is recorded in its index. Returns the absolute path.

        Does not touch ``save_counter`` nor the directory's ``checkpoint`` index. Under
        MultiWorkerMirroredStrategy every task must call it; the chief writes and every task
        returns once the write is complete (see :mod:`cluster.checkpoint._group`).
        """
        return self._commit(path, step, after=None)

    def _commit(self, path: str | os.PathLike, step: int | None,
                after: Callable[[], None] | None) -> str:
        """Write the checkpoint, then ``after()`` (the writer's index update), as one group step."""
        tensors = self._tensors()  # on every task: a metric's aggregate is a collective
        objects = _trackables.describe_objects(self._leaves)
        path = os.path.abspath(os.fspath(path))

        def write() -> str:
            _format.write_checkpoint(path, tensors, step=None if step is None else int(step),
                                     objects=objects)
            if after is not None:
                after()
            return path

        if self._strategy is None:
            return write()
        return _group.write_as_group(self._strategy, write, lambda: path, f"checkpoint {path}")

    def save(self, file_prefix: str | os.PathLike) -> str:
        """Write checkpoint ``<file_prefix>-<n>`` (``n`` = the new ``save_counter``) and record
        it as the latest in its directory's ``checkpoint`` index. Returns its path."""
        self.save_counter += 1
        path = os.path.abspath(f"{os.fspath(file_prefix)}-{self.save_counter}")

        def record() -> None:
            record_checkpoint(os.path.dirname(path), os.path.basename(path), max_to_keep=None)

        try:
            return self._commit(path, None, after=record)
        except BaseException:
            self.save_counter -= 1
            raise

    def read(self, path: str | os.PathLike) -> int | None:
        """Restore every tracked object from checkpoint ``path``; returns the recorded step.

        Raises :class:`~cluster.errors.CheckpointCorruptError` (naming the file) when the
        checkpoint is unreadable, ``ValueError`` when it does not match the tracked objects
        (names, dtypes, shapes). Nothing changes unless everything matches.
        """
        tensors, index = self._load(path)
        return self._apply(path, tensors, index)

    def _apply(self, path: Any, tensors: dict[str, np.ndarray], index: dict[str, Any]) -> Any:
        _trackables.apply_plan(
            _trackables.restore_plan(self._leaves, tensors), tensors,
            lambda entry, array: f"Checkpoint: {entry.name} in {path} is "
                                 f"{array.dtype}{list(array.shape)} but the tracked object is "
                                 f"{entry.dtype}{list(entry.shape)}")
        return index.get("step")

    def restore(self, path: str | os.PathLike) -> int | None:
        """:meth:`read`, and ``save_counter`` too (so later saves continue the numbering)."""
        tensors, index = self._load(path)
        step = self._apply(path, tensors, index)
        counter = tensors.get(_trackables.SAVE_COUNTER)
        if counter is not None:
            self.save_counter = int(counter)
        return step

    def _load(self, path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if path is None:
            raise ValueError("Checkpoint: no checkpoint path given (latest_checkpoint() returned "
                             "None?)")
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise CheckpointCorruptError(f"checkpoint {path} does not exist or is not a "
                                         "checkpoint directory", path=path)
        return _format.read_checkpoint(path)


# CheckpointManager (this package's manager.py) saves through these; they are not exported.


def is_writer(checkpoint: Checkpoint) -> bool:
    """Whether this task writes ``checkpoint``'s files (the chief under a multi-worker
    strategy, every task otherwise)."""
    return _group.is_writer(checkpoint._strategy)


def commit(checkpoint: Checkpoint, path: str | os.PathLike, step: int | None,
           after: Callable[[], None] | None) -> str:
    """Write ``checkpoint`` at ``path``, then ``after()`` on the writer, as one group step."""
    return checkpoint._commit(path, step, after)
