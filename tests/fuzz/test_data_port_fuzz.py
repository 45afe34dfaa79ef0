"""Raw bytes at a task's TCP data port: random and mutated handshakes from
callers without the token, then, with it, random and mutated frames on an authenticated
connection.

Without the token every connection is answered with nothing or a refusal (never the acceptor's
proof) and closed by the victim within its handshake deadline, and afterwards the port takes
fresh connections from real peers: the in-process rank 1 and this process's rank 2 open theirs
only after the fuzz (``assert_serves_real_peers``).

With the token the fuzz claims rank 3 (see ``test_grpc_fuzz``): a connection whose bytes break
the protocol is that peer lost, which fails the group by design, so that part runs last and
checks what must survive it: the process, its memory bound, its health check and variables.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.deadline import Deadline
from cluster.transport import _tcp_protocol as wire
from cluster.transport._sockio import recv_exact, send_all
from cluster.transport.ps_client import PsClient
from cluster.transport.tcp import HANDSHAKE_TIMEOUT
from tests.fuzz._strategies import mutate
from tests.fuzz._victim import TASKS
from tests.fuzz.conftest import EXAMPLES, TOKEN, Victim, assert_serves_real_peers

# Examples take well under a second each; a developer's long run (CLUSTER_FUZZ_EXAMPLES) gets
# a timeout that grows with it.
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120 + 2 * EXAMPLES)]

KEY = TOKEN.value.encode()
CLOSE_WITHIN = HANDSHAKE_TIMEOUT + 25.0  # the victim's deadline, and room for a busy machine
MAX_GROWTH_MIB = 32  # see test_grpc_fuzz


def _hello(src: int, dst: int, world: int, server_nonce: bytes, key: bytes,
           magic: bytes = wire.MAGIC, stream: int = 0) -> bytes:
    nonce = wire.new_nonce()
    tasks = [TASKS[src] if src < len(TASKS) else "x", TASKS[dst] if dst < len(TASKS) else "x"]
    mac = wire.client_mac(key, wire.Facts(server_nonce, nonce, src, dst, world, stream, *tasks))
    return wire.HELLO.pack(magic, src, dst, world, stream, nonce, mac)


@st.composite
def handshakes(draw, server_nonce: bytes) -> bytes:
    """What a caller without the token sends first: garbage, the protocol's own bytes with a
    wrong key or mutated, cut short, or followed by more."""
    u32 = st.one_of(st.integers(0, 5), st.integers(0, (1 << 32) - 1))
    # b"CRDATA01": the previous version of the protocol (a hello without a stream).
    hello = _hello(draw(u32), draw(u32), draw(u32), server_nonce,
                   draw(st.sampled_from([b"", b"wrong", KEY + b"x"])),
                   draw(st.sampled_from([wire.MAGIC, wire.MAGIC_TLS, b"CRDATA01", b"CRDATA03"])),
                   draw(u32))
    return draw(st.one_of(
        st.binary(max_size=256),
        mutate(hello),
        st.just(hello[:draw(st.integers(0, len(hello)))]),
        st.binary(max_size=4096).map(lambda tail: hello + tail),
    ))


def _drain(sock: socket.socket, deadline: Deadline) -> bytes:
    """Everything the victim sends until it closes the connection; fails past ``deadline``."""
    got = bytearray()
    while True:
        sock.settimeout(max(deadline.remaining(), 0.01))
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            raise AssertionError(f"the data port kept a stranger's connection open over "
                                 f"{CLOSE_WITHIN} s") from None
        except ConnectionResetError:
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk


@settings(max_examples=EXAMPLES * 2)
@given(data=st.data())
def test_strangers_handshakes_are_refused_and_closed(victim: Victim, data) -> None:
    deadline = Deadline.after(CLOSE_WITHIN)
    with socket.create_connection(("127.0.0.1", victim.data_port), timeout=30) as sock:
        first = recv_exact(sock, wire.SERVER_HELLO_BYTES, deadline)
        assert first[:len(wire.MAGIC)] == wire.MAGIC
        sent = data.draw(handshakes(first[len(wire.MAGIC):]))
        try:
            send_all(sock, sent, deadline)
            sock.shutdown(socket.SHUT_WR)  # so that a short handshake is seen at once
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: the victim already closed it
            pass
        answer = _drain(sock, deadline)
    assert answer == b"" or wire.decode_refusal(answer) is not None, answer


def test_a_silent_stranger_is_dropped_at_the_handshake_deadline(victim: Victim) -> None:
    deadline = Deadline.after(CLOSE_WITHIN)
    with socket.create_connection(("127.0.0.1", victim.data_port), timeout=30) as sock:
        assert recv_exact(sock, wire.SERVER_HELLO_BYTES, deadline)[:len(wire.MAGIC)] == \
            wire.MAGIC
        assert _drain(sock, deadline) == b""


def test_after_strangers_the_port_serves_real_peers(victim: Victim) -> None:
    assert_serves_real_peers(victim, seq=1)  # rank 1 and 2 connect to the data port now


@st.composite
def frames(draw) -> bytes:
    """Frames of an authenticated connection: well-formed, mutated, cut, or garbage."""
    group = draw(st.sampled_from([b"fuzz", b"g", b"\xff\xfe", b"x" * 2000]))
    signature = draw(st.sampled_from([b"", b"sig", b"\x80"]))
    payload = draw(st.binary(max_size=64))
    nbytes = draw(st.sampled_from([len(payload), len(payload) + 1, 1 << 40, (1 << 64) - 1]))
    header = wire.FRAME.pack(draw(st.sampled_from([wire.DATA, wire.BYE, 0, 7])), len(group),
                             len(signature), draw(st.integers(0, 3)), 0,
                             draw(st.integers(0, 1 << 63)), min(nbytes, (1 << 64) - 1))
    raw = header + group + signature + payload
    return draw(st.one_of(st.just(raw), mutate(raw), st.binary(max_size=64)))


@settings(max_examples=EXAMPLES)
@given(sent=st.lists(frames(), min_size=1, max_size=4))
def test_authenticated_garbage_frames_never_crash_the_victim(victim: Victim, sent) -> None:
    deadline = Deadline.after(CLOSE_WITHIN)
    with socket.create_connection(("127.0.0.1", victim.data_port), timeout=30) as sock:
        first = recv_exact(sock, wire.SERVER_HELLO_BYTES, deadline)
        send_all(sock, _hello(3, 0, len(TASKS), first[len(wire.MAGIC):], KEY), deadline)
        proof = recv_exact(sock, wire.SERVER_PROOF_BYTES, deadline)
        if wire.decode_refusal(proof) == wire.Refusal.DUPLICATE:
            return  # the previous example's connection is not seen closed yet
        assert proof[:len(wire.MAGIC)] == wire.MAGIC, proof
        try:
            send_all(sock, b"".join(sent), deadline)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the victim already closed it (a bad frame)
            pass
        _drain(sock, deadline)  # the victim closes it: a bad frame, or our end of stream
    victim.assert_healthy()


def test_after_authenticated_garbage_the_task_is_bounded_and_serving(victim: Victim) -> None:
    victim.assert_healthy()
    growth = victim.status_mib("VmRSS") - victim.rss_before
    assert growth < MAX_GROWTH_MIB, f"victim grew {growth:.0f} MiB during the fuzz"
    with PsClient(victim.address, TOKEN, task=TASKS[0]) as ps:
        ps.create("real/after-frames", np.ones(3, np.float32), timeout=30)
        [pulled] = ps.pull(["real/after-frames"], timeout=30)
        np.testing.assert_array_equal(pulled.value, np.ones(3, np.float32))
