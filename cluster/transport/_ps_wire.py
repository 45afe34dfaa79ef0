"""Tensors and store errors on the ``ParameterServer`` wire (``proto/ps.proto``); no gRPC here.

A tensor travels as one :class:`TensorChunk` holding the array's raw C-order little-endian bytes
(never pickle); the receiver views them with ``np.frombuffer``. One message carries at most
:data:`MAX_TENSOR_BYTES` of tensor data (protobuf's 2 GiB message limit, less headroom); larger
variables must be sharded with a partitioner (``MaxSizePartitioner``), as TF advises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cluster import errors
from cluster.transport._pb import tensor_pb2

__all__ = ["ERROR_KEY", "MAX_TENSOR_BYTES", "STORE_ERRORS", "check_array", "fill_chunk",
           "from_chunk", "to_array", "to_chunk", "to_piece"]

MAX_TENSOR_BYTES = (2 << 30) - (64 << 20)

#: Trailing-metadata key naming the store error a server raised (a type name, never a message).
ERROR_KEY = "x-ps-error"
STORE_ERRORS: dict[str, type[errors.VariableStoreError]] = {
    cls.__name__: cls for cls in (errors.VariableNotFoundError, errors.VariableExistsError,
                                  errors.VariableMismatchError, errors.StaleStepError,
                                  errors.SyncTimeoutError)
}

_TO_WIRE = {
    np.dtype(np.float16): tensor_pb2.FLOAT16,
    np.dtype(np.float32): tensor_pb2.FLOAT32,
    np.dtype(np.float64): tensor_pb2.FLOAT64,
    np.dtype(np.int32): tensor_pb2.INT32,
    np.dtype(np.int64): tensor_pb2.INT64,
    np.dtype(np.uint8): tensor_pb2.UINT8,
    np.dtype(np.int8): tensor_pb2.INT8,
    np.dtype(np.bool_): tensor_pb2.BOOL,
}
_FROM_WIRE = {v: k.newbyteorder("<") for k, v in _TO_WIRE.items()}


def check_array(array: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    """``(array, wire dtype)``: ``array`` as C-order little-endian (a view when it already is)
    and its dtype's wire number. Raises ``TypeError`` for a dtype the wire cannot carry and
    ``ValueError`` above :data:`MAX_TENSOR_BYTES`; ``what`` names the tensor in messages."""
    array = np.asarray(array)
    wire = _TO_WIRE.get(array.dtype.newbyteorder("="))
    if wire is None:
        raise TypeError(f"{what}: dtype {array.dtype} cannot be sent to a parameter server "
                        f"(supported: {', '.join(str(d) for d in _TO_WIRE)})")
    if array.nbytes > MAX_TENSOR_BYTES:
        raise ValueError(f"{what}: {array.nbytes} bytes exceed the {MAX_TENSOR_BYTES} bytes one "
                         "message carries; shard the variable (MaxSizePartitioner)")
    # not ascontiguousarray: it makes a 0-d array 1-d
    return np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C"), wire


def to_chunk(array: np.ndarray, what: str) -> tensor_pb2.TensorChunk:
    """``array`` as one TensorChunk; raises as :func:`check_array`."""
    chunk = tensor_pb2.TensorChunk()
    fill_chunk(chunk, array, what)
    return chunk


def fill_chunk(chunk: tensor_pb2.TensorChunk, array: np.ndarray, what: str) -> None:
    """:func:`to_chunk` into ``chunk``, a field of a message being built: protobuf copies a
    message passed to a parent's constructor, so large tensors are filled in place instead."""
    array, wire = check_array(array, what)
    chunk.meta.dtype = wire
    chunk.meta.shape[:] = array.shape
    chunk.offset = 0
    chunk.total_bytes = array.nbytes
    chunk.data = array.tobytes()


def from_chunk(chunk: tensor_pb2.TensorChunk, what: str) -> np.ndarray:
    """The array ``chunk`` carries (a read-only view of its bytes, native byte order when that is
    little-endian). Raises ``ValueError`` naming ``what`` for a malformed or partial chunk."""
    # each read of a bytes field copies it: read once
    return to_array(chunk.meta.dtype, chunk.meta.shape, chunk.offset, chunk.total_bytes,
                    chunk.data, what)


def _meta(dtype_number: int, shape: Sequence[int], what: str
          ) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, nbytes)`` of a tensor's wire meta: a known dtype and no negative
    dimension, else ``ValueError`` naming ``what``."""
    dtype = _FROM_WIRE.get(dtype_number)
    if dtype is None:
        raise ValueError(f"{what}: unsupported or missing dtype {dtype_number}")
    shape = tuple(shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"{what}: negative dimension in shape {shape}")
    return dtype, shape, math.prod(shape) * dtype.itemsize


def to_array(dtype_number: int, shape: Sequence[int], offset: int, total_bytes: int,
             data: bytes | memoryview, what: str) -> np.ndarray:
    """The array a whole-tensor chunk of these fields describes: a read-only view of ``data``.

    Checked before anything is made of it: a known dtype, no negative dimension, and
    ``data``, ``total_bytes`` both exactly ``prod(shape) * itemsize`` at offset 0. Raises
    ``ValueError`` naming ``what`` otherwise (chunked tensors are not supported).
    """
    dtype, shape, expected = _meta(dtype_number, shape, what)
    if offset != 0 or total_bytes != expected or len(data) != expected:
        raise ValueError(f"{what}: expected one chunk of {expected} bytes for shape {shape} "
                         f"{dtype}, got offset {offset}, {len(data)} of "
                         f"{total_bytes} bytes (chunked tensors are not supported)")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def to_piece(dtype_number: int, shape: Sequence[int], offset: int, total_bytes: int,
             data: bytes | memoryview, what: str) -> tuple[np.dtype, tuple[int, ...], int,
                                                          np.ndarray]:
    """``(dtype, shape, start, flat)`` of one chunk of a tensor (``PushChunks``): ``flat`` a
    read-only 1-D view of ``data`` holding elements ``[start, start + flat.size)``.

    Checked before anything is made of it: a known dtype, no negative dimension,
    ``total_bytes`` exactly ``prod(shape) * itemsize``, ``offset`` and ``len(data)`` whole
    elements, and ``data`` inside the tensor. Raises ``ValueError`` naming ``what`` otherwise.
    """
    dtype, shape, expected = _meta(dtype_number, shape, what)
    if total_bytes != expected:
        raise ValueError(f"{what}: total_bytes {total_bytes} for shape {shape} {dtype}, which "
                         f"holds {expected} bytes")
    if offset % dtype.itemsize or len(data) % dtype.itemsize or offset + len(data) > expected:
        raise ValueError(f"{what}: a chunk of {len(data)} bytes at offset {offset} is not whole "
                         f"{dtype} elements inside the tensor's {expected} bytes")
    return dtype, shape, offset // dtype.itemsize, np.frombuffer(data, dtype=dtype)
