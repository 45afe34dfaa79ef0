"""A streaming safetensors writer and reader that hash (sha256) the file as it passes.

The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
header length ``N``; ``N`` bytes of JSON ``{name: {"dtype": "F32", "shape": [...],
"data_offsets": [begin, end]}}`` (offsets relative to the end of the header); then the raw
little-endian bytes of every tensor, back to back, with no holes. Files written here are read by
``safetensors.numpy.load_file`` and any other safetensors reader.

Why not ``safetensors.numpy.save``: it builds the whole file as one ``bytes`` object (a copy of
every tensor, then a second copy into the page cache), and hashing that object is a third pass.
Here every tensor's buffer goes straight from its array to ``os.writev`` (no ``tobytes()``, no
whole-file object), while a second thread hashes the same memory (``hashlib`` releases the GIL),
and written ranges are handed to the kernel's writeback as the write goes (``posix_fadvise``
``DONTNEED``: starts writeback now instead of at the final ``fsync``, and keeps a checkpoint from
evicting the page cache the training uses). Reading fills one preallocated buffer in large
``readinto`` calls while the second thread hashes what has arrived; tensors are then
``np.frombuffer`` views of that buffer (no second copy).

Tensors are laid out by decreasing item size, then name, after a header padded with spaces to a
multiple of 8 bytes: every tensor starts aligned to its item size, so the views are aligned.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["HEADER_ALIGN", "dtype_code", "parse_header", "read_tensor_file",
           "tensor_views", "write_tensor_file"]

HEADER_ALIGN = 8
# Each writev/readinto moves up to this many bytes: large enough that system-call overhead is
# nothing, small enough that hashing and writeback overlap with the next piece.
_PIECE = 16 << 20
_IOV_MAX = 512  # below every platform's IOV_MAX (1024 on Linux)
_CODES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
          "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32",
          "float32": "F32", "uint64": "U64", "int64": "I64", "float64": "F64"}


def dtype_code(dtype: np.dtype) -> str | None:
    """The safetensors dtype code of a NumPy dtype (``"F32"``), or None if it has none."""
    return _CODES.get(np.dtype(dtype).name)


class _Hasher:
    """sha256 of a sequence of buffers, computed on a thread of its own in submission order.

    ``update`` only enqueues (the buffer must stay unchanged until :meth:`hexdigest`);
    ``hexdigest`` waits for the thread. ``close`` stops it early (on an error path).
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._queue: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (view := self._queue.get()) is not None:
            try:
                self._sha.update(view)
            except BaseException as e:  # reported by hexdigest(); keep draining the queue
                self._error = e

    def update(self, view: memoryview) -> None:
        self._queue.put(view)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            # Bounded by the bytes already queued (a hash runs at >1 GB/s); never blocks on I/O.
            self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:
            raise self._error
        return self._sha.hexdigest()


def _plan(arrays: Mapping[str, np.ndarray]) -> tuple[bytes, list[tuple[str, np.ndarray]]]:
    """The padded header (with its 8-byte length) and the arrays in file order."""
    ordered = sorted(arrays.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
    header: dict[str, Any] = {}
    offset = 0
    for name, array in ordered:
        code = dtype_code(array.dtype)
        if code is None:
            raise TypeError(f"Checkpoint: tensor {name!r} has dtype {array.dtype}, which "
                            f"safetensors cannot store (it stores {', '.join(sorted(_CODES))})")
        header[name] = {"dtype": code, "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % HEADER_ALIGN)
    return struct.pack("<Q", len(text)) + text, ordered


def _byte_view(array: np.ndarray) -> memoryview:
    # A 0-d array has no 1-d byte view; reshape(-1) of a C-contiguous array is a view, not a copy.
    return memoryview(array.reshape(-1)).cast("B")


def _pieces(head: bytes, arrays: list[tuple[str, np.ndarray]]):
    """Batches of byte views, each at most ``_PIECE`` bytes (or one view) and ``_IOV_MAX``
    views, covering the file in order."""
    batch: list[memoryview] = [memoryview(head)]
    size = len(head)
    for _, array in arrays:
        view = _byte_view(array)
        for start in range(0, len(view), _PIECE):
            part = view[start:start + _PIECE]
            if batch and (size + len(part) > _PIECE or len(batch) >= _IOV_MAX):
                yield batch
                batch, size = [], 0
            batch.append(part)
            size += len(part)
    if batch:
        yield batch


def _writev_all(fd: int, views: list[memoryview]) -> None:
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):  # a short write: drop what went, resume mid-view
            n -= len(views[0])
            views = views[1:]
        if views and n:
            views[0] = views[0][n:]


def write_tensor_file(path: str, tensors: Mapping[str, np.ndarray]) -> tuple[int, str]:
    """Write ``tensors`` as a new safetensors file at ``path`` (which must not exist), fsynced.

    Returns ``(size in bytes, sha256 hex digest)`` of the file. Arrays must not change until it
    returns (they are written and hashed in place). Raises ``TypeError`` naming a tensor whose
    dtype safetensors cannot store, ``OSError`` from the file system (the partial file is left
    for the caller, whose temporary directory holds it, to remove).
    """
    arrays = {name: _little_endian(np.ascontiguousarray(a) if a.ndim else np.asarray(a))
              for name, a in tensors.items()}
    head, ordered = _plan(arrays)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    hasher = _Hasher()
    try:
        written = 0
        for batch in _pieces(head, ordered):
            for view in batch:
                hasher.update(view)
            _writev_all(fd, list(batch))
            size = sum(len(v) for v in batch)
            if hasattr(os, "posix_fadvise"):
                # Start writeback of this batch now (see the module docstring).
                os.posix_fadvise(fd, written, size, os.POSIX_FADV_DONTNEED)
            written += size
        digest = hasher.hexdigest()
        os.fsync(fd)
    finally:
        hasher.close()
        os.close(fd)
    return written, digest


def _little_endian(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder("<")) if array.dtype.byteorder == ">" else array


def read_tensor_file(path: str, size: int, bad: Callable[[str], Exception]) -> tuple[
        np.ndarray, str]:
    """``(buffer, sha256 hex)``: the ``size`` bytes of file ``path`` in one new uint8 array,
    hashed as they arrive. Raises ``bad(what)`` when the file is not exactly ``size`` bytes long
    while read (it changed after its size was checked); ``OSError`` passes through."""
    buffer = np.empty(size, np.uint8)
    view = memoryview(buffer)
    hasher = _Hasher()
    try:
        with open(path, "rb", buffering=0) as f:
            if hasattr(os, "posix_fadvise"):  # a larger readahead window
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            done = 0
            while done < size:
                n = f.readinto(view[done:done + _PIECE])
                if not n:
                    raise bad(f"read {done} bytes, expected {size}; the file changed while read")
                hasher.update(view[done:done + n])
                done += n
            if f.read(1):
                raise bad(f"is longer than {size} bytes; the file changed while read")
        return buffer, hasher.hexdigest()
    finally:
        hasher.close()


def parse_header(data: np.ndarray, bad: Callable[[str], Exception]) -> tuple[dict[str, Any], int]:
    """``(header without __metadata__, offset of the data)`` of the safetensors bytes ``data``;
    ``bad(what)`` when the length or the JSON is malformed."""
    if len(data) < 8:
        raise bad("is shorter than a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8].tobytes())
    if header_len > len(data) - 8:
        raise bad(f"header length {header_len} runs past the end of the file")
    try:
        header = json.loads(data[8:8 + header_len].tobytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + header_len


def tensor_views(data: np.ndarray, header: Mapping[str, Any], start: int,
                 dtypes: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """Arrays viewing ``data`` (no copy) for every header entry, with ``dtypes[name]``; the
    header must have been checked against the sizes (see ``_format._check_header``)."""
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = np.dtype(dtypes[name]).newbyteorder("<")
        flat = data[start + begin:start + end].view(dtype)
        out[name] = flat.reshape(entry["shape"])
    return out
