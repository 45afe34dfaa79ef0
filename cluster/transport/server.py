"""A task's gRPC server: binds the address the cluster spec gives it (or, when that address is not
this host's yet, every interface: :mod:`cluster.transport.names`), authenticates every call."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from cluster.transport.auth import Token, TokenInterceptor
from cluster.transport.names import Bind, bind_choice
from cluster.transport.tls import add_port

__all__ = ["CHANNEL_OPTIONS", "CONTROL_CHANNEL_OPTIONS", "LARGE_MESSAGE_BYTES", "MAX_MESSAGE_BYTES",
           "SERVER_OPTIONS", "SERVICE_MESSAGE_BYTES", "ServiceHandlers", "TaskServer",
           "message_limit", "parsing_requests"]

ServiceHandlers = Mapping[str, Mapping[str, grpc.RpcMethodHandler]]
"""More services of a task: ``{service name: {method: handler}}``."""

log = logging.getLogger(__name__)

_UNLIMITED = -1
# Bulk tensor streams: HTTP/2 frames as large as the protocol allows (default 16 KiB) and large
# socket reads cut per-byte overhead of bare grpcio by about 10% on 4 MiB messages both ways
# (measured on this 2-core machine; within noise once our own per-frame costs are added).
_BULK_OPTIONS = (
    ("grpc.http2.max_frame_size", (1 << 24) - 1),
    ("grpc.experimental.tcp_read_chunk_size", 4 << 20),
    ("grpc.experimental.tcp_min_read_chunk_size", 1 << 20),
    ("grpc.experimental.tcp_max_read_chunk_size", 16 << 20),
)

MAX_MESSAGE_BYTES = 8 << 20
"""The largest request a task accepts on its own services (Collective, Control, Coordination):
an Exchange frame is at most ``_grpc_plane.MAX_FRAME_BYTES`` (4 MiB) of data plus a small header;
everything else is a few KiB. gRPC refuses a longer message from its length prefix, before
buffering it (RESOURCE_EXHAUSTED)."""

LARGE_MESSAGE_BYTES = (2 << 30) - 1
"""The cap of services whose requests carry whole tensors or pickled calls: a parameter server's
Push/CreateVariable/Assign (a tensor travels whole, up to ``_ps_wire.MAX_TENSOR_BYTES``) and a
worker's Run. Protobuf's own 2 GiB limit; only authenticated callers ever get to send one."""

SERVICE_MESSAGE_BYTES: Mapping[str, int] = {
    "cluster_runtime.v1.ParameterServer": LARGE_MESSAGE_BYTES,
    "cluster_runtime.v1.Worker": LARGE_MESSAGE_BYTES,
}
"""Per-service request caps above :data:`MAX_MESSAGE_BYTES`; see :func:`message_limit`."""

# Ports must never be shared silently (grpcio's SO_REUSEPORT default). No BDP probing on the
# receiving side: it grows every stream's flow-control window to the bandwidth-delay product
# (MiBs on loopback) even for a stream nobody reads, so a caller the token check refused could
# park that much per stream in the server (32 refused 64 MiB calls: +30-70 MiB RSS with it,
# +3 MiB without). Streams that are read still get the window their message needs; bulk
# throughput into a server was the same within noise (docs/guide/parameter-servers.md,
# "Trust model").
SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.http2.bdp_probe", 0),
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


def parsing_requests(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with its request deserializer run inside the call, so that bytes it refuses
    (``DecodeError``) end the call INVALID_ARGUMENT, naming the message type. gRPC's own answer
    to a failing deserializer is INTERNAL, the status of a server bug, for what is the caller's
    malformed request (found by the fuzz suite, ``tests/fuzz``). Handlers that take raw bytes
    (no deserializer) are returned as they are."""
    parse = handler.request_deserializer
    if parse is None:
        return handler

    def decode(raw: bytes, context: grpc.ServicerContext):
        try:
            return parse(raw)
        except DecodeError as e:
            what = getattr(getattr(parse, "__self__", None), "__name__", "request")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {what}: {e}")

    serialize = handler.response_serializer
    if not handler.request_streaming:
        unary = handler.unary_unary or handler.unary_stream

        def one(raw, context):
            return unary(decode(raw, context), context)

        make = grpc.unary_stream_rpc_method_handler if handler.response_streaming \
            else grpc.unary_unary_rpc_method_handler
        return make(one, response_serializer=serialize)
    streaming = handler.stream_unary or handler.stream_stream

    def many(raws, context):
        return streaming((decode(raw, context) for raw in raws), context)

    make = grpc.stream_stream_rpc_method_handler if handler.response_streaming \
        else grpc.stream_unary_rpc_method_handler
    return make(many, response_serializer=serialize)


def message_limit(services: Iterable[str]) -> int:
    """The request cap of a server hosting ``services`` (names): the largest any of them needs."""
    return max((SERVICE_MESSAGE_BYTES.get(s, MAX_MESSAGE_BYTES) for s in services),
               default=MAX_MESSAGE_BYTES)


class TaskServer:
    """One gRPC server per task process, hosting every service of that task.

    ``TaskServer("127.0.0.1:0", token)`` binds at construction (raising ``OSError`` naming the
    address when it is taken) and exposes the bound ``port``; services are added with
    :meth:`add_handlers` before :meth:`start`. ``address`` is the spec's host with that port (what
    peers dial); ``bind_host`` what the server listens on: the spec's host when it is this
    host's, else every interface (:data:`~cluster.transport.names.WILDCARD`, logged with the
    reason: :func:`~cluster.transport.names.bind_choice`).

    Every call is authenticated (:class:`~cluster.transport.auth.TokenInterceptor`) before a
    byte of its request is read; an authenticated request longer than ``max_message_bytes``
    (:func:`message_limit` of the services it will host) is refused with RESOURCE_EXHAUSTED.
    """

    def __init__(self, address: str, token: Token, *, max_workers: int = 32,
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
            interceptors=[TokenInterceptor(token)],
            options=(*SERVER_OPTIONS, ("grpc.max_receive_message_length", max_message_bytes)),
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
        """Serve ``service``'s methods. A request its handler's deserializer refuses (bytes that
        are not that message) ends the call INVALID_ARGUMENT (:func:`parsing_requests`)."""
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            service, {name: parsing_requests(h) for name, h in handlers.items()}),))

    def start(self) -> None:
        self._server.start()
        self._started = True

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; in-flight calls get ``grace`` seconds (``None``: until they end), and
        the wait for the server's own shutdown ends 1 s after that at most. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace).wait(None if grace is None else grace + 1.0)

    def __enter__(self) -> TaskServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
