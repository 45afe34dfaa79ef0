"""Data-plane socket tuning: small buffers between processes of one host, autotuning across
hosts (``cluster.transport._sockio.tune``)."""

from __future__ import annotations

import socket
import threading

import pytest

from cluster.transport._sockio import LOCAL_BUFFER_BYTES, _same_host, tune

pytestmark = pytest.mark.timeout(30)


class _Ends:
    """A stand-in socket with given local and peer addresses."""

    def __init__(self, local: str | None, peer: str | None) -> None:
        self.local, self.peer = local, peer

    def getsockname(self):
        if self.local is None:
            raise OSError("not connected")
        return (self.local, 1)

    def getpeername(self):
        if self.peer is None:
            raise OSError("not connected")
        return (self.peer, 2)


@pytest.mark.parametrize("local, peer, same", [
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "127.0.0.5", True),
    ("::1", "::1", True),
    ("10.1.2.3", "10.1.2.3", True),  # a host dialing its own interface
    ("10.1.2.3", "10.1.2.4", False),
    ("fe80::1%eth0", "fe80::2%eth0", False),
    ("10.1.2.3", None, False),
    ("10.1.2.3", "not-an-address", False),
])
def test_same_host_is_a_loopback_peer_or_our_own_address(local, peer, same) -> None:
    assert _same_host(_Ends(local, peer)) is same


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=5)
    server, _ = listener.accept()
    return listener, client, server


def test_a_loopback_connection_gets_the_small_buffers_and_no_delay() -> None:
    listener, client, server = _pair()
    try:
        for sock in (client, server):
            tune(sock)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            # Linux reports twice what was set (its bookkeeping overhead); never autotuned MiBs.
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                got = sock.getsockopt(socket.SOL_SOCKET, option)
                assert LOCAL_BUFFER_BYTES <= got <= 2 * LOCAL_BUFFER_BYTES, (option, got)
        payload = bytes(range(256)) * (16 << 10)  # 4 MiB through the small buffers
        sender = threading.Thread(target=client.sendall, args=(payload,), daemon=True)
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            got += server.recv(1 << 20)
        sender.join(10)
        assert bytes(got) == payload
    finally:
        for sock in (client, server, listener):
            sock.close()


def test_a_connection_across_hosts_is_left_to_autotuning(monkeypatch) -> None:
    listener, client, server = _pair()
    try:
        before = client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        monkeypatch.setattr("cluster.transport._sockio._same_host", lambda sock: False)
        tune(client)
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == before
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        for sock in (client, server, listener):
            sock.close()
