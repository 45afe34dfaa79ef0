"""Exchange streams from callers with the token that are buggy or lying,
and the close of a stream to a silent peer:
frames claiming sizes they never send, frames out of order, streams that name a rank and send
nothing. The receiving task holds only what arrived, answers INVALID_ARGUMENT, and never takes
such a stream for the named peer leaving or dying."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
import tracemalloc

import grpc
import pytest

from cluster.deadline import Deadline
from cluster.errors import CollectiveTimeoutError
from cluster.testing import TaskProcess
from cluster.transport import _framing
from cluster.transport._grpc_plane import Outbox, Reassembler
from cluster.transport._pb import collective_pb2
from cluster.transport._tcp_protocol import MAX_PAYLOAD_BYTES
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.server import TaskServer
from tests.conftest import REPO

from .conftest import TOKEN, NetworkGroup

pytestmark = pytest.mark.timeout(60)

EXCHANGE = "/cluster_runtime.v1.Collective/Exchange"
CLAIM = 384 << 20  # what each hostile frame claims; it carries 32 bytes


def _frame(seq: int, data: bytes, *, offset: int = 0, total: int | None = None,
           src: int = 1) -> bytes:
    header = collective_pb2.Frame(src_rank=src, group="g", seq=seq, offset=offset,
                                  total_bytes=len(data) if total is None else total)
    return _framing.encode(header, data)


def _feed(reassembler: Reassembler, raw: bytes):
    return reassembler.feed(*_framing.decode(raw))


# -- the reassembler alone ---------------------------------------------------------------------


def test_frames_join_in_order_and_a_whole_frame_passes_straight_through() -> None:
    r = Reassembler()
    key, whole = _feed(r, _frame(0, b"abc"))
    assert key == MessageKey("g", 0, 0) and bytes(whole.payload) == b"abc"
    assert _feed(r, _frame(1, b"ab", total=5)) is None
    assert _feed(r, _frame(1, b"cd", offset=2, total=5)) is None
    key, joined = _feed(r, _frame(1, b"e", offset=4, total=5))
    assert key.seq == 1 and bytes(joined.payload) == b"abcde" and r.unfinished == 0


@pytest.mark.parametrize(("frames", "message"), [
    ([_frame(0, b"x", total=MAX_PAYLOAD_BYTES + 1)], "more than"),
    ([_frame(0, b"x", total=1 << 40 | 1)], "more than"),
    ([_frame(0, b"xyz", total=2)], "bytes 0..3 of a 2-byte"),
    ([_frame(0, b"x", offset=4, total=8)], "never started"),
    ([_frame(0, b"ab", total=8), _frame(0, b"cd", offset=4, total=8)], "expected 2"),
    ([_frame(0, b"ab", total=8), _frame(0, b"ab", offset=0, total=8)], "expected 2"),
])
def test_frames_that_do_not_continue_their_message_exactly_are_refused(frames, message) -> None:
    r = Reassembler()
    for raw in frames[:-1]:
        _feed(r, raw)
    with pytest.raises(_framing.FrameError, match=message):
        _feed(r, frames[-1])


def test_memory_follows_the_bytes_that_arrived_not_the_size_claimed() -> None:
    r = Reassembler(max_partial=4)
    tracemalloc.start()
    try:
        for seq in range(4):
            assert _feed(r, _frame(seq, b"x" * 32, total=CLAIM)) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"4 frames of 32 bytes cost {peak} bytes"
    with pytest.raises(_framing.FrameError, match="more than 4 unfinished"):
        _feed(r, _frame(9, b"x" * 32, total=CLAIM))


# -- a real task under attack --------------------------------------------------------------------


def _status_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"{key} missing from /proc/{pid}/status")


@pytest.mark.skipif(shutil.which("prlimit") is None,
                    reason="needs prlimit (util-linux) to confine the victim's memory")
def test_frames_claiming_huge_messages_cost_nothing_and_are_refused_as_invalid() -> None:
    argv = ["prlimit", f"--data={1 << 30}", sys.executable, "-m", "tests.transport._grpc_victim"]
    with TaskProcess(argv, name="victim", cwd=REPO) as victim:
        address = victim.read_until("\nready", timeout=30).split("address ")[1].split()[0]
        before = _status_mib(victim.pid, "VmRSS")
        frames = [_frame(seq, b"x" * 32, total=CLAIM) for seq in range(8)]
        frames.append(_frame(98, b"x" * 32, total=1 << 40))  # once a MemoryError (UNKNOWN)
        frames.append(_frame(99, b"x" * 32, total=1 << 41))  # beyond any message: refused
        md = (*TOKEN.metadata, ("x-src-rank", "1"))
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                channel.stream_unary(EXCHANGE)(iter(frames), timeout=20, metadata=md)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
        assert "more than" in raised.value.details()
        growth = _status_mib(victim.pid, "VmHWM") - before
        assert growth < 16, f"8 frames of 32 bytes grew the task by {growth:.0f} MiB"
        # The real rank 1 still reaches rank 0: the refused stream was not taken for it.
        victim.kill(signal.SIGUSR1)
        victim.read_until("roundtrip ok", timeout=20)  # raises with the output otherwise


# -- streams that name a rank and send nothing ---------------------------------------------------


def _bogus_stream(address: str, how: str) -> None:
    """An Exchange stream naming rank 1 that carries no data, ended the way ``how`` says."""
    md = (*TOKEN.metadata, ("x-src-rank", "1"))
    with grpc.insecure_channel(address) as channel:
        method = channel.stream_unary(EXCHANGE)
        if how == "empty":
            method(iter(()), timeout=10, metadata=md)  # returns once the handler has returned
            return
        if how == "garbage":
            with pytest.raises(grpc.RpcError):
                method(iter([b"\x7a\xff\xff\xff\x0f"]), timeout=10, metadata=md)
            return
        release = threading.Event()

        def nothing():
            release.wait(10)
            yield from ()

        call = method.future(nothing(), timeout=10, metadata=md)
        # Cancelled at once, the call may never reach the server; wait until it surely has.
        threading.Event().wait(0.3)
        call.cancel()
        release.set()


@pytest.mark.parametrize("how", ["empty", "garbage", "cancelled"])
def test_a_stream_naming_a_rank_that_sends_nothing_is_not_that_rank_leaving(how: str) -> None:
    group = NetworkGroup(2, data_plane="grpc")
    try:
        a, b = group.transports
        _bogus_stream(group.servers[0].address, how)
        if how == "cancelled":
            # The server learns of the cancellation on its own; give it that long to (wrongly)
            # act on it. Under load this can only make the test pass wrongly, never fail.
            threading.Event().wait(0.5)
        # Rank 1 has not left: a wait on it runs to its deadline instead of failing at once.
        with pytest.raises(CollectiveTimeoutError):
            a.recv(1, MessageKey("g", 7, 0), deadline=Deadline.after(1.0))
        assert not a.failed
        b.send(0, MessageKey("g", 8, 0), b"alive", deadline=Deadline.after(5))
        assert bytes(a.recv(1, MessageKey("g", 8, 0), deadline=Deadline.after(5)).payload) == \
            b"alive"
    finally:
        group.close()


# -- closing a stream to a peer that went silent (item 10) -------------------------------------


def test_closing_a_stream_to_a_silent_peer_cancels_it_at_the_deadline() -> None:
    """A partitioned peer never finishes the stream: ``close`` must end at its deadline with the
    stream cancelled, not raise gRPC's own timeout class out of the shutdown path."""
    release = threading.Event()

    def silent(request_iterator, context):
        release.wait(20)  # reads nothing, answers nothing: a peer behind a partition
        return b""

    server = TaskServer("127.0.0.1:0", TOKEN)
    server.add_handlers("t.Silent", {"Exchange": grpc.stream_unary_rpc_method_handler(silent)})
    server.start()
    failures: list = []
    try:
        with grpc.insecure_channel(server.address) as channel:
            peer = PeerInfo(1, "worker:1", server.address)
            outbox = Outbox(peer, channel, "/t.Silent/Exchange", TOKEN.metadata, failures.append)
            outbox.put(b"frame", Deadline.after(5), MessageKey("g", 0, 0))
            started = time.monotonic()
            outbox.close(Deadline.after(0.5))  # raised grpc.FutureTimeoutError when uncaught
            assert time.monotonic() - started < 5
    finally:
        release.set()
        server.stop(0)
    assert failures == []  # a close is no failure of the group
