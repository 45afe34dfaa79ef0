"""How tasks talk: the ``Transport`` contract and its implementations, and every gRPC detail.

Public surface (``__all__``): the contract (:mod:`~cluster.transport.api`: ``Transport``,
``PeerInfo``, ``MessageKey``, ``Received``); its implementations, :class:`InProcessHub` (ranks as
threads, for tests) and :class:`NetworkTransport` (tasks over gRPC control and a
:class:`DataPlane`: raw TCP or gRPC streams); the server a task serves on
(:class:`TaskServer`, with :class:`CollectiveEndpoint` for the group and the Control service),
the token (:class:`Token`, :func:`resolve_token`), and the clients of peers' services
(:class:`ControlClient`, ``ps_client``). Nothing outside this package (and the servicers of
``worker/`` and ``ps/``) imports grpc; gRPC failures become :mod:`cluster.errors` here, in
:mod:`~cluster.transport._grpc_errors`.

Names are loaded on first use, so importing the contract (``cluster.transport.api``) does not
load grpc.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CollectiveEndpoint",
    "ControlClient",
    "DataPlane",
    "InProcessHub",
    "MessageKey",
    "NetworkTransport",
    "PeerInfo",
    "Received",
    "SubsetTransport",
    "TaskServer",
    "Token",
    "Transport",
    "resolve_token",
]

_HOME = {
    "CollectiveEndpoint": "endpoint",
    "ControlClient": "control_client",
    "DataPlane": "dataplane",
    "InProcessHub": "inproc",
    "MessageKey": "api",
    "NetworkTransport": "network",
    "PeerInfo": "api",
    "Received": "api",
    "SubsetTransport": "subset",
    "TaskServer": "server",
    "Token": "auth",
    "Transport": "api",
    "resolve_token": "auth",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'cluster.transport' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cluster.transport.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
