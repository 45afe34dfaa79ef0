"""The streaming safetensors writer and reader (cluster/checkpoint/_safetensors.py): files any
safetensors reader loads, for every dtype and odd shapes; pieces, short writes and batching; the
sha256 computed while writing; reads that hand out views of one buffer; every corruption check."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest
import safetensors.numpy

from cluster.checkpoint import CheckpointCorruptError, _format, _safetensors

pytestmark = pytest.mark.timeout(60)

DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.float16, np.uint32, np.int32,
          np.float32, np.uint64, np.int64, np.float64]


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {f"t/{np.dtype(d).name}": (rng.standard_normal((3, 5)) * 50).astype(d)
           for d in DTYPES}
    out["scalar"] = np.array(7, np.int64)  # 0-d
    out["empty"] = np.zeros((0, 4), np.float32)
    out["transposed"] = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    out["big_endian"] = np.arange(6, dtype=">i4")
    out["odd"] = np.arange(3, dtype=np.uint8)  # 3 bytes: later tensors must still be aligned
    return out


def _file(path) -> str:
    return os.path.join(path, _format.TENSOR_FILE)


def test_written_file_is_plain_safetensors_with_every_dtype(tmp_path):
    tensors = _tensors()
    path = _format.write_checkpoint(str(tmp_path / "c"), tensors)
    loaded = safetensors.numpy.load_file(_file(path))
    assert set(loaded) == set(tensors)
    for name, want in tensors.items():
        assert loaded[name].dtype == want.dtype.newbyteorder("=") and \
            loaded[name].shape == want.shape, name
        np.testing.assert_array_equal(loaded[name], want)
    with open(_file(path), "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    assert (8 + header_len) % 8 == 0  # the data starts 8-aligned
    header = json.loads(data[8:8 + header_len])
    for name, entry in header.items():
        begin = entry["data_offsets"][0]
        assert begin % np.dtype(loaded[name].dtype).itemsize == 0, name
    index = _format.read_index(path)
    assert index["tensor_bytes"] == len(data)
    assert index["sha256"] == hashlib.sha256(data).hexdigest()
    assert index["tensors"]["big_endian"] == {"dtype": "int32", "shape": [6]}


def test_read_back_equals_and_views_one_buffer(tmp_path):
    tensors = _tensors()
    path = _format.write_checkpoint(str(tmp_path / "c"), tensors)
    got, _ = _format.read_checkpoint(path)
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype.newbyteorder("=") and got[name].shape == want.shape
        np.testing.assert_array_equal(got[name], want)
    # No per-tensor copies: every tensor is a view of the one buffer the file was read into.
    base = got["t/float32"].base
    while getattr(base, "base", None) is not None:
        base = base.base
    assert all(np.shares_memory(a, base) for a in got.values() if a.size)
    assert all(a.flags.aligned for a in got.values())


def test_small_pieces_short_writes_and_many_views(tmp_path, monkeypatch):
    # Pieces of 1000 bytes, at most 3 views per writev, and a writev that writes at most 777
    # bytes a call: the file must still be exactly what safetensors would read back.
    monkeypatch.setattr(_safetensors, "_PIECE", 1000)
    monkeypatch.setattr(_safetensors, "_IOV_MAX", 3)
    real_writev = os.writev
    calls = []

    def short_writev(fd, views):
        budget, cut = 777, []
        for v in views:
            if budget <= 0:
                break
            cut.append(v[:budget])
            budget -= len(cut[-1])
        calls.append(len(views))
        return real_writev(fd, cut)

    monkeypatch.setattr(_safetensors.os, "writev", short_writev)
    tensors = {f"w{i}": np.random.default_rng(i).standard_normal(300 + 7 * i).astype(np.float32)
               for i in range(6)}
    path = _format.write_checkpoint(str(tmp_path / "c"), tensors)
    assert max(calls) <= 3 and len(calls) > 10
    loaded = safetensors.numpy.load_file(_file(path))
    for name, want in tensors.items():
        np.testing.assert_array_equal(loaded[name], want)
    got, _ = _format.read_checkpoint(path)  # and the sha256 taken while writing matches
    np.testing.assert_array_equal(got["w5"], tensors["w5"])


def test_unsupported_dtype_is_refused_naming_the_tensor_and_leaves_nothing(tmp_path):
    with pytest.raises(TypeError, match="tensor 'z' has dtype complex64"):
        _format.write_checkpoint(str(tmp_path / "c"), {"z": np.zeros(2, np.complex64)})
    assert list(tmp_path.iterdir()) == []


def test_write_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    def failing_writev(fd, views):
        raise OSError(28, "injected: no space left on device")

    monkeypatch.setattr(_safetensors.os, "writev", failing_writev)
    with pytest.raises(OSError, match="injected"):
        _format.write_checkpoint(str(tmp_path / "c"), {"w": np.ones(10, np.float32)})
    assert list(tmp_path.iterdir()) == []


def _rewrite(path: str, data: bytes) -> None:
    """Replace the tensor file with ``data`` and make the index's size and sha256 agree, so only
    the header checks can refuse it."""
    with open(_file(path), "wb") as f:
        f.write(data)
    index_path = os.path.join(path, _format.INDEX_FILE)
    with open(index_path) as f:
        index = json.load(f)
    index.update(tensor_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(index_path, "w") as f:
        json.dump(index, f)


def _with_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@pytest.mark.parametrize("header, body, message", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}, bytes(20), "hole"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), "overlap"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(24), "covers 16"),
    ({"a": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(16), "is I32"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": "x"},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(16), "invalid"),
])
def test_headers_that_do_not_tile_the_data_are_refused(tmp_path, header, body, message):
    path = _format.write_checkpoint(str(tmp_path / "c"), {"a": np.ones(2, np.float32),
                                                          "b": np.ones(2, np.float32)})
    _rewrite(path, _with_header(header, body))
    with pytest.raises(CheckpointCorruptError, match=message) as info:
        _format.read_checkpoint(path)
    assert info.value.path == _file(path)


def test_a_file_that_changes_size_while_read_is_refused(tmp_path):
    path = _format.write_checkpoint(str(tmp_path / "c"), {"a": np.ones(64, np.float32)})
    size = os.path.getsize(_file(path))

    def bad(what):
        return CheckpointCorruptError(what, path=_file(path))

    with pytest.raises(CheckpointCorruptError, match="longer than"):
        _safetensors.read_tensor_file(_file(path), size - 1, bad)
    with pytest.raises(CheckpointCorruptError, match="expected"):
        _safetensors.read_tensor_file(_file(path), size + 1, bad)
