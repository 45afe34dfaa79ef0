"""The TCP data plane's handshake under hostile connections.

A slow drip is dropped at the handshake's one deadline; a flood of hostile connections does
not keep a real peer out; a connector whose connection is closed before the acceptor answered
retries and, if it never gets in, fails with a transient error, not a token mismatch.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cluster.deadline import Deadline
from cluster.errors import ClusterSpecMismatchError, PeerUnavailableError, UnauthenticatedError
from cluster.transport import _tcp_protocol as wire
from cluster.transport import tcp
from cluster.transport._sockio import recv_exact
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.network import NetworkTransport
from cluster.transport.server import TaskServer
from cluster.transport.tcp import TcpDataPlane

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)

PEERS = [PeerInfo(0, "worker:0", "127.0.0.1:1"), PeerInfo(1, "worker:1", "127.0.0.1:2")]
KEY = MessageKey("g", 0, 0)


def _plane(me: int, key: bytes = b"k", peers: list[PeerInfo] = PEERS, **callbacks) -> TcpDataPlane:
    return TcpDataPlane(peers[me], peers, key, "127.0.0.1",
                        on_message=callbacks.get("on_message", lambda *a: None),
                        on_lost=lambda *a: None, on_departed=lambda *a: None)


def _hostile_hello() -> bytes:
    """What a stranger can send: a well-formed hello with a MAC it cannot compute."""
    return wire.HELLO.pack(wire.MAGIC, 0, 1, 2, 0, wire.new_nonce(), b"\0" * 32)


def _closed(sock: socket.socket, wait: float) -> bool:
    """Whether the other side closed ``sock`` (EOF or reset), waiting at most ``wait`` s."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


# -- (a) one deadline for the whole handshake ----------------------------------------------------

def test_slow_drip_is_dropped_within_the_handshake_deadline(monkeypatch) -> None:
    # A byte every 0.25 s never lets a per-read timeout of 1 s expire; the handshake's one
    # deadline (1 s from accept) must still end it. The bound is generous for a loaded machine.
    monkeypatch.setattr(tcp, "HANDSHAKE_TIMEOUT", 1.0)
    plane = _plane(1)
    try:
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", plane.port), timeout=5) as s:
            assert recv_exact(s, wire.SERVER_HELLO_BYTES).startswith(wire.MAGIC)
            dropped_after = None
            for byte in _hostile_hello():  # 88 bytes: 22 s of dripping, were it never dropped
                try:
                    s.send(bytes((byte,)))
                except OSError:
                    dropped_after = time.monotonic() - start
                    break
                if _closed(s, 0.25):
                    dropped_after = time.monotonic() - start
                    break
                if time.monotonic() - start > 10:
                    break
        assert dropped_after is not None, "a slow drip kept its handshake open for 10 s"
        assert 0.5 < dropped_after < 1.0 + 4.0, dropped_after
    finally:
        plane.close(Deadline.after(2))


# -- (b) a flood does not keep a real peer out -----------------------------------------------------

class _Flood:
    """``n`` hostile connections to each port, opened at once and then kept alive by a drip of
    one hello byte every 0.5 s (well inside any per-read timeout), until ``stop()``."""

    def __init__(self, ports: list[int], n: int) -> None:
        self.socks: list[socket.socket] = []
        self._stop = threading.Event()
        for _ in range(n):
            for port in ports:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                self.socks.append(s)
                # The acceptor has taken it up (a challenge) or turned it away (EOF): either
                # way the slots are as full as this flood can make them before the peer dials.
                s.recv(wire.SERVER_HELLO_BYTES)
        self._hello = _hostile_hello()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _drip(self) -> None:
        i = 0
        while not self._stop.wait(0.5):
            for s in self.socks:
                try:
                    s.send(self._hello[i:i + 1])
                except OSError:
                    pass  # dropped by the acceptor: that is the point
            i = min(i + 1, len(self._hello) - 2)  # never complete the hello

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.socks:
            s.close()


def _start_group(n: int) -> tuple[list[TaskServer], list[NetworkTransport]]:
    servers = [TaskServer("127.0.0.1:0", TOKEN) for _ in range(n)]
    endpoints = [CollectiveEndpoint.install(s, f"worker:{r}", heartbeat_interval=0.2)
                 for r, s in enumerate(servers)]
    for s in servers:
        s.start()
    peers = [PeerInfo(r, f"worker:{r}", s.address) for r, s in enumerate(servers)]
    transports = [NetworkTransport(e, r, peers, TOKEN, data_plane="tcp")
                  for r, e in enumerate(endpoints)]
    return servers, transports


def _stop_group(servers: list[TaskServer], transports: list[NetworkTransport]) -> None:
    for t in transports:
        t.close(Deadline.after(2))
    for s in servers:
        s.stop(0)


def test_200_hostile_connections_do_not_keep_a_real_peer_out() -> None:
    servers, transports = _start_group(2)
    flood = None
    try:
        ports = [t.data_port for t in transports]
        flood = _Flood(ports, 100)  # 200 in all, 100 at each rank's data port
        errors: list[BaseException] = []

        def connect(t: NetworkTransport) -> None:
            try:
                t.connect(Deadline.after(20))
            except BaseException as e:  # asserted below
                errors.append(e)

        threads = [threading.Thread(target=connect, args=(t,)) for t in transports]
        for th in threads:
            th.start()
        for th in threads:
            th.join(25)
        assert errors == []
        a, b = transports
        assert a.data_planes == {1: "tcp"} and b.data_planes == {0: "tcp"}  # not fallen back
        payload = bytes(range(256)) * 4096  # 1 MiB, with the flood still dripping
        a.send(1, KEY, payload, deadline=Deadline.after(10))
        b.send(0, KEY, b"back", deadline=Deadline.after(10))
        assert bytes(b.recv(0, KEY, deadline=Deadline.after(10)).payload) == payload
        assert bytes(a.recv(1, KEY, deadline=Deadline.after(10)).payload) == b"back"
    finally:
        if flood is not None:
            flood.stop()
        _stop_group(servers, transports)


# -- (c) closed before answering is transient, never a wrong token ---------------------------------

class _Slammer:
    """A port that accepts every connection and closes it at once (a full acceptor)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        socket.socket.shutdown(self.listener, socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(5)


def test_dialer_closed_before_the_handshake_gets_a_transient_error_not_the_token() -> None:
    slammer = _Slammer()
    plane = _plane(0)
    try:
        with pytest.raises(OSError) as caught:  # on the base commit: UnauthenticatedError
            plane.connect(PEERS[1], "127.0.0.1", slammer.port, Deadline.after(1.5))
        assert isinstance(caught.value, tcp.HandshakeDroppedError)
        assert "CLUSTER_TOKEN" not in str(caught.value) and "busy" in str(caught.value)
        assert slammer.accepted >= 2  # it retried within its deadline
        assert plane.routes() == set()
    finally:
        plane.close(Deadline.after(2))
        slammer.close()


def test_dialer_retries_a_busy_acceptor_and_gets_in() -> None:
    got: list[bytes] = []
    arrived = threading.Event()

    def on_message(src, key, received) -> None:
        got.append(bytes(received.payload))
        arrived.set()

    acceptor = _plane(1, on_message=on_message)
    real = acceptor._check_proof
    turned_away = []

    def busy_twice(conn, *args):  # closes the first two unheard, as a full acceptor does
        if len(turned_away) < 2:
            turned_away.append(conn)
            raise EOFError("busy")
        return real(conn, *args)

    acceptor._check_proof = busy_twice
    dialer = _plane(0)
    try:
        dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(10))
        assert len(turned_away) == 2
        dialer.send(1, KEY, b"in", "", Deadline.after(5))
        assert arrived.wait(5) and got == [b"in"]
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))


def test_group_whose_data_port_never_answers_fails_transient_not_unauthenticated(
        monkeypatch) -> None:
    def always_busy(self, conn, *args):
        raise EOFError("pending-handshake slots full")

    monkeypatch.setattr(TcpDataPlane, "_check_proof", always_busy)
    servers, transports = _start_group(2)
    try:
        with pytest.raises(PeerUnavailableError) as caught:  # retryable: exit 201, not 1
            transports[0].connect(Deadline.after(2))
        assert "CLUSTER_TOKEN" not in str(caught.value)
        assert caught.value.task == "worker:1"
    finally:
        _stop_group(servers, transports)


# -- what a refusal that was heard out tells the connector ---------------------------------------

def test_a_wrong_token_is_still_reported_as_a_wrong_token() -> None:
    acceptor, dialer = _plane(1, key=b"one"), _plane(0, key=b"another")
    try:
        with pytest.raises(UnauthenticatedError, match="worker:1 .*CLUSTER_TOKEN"):
            dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(5))
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))


def test_another_group_size_is_a_spec_mismatch() -> None:
    acceptor = _plane(1)
    dialer = _plane(0, peers=[*PEERS, PeerInfo(2, "worker:2", "127.0.0.1:3")])
    try:
        with pytest.raises(ClusterSpecMismatchError, match="another group"):
            dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(5))
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))
