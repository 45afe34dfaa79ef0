"""Frames on an Exchange stream: a protobuf ``Frame`` whose ``data`` field is the raw payload.

``Frame.data`` is field 15 and written last, so a sender encodes the small header with protobuf
and appends field 15's tag, the payload length and the payload buffer, without building a message
around the payload; a receiver walks the header's fields to where ``data`` starts and hands out a
``memoryview`` slice, without protobuf copying the payload into a new ``bytes``. The result is an
ordinary, valid ``Frame`` on the wire (``tests/transport/test_framing.py`` checks both ways).
"""

from __future__ import annotations

from cluster.transport._pb import collective_pb2

__all__ = ["FrameError", "decode", "encode"]

_DATA_TAG = bytes([(15 << 3) | 2])  # field 15, wire type 2 (length-delimited)


class FrameError(ValueError):
    """The bytes are not a well-formed Frame."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise FrameError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def encode(header: collective_pb2.Frame, payload: bytes | bytearray | memoryview) -> bytes:
    """The wire bytes of ``header`` with ``payload`` as its ``data`` (one copy of the payload)."""
    head = header.SerializeToString()
    view = memoryview(payload).cast("B") if not isinstance(payload, bytes) else payload
    return b"".join((head, _DATA_TAG, _varint(len(view)), view))


def decode(raw: bytes) -> tuple[collective_pb2.Frame, memoryview]:
    """Split wire bytes into the parsed header (``data`` left empty) and a view of the payload.

    Raises :class:`FrameError` for malformed input; never copies the payload.
    """
    pos = 0
    end = len(raw)
    data_start = data_end = header_end = end
    while pos < end:
        field_start = pos
        key, pos = _read_varint(raw, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(raw, pos)
        elif wire == 2:
            length, pos = _read_varint(raw, pos)
            if pos + length > end:
                raise FrameError(f"field {field} runs past the end of the frame")
            if field == 15:
                header_end, data_start, data_end = field_start, pos, pos + length
                if data_end != end:
                    raise FrameError("bytes after the data field")
                break
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise FrameError(f"unsupported wire type {wire} for field {field}")
    if pos > end:
        raise FrameError("truncated frame")
    try:
        header = collective_pb2.Frame.FromString(raw[:header_end])
    except Exception as e:  # protobuf's DecodeError; the type varies between backends
        raise FrameError(f"malformed frame header: {e}") from e
    return header, memoryview(raw)[data_start:data_end]
