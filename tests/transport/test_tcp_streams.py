"""Several TCP data connections (streams) from one rank to one peer, on real sockets.

A second stream opens when two threads send large frames to one peer at once, never for small
frames, and is authenticated like the first; the acceptor refuses a stream number beyond
``MAX_STREAMS``; a peer has departed only when every stream it opened said goodbye, and a stream
that breaks without one is a lost peer.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

from cluster.deadline import Deadline
from cluster.errors import ClusterSpecMismatchError, CollectiveTimeoutError, PeerUnavailableError
from cluster.transport import _tcp_outbound
from cluster.transport import _tcp_protocol as wire
from cluster.transport._sockio import recv_exact
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.tcp import MAX_STREAMS, TcpDataPlane

from .conftest import TOKEN, NetworkGroup

pytestmark = pytest.mark.timeout(60)

PEERS = [PeerInfo(0, "worker:0", "127.0.0.1:1"), PeerInfo(1, "worker:1", "127.0.0.1:2")]
LARGE = 4 << 20  # far above SMALL_PAYLOAD, and above what two sockets' buffers hold


def _key(seq: int) -> MessageKey:
    return MessageKey("g", seq, 0)


def _payload(seq: int, nbytes: int = LARGE) -> bytes:
    return np.random.default_rng(seq).integers(0, 256, nbytes, np.uint8).tobytes()


class _Inbox:
    """An acceptor's callbacks: what arrived (and on which receiver thread), losses, departures.
    While ``gate`` is clear, delivery blocks (at most 20 s): the receiver thread stops reading,
    so senders on that connection block once the socket buffers are full."""

    def __init__(self, gated: bool = False) -> None:
        self.cond = threading.Condition()
        self.got: dict[MessageKey, bytes] = {}
        self.threads: set[int] = set()
        self.lost: list[tuple[int, str]] = []
        self.departed: list[tuple[int, str]] = []
        self.gate = threading.Event()
        if not gated:
            self.gate.set()

    def on_message(self, src, key, received) -> None:
        with self.cond:
            self.got[key] = bytes(received.payload)
            self.threads.add(threading.get_ident())
            self.cond.notify_all()
        self.gate.wait(20)

    def on_lost(self, src, why) -> None:
        with self.cond:
            self.lost.append((src, why))
            self.cond.notify_all()

    def on_departed(self, src, lost) -> None:
        with self.cond:
            self.departed.append((src, lost))
            self.cond.notify_all()

    def wait(self, predicate, timeout: float = 20) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), "not within the timeout"


def _plane(me: int, inbox: _Inbox | None = None, key: bytes = b"k") -> TcpDataPlane:
    inbox = inbox or _Inbox()
    return TcpDataPlane(PEERS[me], PEERS, key, "127.0.0.1", on_message=inbox.on_message,
                        on_lost=inbox.on_lost, on_departed=inbox.on_departed)


@pytest.fixture
def pair():
    """A dialer (rank 0) connected to an acceptor (rank 1) whose deliveries are gated."""
    inbox = _Inbox(gated=True)
    acceptor, dialer = _plane(1, inbox), _plane(0)
    dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(10))
    yield dialer, acceptor, inbox
    inbox.gate.set()
    dialer.close(Deadline.after(2))
    acceptor.close(Deadline.after(2))


def _send_in_threads(dialer: TcpDataPlane,
                     plan: list[list[int]]) -> tuple[list[BaseException], list[threading.Thread]]:
    """Start one thread per list of ``plan``, each sending those frames in order to rank 1."""
    errors: list[BaseException] = []

    def send(seqs: list[int]) -> None:
        try:
            for seq in seqs:
                dialer.send(1, _key(seq), _payload(seq), "", Deadline.after(30))
        except BaseException as e:  # asserted by the caller
            errors.append(e)

    threads = [threading.Thread(target=send, args=(seqs,)) for seqs in plan]
    for t in threads:
        t.start()
    return errors, threads


def test_two_threads_sending_large_frames_at_once_open_a_second_stream(pair) -> None:
    dialer, acceptor, inbox = pair
    # Deliveries are held: the first frame on a connection is read whole, then its receiver
    # blocks, and the next sender on that connection blocks in the kernel holding it. So the
    # threads meet a busy stream 0 whatever their order, open stream 1 and fill it too; a third
    # thread then waits for a free stream.
    errors, threads = _send_in_threads(dialer, [[1, 2, 3], [11, 12, 13], [21, 22]])
    inbox.wait(lambda: len(inbox.threads) == 2)  # one frame through each receiver thread
    assert dialer.streams(1) == MAX_STREAMS == 2
    with acceptor._lock:
        assert set(acceptor._inbound) == {(0, 0), (0, 1)}
    inbox.gate.set()
    for t in threads:
        t.join(30)
    assert errors == []
    inbox.wait(lambda: len(inbox.got) == 8)
    for seq in (1, 2, 3, 11, 12, 13, 21, 22):
        assert inbox.got[_key(seq)] == _payload(seq), seq
    assert dialer.streams(1) == 2  # never more than MAX_STREAMS


def test_small_frames_never_open_a_second_stream(pair) -> None:
    dialer, _, inbox = pair
    inbox.gate.set()
    first = dialer._outbound[1].streams[0]
    small = _tcp_outbound.SMALL_PAYLOAD
    with first.lock:  # stream 0 busy, as if another thread were sending on it
        with pytest.raises(CollectiveTimeoutError, match="worker:1"):
            dialer.send(1, _key(1), b"s" * small, "", Deadline.after(0.3))
        assert dialer.streams(1) == 1  # it waited for stream 0, until its deadline
        # The control: one byte more, and the frame opens stream 1 and goes.
        dialer.send(1, _key(2), b"L" * (small + 1), "", Deadline.after(10))
        assert dialer.streams(1) == 2
    inbox.wait(lambda: _key(2) in inbox.got)
    assert inbox.got[_key(2)] == b"L" * (small + 1) and _key(1) not in inbox.got


def test_a_peer_that_refuses_a_second_stream_is_not_asked_again_for_a_while(pair) -> None:
    dialer, acceptor, inbox = pair
    inbox.gate.set()
    answered = []
    real = acceptor._check_proof

    def busy(conn, *args):  # every later connection closed unanswered, as a full acceptor does
        answered.append(conn)
        raise EOFError("busy")

    acceptor._check_proof = busy
    first = dialer._outbound[1].streams[0]
    try:
        with first.lock:
            for seq in (1, 2):
                with pytest.raises(CollectiveTimeoutError):
                    dialer.send(1, _key(seq), _payload(seq), "", Deadline.after(0.5))
        assert len(answered) == 1  # tried once, then remembered
        assert dialer.streams(1) == 1
    finally:
        acceptor._check_proof = real
    dialer.send(1, _key(3), _payload(3), "", Deadline.after(10))  # stream 0 still serves
    inbox.wait(lambda: _key(3) in inbox.got)
    assert inbox.got[_key(3)] == _payload(3)


# -- the handshake names the stream ----------------------------------------------------------

def _dial(port: int, key: bytes, stream: int, *, mac_stream: int | None = None,
          src: int = 0, dst: int = 1) -> tuple[socket.socket, bytes]:
    """The connector's handshake by hand, as rank ``src`` on ``stream`` (with a MAC computed
    for ``mac_stream``, if given); returns the socket and the acceptor's answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    first = recv_exact(s, wire.SERVER_HELLO_BYTES)
    nonce = wire.new_nonce()
    facts = wire.Facts(first[len(wire.MAGIC):], nonce, src, dst, 2,
                       stream if mac_stream is None else mac_stream, f"worker:{src}",
                       f"worker:{dst}")
    s.sendall(wire.HELLO.pack(wire.MAGIC, src, dst, 2, stream, nonce,
                              wire.client_mac(key, facts)))
    try:
        return s, recv_exact(s, wire.SERVER_PROOF_BYTES)
    except (EOFError, ConnectionResetError):
        return s, b""


def test_a_second_stream_is_authenticated_and_its_number_bounded() -> None:
    acceptor = _plane(1, key=b"right")
    opened = []
    try:
        for key, stream, mac_stream, refusal in [
            (b"wrong", 1, None, wire.Refusal.BAD_MAC),
            (b"right", 1, 0, wire.Refusal.BAD_MAC),  # the MAC covers the stream number
            (b"right", MAX_STREAMS, None, wire.Refusal.BAD_STREAM),
            (b"right", (1 << 32) - 1, None, wire.Refusal.BAD_STREAM),
            (b"wrong", MAX_STREAMS, None, wire.Refusal.BAD_MAC),  # no token: told nothing more
        ]:
            sock, answer = _dial(acceptor.port, key, stream, mac_stream=mac_stream)
            sock.close()
            assert answer == wire.encode_refusal(refusal), (key, stream, mac_stream)
        # The control: the right token, for streams 0 and 1, gets the acceptor's proof, and a
        # second connection on a stream already held is a transient duplicate.
        for stream in (0, 1):
            sock, answer = _dial(acceptor.port, b"right", stream)
            opened.append(sock)
            assert answer.startswith(wire.MAGIC) and len(answer) == wire.SERVER_PROOF_BYTES
        sock, answer = _dial(acceptor.port, b"right", 1)
        sock.close()
        assert answer == wire.encode_refusal(wire.Refusal.DUPLICATE)
    finally:
        for sock in opened:
            sock.close()
        acceptor.close(Deadline.after(2))


def test_a_connector_refused_a_stream_number_says_so() -> None:
    acceptor = _plane(1)
    dialer = _tcp_outbound.Dialer(PEERS[0], 2, b"k", None, threading.Event())
    try:
        with pytest.raises(ClusterSpecMismatchError, match="worker:1 .*#2.*versions"):
            dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(5),
                           stream=MAX_STREAMS)
    finally:
        acceptor.close(Deadline.after(2))


# -- departed only when every stream said goodbye; lost when one breaks -----------------------

def _bye(lost: bytes = b"") -> bytes:
    return wire.encode_header(wire.BYE, lost, b"", 0, 0, 0, 0)


def _eof(sock: socket.socket, timeout: float = 10) -> bool:
    """Whether the acceptor closed ``sock`` (it does once it has handled the connection's end)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_goodbye_on_one_stream_leaves_a_frame_in_flight_on_the_other_deliverable() -> None:
    group = NetworkGroup(2, data_plane="tcp", lazy=True)  # no route yet: the raw ones are rank 0's
    receiver = group.transports[1]
    key, payload = _key(7), _payload(7, 1 << 20)
    got: list[object] = []
    waiting = threading.Thread(
        target=lambda: got.append(_recv_or_error(receiver, key, Deadline.after(20))))
    s0, answer0 = _dial(receiver.data_port, TOKEN.value.encode(), 0)
    s1, answer1 = _dial(receiver.data_port, TOKEN.value.encode(), 1)
    try:
        assert answer0.startswith(wire.MAGIC) and answer1.startswith(wire.MAGIC)
        waiting.start()
        header = wire.encode_header(wire.DATA, b"g", b"", key.step, key.chunk, key.seq,
                                    len(payload))
        s1.sendall(header + payload[:1000])  # a frame begun on stream 1...
        s0.sendall(_bye())  # ...and the goodbye on stream 0, handled first
        assert _eof(s0)
        s1.sendall(payload[1000:])
        waiting.join(20)
        assert got and got[0] == payload, got  # delivered, not "left the group"
        assert not receiver.departed("worker:0")
        s1.sendall(_bye())
        assert _eof(s1)
        assert receiver.departed("worker:0")  # now every stream has said goodbye
        with pytest.raises(PeerUnavailableError, match="worker:0 .*left the group"):
            receiver.recv(0, _key(8), deadline=Deadline.after(5))
    finally:
        s0.close()
        s1.close()
        group.close()


def _recv_or_error(transport, key: MessageKey, deadline: Deadline) -> object:
    try:
        return bytes(transport.recv(0, key, deadline=deadline).payload)
    except Exception as e:  # returned, so the test shows what went wrong
        return e


def test_a_stream_that_breaks_without_goodbye_is_a_lost_peer(pair) -> None:
    dialer, acceptor, inbox = pair
    inbox.gate.set()
    with dialer._outbound[1].streams[0].lock:  # stream 0 busy: the frame opens stream 1
        dialer.send(1, _key(1), _payload(1), "", Deadline.after(10))
    inbox.wait(lambda: _key(1) in inbox.got)
    assert dialer.streams(1) == 2
    second = dialer._outbound[1].streams[1].sock
    socket.socket.shutdown(second, socket.SHUT_RDWR)  # as a killed process's socket ends
    inbox.wait(lambda: inbox.lost)
    assert inbox.lost[0][0] == 0 and "broke" in inbox.lost[0][1]
    assert inbox.departed == []


@pytest.mark.parametrize("how", ["closed", "reset"])
def test_a_second_stream_abandoned_before_its_first_frame_is_no_loss(how) -> None:
    inbox = _Inbox()
    acceptor = _plane(1, inbox)
    try:
        s0, _ = _dial(acceptor.port, b"k", 0)
        s1, answer = _dial(acceptor.port, b"k", 1)
        assert answer.startswith(wire.MAGIC)
        if how == "reset":  # as a close with the proof still unread ends it
            s1.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s1.close()  # its connector gave up on it (say, its own deadline passed)
        deadline = Deadline.after(10)
        while True:
            with acceptor._lock:
                if (0, 1) not in acceptor._inbound:
                    break
            assert not deadline.expired, "stream 1 still registered"
            time.sleep(0.01)
        assert inbox.lost == [] and inbox.departed == []
        s0.sendall(_bye(b"worker:9"))  # then the peer leaves: departed, naming its reason
        inbox.wait(lambda: inbox.departed)
        assert inbox.departed == [(0, "worker:9")] and inbox.lost == []
        s0.close()
    finally:
        acceptor.close(Deadline.after(2))


def test_close_says_goodbye_on_every_stream(pair) -> None:
    dialer, _, inbox = pair
    inbox.gate.set()
    with dialer._outbound[1].streams[0].lock:
        dialer.send(1, _key(1), _payload(1), "", Deadline.after(10))
    assert dialer.streams(1) == 2
    dialer.close(Deadline.after(5), "worker:5")
    inbox.wait(lambda: inbox.departed)
    assert inbox.departed == [(0, "worker:5")] and inbox.lost == []


def test_a_two_lane_ring_at_two_ranks_sends_on_two_streams_each_way() -> None:
    """At N = 2 both lanes' neighbour is the one peer: their frames go on a stream each, drained
    by a receiver thread each (the point of streams). Whether the lanes meet on one stream is a
    matter of timing, so the ring runs a few times; a 16 MiB ring meets at once in practice."""
    from cluster.collectives import CollectiveGroup
    from cluster.collectives.options import CollectivePath, CollectiveSettings

    group = NetworkGroup(2, data_plane="tcp")
    try:
        settings = CollectiveSettings(path=CollectivePath.NETWORK, lanes=2)
        groups = [CollectiveGroup(t, name="lanes", settings=settings) for t in group.transports]
        inputs = [np.full(4 << 20, r + 1, np.float32) for r in range(2)]
        for _ in range(5):
            results: list[object] = [None, None]

            def run(r: int, results: list[object] = results) -> None:
                try:
                    results[r] = groups[r].all_reduce(inputs[r])
                except Exception as e:  # asserted below
                    results[r] = e

            threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            for result in results:
                assert isinstance(result, np.ndarray), result
                assert np.array_equal(result, np.full(4 << 20, 3, np.float32))
            if all(t._tcp.streams(1 - t.rank) == 2 for t in group.transports):
                break
        assert [t._tcp.streams(1 - t.rank) for t in group.transports] == [2, 2]
    finally:
        group.close()
