"""A checkpoint directory's ``checkpoint`` index: which checkpoints it holds, and the latest.

``<directory>/checkpoint`` is JSON: ``{"format": "cluster-checkpoint-index", "version": 1,
"latest": "ckpt-7", "checkpoints": ["ckpt-5", "ckpt-6", "ckpt-7"]}`` (names relative to the
directory, oldest first). It is replaced atomically (temporary file, fsync, rename, fsync of the
directory) and only after the checkpoint it names is complete on disk, so it never names a
checkpoint that is not there in full. Checkpoints it drops are deleted after it is written.
"""

from __future__ import annotations

import json
import os
from typing import Any

from cluster.checkpoint import _format
from cluster.errors import CheckpointCorruptError

__all__ = [
    "INDEX_NAME",
    "latest_checkpoint",
    "plan_names",
    "read_directory_index",
    "record_checkpoint",
]

INDEX_NAME = "checkpoint"
_FORMAT = "cluster-checkpoint-index"


def read_directory_index(directory: str) -> dict[str, Any] | None:
    """The checked index of ``directory``; ``None`` when there is none.

    Raises :class:`~cluster.errors.CheckpointCorruptError` naming the file when it is unreadable.
    """
    path = os.path.join(directory, INDEX_NAME)
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read(1 << 20))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(f"checkpoint index {path} is not valid JSON ({e})",
                                     path=path) from e
    names = index.get("checkpoints") if isinstance(index, dict) else None
    if (not isinstance(index, dict) or index.get("format") != _FORMAT
            or index.get("version") != 1 or not isinstance(names, list)
            or not all(isinstance(n, str) and n and "/" not in n for n in names)
            or index.get("latest") not in [*names, None]):
        raise CheckpointCorruptError(f"checkpoint index {path} is not a {_FORMAT} (version 1)",
                                     path=path)
    return index


def write_directory_index(directory: str, names: list[str]) -> None:
    """Atomically replace ``directory``'s index with ``names`` (oldest first; last = latest)."""
    _format.write_json_atomic(os.path.join(directory, INDEX_NAME), {
        "format": _FORMAT, "version": 1,
        "latest": names[-1] if names else None, "checkpoints": list(names)})


def plan_names(known: list[str], name: str,
               max_to_keep: int | None) -> tuple[list[str], list[str]]:
    """``(kept, dropped)`` after adding ``name`` as the latest to ``known`` (oldest first)."""
    names = [n for n in known if n != name] + [name]
    if max_to_keep is not None and len(names) > max_to_keep:
        return names[-max_to_keep:], names[:-max_to_keep]
    return names, []


def record_checkpoint(directory: str, name: str, *, max_to_keep: int | None,
                      known: list[str] | None = None) -> list[str]:
    """Record the complete checkpoint ``name`` as the latest in ``directory``'s index, then
    delete the oldest beyond ``max_to_keep`` (``None``: keep all). ``known`` is the list to
    start from (default: the index on disk, or nothing when it is missing or unreadable).
    Returns the new list, oldest first."""
    if known is None:
        try:
            index = read_directory_index(directory)
        except CheckpointCorruptError:
            index = None  # rebuilt from this save on: a damaged index must not block saving
        known = [] if index is None else list(index["checkpoints"])
    names, dropped = plan_names(known, name, max_to_keep)
    write_directory_index(directory, names)
    for old in dropped:  # only now: the index no longer names them
        _format.remove_checkpoint(os.path.join(directory, old))
    return names


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    """The path of the latest checkpoint recorded in ``directory``'s ``checkpoint`` index, or
    ``None`` when there is no index (``tf.train.latest_checkpoint``). Raises
    :class:`~cluster.errors.CheckpointCorruptError` when the index is unreadable."""
    directory = os.fspath(directory)
    index = read_directory_index(directory)
    if index is None or index["latest"] is None:
        return None
    return os.path.join(os.path.abspath(directory), index["latest"])
