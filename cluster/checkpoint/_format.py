"""The on-disk format of one checkpoint, and the atomic file operations it relies on.

A checkpoint is a directory (``ckpt-7/``) holding two files:

- ``tensors.safetensors``: every tensor, by name, in the safetensors format (readable by any
  safetensors reader; no pickle).
- ``index.json``: ``{"format": "cluster-checkpoint", "version": 1, "tensor_file": ...,
  "tensor_bytes": N, "sha256": hex, "tensors": {name: {"dtype", "shape"}}, "step": int|null,
  "objects": {...}}``; ``objects`` describes the trackables (optimizer type and
  hyperparameters, metric type) for people and tools; restoring does not need it.

Writing is atomic: both files go into a fresh temporary directory beside the target
(``.ckpt-7.tmp-<random>``), are fsynced, the directory is fsynced, renamed onto the target, and
the parent directory is fsynced. A crash at any moment leaves either no ``ckpt-7`` or a complete
one (and maybe a temporary directory, which readers ignore).

The tensor file is streamed (:mod:`cluster.checkpoint._safetensors`): each array's buffer is
written in place and hashed while it is written; no copy of the file is ever held in memory.

Reading trusts nothing before checking it: the index must parse and carry this format; the tensor
file's size must equal ``tensor_bytes`` before it is read into memory (one buffer, hashed as it
fills); its sha256 must match; the safetensors header must list exactly the index's tensors with
their dtypes, shapes and offsets tiling the data. Any failure raises
:class:`~cluster.errors.CheckpointCorruptError` naming the file. The tensors returned are views of
that one buffer.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from cluster.checkpoint import _safetensors
from cluster.errors import CheckpointCorruptError

__all__ = [
    "FORMAT",
    "INDEX_FILE",
    "TENSOR_FILE",
    "VERSION",
    "fsync_dir",
    "read_checkpoint",
    "read_index",
    "remove_checkpoint",
    "write_checkpoint",
    "write_json_atomic",
]

FORMAT = "cluster-checkpoint"
VERSION = 1
INDEX_FILE = "index.json"
TENSOR_FILE = "tensors.safetensors"
# The index is small (names, shapes); anything bigger is not one of ours.
_MAX_INDEX_BYTES = 64 << 20
_TMP_MARK = ".tmp-"


def fsync_dir(path: str) -> None:
    """fsync a directory, so the names created or renamed in it survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc: Any = None


def _exchange(a: str, b: str) -> bool:
    """Swap paths ``a`` and ``b`` atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``);
    ``False`` when the system or the file system cannot (then nothing happened)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    renameat2 = getattr(_libc, "renameat2", None) if _libc else None
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a!r}, {b!r}, RENAME_EXCHANGE): {os.strerror(err)}")


def temporary_name(path: str) -> str:
    """A fresh temporary path beside ``path`` (same directory, so the rename is atomic)."""
    parent, base = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{base}{_TMP_MARK}{uuid.uuid4().hex[:12]}")


def is_temporary(name: str) -> bool:
    """Whether a directory entry is a temporary left by an interrupted write."""
    return name.startswith(".") and _TMP_MARK in name


def write_json_atomic(path: str, document: Any) -> None:
    """Write ``document`` as JSON to ``path`` atomically (temporary file, fsync, rename)."""
    tmp = temporary_name(path)
    try:
        _write_file(tmp, json.dumps(document, indent=1, sort_keys=True).encode())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def write_checkpoint(path: str, tensors: Mapping[str, np.ndarray], *, step: int | None = None,
                     objects: Mapping[str, Any] | None = None) -> str:
    """Write ``tensors`` (name -> NumPy array) as the checkpoint directory ``path``, atomically.

    An existing checkpoint at ``path`` is replaced in one atomic step where the file system
    allows (``renameat2(RENAME_EXCHANGE)`` swaps the two directories, then the old one is
    removed), so a kill at any moment leaves one whole checkpoint at ``path``; elsewhere it is
    moved aside first (a kill between the two renames then leaves none). Returns ``path``.
    Raises ``OSError`` from the file system; on any failure nothing is left at ``path`` that
    was not there before.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    arrays = {name: np.asarray(array) for name, array in tensors.items()}
    tmp = temporary_name(path)
    try:
        os.mkdir(tmp)
        size, digest = _safetensors.write_tensor_file(os.path.join(tmp, TENSOR_FILE), arrays)
        index = {
            "format": FORMAT,
            "version": VERSION,
            "tensor_file": TENSOR_FILE,
            "tensor_bytes": size,
            "sha256": digest,
            "step": step,
            "tensors": {name: {"dtype": _dtype_name(a.dtype), "shape": list(a.shape)}
                        for name, a in sorted(arrays.items())},
            "objects": dict(objects or {}),
        }
        # The index is written after the tensors: a directory with an index is complete.
        _write_file(os.path.join(tmp, INDEX_FILE),
                    json.dumps(index, indent=1, sort_keys=True).encode())
        fsync_dir(tmp)
        old = None
        if os.path.lexists(path):
            if _exchange(tmp, path):
                old, tmp = tmp, None  # tmp now holds the replaced checkpoint
            else:
                old = temporary_name(path)
                os.rename(path, old)
        if tmp is not None:
            os.rename(tmp, path)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def read_index(path: str) -> dict[str, Any]:
    """The checked ``index.json`` of checkpoint ``path`` (``CheckpointCorruptError`` if absent,
    unparsable, of another format or version, or inconsistent)."""
    index_path = os.path.join(path, INDEX_FILE)
    try:
        size = os.path.getsize(index_path)
        if size > _MAX_INDEX_BYTES:
            raise CheckpointCorruptError(
                f"checkpoint index {index_path} is {size} bytes, more than any index; "
                "not a checkpoint", path=index_path)
        with open(index_path, "rb") as f:
            index = json.loads(f.read())
    except FileNotFoundError as e:
        raise CheckpointCorruptError(
            f"checkpoint index {index_path} is missing: not a complete checkpoint",
            path=index_path) from e
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(
            f"checkpoint index {index_path} is not valid JSON ({e}); the file is corrupt",
            path=index_path) from e
    _check_index(index, index_path)
    return index


def _check_index(index: Any, index_path: str) -> None:
    def bad(what: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"checkpoint index {index_path}: {what}", path=index_path)

    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} index")
    if index.get("version") != VERSION:
        raise bad(f"format version {index.get('version')!r}; this runtime reads version "
                  f"{VERSION}")
    if index.get("tensor_file") != TENSOR_FILE:
        raise bad(f"unexpected tensor_file {index.get('tensor_file')!r}")
    if not isinstance(index.get("tensor_bytes"), int) or index["tensor_bytes"] < 8:
        raise bad("tensor_bytes missing or invalid")
    if not isinstance(index.get("sha256"), str) or len(index["sha256"]) != 64:
        raise bad("sha256 missing or invalid")
    tensors = index.get("tensors")
    if not isinstance(tensors, dict):
        raise bad("tensors missing")
    for name, spec in tensors.items():
        try:
            np.dtype(spec["dtype"])
            ok = all(isinstance(d, int) and d >= 0 for d in spec["shape"])
        except (TypeError, KeyError) as e:
            raise bad(f"tensor {name!r} has an invalid entry {spec!r}") from e
        if not ok:
            raise bad(f"tensor {name!r} has an invalid shape {spec['shape']!r}")


def read_checkpoint(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(tensors, index)`` of checkpoint directory ``path``, every check passed.

    Raises :class:`~cluster.errors.CheckpointCorruptError` naming the file when anything does not
    match (see the module docstring); ``OSError`` other than a missing file passes through.
    """
    path = os.path.abspath(path)
    index = read_index(path)
    tensor_path = os.path.join(path, TENSOR_FILE)

    def bad(what: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"checkpoint tensor file {tensor_path}: {what}",
                                      path=tensor_path)

    expected = index["tensor_bytes"]
    try:
        size = os.path.getsize(tensor_path)
    except FileNotFoundError as e:
        raise bad("missing") from e
    if size != expected:  # checked before reading: a huge or cut file is never loaded
        raise bad(f"is {size} bytes but its index says {expected}; truncated or altered")
    data, digest = _safetensors.read_tensor_file(tensor_path, expected, bad)
    if digest != index["sha256"]:
        raise bad(f"sha256 {digest} does not match the index's {index['sha256']}; corrupt")
    header, start = _safetensors.parse_header(data, bad)
    _check_header(header, len(data) - start, index["tensors"], bad)
    dtypes = {name: np.dtype(spec["dtype"]) for name, spec in index["tensors"].items()}
    return _safetensors.tensor_views(data, header, start, dtypes), index


def _check_header(header: Mapping[str, Any], body: int, specs: Mapping[str, Any],
                  bad: Any) -> None:
    """The safetensors header lists exactly ``specs``' names, dtypes and shapes, with offsets
    inside the ``body`` bytes after it that tile it without holes."""
    if set(header) != set(specs):
        raise bad(f"holds tensors {sorted(header)} but the index lists {sorted(specs)}")
    spans = []
    for name, entry in header.items():
        spec = specs[name]
        dtype = np.dtype(spec["dtype"])
        try:
            begin, end = entry["data_offsets"]
            shape, code = list(entry["shape"]), entry["dtype"]
        except (TypeError, KeyError, ValueError) as e:
            raise bad(f"tensor {name!r} has an invalid header entry {entry!r}") from e
        if code != _safetensors.dtype_code(dtype):
            raise bad(f"tensor {name!r} is {code} but the index says {spec['dtype']}")
        if shape != list(spec["shape"]):
            raise bad(f"tensor {name!r} has shape {shape} but the index says {spec['shape']}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= body) \
                or end - begin != dtype.itemsize * int(np.prod(spec["shape"], dtype=np.int64)):
            raise bad(f"tensor {name!r} has offsets {entry['data_offsets']} that do not fit a "
                      f"{spec['dtype']} tensor of shape {spec['shape']}")
        spans.append((begin, end))
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            raise bad(f"tensor data has a hole or overlap at byte {covered}")
        covered = end
    if covered != body:
        raise bad(f"tensor data covers {covered} of its {body} bytes")


def remove_checkpoint(path: str) -> None:
    """Delete checkpoint directory ``path``: renamed aside first (atomically, so no reader ever
    sees a half-deleted checkpoint under its name), then removed."""
    if not os.path.lexists(path):
        return
    doomed = temporary_name(path)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
