"""The tensor-carrying ``ParameterServer`` messages, encoded and parsed by hand around the bytes.

``PullReply`` (a server's answer) and ``PushRequest`` (a worker's gradients) carry whole
variables. Built with protobuf, a pulled tensor is copied five times on the server (the store's
copy, ``tobytes``, the assignment to ``data``, ``SerializeToString``, gRPC's) and three times on
the client (gRPC's, parsing, reading ``data``): 16 MiB took 3-4x a bare gRPC call of the same
bytes. Here the wire bytes are written in one copy, straight from the array (under the
variable's lock for a pull), and parsed in none: the arrays returned are read-only
``np.frombuffer`` views of the received message. gRPC's own copy, one per side, remains.

The bytes are exactly protobuf's (``proto/ps.proto``, ``proto/tensor.proto``), field by field in
field-number order, as ``SerializeToString`` writes them: a stock parser reads every message
this module writes, and this module reads every message a stock serializer writes. Only the
tensor payload is handled by hand: ``TensorChunk.data`` is field 15, last on purpose, so a
chunk is its header fields (serialized by protobuf, including ``padding``, field 14, sized so
that the data starts at a multiple of :data:`ALIGN` in its message), then field 15's tag and
length, then the array's buffer. Parsing walks the fields without copying; the small header
fields of each message are handed to protobuf, so merged or repeated fields mean what they mean
to protobuf (a repeated ``data`` keeps its last value; unknown fields are ignored).

Safety: every length read from the wire is checked against the bytes actually received before
it is used, nothing is allocated from a size a peer claims, and a chunk's data must be exactly
``prod(shape) * itemsize`` bytes before an array is made of it (the store then checks shape and
dtype against the variable's). Anything malformed raises ``ValueError`` naming the message and
the offset, which a servicer answers with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from cluster.transport._pb import ps_pb2, tensor_pb2
from cluster.transport._ps_wire import check_array, to_array, to_piece

__all__ = ["ALIGN", "MIN_PIECE_BYTES", "decode_pull_reply", "decode_push_pieces",
           "decode_push_request", "encode_push_request", "encode_value_entry",
           "push_chunk_messages"]

_LEN = 2  # wire type of length-delimited fields
_VARINT, _I64, _I32 = 0, 1, 5
_DATA_TAG = b"\x7a"  # TensorChunk.data: field 15, wire type 2
_VALUE_TAG = b"\x1a"  # VariableValue.value: field 3, wire type 2
_ENTRY_TAG = b"\x0a"  # PullReply.values / PushRequest.gradients: field 1, wire type 2

Buffer = bytes | bytearray | memoryview


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# -- encoding --------------------------------------------------------------------------------


ALIGN = 64
"""Tensor data starts at a multiple of this many bytes from the start of every message written
here (a cache line): a reader's view of its received bytes is then an aligned array, and NumPy
computes on it at full speed (on a misaligned float32 view it goes through buffered copies: a
16 MiB SGD update measured 6.4 ms against 4.0 ms). ``TensorChunk.padding`` takes up the slack."""


def _chunk_parts(array: np.ndarray, wire: int, pad: int, lo: int, hi: int) -> list[Any]:
    """A ``TensorChunk`` holding bytes ``[lo, hi)`` of ``array`` (checked, C-order little-endian;
    with ``pad`` bytes of padding), as byte strings and a view of the array's buffer (not copied
    here), the view last."""
    head = tensor_pb2.TensorChunk(offset=lo, total_bytes=array.nbytes, padding=bytes(pad))
    head.meta.dtype = wire
    head.meta.shape[:] = array.shape
    parts: list[Any] = [head.SerializeToString()]
    if hi > lo:  # proto3 leaves an empty bytes field out
        parts += [_DATA_TAG + _varint(hi - lo), array.reshape(-1).view(np.uint8)[lo:hi]]
    return parts


def _entry_parts(name: str, version: int, array: np.ndarray, what: str, at: int,
                 span: tuple[int, int] | None = None) -> list[Any]:
    """A ``VariableValue`` as field 1 of its parent (tag, length, message), in parts, its data
    starting at a multiple of :data:`ALIGN` counted from ``at`` bytes before the entry; ``span``:
    the byte range of ``array`` it carries (default: all of it)."""
    array, wire = check_array(array, what)
    lo, hi = span or (0, array.nbytes)
    pad = 0
    for _ in range(8):  # each try may lengthen a varint around it, which only ever grows
        chunk = _chunk_parts(array, wire, pad, lo, hi)
        chunk_len = sum(len(part) for part in chunk)
        head = ps_pb2.VariableValue(name=name, version=version).SerializeToString() \
            + _VALUE_TAG + _varint(chunk_len)
        parts = [_ENTRY_TAG + _varint(len(head) + chunk_len) + head, *chunk]
        if len(chunk) == 1:
            return parts  # no data to align
        miss = -(at + sum(len(part) for part in parts[:-1])) % ALIGN
        if miss == 0:
            break
        # A padding field is its tag, a length byte and at least one byte (proto3 leaves an
        # empty one out); a longer one moves the data by as many bytes as it grows.
        pad = pad + miss if pad else (miss - 2) % ALIGN or ALIGN
    return parts


def encode_value_entry(name: str, version: int, array: np.ndarray, at: int = 0) -> bytes:
    """One ``PullReply.values`` entry holding ``array``, copied once into the bytes returned;
    ``at``: the entry's offset in its reply (the data is aligned counting from there).

    A ``PullReply`` is its entries concatenated (``b"".join``). Raises ``TypeError`` for a dtype
    the wire cannot carry, ``ValueError`` for a tensor too large for one message.
    """
    return b"".join(_entry_parts(name, version, array, f"variable {name}", at))


def encode_push_request(grads: Mapping[str, np.ndarray], header: ps_pb2.PushRequest) -> bytes:
    """A ``PushRequest`` of ``header``'s fields (its ``gradients`` must be empty) and
    ``grads``, each array copied once, straight into the bytes returned."""
    if len(header.gradients):
        raise ValueError("encode_push_request: the header must not hold gradients")
    parts: list[Any] = []
    at = 0
    for name, grad in grads.items():
        entry = _entry_parts(name, 0, grad, f"gradient of {name}", at)
        at += sum(len(part) for part in entry)
        parts += entry
    parts.append(header.SerializeToString())  # fields 2.. after field 1, as protobuf orders them
    return b"".join(parts)


MIN_PIECE_BYTES = 64 << 10
"""The smallest chunk :func:`push_chunk_messages` splits off a gradient (but its last): a
receiver refuses gradients in more than ``1 + nbytes // MIN_PIECE_BYTES`` chunks."""


def push_chunk_messages(grads: Mapping[str, np.ndarray], header: ps_pb2.PushRequest,
                        chunk_bytes: int) -> list[Callable[[], bytes]]:
    """The messages of a ``PushChunks`` stream, each a call that writes it (copying its part of
    the gradients once, when called, so a sender writes message k+1 while message k travels).

    Every gradient is checked here, before any message is written (``TypeError``,
    ``ValueError`` as :func:`encode_push_request`). The first message holds ``header``'s fields
    (its ``gradients`` must be empty). Messages hold about ``chunk_bytes`` of tensor data:
    small gradients whole, large ones split at multiples of :data:`ALIGN` bytes into chunks of
    at least :data:`MIN_PIECE_BYTES` (but a gradient's last).
    """
    if len(header.gradients):
        raise ValueError("push_chunk_messages: the header must not hold gradients")
    if chunk_bytes < MIN_PIECE_BYTES:
        raise ValueError(f"chunk_bytes must be at least {MIN_PIECE_BYTES}, got {chunk_bytes}")
    plan: list[list[tuple[str, np.ndarray, int, int]]] = [[]]
    room = chunk_bytes
    for name, grad in grads.items():
        array, _ = check_array(grad, f"gradient of {name}")
        lo, n = 0, array.nbytes
        while True:
            if n - lo > room and plan[-1] and room < MIN_PIECE_BYTES:
                plan.append([])
                room = chunk_bytes
            hi = n if n - lo <= room else lo + room // ALIGN * ALIGN
            plan[-1].append((name, array, lo, hi))
            room -= hi - lo
            lo = hi
            if lo == n:
                break
    tail = header.SerializeToString()

    def message(entries: list[tuple[str, np.ndarray, int, int]], first: bool) -> bytes:
        parts: list[Any] = []
        at = 0
        for name, array, lo, hi in entries:
            entry = _entry_parts(name, 0, array, f"gradient of {name}", at, (lo, hi))
            at += sum(len(part) for part in entry)
            parts += entry
        if first:
            parts.append(tail)  # fields 2.. after field 1, as protobuf orders them
        return b"".join(parts)

    return [lambda entries=entries, first=(i == 0): message(entries, first)
            for i, entries in enumerate(plan)]


# -- parsing ---------------------------------------------------------------------------------


def _read_varint(buf: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError(f"{what}: truncated varint at byte {pos}")
        if shift > 63:
            raise ValueError(f"{what}: varint longer than 10 bytes at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview, start: int, end: int,
            what: str) -> Iterator[tuple[int, int, int, int, int]]:
    """``(number, wire type, field start, value start, field end)`` of each field in
    ``buf[start:end]``; every length is checked against ``end`` before it is trusted."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos, end, what)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"{what}: field number 0 at byte {field_start}")
        if wire == _VARINT:
            _, value_end = _read_varint(buf, pos, end, what)
        elif wire == _I64 or wire == _I32:
            value_end = pos + (8 if wire == _I64 else 4)
        elif wire == _LEN:
            length, pos = _read_varint(buf, pos, end, what)
            value_end = pos + length
        else:  # groups (3, 4) are not in our schema; 6 and 7 are not wire types
            raise ValueError(f"{what}: unsupported wire type {wire} at byte {field_start}")
        if value_end > end:
            raise ValueError(f"{what}: field {number} at byte {field_start} runs "
                             f"{value_end - end} bytes past the end of its message")
        yield number, wire, field_start, pos, value_end
        pos = value_end


def _parse_header(message_type: Any, parts: list[memoryview], what: str) -> Any:
    """The small (non-tensor) fields of a message, parsed by protobuf."""
    try:
        return message_type.FromString(b"".join(parts))
    except DecodeError as e:
        raise ValueError(f"{what}: malformed header fields: {e}") from e


def _chunk(buf: memoryview, ranges: list[tuple[int, int]], what: str, make: Callable) -> Any:
    """``make(dtype, shape, offset, total_bytes, data, what)`` of a ``TensorChunk`` given as one
    or more (merged) byte ranges of ``buf``: :func:`to_array` or :func:`to_piece`."""
    head: list[memoryview] = []
    data: memoryview = memoryview(b"")
    for start, end in ranges:
        for number, wire, field_start, value_start, value_end in _fields(buf, start, end, what):
            if number == 15:
                if wire != _LEN:
                    raise ValueError(f"{what}: data field with wire type {wire}")
                data = buf[value_start:value_end]  # the last one wins, as in protobuf
            else:
                head.append(buf[field_start:value_end])
    chunk = _parse_header(tensor_pb2.TensorChunk, head, what)
    return make(chunk.meta.dtype, chunk.meta.shape, chunk.offset, chunk.total_bytes, data, what)


def _value(buf: memoryview, start: int, end: int, what: str,
           make: Callable) -> tuple[str, int, Any]:
    """``(name, version, make(...))`` of the ``VariableValue`` in ``buf[start:end]``."""
    head: list[memoryview] = []
    chunk: list[tuple[int, int]] = []
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end, what):
        if number == 3 and wire == _LEN:
            chunk.append((value_start, value_end))  # several occurrences merge, as in protobuf
        else:
            head.append(buf[field_start:value_end])
    value = _parse_header(ps_pb2.VariableValue, head, what)
    return value.name, value.version, _chunk(buf, chunk, f"{what} ({value.name!r})", make)


def _entries(data: Buffer, what: str, make: Callable = to_array
             ) -> tuple[list[tuple[str, int, Any]], list[memoryview]]:
    """The field-1 ``VariableValue`` entries of a message and its other fields (raw)."""
    buf = memoryview(data).cast("B")
    values, rest = [], []
    for number, wire, field_start, value_start, value_end in _fields(buf, 0, len(buf), what):
        if number == 1:
            if wire != _LEN:
                raise ValueError(f"{what}: field 1 with wire type {wire}")
            values.append(_value(buf, value_start, value_end, f"{what}, entry {len(values)}",
                                 make))
        else:
            rest.append(buf[field_start:value_end])
    return values, rest


def decode_pull_reply(data: Buffer) -> list[tuple[str, int, np.ndarray]]:
    """``[(name, version, array)]`` of a serialized ``PullReply``; the arrays are read-only
    views of ``data``. Raises ``ValueError`` for a malformed message."""
    values, rest = _entries(data, "PullReply")
    _parse_header(ps_pb2.PullReply, rest, "PullReply")  # unknown fields: valid ones, ignored
    return values


def decode_push_request(data: Buffer) -> tuple[ps_pb2.PushRequest,
                                               Sequence[tuple[str, np.ndarray]]]:
    """``(header, [(name, gradient)])`` of a serialized ``PushRequest``: ``header`` holds every
    field but ``gradients``; the gradients are read-only views of ``data``. Raises
    ``ValueError`` for a malformed message."""
    values, rest = _entries(data, "PushRequest")
    return (_parse_header(ps_pb2.PushRequest, rest, "PushRequest"),
            [(name, array) for name, _, array in values])


def decode_push_pieces(data: Buffer) -> tuple[ps_pb2.PushRequest,
                                              list[tuple[str, tuple[Any, ...]]]]:
    """``(header, [(name, (dtype, shape, start, flat))])`` of one serialized ``PushRequest`` of
    a ``PushChunks`` stream: each gradient entry is one chunk of its tensor, as
    :func:`~cluster.transport._ps_wire.to_piece` reads it (``flat``: a read-only view of
    ``data``). Raises ``ValueError`` for a malformed message."""
    values, rest = _entries(data, "PushRequest", to_piece)
    return (_parse_header(ps_pb2.PushRequest, rest, "PushRequest"),
            [(name, piece) for name, _, piece in values])
