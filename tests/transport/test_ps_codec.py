"""The hand-written PullReply / PushRequest codec against protobuf itself, and against garbage."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.transport._pb import ps_pb2
from cluster.transport._ps_codec import (
    ALIGN,
    decode_pull_reply,
    decode_push_request,
    encode_push_request,
    encode_value_entry,
)
from cluster.transport._ps_wire import fill_chunk, from_chunk

pytestmark = pytest.mark.timeout(120)

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(7, np.int64),  # 0-d
    np.zeros((0, 5), np.float64),  # empty: proto3 leaves data out
    np.array([True, False, True]),
    np.arange(6, dtype=np.float16).reshape(2, 1, 3),
    np.arange(5, dtype=">i4"),  # big-endian in: little-endian on the wire
    np.arange(20, dtype=np.float32).reshape(4, 5)[:, 1:3],  # not contiguous
    np.arange(256, dtype=np.uint8),
]


def _pb_reply(values: list[tuple[str, int, np.ndarray]]) -> ps_pb2.PullReply:
    reply = ps_pb2.PullReply()
    for name, version, array in values:
        fill_chunk(reply.values.add(name=name, version=version).value, array, name)
    return reply


def _pb_values(message) -> list[tuple[str, int, np.ndarray]]:
    field = message.values if isinstance(message, ps_pb2.PullReply) else message.gradients
    return [(v.name, v.version, from_chunk(v.value, v.name)) for v in field]


def _reply(values: list[tuple[str, int, np.ndarray]]) -> bytes:
    """A PullReply as the servicer writes it: entries joined, each told where it starts."""
    entries: list[bytes] = []
    for value in values:
        entries.append(encode_value_entry(*value, at=sum(len(e) for e in entries)))
    return b"".join(entries)


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        g[:-1] == w[:-1] and g[-1].dtype == w[-1].dtype and g[-1].shape == w[-1].shape
        and g[-1].tobytes() == w[-1].tobytes() for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_pull_entry_is_protobufs_bytes_and_decodes_to_a_read_only_view(array) -> None:
    values = [("dense/kernel", 41, array), ("b", 0, np.ones(2, np.float32))]
    encoded = _reply(values)
    parsed = ps_pb2.PullReply.FromString(encoded)
    assert encoded == parsed.SerializeToString()  # protobuf's own bytes, padding and all
    assert _same(_pb_values(parsed), _pb_values(_pb_reply(values)))
    # and what a stock serializer writes (no padding) decodes the same
    assert _same(decode_pull_reply(_pb_reply(values).SerializeToString()),
                 decode_pull_reply(encoded))
    decoded = decode_pull_reply(encoded)
    assert _same(decoded, [(n, v, np.asarray(a, a.dtype.newbyteorder("<"))) for n, v, a in values])
    assert decoded[0][2].shape == array.shape and decoded[0][2].tolist() == array.tolist()
    got = decoded[0][2]
    assert not got.flags.writeable
    if got.nbytes:
        assert np.shares_memory(got, np.frombuffer(encoded, np.uint8))  # a view: no copy


@pytest.mark.parametrize("size", [1, 3, 100, 127, 128, 4 << 20, (1 << 21) - 7])
@pytest.mark.parametrize("name", ["v", "w" * 60, "x" * 300])
def test_tensor_data_starts_aligned_so_views_are_aligned_arrays(size, name) -> None:
    # Misaligned float32 views make NumPy copy through buffers: the ps's SGD update ran 1.6x
    # slower on them. Every entry's data starts at a multiple of ALIGN in its message.
    arrays = [np.arange(size, dtype=np.float32), np.arange(size // 2 + 1, dtype=np.float64),
              np.arange(size % 7 + 1, dtype=np.int8)]
    push = encode_push_request({f"{name}{i}": a for i, a in enumerate(arrays)},
                               ps_pb2.PushRequest(step=2))
    reply = _reply([(f"{name}{i}", i, a) for i, a in enumerate(arrays)])
    for encoded, decoded in [(push, [a for _, a in decode_push_request(push)[1]]),
                             (reply, [a for _, _, a in decode_pull_reply(reply)])]:
        base = np.frombuffer(encoded, np.uint8).ctypes.data
        for got, want in zip(decoded, arrays, strict=True):
            assert (got.ctypes.data - base) % ALIGN == 0
            assert got.flags.aligned and np.array_equal(got, want)


@pytest.mark.parametrize("contributor", [None, 0, 2])
def test_push_request_is_protobufs_bytes_both_ways(contributor) -> None:
    grads = {f"v{i}": a for i, a in enumerate(ARRAYS)}
    header = ps_pb2.PushRequest(step=9, num_contributors=3, contributor=contributor,
                                no_wait=True)
    header.optimizer.adam.learning_rate = 0.5
    encoded = encode_push_request(grads, header)
    want = ps_pb2.PushRequest()
    want.CopyFrom(header)
    for name, grad in grads.items():
        fill_chunk(want.gradients.add(name=name).value, grad, name)
    parsed = ps_pb2.PushRequest.FromString(encoded)
    assert encoded == parsed.SerializeToString()  # protobuf's own bytes, padding and all
    for entry in parsed.gradients:
        entry.value.ClearField("padding")
    assert parsed == want
    got_header, got = decode_push_request(want.SerializeToString())
    assert got_header == header
    assert got_header.HasField("contributor") == (contributor is not None)
    assert _same([(n, 0, a) for n, a in got], _pb_values(want))


def test_push_header_with_gradients_is_refused() -> None:
    header = ps_pb2.PushRequest()
    header.gradients.add(name="x")
    with pytest.raises(ValueError, match="must not hold gradients"):
        encode_push_request({}, header)


def test_merged_and_unknown_fields_mean_what_they_mean_to_protobuf() -> None:
    entry = encode_value_entry("x", 1, np.arange(3, dtype=np.float32))
    # The value field again, with data only: merged, meta stays and the last data wins.
    again = ps_pb2.VariableValue()
    again.value.total_bytes = 12
    again.value.data = np.arange(10, 13, dtype="<f4").tobytes()
    extra = again.SerializeToString()
    merged = entry[:1] + bytes([entry[1] + len(extra)]) + entry[2:] + extra
    unknown = b"\x98\x06\x05" + b"\x21" + bytes(8) + b"\x2a\x02hi"  # varint, i64, bytes
    message = merged + unknown
    want = _pb_values(ps_pb2.PullReply.FromString(message))
    assert want[0][2].tolist() == [10, 11, 12]
    assert _same(decode_pull_reply(message), want)


values_st = st.lists(st.tuples(
    st.text(max_size=5), st.integers(0, 2**64 - 1),
    st.sampled_from(ARRAYS[:5])), min_size=0, max_size=3)


def _pull_message(values) -> bytes:
    return b"".join(encode_value_entry(*v) for v in values)


def _push_message(values) -> bytes:
    header = ps_pb2.PushRequest(step=3, num_contributors=2, contributor=1)
    return encode_push_request({name: array for name, _, array in values}, header)


def _decode_push(data: bytes) -> list:
    header, grads = decode_push_request(data)
    return [header] + [(name, 0, array) for name, array in grads]


def _pb_push(data: bytes) -> list:
    message = ps_pb2.PushRequest.FromString(data)
    header = ps_pb2.PushRequest()
    header.CopyFrom(message)
    del header.gradients[:]
    return [header] + _pb_values(message)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["pull", "push"]), values=values_st, cut=st.integers(0, 10_000),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       tail=st.binary(max_size=16))
def test_mangled_messages_raise_value_error_or_agree_with_protobuf(kind, values, cut, edits,
                                                                  tail) -> None:
    build, decode, oracle = {
        "pull": (_pull_message, decode_pull_reply,
                 lambda d: _pb_values(ps_pb2.PullReply.FromString(d))),
        "push": (_push_message, _decode_push, _pb_push)}[kind]
    data = bytearray(build(values))
    for pos, byte in edits:
        if data:
            data[pos % len(data)] = byte
    data = bytes(data[:cut % (len(data) + 1)] + tail if edits or tail else data)
    try:
        got = decode(data)
    except ValueError:
        assert edits or tail, "an untouched message was refused"
        return  # refused: what a servicer answers INVALID_ARGUMENT
    # Accepted: then protobuf reads the same message the same way.
    try:
        want = oracle(data)
    except (DecodeError, ValueError) as e:
        pytest.fail(f"codec accepted {data!r}, which protobuf refuses: {e}")
    if kind == "push":
        assert got[0] == want[0]
        got, want = got[1:], want[1:]
    assert _same(got, want)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_garbage_raises_only_value_error(data) -> None:
    for decode in (decode_pull_reply, decode_push_request):
        try:
            decode(data)
        except ValueError:
            pass


@pytest.mark.parametrize("message", [
    b"\x0a",  # a length missing
    b"\x0a\x05abc",  # a length past the end
    b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # an 11-byte varint
    b"\x0b",  # a group
    b"\x0f",  # wire type 7
    b"\x00\x01",  # field 0
    b"\x08\x01",  # PullReply.values as a varint
], ids=repr)
def test_malformed_framing_is_refused(message) -> None:
    with pytest.raises(ValueError):
        decode_pull_reply(message)
    with pytest.raises(ValueError):
        decode_push_request(message)


def _chunk_claiming(shape, total_bytes, data) -> bytes:
    grad = ps_pb2.PushRequest().gradients.add(name="g")
    grad.value.meta.dtype = 2  # FLOAT32
    grad.value.meta.shape[:] = shape
    grad.value.total_bytes = total_bytes
    grad.value.data = data
    return grad.SerializeToString()


@pytest.mark.parametrize("shape,total,data", [
    ((1 << 28,), 1 << 30, b"\x00" * 16),  # claims 1 GiB, sends 16 bytes
    ((4,), 16, b"\x00" * 12),  # truncated data
    ((4,), 16, b"\x00" * 20),  # oversized data
    ((4,), 20, b"\x00" * 16),  # total_bytes disagrees
    ((-1, 4), 16, b"\x00" * 16),  # negative dimension
    ((1 << 40, 1 << 40), 0, b""),  # absurd shape, no data
])
def test_sizes_a_peer_claims_are_checked_before_anything_is_allocated(shape, total,
                                                                      data) -> None:
    entry = _chunk_claiming(shape, total, data)
    message = b"\x0a" + bytes([len(entry)]) + entry
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            decode_push_request(message)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"decoding a refused message allocated {peak} bytes"
