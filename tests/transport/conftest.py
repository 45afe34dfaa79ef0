"""Fixtures that build connected groups over every Transport implementation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from cluster.deadline import Deadline
from cluster.transport.api import PeerInfo, Transport
from cluster.transport.auth import Token
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.inproc import InProcessHub
from cluster.transport.network import NetworkTransport
from cluster.transport.server import TaskServer

TOKEN = Token("test-secret-token")


class NetworkGroup:
    """N gRPC transports in this process, each with its own server on a loopback port."""

    def __init__(self, n: int, token: Token = TOKEN, **transport_kwargs) -> None:
        self.servers = [TaskServer("127.0.0.1:0", token) for _ in range(n)]
        self.endpoints = [
            CollectiveEndpoint.install(s, f"worker:{r}", heartbeat_interval=0.2)
            for r, s in enumerate(self.servers)
        ]
        for server in self.servers:
            server.start()
        self.peers = [PeerInfo(r, f"worker:{r}", s.address) for r, s in enumerate(self.servers)]
        self.transports = [
            NetworkTransport(e, r, self.peers, token, **transport_kwargs)
            for r, e in enumerate(self.endpoints)
        ]
        errors: list[BaseException] = []

        def connect(t: NetworkTransport) -> None:
            try:
                t.connect(Deadline.after(10))
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=connect, args=(t,)) for t in self.transports]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        if errors:
            self.close()
            raise errors[0]

    def close(self) -> None:
        for t in self.transports:
            t.close(Deadline.after(2))
        for s in self.servers:
            s.stop(0)


@pytest.fixture(params=["inproc", "grpc", "tcp"])
def make_group(request) -> Iterator[Callable[..., list[Transport]]]:
    """``make_group(n, **kwargs)`` -> n connected transports of the parametrised kind.

    ``grpc`` and ``tcp`` are both :class:`NetworkTransport`, with tensor bytes on the gRPC Exchange
    streams or on the raw TCP data plane.
    """
    groups: list[NetworkGroup] = []
    hubs: list[InProcessHub] = []

    def make(n: int, **kwargs) -> list[Transport]:
        if request.param == "inproc":
            hub = InProcessHub(n)
            hubs.append(hub)
            return hub.transports
        group = NetworkGroup(n, data_plane=request.param, **kwargs)
        groups.append(group)
        return group.transports

    yield make
    for group in groups:
        group.close()
    for hub in hubs:
        for t in hub.transports:
            t.close()
