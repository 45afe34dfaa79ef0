"""A rank that opens its route to a peer that has left the group fails at once, naming the
peer, instead of waiting out its route timeout; a peer between two elastic generations (its old
transport closed, the next not attached yet) is waited for, as one still starting is."""

from __future__ import annotations

import threading
import time

import pytest

from cluster.deadline import Deadline
from cluster.errors import PeerUnavailableError
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.network import NetworkTransport
from cluster.transport.server import TaskServer

from .conftest import TOKEN, NetworkGroup

pytestmark = pytest.mark.timeout(60)

ROUTE_TIMEOUT = 40.0  # s: far longer than any wait these tests allow


@pytest.mark.parametrize("plane", ["tcp", "grpc"])
def test_a_route_to_a_peer_that_closed_its_transport_fails_at_once_naming_it(plane) -> None:
    aborts: list[str] = []
    group = NetworkGroup(3, data_plane=plane, lazy=True, route_timeout=ROUTE_TIMEOUT,
                         on_abort=aborts.append)
    try:
        a, b, _ = group.transports
        b.close()  # it left (its group failed, its script ended): rank 0 never talked to it
        started = time.monotonic()
        with pytest.raises(PeerUnavailableError, match="left the group") as info:
            a.send(1, MessageKey("g", 0, 0), b"x", deadline=Deadline.after(ROUTE_TIMEOUT))
        assert time.monotonic() - started < ROUTE_TIMEOUT / 4
        assert info.value.task == "worker:1"
        assert str(info.value).startswith(f"{group.peers[1]} left the group")
        # Departed, not lost: the collective's abort goes to the whole group (through the
        # caller: the coordination service), which no LOST event would otherwise tell.
        assert a.departed("worker:1")
        a.abort("all_gather #0 failed: worker:1 left the group")
        assert aborts == ["all_gather #0 failed: worker:1 left the group"]
    finally:
        group.close()


def test_a_peer_between_generations_is_waited_for_and_one_that_left_a_generation_is_not() -> None:
    servers = [TaskServer("127.0.0.1:0", TOKEN) for _ in range(2)]
    endpoints = [CollectiveEndpoint.install(s, f"worker:{r}") for r, s in enumerate(servers)]
    for server in servers:
        server.start()
    peers = [PeerInfo(r, f"worker:{r}", s.address) for r, s in enumerate(servers)]

    def transport(rank: int, generation: int) -> NetworkTransport:
        t = NetworkTransport(endpoints[rank], rank, peers, TOKEN, lazy=True,
                             route_timeout=ROUTE_TIMEOUT, generation=generation)
        t.connect(Deadline.after(5))
        return t

    opened: list[NetworkTransport] = []
    try:
        opened.append(transport(1, 3))
        opened[-1].close()  # worker:1 left generation 3 and asks for the next one
        a4 = transport(0, 4)
        opened.append(a4)
        sent: list[BaseException | None] = []

        def send() -> None:
            try:
                a4.send(1, MessageKey("g", 0, 0), b"x", deadline=Deadline.after(ROUTE_TIMEOUT))
                sent.append(None)
            except BaseException as e:  # asserted below
                sent.append(e)

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(1.0)
        assert sender.is_alive()  # waits: worker:1 may still enter generation 4
        b4 = transport(1, 4)
        opened.append(b4)
        assert bytes(b4.recv(0, MessageKey("g", 0, 0), deadline=Deadline.after(20)).payload) \
            == b"x"
        sender.join(5)
        assert sent == [None]
        # worker:0 still in generation 3 (it has not heard yet) finds worker:1 gone from it.
        a4.close()
        b4.close()
        a3 = transport(0, 3)
        opened.append(a3)
        with pytest.raises(PeerUnavailableError, match="left the group"):
            a3.send(1, MessageKey("g", 1, 0), b"y", deadline=Deadline.after(ROUTE_TIMEOUT / 4))
    finally:
        for t in opened:
            t.close(Deadline.after(2))
        for server in servers:
            server.stop(0)
