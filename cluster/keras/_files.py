"""Only the chief writes files: the other tasks' Keras callbacks and ``model.save`` write into a
private temporary folder, removed afterwards (what TensorFlow's Keras does under a strategy).

The callbacks redirected are Keras' file writers: ``ModelCheckpoint`` (``filepath``),
``TensorBoard`` (``log_dir``) and ``CSVLogger`` (``filename``). Their paths are put back when
``fit`` returns, so a callback object can be reused. Keras' own ``BackupAndRestore`` is refused
under a strategy: it would restore each task from files only the chief has;
:class:`cluster.keras.BackupAndRestore` is the one that works.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import keras

__all__ = ["PRIVATE_PREFIX", "check_callbacks", "is_private", "private_folder",
           "private_path", "redirect_callbacks"]

PRIVATE_PREFIX = "cluster-keras-"
"""The name prefix of a non-chief task's private temporary folder."""

# (callback class, the attribute holding the path it writes)
_WRITERS = (
    (keras.callbacks.ModelCheckpoint, "filepath"),
    (keras.callbacks.TensorBoard, "log_dir"),
    (keras.callbacks.CSVLogger, "filename"),
)


def check_callbacks(callbacks: Sequence[Any]) -> None:
    """``ValueError`` for a callback that cannot work under a strategy (Keras' own
    ``BackupAndRestore``), naming the one to use instead."""
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise ValueError(
                "keras.callbacks.BackupAndRestore cannot resume a model trained under a cluster "
                "strategy (only the chief writes its files, and it does not resume mid-epoch): "
                "use cluster.keras.BackupAndRestore(backup_dir), which saves through "
                "cluster.checkpoint and resumes at the same step")


@contextlib.contextmanager
def private_folder(task: str) -> Iterator[str]:
    """A fresh temporary folder of this task, removed on exit."""
    folder = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{task.replace(':', '-')}-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def is_private(path: Any) -> bool:
    """Whether ``path`` lies in a private folder (a redirected callback saving through
    ``model.save``: it is already where it may write)."""
    root = os.path.join(os.path.realpath(tempfile.gettempdir()), PRIVATE_PREFIX)
    return os.path.realpath(os.fspath(path)).startswith(root)


def private_path(folder: str, path: Any) -> str:
    """Where a non-chief task writes instead of ``path``: the same name in its private
    folder."""
    name = os.path.basename(os.path.normpath(os.fspath(path))) or "output"
    return os.path.join(folder, name)


@contextlib.contextmanager
def redirect_callbacks(callbacks: Sequence[Any], folder: str) -> Iterator[None]:
    """Point the file-writing callbacks at ``folder`` for the duration, then back."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for callback in callbacks:
            for kind, attribute in _WRITERS:
                if isinstance(callback, kind):
                    original = getattr(callback, attribute)
                    saved.append((callback, attribute, original))
                    setattr(callback, attribute, private_path(folder, original))
        yield
    finally:
        for callback, attribute, original in reversed(saved):
            setattr(callback, attribute, original)
