"""A task's gRPC server: binds the address the cluster spec gives it (or, when that address is not
this host's yet, every interface: :mod:`cluster.transport.names`), authenticates every call."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent import futures

import grpc

from cluster.transport.auth import Token, TokenInterceptor
from cluster.transport.names import Bind, bind_choice
from cluster.transport.tls import add_port

__all__ = ["CHANNEL_OPTIONS", "CONTROL_CHANNEL_OPTIONS", "SERVER_OPTIONS", "ServiceHandlers",
           "TaskServer"]

ServiceHandlers = Mapping[str, Mapping[str, grpc.RpcMethodHandler]]
"""More services of a task: ``{service name: {method: handler}}``."""

log = logging.getLogger(__name__)

_UNLIMITED = -1
# Tensor frames are bounded by the sender (see _grpc_plane.MAX_FRAME_BYTES), so message size
# limits only get in the way; ports must never be shared silently (grpcio's SO_REUSEPORT default).
# Bulk tensor streams: HTTP/2 frames as large as the protocol allows (default 16 KiB) and large
# socket reads cut per-byte overhead of bare grpcio by about 10% on 4 MiB messages both ways
# (measured on this 2-core machine; within noise once our own per-frame costs are added).
_BULK_OPTIONS = (
    ("grpc.http2.max_frame_size", (1 << 24) - 1),
    ("grpc.experimental.tcp_read_chunk_size", 4 << 20),
    ("grpc.experimental.tcp_min_read_chunk_size", 1 << 20),
    ("grpc.experimental.tcp_max_read_chunk_size", 16 << 20),
)
SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", _UNLIMITED),
    ("grpc.max_send_message_length", _UNLIMITED),
    *_BULK_OPTIONS,
)
# Control-plane channels (heartbeats, registration): small messages, so no bulk buffers, which
# cost ~250 KiB per connection on each side (measured with 256 connections).
CONTROL_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _UNLIMITED),
    ("grpc.max_send_message_length", _UNLIMITED),
    *_BULK_OPTIONS,
    # Reconnect quickly when a peer comes up after us (default backoff reaches 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)


class TaskServer:
    """One gRPC server per task process, hosting every service of that task.

    ``TaskServer("127.0.0.1:0", token)`` binds at construction (raising ``OSError`` naming the
    address when it is taken) and exposes the bound ``port``; services are added with
    :meth:`add_handlers` before :meth:`start`. ``address`` is the spec's host with that port (what
    peers dial); ``bind_host`` what the server listens on: the spec's host when it is this
    host's, else every interface (:data:`~cluster.transport.names.WILDCARD`, logged with the
    reason: :func:`~cluster.transport.names.bind_choice`).
    """

    def __init__(self, address: str, token: Token, *, max_workers: int = 32) -> None:
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
            interceptors=[TokenInterceptor(token)],
            options=SERVER_OPTIONS,
            maximum_concurrent_rpcs=None,
        )
        host, _, wanted = address.rpartition(":")
        choice = bind_choice(address)
        if not wanted.isdigit():
            raise OSError(f"cannot bind gRPC server to {address}: expected host:port")
        listen = address if choice.why is Bind.SPEC else choice.address(int(wanted))
        try:
            port = add_port(self._server, listen, token.tls)  # mutual TLS when on
        except RuntimeError as e:
            raise OSError(f"cannot bind gRPC server to {listen}: address in use or invalid") from e
        if port == 0:
            raise OSError(f"cannot bind gRPC server to {listen}: address in use or invalid")
        if choice.why is not Bind.SPEC:
            # A pod whose DNS name is not published yet is the expected case on Kubernetes; an
            # address that is someone else's is worth a look (NAT, a stale record, a typo).
            level = logging.INFO if choice.why is Bind.NOT_RESOLVED else logging.WARNING
            log.log(level, "serving %s:%d on every interface (%s): %s", host, port,
                    choice.address(port), choice.reason)
        self.port = port
        self.address = f"{host}:{port}"
        self.bind_host = choice.host
        self._started = False
        self._stopped = False

    def add_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )

    def start(self) -> None:
        self._server.start()
        self._started = True

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; in-flight calls get ``grace`` seconds. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace).wait(None if grace is None else grace + 5.0)

    def __enter__(self) -> TaskServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
