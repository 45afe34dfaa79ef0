"""``CheckpointManager``: numbered checkpoints in one directory, the newest ``max_to_keep`` kept
(``tf.train.CheckpointManager``'s shape)."""

from __future__ import annotations

import os
import re
import shutil
import warnings

from cluster.checkpoint import _format
from cluster.checkpoint._directory import plan_names, read_directory_index, record_checkpoint
from cluster.checkpoint.checkpoint import Checkpoint, commit, is_writer
from cluster.errors import CheckpointCorruptError

__all__ = ["CheckpointManager"]


class CheckpointManager:
    """Saves ``checkpoint`` as ``<directory>/<checkpoint_name>-<n>`` and keeps the newest.

    One manager writes a directory at a time. Under MultiWorkerMirroredStrategy every task
    creates its manager on the same (shared) directory and calls :meth:`save`; the chief writes.
    Each :meth:`save` writes the checkpoint atomically, then the directory's ``checkpoint``
    index (atomically too), and only then deletes the checkpoints beyond ``max_to_keep``
    (``None`` keeps all). A crash (even ``kill -9``) at any moment leaves the index naming only
    complete checkpoints. Temporary directories left by an interrupted save, and
    ``<checkpoint_name>-<n>`` checkpoints the index no longer names (dropped by a save killed
    before it deleted them), are removed when a manager opens the directory.
    """

    def __init__(self, checkpoint: Checkpoint, directory: str | os.PathLike,
                 max_to_keep: int | None = 5, checkpoint_name: str = "ckpt") -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"CheckpointManager: expected a Checkpoint, got "
                            f"{type(checkpoint).__name__}")
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or max_to_keep < 1):
            raise ValueError(f"CheckpointManager: max_to_keep must be >= 1 or None, got "
                             f"{max_to_keep!r}")
        if not checkpoint_name or "/" in checkpoint_name:
            raise ValueError(f"CheckpointManager: invalid checkpoint_name {checkpoint_name!r}")
        self._checkpoint = checkpoint
        self._directory = os.path.abspath(os.fspath(directory))
        self._max_to_keep = max_to_keep
        self._name = checkpoint_name
        # Under MultiWorkerMirroredStrategy only the chief writes (and cleans) the directory.
        writer = is_writer(checkpoint)
        os.makedirs(self._directory, exist_ok=True)
        for entry in os.listdir(self._directory) if writer else ():
            if _format.is_temporary(entry):  # left by a save that was killed
                _remove_any(os.path.join(self._directory, entry))
        try:
            index = read_directory_index(self._directory)
        except CheckpointCorruptError as e:
            warnings.warn(f"{e}; ignoring it (checkpoints found by name instead)",
                          RuntimeWarning, stacklevel=2)
            index = None
        if index is None:
            self._names = self._scan()
        else:
            self._names = [n for n in index["checkpoints"]
                           if os.path.isdir(os.path.join(self._directory, n))]
            for stale in set(self._scan()) - set(self._names) if writer else ():
                # Dropped from the index by a save that was killed before deleting it.
                _format.remove_checkpoint(os.path.join(self._directory, stale))

    def _scan(self) -> list[str]:
        pattern = re.compile(re.escape(self._name) + r"-(\d+)$")
        found = [(int(m.group(1)), e) for e in os.listdir(self._directory)
                 if (m := pattern.match(e)) and os.path.isdir(os.path.join(self._directory, e))]
        return [e for _, e in sorted(found)]

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints, oldest first."""
        return [os.path.join(self._directory, n) for n in self._names]

    @property
    def latest_checkpoint(self) -> str | None:
        """Path of the newest checkpoint, or ``None``."""
        return os.path.join(self._directory, self._names[-1]) if self._names else None

    def save(self, checkpoint_number: int | None = None) -> str:
        """Save a new checkpoint; returns its path.

        Named ``<name>-<checkpoint_number>`` (recorded as the step in its index), or
        ``<name>-<save_counter>`` when no number is given. Saving a number again replaces it.
        """
        ckpt = self._checkpoint
        if checkpoint_number is not None:
            checkpoint_number = int(checkpoint_number)
        ckpt.save_counter += 1
        number = ckpt.save_counter if checkpoint_number is None else checkpoint_number
        name = f"{self._name}-{number}"
        kept, _ = plan_names(self._names, name, self._max_to_keep)

        def record() -> None:  # the writer only, once the checkpoint is complete
            record_checkpoint(self._directory, name, max_to_keep=self._max_to_keep,
                              known=self._names)

        try:
            path = commit(ckpt, os.path.join(self._directory, name), checkpoint_number,
                          after=record)
        except BaseException:
            ckpt.save_counter -= 1
            raise
        self._names = kept
        return path

    def restore_or_initialize(self) -> str | None:
        """Restore the newest readable checkpoint; returns its path, or ``None`` when there is
        none (the objects keep their initial values).

        A corrupt checkpoint is skipped with a ``RuntimeWarning`` naming the file, and the one
        before it is tried. Raises the last :class:`~cluster.errors.CheckpointCorruptError` when
        checkpoints exist but none is readable (starting over silently would lose the run).
        """
        error: CheckpointCorruptError | None = None
        for path in reversed(self.checkpoints):
            try:
                self._checkpoint.restore(path)
            except CheckpointCorruptError as e:
                warnings.warn(f"{e}; falling back to the previous checkpoint", RuntimeWarning,
                              stacklevel=2)
                error = e
                continue
            return path
        if error is not None:
            raise error
        return None


def _remove_any(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
