"""Hypothesis strategies for the fuzz suite: request bytes for every method of every service.

Requests are built from the compiled descriptors (``cluster/transport/_pb``), so a field added
to a ``.proto`` is fuzzed without touching this file: :func:`message` draws a valid message of
any type (every scalar at its edges too, nested messages to a bounded depth, repeated fields,
oneofs, unknown enum numbers), :func:`request_bytes` serialises one and then maybe mutates the
bytes (flip, cut, splice, duplicate, append) or replaces them with raw random bytes. Names are
drawn from a small pool that includes the victim's real variables and tasks, so that requests
reach past the "no such variable" checks into the code that does the work.
"""

from __future__ import annotations

import math

import numpy as np
from google.protobuf import descriptor as _d
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from cluster.transport import _framing
from cluster.transport._pb import (
    collective_pb2,
    control_pb2,
    coordination_pb2,
    coordinator_pb2,
    ps_pb2,
    tensor_pb2,
)
from cluster.transport._ps_wire import to_chunk

__all__ = ["METHODS", "Method", "frames", "message", "mutate", "request_bytes"]

NAMES = ["fuzz/var", "fuzz/other", "worker:0", "worker:1", "worker:3", "chief:0", "", "x" * 300,
         "\u00e9/\u4e2d", "fuzz/var/part_1"]
_MAX_DEPTH = 3
_INTS = {
    _d.FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    _d.FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    _d.FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    _d.FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    _d.FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    _d.FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    _d.FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    _d.FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    _d.FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    _d.FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
}


def _integer(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, 2, 3, 4, -1, lo, hi, hi // 2, 1 << 20, 1 << 31, 1 << 40)
             if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(0, 16), st.integers(lo, hi))


def _scalar(field: _d.FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t in _INTS:
        return _integer(*_INTS[t])
    if t == _d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (_d.FieldDescriptor.TYPE_DOUBLE, _d.FieldDescriptor.TYPE_FLOAT):
        width = 32 if t == _d.FieldDescriptor.TYPE_FLOAT else 64
        return st.one_of(st.sampled_from([0.0, 0.1, -1.0, math.inf, -math.inf, math.nan, 1e300]),
                         st.floats(width=width))
    if t == _d.FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(NAMES), st.text(max_size=24))
    if t == _d.FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.sampled_from(
            [np.arange(4, dtype=np.float32).tobytes(), b"\0" * 1024]))
    if t == _d.FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-3, 1000))
    raise TypeError(f"no strategy for field {field.full_name} of type {t}")


@st.composite
def _message(draw, descriptor: _d.Descriptor) -> Message:
    msg = GetMessageClass(descriptor)()
    draw(_fill(msg, 0))
    return msg


@st.composite
def _tensor(draw, chunk: tensor_pb2.TensorChunk) -> None:
    """A consistent whole-tensor chunk (``to_chunk``'s layout), so that requests carrying
    tensors get past the chunk checks into the store; the shape of the real variable
    (``fuzz/var``: float32, [4]) comes up often."""
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float64, np.int32, np.bool_]))
    shape = draw(st.sampled_from([[4], [4], [], [0], [2, 2], [3]]))
    array = np.ones(shape, dtype) * draw(st.sampled_from([1, 0, -1]))
    chunk.CopyFrom(to_chunk(array, "fuzz"))


@st.composite
def _fill(draw, msg: Message, depth: int) -> Message:
    if msg.DESCRIPTOR is tensor_pb2.TensorChunk.DESCRIPTOR and draw(st.booleans()):
        draw(_tensor(msg))
        return msg
    for field in msg.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue  # absent: proto3 default, or an unset oneof / optional
        repeated = field.is_repeated
        count = draw(st.integers(0, 3)) if repeated else 1
        for _ in range(count):
            if field.type == _d.FieldDescriptor.TYPE_MESSAGE:
                if depth >= _MAX_DEPTH:
                    break
                child = getattr(msg, field.name).add() if repeated \
                    else getattr(msg, field.name)
                child.SetInParent()
                draw(_fill(child, depth + 1))
            elif repeated:
                getattr(msg, field.name).append(draw(_scalar(field)))
            else:
                setattr(msg, field.name, draw(_scalar(field)))
    return msg


def message(descriptor: _d.Descriptor) -> st.SearchStrategy[Message]:
    """A valid message of ``descriptor``'s type, any field set or not."""
    return _message(descriptor)


@st.composite
def mutate(draw, raw: bytes) -> bytes:
    """``raw`` as it is (a third of the time) or with one to three byte-level mutations."""
    out = bytearray(raw)
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup", "append", "varint"]))
        at = draw(st.integers(0, len(out)))
        if op == "flip" and out:
            i = min(at, len(out) - 1)
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            out = out[:at] if draw(st.booleans()) else out[:at] + out[at + draw(
                st.integers(1, 8)):]
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "dup":
            out += out[at:]
        elif op == "append":
            out += draw(st.binary(max_size=16))
        elif op == "varint":  # a length or number turned huge: the classic parser trap
            out[at:at] = b"\xff" * draw(st.integers(1, 10)) + b"\x01"
    return bytes(out)


def request_bytes(descriptor: _d.Descriptor) -> st.SearchStrategy[bytes]:
    """Wire bytes for a request of ``descriptor``'s type: valid, mutated or raw garbage."""
    valid = message(descriptor).map(lambda m: m.SerializeToString())
    return st.one_of(valid, valid.flatmap(mutate), st.binary(max_size=128))


@st.composite
def _frame(draw, src_rank: int) -> bytes:
    header = draw(message(collective_pb2.Frame.DESCRIPTOR))
    header.ClearField("data")
    # A goodbye naming a lost task tells a loss, as Abort does: left out (see test_grpc_fuzz).
    header.ClearField("goodbye")
    header.ClearField("lost_task")
    if draw(st.sampled_from([True, True, True, False])):  # well-formed, often a whole message
        header.src_rank = src_rank
        header.group = draw(st.sampled_from(["fuzz", "g"]))
        data = draw(st.binary(max_size=64))
        header.offset = draw(st.sampled_from([0, 0, 0, len(data), 7]))
        header.total_bytes = header.offset + len(data) + draw(st.sampled_from([0, 0, 1, 1 << 40]))
        return _framing.encode(header, data)
    return draw(mutate(_framing.encode(header, draw(st.binary(max_size=64)))))


def frames(src_rank: int) -> st.SearchStrategy[list[bytes]]:
    """The messages of one Exchange stream: framed payloads, mutated frames, garbage, and last
    the goodbye frame a peer ends its stream with (a stream that ends without it is a lost
    peer, which fails the group; after a goodbye among the mutated frames, it is refused)."""
    goodbye = _framing.encode(collective_pb2.Frame(src_rank=src_rank, goodbye=True), b"")
    return st.lists(st.one_of(_frame(src_rank), st.binary(max_size=64)),
                    max_size=6).map(lambda sent: [*sent, goodbye])


class Method:
    """One RPC: its path, request type and cardinality, from the service descriptor."""

    def __init__(self, service: _d.ServiceDescriptor, method: _d.MethodDescriptor) -> None:
        self.path = f"/{service.full_name}/{method.name}"
        self.request = method.input_type
        self.client_streaming = method.client_streaming
        self.server_streaming = method.server_streaming

    def __repr__(self) -> str:
        return self.path


METHODS = [Method(s, m)
           for module in (collective_pb2, control_pb2, coordination_pb2, coordinator_pb2, ps_pb2)
           for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods]
