"""The server side of a task's group transport: the ``Collective`` and ``Control`` services.

A :class:`CollectiveEndpoint` is installed on the task's
:class:`~cluster.transport.server.TaskServer` before it starts (so peers never see UNIMPLEMENTED);
the group's transport attaches to it later, through the :class:`InboundHandler` interface, and
receives from then on:

- ``Hello`` (unary): a peer checks it is talking to the rank it expects; the reply's trailing
  metadata advertises this rank's TCP data port, if it has one;
- ``Exchange`` (client streaming, raw bytes): the gRPC data plane's frames from one peer, for
  the transport's whole life, joined per stream (:class:`~cluster.transport._grpc_plane.
  Reassembler`); the stream's end is the peer's goodbye, its breaking a loss, but only once it
  has carried a well-formed frame: an empty or garbage stream that names a rank (a buggy or
  hostile caller with the token) says nothing about that rank's process;
- ``Abort`` (unary): a peer aborted the group, or (``lost_task`` set) found a peer dead and is
  leaving because of it; ignored when it names another elastic generation than the attached
  transport's.

Calls that arrive before a transport is attached (or after it closed) get UNAVAILABLE and are
retried by the caller's ``connect``; but a ``Hello`` for a group this task has left (its
transport closed: the script ended, the group failed, or an elastic generation no newer than
the closed one) gets ABORTED, and the caller's group fails at once naming this task, where it
would otherwise wait out its route timeout for a rank that is never coming back. Malformed
frames (bad encoding, another rank's, a gap, an impossible size) get INVALID_ARGUMENT and end
that stream. Every call has passed the token interceptor before any of this runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

import grpc

from cluster.transport import _framing
from cluster.transport._grpc_plane import Reassembler
from cluster.transport._pb import collective_pb2
from cluster.transport.api import MessageKey, Received
from cluster.transport.control import SERVICE as CONTROL_SERVICE
from cluster.transport.control import ControlService
from cluster.transport.server import TaskServer

__all__ = ["DATA_PORT_KEY", "SERVICE", "SRC_RANK_KEY", "CollectiveEndpoint", "InboundHandler"]

SERVICE = "cluster_runtime.v1.Collective"
SRC_RANK_KEY = "x-src-rank"  # Exchange call metadata: the sending rank
DATA_PORT_KEY = "x-data-port"  # Hello reply trailer: the replying rank's TCP data port


class InboundHandler(Protocol):
    """What the endpoint needs of the transport attached to it (all called on RPC threads)."""

    rank: int
    closed: bool
    generation: int  # an elastic group's generation (0: not elastic)

    @property
    def data_port(self) -> int | None:
        """This rank's TCP data port, advertised in Hello replies (None: gRPC only)."""
        ...

    def hello_problem(self, request: collective_pb2.HelloRequest) -> str:
        """Why the caller of this Hello is not the peer this rank expects ("" when it is)."""
        ...

    def src_rank(self, metadata: Iterable[tuple[str, str]]) -> int | None:
        """The peer rank an Exchange call's metadata names, or None when missing or invalid."""
        ...

    def deliver_message(self, src: int, key: MessageKey, received: Received) -> None:
        """A whole message from ``src``'s Exchange stream."""
        ...

    def peer_stream_broke(self, src: int) -> None:
        """``src``'s Exchange stream, which had carried its data, broke or ended without its
        goodbye frame (its process died, the connection reset)."""
        ...

    def peer_said_goodbye(self, src: int, lost: str) -> None:
        """``src`` closed its transport, saying so on its stream (its goodbye frame): because
        ``lost`` died, or ("") for no loss."""
        ...

    def aborted_by_peer(self, task: str, reason: str) -> None:
        ...

    def lost_by_peer(self, task: str, reason: str, lost_task: str, lost_address: str) -> None:
        """``task`` found ``lost_task`` dead and is leaving the group because of it."""
        ...


class CollectiveEndpoint:
    """The Collective and Control services of one task; see the module docstring.

    ``control`` is the task's :class:`~cluster.transport.control.ControlService` (health checks,
    heartbeats, failure reports, shutdown).
    """

    def __init__(self, server: TaskServer, task: str, heartbeat_interval: float) -> None:
        self.server = server
        self.task = task
        self.control = ControlService(task, interval=heartbeat_interval)
        self._transport: InboundHandler | None = None
        self._lock = threading.Lock()

    @classmethod
    def install(
        cls, server: TaskServer, task: str, *, heartbeat_interval: float = 1.0
    ) -> CollectiveEndpoint:
        """Create the endpoint and add both services' handlers to ``server`` (not started)."""
        endpoint = cls(server, task, heartbeat_interval)
        server.add_handlers(SERVICE, {
            "Hello": grpc.unary_unary_rpc_method_handler(
                endpoint._hello,
                request_deserializer=collective_pb2.HelloRequest.FromString,
                response_serializer=collective_pb2.HelloReply.SerializeToString,
            ),
            # Raw bytes in: frames are split by _framing, never parsed whole by protobuf.
            "Exchange": grpc.stream_unary_rpc_method_handler(
                endpoint._exchange,
                request_deserializer=None,
                response_serializer=collective_pb2.ExchangeSummary.SerializeToString,
            ),
            "Abort": grpc.unary_unary_rpc_method_handler(
                endpoint._abort,
                request_deserializer=collective_pb2.AbortRequest.FromString,
                response_serializer=collective_pb2.AbortReply.SerializeToString,
            ),
        })
        server.add_handlers(CONTROL_SERVICE, endpoint.control.handlers())
        return endpoint

    def attach(self, transport: InboundHandler) -> None:
        """Route inbound calls to ``transport``; raises ``RuntimeError`` if an open one is
        attached already."""
        with self._lock:
            if self._transport is not None and not self._transport.closed:
                raise RuntimeError(f"{self.task}: a transport is already attached")
            self._transport = transport

    def _attached(self, context: grpc.ServicerContext) -> InboundHandler:
        transport = self._transport
        if transport is None or transport.closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.task}: no collective group yet")
        return transport

    def _hello(self, request, context):
        left = self._transport
        if left is not None and left.closed and request.generation <= left.generation:
            context.abort(grpc.StatusCode.ABORTED,
                          f"{self.task} left the group (closed its transport"
                          f"{f' of generation {left.generation}' if left.generation else ''})")
        transport = self._attached(context)
        problem = transport.hello_problem(request)
        if problem:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        port = transport.data_port
        if port is not None:
            context.set_trailing_metadata(((DATA_PORT_KEY, str(port)),))
        return collective_pb2.HelloReply(rank=transport.rank, task=self.task)

    def _exchange(self, request_iterator, context):
        transport = self._attached(context)
        src = transport.src_rank(context.invocation_metadata())
        if src is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"missing or bad {SRC_RANK_KEY}")
        reassembler = Reassembler()  # this stream's unfinished messages die with it
        frames = 0
        farewell: str | None = None  # what the goodbye frame said, once it came
        try:
            for raw in request_iterator:
                try:
                    header, data = _framing.decode(raw)
                    if header.src_rank != src:
                        raise _framing.FrameError(
                            f"frame claims rank {header.src_rank} on rank {src}'s stream")
                    if farewell is not None:
                        raise _framing.FrameError("frame after the goodbye")
                    if header.goodbye:
                        farewell = header.lost_task
                        continue
                    done = reassembler.feed(header, data)
                except _framing.FrameError as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{self.task}: malformed frame from rank {src}: {e}")
                frames += 1
                if done is not None:
                    transport.deliver_message(src, *done)
        except grpc.RpcError:
            # The caller vanished mid-stream (killed, connection reset): that peer is lost.
            if frames:
                transport.peer_stream_broke(src)
            raise
        if farewell is not None:
            transport.peer_said_goodbye(src, farewell)
        elif frames:
            # Ended without its goodbye: the caller died. grpc-python ends the request stream of
            # a killed caller as if it had finished, so only the goodbye frame tells a clean end.
            transport.peer_stream_broke(src)
        return collective_pb2.ExchangeSummary(frames=frames)

    def _abort(self, request, context):
        transport = self._attached(context)
        if request.generation != transport.generation:
            return collective_pb2.AbortReply()  # about a group this task no longer belongs to
        if request.lost_task:
            transport.lost_by_peer(request.task, request.reason, request.lost_task,
                                   request.lost_address)
        else:
            transport.aborted_by_peer(request.task, request.reason)
        return collective_pb2.AbortReply()
