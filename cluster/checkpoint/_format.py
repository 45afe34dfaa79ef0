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

Reading trusts nothing before checking it: the index must parse and carry this format; the tensor
file's size must equal ``tensor_bytes`` before it is read into memory; its sha256 must match;
the safetensors header must list exactly the index's tensors with their dtypes and shapes. Any
failure raises :class:`~cluster.errors.CheckpointCorruptError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.numpy

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

    An existing checkpoint at ``path`` is replaced (moved aside, then removed after the new one
    is in place). Returns ``path``. Raises ``OSError`` from the file system; on any failure
    nothing is left at ``path`` that was not there before.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    # np.ascontiguousarray would turn a scalar into shape (1,): copy only what needs it.
    arrays = {name: np.asarray(array, order="C") for name, array in tensors.items()}
    data = safetensors.numpy.save(arrays)
    index = {
        "format": FORMAT,
        "version": VERSION,
        "tensor_file": TENSOR_FILE,
        "tensor_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "step": step,
        "tensors": {name: {"dtype": _dtype_name(a.dtype), "shape": list(a.shape)}
                    for name, a in sorted(arrays.items())},
        "objects": dict(objects or {}),
    }
    tmp = temporary_name(path)
    try:
        os.mkdir(tmp)
        _write_file(os.path.join(tmp, TENSOR_FILE), data)
        # The index is written after the tensors: a directory with an index is complete.
        _write_file(os.path.join(tmp, INDEX_FILE),
                    json.dumps(index, indent=1, sort_keys=True).encode())
        fsync_dir(tmp)
        old = None
        if os.path.lexists(path):
            old = temporary_name(path)
            os.rename(path, old)
        os.rename(tmp, path)
    except BaseException:
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
    with open(tensor_path, "rb") as f:
        data = f.read()
    if len(data) != expected:
        raise bad(f"read {len(data)} bytes, expected {expected}; the file changed while read")
    digest = hashlib.sha256(data).hexdigest()
    if digest != index["sha256"]:
        raise bad(f"sha256 {digest} does not match the index's {index['sha256']}; corrupt")
    _check_header(data, index["tensors"], bad)
    try:
        tensors = safetensors.numpy.load(data)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise bad(f"unreadable safetensors data ({e})") from e
    for name, array in tensors.items():
        if array.dtype != np.dtype(index["tensors"][name]["dtype"]):
            raise bad(f"tensor {name!r} is {array.dtype} but the index says "
                      f"{index['tensors'][name]['dtype']}")
    return tensors, index


def _check_header(data: bytes, specs: Mapping[str, Any], bad: Any) -> None:
    """The safetensors header lists exactly ``specs``' names, dtypes and shapes, with offsets
    inside the file; checked before safetensors allocates anything."""
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise bad(f"header length {header_len} runs past the end of the file")
    try:
        header = json.loads(data[8:8 + header_len])
    except ValueError as e:
        raise bad(f"header is not valid JSON ({e})") from e
    header.pop("__metadata__", None)
    if set(header) != set(specs):
        raise bad(f"holds tensors {sorted(header)} but the index lists {sorted(specs)}")
    body = len(data) - 8 - header_len
    for name, entry in header.items():
        spec = specs[name]
        dtype = np.dtype(spec["dtype"])
        begin, end = entry["data_offsets"]
        if list(entry["shape"]) != list(spec["shape"]):
            raise bad(f"tensor {name!r} has shape {entry['shape']} but the index says "
                      f"{spec['shape']}")
        if not 0 <= begin <= end <= body or end - begin != dtype.itemsize * int(
                np.prod(spec["shape"], dtype=np.int64)):
            raise bad(f"tensor {name!r} has offsets {entry['data_offsets']} that do not fit a "
                      f"{spec['dtype']} tensor of shape {spec['shape']}")


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
