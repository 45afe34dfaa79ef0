"""One contract suite, run against every Transport implementation (in-process and gRPC)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cluster.deadline import Deadline
from cluster.errors import CollectiveAbortedError, CollectiveTimeoutError, TransportClosedError
from cluster.transport.api import MessageKey

pytestmark = pytest.mark.timeout(30)


def key(seq: int, step: int = 0, chunk: int = 0, group: str = "g") -> MessageKey:
    return MessageKey(group, seq, step, chunk)


def test_send_then_recv_delivers_the_exact_bytes_and_signature(make_group) -> None:
    a, b = make_group(2)
    a.send(1, key(0), b"hello", deadline=Deadline.after(5), signature="sig")
    got = b.recv(0, key(0), deadline=Deadline.after(5))
    assert bytes(got.payload) == b"hello"
    assert got.signature == "sig"


def test_numpy_payload_arrives_bit_exact(make_group) -> None:
    a, b = make_group(2)
    x = np.random.default_rng(0).standard_normal((37, 11)).astype(np.float32)
    a.send(1, key(1), x, deadline=Deadline.after(5))
    got = np.frombuffer(b.recv(0, key(1), deadline=Deadline.after(5)).payload, np.float32)
    assert got.tobytes() == x.tobytes()


def test_empty_payload_is_a_message(make_group) -> None:
    a, b = make_group(2)
    a.send(1, key(2), b"", deadline=Deadline.after(5))
    assert len(b.recv(0, key(2), deadline=Deadline.after(5)).payload) == 0


def test_recv_matches_by_key_not_by_arrival_order(make_group) -> None:
    a, b = make_group(2)
    for step in range(5):
        a.send(1, key(3, step), bytes([step]) * 3, deadline=Deadline.after(5))
    for step in reversed(range(5)):
        got = b.recv(0, key(3, step), deadline=Deadline.after(5)).payload
        assert bytes(got) == bytes([step]) * 3


def test_same_key_from_different_sources_is_kept_apart(make_group) -> None:
    a, b, c = make_group(3)
    a.send(2, key(4), b"from-a", deadline=Deadline.after(5))
    b.send(2, key(4), b"from-b", deadline=Deadline.after(5))
    assert bytes(c.recv(1, key(4), deadline=Deadline.after(5)).payload) == b"from-b"
    assert bytes(c.recv(0, key(4), deadline=Deadline.after(5)).payload) == b"from-a"


def test_payload_larger_than_a_frame_is_reassembled(make_group) -> None:
    a, b = make_group(2)
    x = np.arange(3_000_001, dtype=np.float64)  # 24 MB: several frames on the gRPC transport
    a.send(1, key(5), x, deadline=Deadline.after(20))
    got = b.recv(0, key(5), deadline=Deadline.after(20)).payload
    assert np.array_equal(np.frombuffer(got, np.float64), x)


def test_sender_may_reuse_its_buffer_after_send_returns(make_group) -> None:
    a, b = make_group(2)
    buf = bytearray(b"first")
    a.send(1, key(6), buf, deadline=Deadline.after(5))
    buf[:] = b"XXXXX"
    assert bytes(b.recv(0, key(6), deadline=Deadline.after(5)).payload) == b"first"


def test_recv_times_out_naming_the_peer_and_collective(make_group) -> None:
    a, b = make_group(2)
    with pytest.raises(CollectiveTimeoutError, match=r"worker:0.*#7 of group 'g'"):
        b.recv(0, key(7), deadline=Deadline.after(0.3))


def test_abort_fails_pending_and_later_calls_on_every_rank(make_group) -> None:
    a, b, c = make_group(3)
    caught: list[BaseException] = []

    def wait_on_c() -> None:
        try:
            c.recv(1, key(8), deadline=Deadline.after(10))
        except BaseException as e:
            caught.append(e)

    waiter = threading.Thread(target=wait_on_c)
    waiter.start()
    a.abort("shape mismatch in all_reduce #8")
    waiter.join(10)
    assert len(caught) == 1 and isinstance(caught[0], CollectiveAbortedError)
    assert "worker:0" in str(caught[0]) and "shape mismatch" in str(caught[0])
    with pytest.raises(CollectiveAbortedError):
        b.recv(0, key(9), deadline=Deadline.after(5))
    with pytest.raises(CollectiveAbortedError):
        b.send(2, key(9), b"x", deadline=Deadline.after(5))


def test_closed_transport_refuses_calls(make_group) -> None:
    a, b = make_group(2)
    a.close()
    with pytest.raises(TransportClosedError):
        a.send(1, key(10), b"x", deadline=Deadline.after(1))
    with pytest.raises(TransportClosedError):
        a.recv(1, key(10), deadline=Deadline.after(1))


def test_many_threads_sending_concurrently_all_arrive(make_group) -> None:
    a, b = make_group(2)

    def sender(i: int) -> None:
        for j in range(20):
            a.send(1, key(100 + i, j), f"{i}:{j}".encode(), deadline=Deadline.after(10))

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for i in range(4):
        for j in range(20):
            got = b.recv(0, key(100 + i, j), deadline=Deadline.after(10)).payload
            assert bytes(got) == f"{i}:{j}".encode()


def test_peers_lists_every_rank_in_order(make_group) -> None:
    group = make_group(3)
    for t in group:
        assert [p.rank for p in t.peers] == [0, 1, 2]
        assert [p.task for p in t.peers] == ["worker:0", "worker:1", "worker:2"]
        assert t.world_size == 3


def test_signature_survives_a_payload_split_into_frames(make_group) -> None:
    a, b = make_group(2)
    x = np.zeros(2_000_000, dtype=np.float32)  # 8 MB: two frames or more on gRPC
    a.send(1, key(11), x, deadline=Deadline.after(20), signature="all_reduce SUM float32[2000000]")
    got = b.recv(0, key(11), deadline=Deadline.after(20))
    assert got.signature == "all_reduce SUM float32[2000000]"
    assert len(got.payload) == x.nbytes


def test_posted_buffer_receives_the_payload_or_is_left_alone(make_group) -> None:
    a, b = make_group(2)
    x = np.arange(100_000, dtype=np.float32)
    into = memoryview(np.zeros(x.nbytes, np.uint8))
    b.post_recv(0, key(12), into)
    a.send(1, key(12), x, deadline=Deadline.after(5))
    got = b.recv(0, key(12), deadline=Deadline.after(5))
    assert np.array_equal(np.frombuffer(got.payload, np.float32), x)
    if got.payload is into:  # honoured: the bytes landed in place
        assert np.array_equal(np.frombuffer(into, np.float32), x)
    # A payload of another size never lands in the offered buffer; one that arrived before the
    # offer is still delivered.
    small = memoryview(np.zeros(8, np.uint8))
    b.post_recv(0, key(13), small)
    a.send(1, key(13), x, deadline=Deadline.after(5))
    got = b.recv(0, key(13), deadline=Deadline.after(5))
    assert got.payload is not small and bytes(small) == bytes(8)
    assert np.array_equal(np.frombuffer(got.payload, np.float32), x)
    # key 15 is received after key 14 arrived (one connection keeps order): offered too late.
    a.send(1, key(14), x, deadline=Deadline.after(5))
    a.send(1, key(15), b"", deadline=Deadline.after(5))
    b.recv(0, key(15), deadline=Deadline.after(5))
    late = memoryview(np.zeros(x.nbytes, np.uint8))
    b.post_recv(0, key(14), late)
    assert bytes(b.recv(0, key(14), deadline=Deadline.after(5)).payload) == x.tobytes()


def test_tcp_lands_a_posted_payload_in_place() -> None:
    from .conftest import NetworkGroup

    group = NetworkGroup(2, data_plane="tcp")
    try:
        a, b = group.transports
        x = np.arange(100_000, dtype=np.float32)
        into = memoryview(np.zeros(x.nbytes, np.uint8))
        b.post_recv(0, key(16), into)
        a.send(1, key(16), x, deadline=Deadline.after(5))
        assert b.recv(0, key(16), deadline=Deadline.after(5)).payload is into
        assert np.array_equal(np.frombuffer(into, np.float32), x)
    finally:
        group.close()


def test_tcp_lands_a_posted_payload_from_a_peer_this_rank_never_sends_to() -> None:
    # Lazy routes (the task runtime): a ring's rank opens a route only to its right neighbour,
    # yet what its left neighbour sends must land in the buffer offered for it.
    from .conftest import NetworkGroup

    group = NetworkGroup(3, data_plane="tcp", lazy=True)
    try:
        a, b, _ = group.transports
        x = np.arange(100_000, dtype=np.float32)
        into = memoryview(np.zeros(x.nbytes, np.uint8))
        b.post_recv(0, key(22), into)
        a.send(1, key(22), x, deadline=Deadline.after(10))
        assert 0 not in b.data_planes  # b has no route to a
        assert b.recv(0, key(22), deadline=Deadline.after(10)).payload is into
        assert np.array_equal(np.frombuffer(into, np.float32), x)
    finally:
        group.close()
