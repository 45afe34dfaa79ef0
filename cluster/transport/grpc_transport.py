"""The gRPC transport: persistent, authenticated Exchange streams between the ranks of a group.

Set-up, in every process of the group::

    server = TaskServer("127.0.0.1:0", token)          # or the address from the cluster spec
    endpoint = CollectiveEndpoint.install(server, task="worker:0")
    server.start()
    transport = GrpcTransport(endpoint, rank, peers, token)
    transport.connect(Deadline.after(30))              # Hello to every peer, open streams

gRPC is the control plane (Hello, heartbeats, Abort). Tensor bytes take one of two data planes,
chosen per transport by ``data_plane=`` (the task's ``settings.data_plane``,
``CLUSTER_DATA_PLANE``: ``tcp``, the default, or ``grpc``):

- ``tcp`` (:mod:`~cluster.transport.tcp`): each rank listens on an extra port on its gRPC host and
  advertises it in the authenticated Hello reply; peers open one authenticated raw TCP connection
  per direction and write payloads straight from their buffers (~3x the bandwidth of grpcio here).
  A peer whose data port cannot be reached is served over gRPC instead, with a warning.
- ``grpc``: one client-streaming ``Exchange`` call to each peer for the transport's whole life;
  frames are raw bytes (``_framing``: a protobuf ``Frame`` with the payload appended).

Either way a rank receives on both, so tasks configured differently still interoperate. Peer loss
is noticed three ways: the inbound connection breaks, a send fails, or heartbeats stop
(``health.HeartbeatMonitor``).
"""

from __future__ import annotations

import logging
import threading

import grpc

from cluster.deadline import Deadline
from cluster.errors import (
    ClusterError,
    CollectiveAbortedError,
    PeerUnavailableError,
    TaskConfigError,
    TransportClosedError,
    UnauthenticatedError,
)
from cluster.settings import DATA_PLANES, ENV_DATA_PLANE
from cluster.transport import _framing, _malloc
from cluster.transport._grpc_errors import translate
from cluster.transport._grpc_plane import Outbox, Reassembler
from cluster.transport._mailbox import Mailbox
from cluster.transport._pb import collective_pb2
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport
from cluster.transport.auth import Token
from cluster.transport.health import ControlService, HeartbeatMonitor
from cluster.transport.server import CHANNEL_OPTIONS, TaskServer
from cluster.transport.tcp import DataPlane

__all__ = ["CollectiveEndpoint", "GrpcTransport", "MAX_FRAME_BYTES"]

log = logging.getLogger(__name__)

SERVICE = "cluster_runtime.v1.Collective"
MAX_FRAME_BYTES = 4 << 20  # payloads above this travel as several frames
_SRC_RANK_KEY = "x-src-rank"
_DATA_PORT_KEY = "x-data-port"  # Hello reply trailer: the replying rank's TCP data port


class CollectiveEndpoint:
    """Server side of the Collective and Control services of one task.

    Installed on a :class:`TaskServer` before it starts; a :class:`GrpcTransport` attaches to it
    later. Calls that arrive before a transport is attached get UNAVAILABLE and are retried by the
    caller's ``connect``.
    """

    def __init__(self, server: TaskServer, task: str, heartbeat_interval: float) -> None:
        self.server = server
        self.task = task
        self.control = ControlService(task, interval=heartbeat_interval)
        self._transport: GrpcTransport | None = None
        self._lock = threading.Lock()

    @classmethod
    def install(
        cls, server: TaskServer, task: str, *, heartbeat_interval: float = 1.0
    ) -> CollectiveEndpoint:
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
        server.add_handlers("cluster_runtime.v1.Control", endpoint.control.handlers())
        return endpoint

    def attach(self, transport: GrpcTransport) -> None:
        with self._lock:
            if self._transport is not None and not self._transport.closed:
                raise RuntimeError(f"{self.task}: a transport is already attached")
            self._transport = transport

    def _attached(self, context: grpc.ServicerContext) -> GrpcTransport:
        transport = self._transport
        if transport is None or transport.closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.task}: no collective group yet")
        return transport

    def _hello(self, request, context):
        transport = self._attached(context)
        problem = transport._check_hello(request)
        if problem:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        if transport._data is not None:
            context.set_trailing_metadata(((_DATA_PORT_KEY, str(transport._data.port)),))
        return collective_pb2.HelloReply(rank=transport.rank, task=self.task)

    def _exchange(self, request_iterator, context):
        transport = self._attached(context)
        src = transport._src_rank_from(context)
        frames = 0
        try:
            for raw in request_iterator:
                try:
                    header, data = _framing.decode(raw)
                except _framing.FrameError as e:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed frame: {e}")
                if header.src_rank != src:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"frame claims rank {header.src_rank} on rank {src}'s stream")
                transport._deliver(src, header, data)
                frames += 1
        except grpc.RpcError:
            # The caller vanished mid-stream (killed, connection reset): that peer is lost.
            transport._peer_lost_by_rank(src, "its stream to us broke")
            raise
        transport._peer_departed_by_rank(src)
        return collective_pb2.ExchangeSummary(frames=frames)

    def _abort(self, request, context):
        transport = self._attached(context)
        transport._aborted_by_peer(request.task, request.reason)
        return collective_pb2.AbortReply()


class GrpcTransport(Transport):
    """The :class:`~cluster.transport.api.Transport` contract over gRPC; see the module doc."""

    def __init__(
        self,
        endpoint: CollectiveEndpoint,
        rank: int,
        peers: list[PeerInfo],
        token: Token,
        *,
        heartbeat_timeout: float = 5.0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        data_plane: str = "tcp",
    ) -> None:
        if data_plane not in DATA_PLANES:
            raise ValueError(f"data plane ({ENV_DATA_PLANE}) must be one of "
                             f"{', '.join(DATA_PLANES)}, got {data_plane!r}")
        if not 0 <= rank < len(peers):
            raise ValueError(f"rank {rank} is outside the group of {len(peers)}")
        if [p.rank for p in peers] != list(range(len(peers))):
            raise ValueError("peers must be listed in rank order, ranks 0..N-1")
        self.rank = rank
        self.world_size = len(peers)
        self.token = token
        self.closed = False
        _malloc.tune_for_large_buffers()
        self._peers = list(peers)
        self._me = peers[rank]
        self._endpoint = endpoint
        self._heartbeat_timeout = heartbeat_timeout
        self._max_frame = max_frame_bytes
        self._mailbox = Mailbox(lambda r: str(self._peers[r]))
        self._departed: set[int] = set()
        self._reassembler = Reassembler()
        self._channels: dict[int, grpc.Channel] = {}
        self._outboxes: dict[int, Outbox] = {}
        self._monitor: HeartbeatMonitor | None = None
        self._data: DataPlane | None = None
        self._tcp_routes: frozenset[int] = frozenset()
        endpoint.attach(self)
        if data_plane == "tcp":
            self._data = DataPlane(
                self._me, self._peers, (token.value or "").encode(),
                endpoint.server.address.rsplit(":", 1)[0],
                on_message=self._mailbox.put,
                on_lost=self._peer_lost_by_rank,
                on_departed=self._peer_departed_by_rank,
            )

    @property
    def peers(self) -> list[PeerInfo]:
        return list(self._peers)

    @property
    def data_planes(self) -> dict[int, str]:
        """How this rank sends to each connected peer: ``"tcp"`` or ``"grpc"``."""
        return {r: "tcp" if r in self._tcp_routes else "grpc"
                for r in (*self._tcp_routes, *self._outboxes)}

    def _others(self) -> list[PeerInfo]:
        return [p for p in self._peers if p.rank != self.rank]

    # -- set-up -----------------------------------------------------------------------------

    def connect(self, deadline: Deadline) -> None:
        """Say Hello to every peer (retrying until each is up), then open streams and heartbeats.

        Raises ``PeerUnavailableError`` listing every peer that never answered, with its address.
        """
        others = self._others()
        for peer in others:
            self._channels[peer.rank] = grpc.insecure_channel(peer.address,
                                                              options=CHANNEL_OPTIONS)
        pending = {p.rank: p for p in others}
        data_ports: dict[int, int | None] = {}
        errors: dict[int, str] = {}
        wait = threading.Event()
        backoff = 0.02
        while pending:
            for rank in list(pending):
                peer = pending[rank]
                try:
                    data_ports[rank] = self._hello(peer, deadline)
                    del pending[rank]
                except grpc.RpcError as e:
                    if e.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                    grpc.StatusCode.FAILED_PRECONDITION):
                        self.close()
                        raise translate(e, peer, "connect") from e
                    errors[rank] = e.code().name
            if not pending:
                break
            if deadline.expired:
                missing = ", ".join(f"{p} [{errors.get(r, 'no answer')}]"
                                    for r, p in sorted(pending.items()))
                self.close()
                first = next(iter(pending.values()))
                raise PeerUnavailableError(
                    f"{self._me}: peers never came up before the deadline: {missing}",
                    task=first.task, address=first.address)
            wait.wait(min(backoff, deadline.remaining()))
            backoff = min(backoff * 2, 0.5)
        tcp = set()
        for peer in others:
            if self._connect_data(peer, data_ports.get(peer.rank), deadline):
                tcp.add(peer.rank)
            else:
                self._outboxes[peer.rank] = Outbox(
                    peer, self._channels[peer.rank], f"/{SERVICE}/Exchange",
                    (*self.token.metadata, (_SRC_RANK_KEY, str(self.rank))), self._fail)
        self._tcp_routes = frozenset(tcp)
        self._monitor = HeartbeatMonitor(
            self._me, others, self._channels, self.token,
            on_lost=self._peer_lost,
            on_departed=lambda peer: self._peer_departed_by_rank(peer.rank),
            interval=self._endpoint.control.interval, timeout=self._heartbeat_timeout,
        )
        self._monitor.start()

    def _connect_data(self, peer: PeerInfo, port: int | None, deadline: Deadline) -> bool:
        """Open the TCP data connection to ``peer``; False when gRPC must carry the data."""
        if self._data is None or port is None:
            return False
        host = peer.address.rsplit(":", 1)[0]
        try:
            self._data.connect(peer, host, port, deadline)
        except UnauthenticatedError:
            self.close()
            raise
        except (OSError, EOFError) as e:
            if deadline.expired:
                self.close()
                raise PeerUnavailableError(
                    f"{self._me}: no data connection to {peer} (port {port}) before the "
                    f"deadline: {e}", task=peer.task, address=peer.address) from e
            log.warning("%s: data port %s:%d of %s unreachable (%s); sending to it over gRPC",
                        self._me, host, port, peer, e)
            return False
        return True

    def _hello(self, peer: PeerInfo, deadline: Deadline) -> int | None:
        """Hello to ``peer``; returns its TCP data port, if it offers one."""
        method = self._channels[peer.rank].unary_unary(
            f"/{SERVICE}/Hello",
            request_serializer=collective_pb2.HelloRequest.SerializeToString,
            response_deserializer=collective_pb2.HelloReply.FromString,
        )
        request = collective_pb2.HelloRequest(rank=self.rank, world_size=self.world_size,
                                              task=self._me.task)
        timeout = min(deadline.remaining(), 2.0)
        reply, call = method.with_call(request, timeout=max(timeout, 0.05),
                                       metadata=self.token.metadata, wait_for_ready=True)
        if reply.rank != peer.rank or reply.task != peer.task:
            self.close()
            raise TaskConfigError(
                f"{self._me}: {peer.address} answered as {reply.task} (rank {reply.rank}), "
                f"expected {peer.task} (rank {peer.rank}): the cluster spec differs between tasks")
        for k, v in call.trailing_metadata() or ():
            if k == _DATA_PORT_KEY and isinstance(v, str) and v.isdigit() and 0 < int(v) < 65536:
                return int(v)
        return None

    def _check_hello(self, request: collective_pb2.HelloRequest) -> str:
        if request.world_size != self.world_size:
            return (f"{self._me} is in a group of {self.world_size}, "
                    f"{request.task} thinks {request.world_size}")
        if not 0 <= request.rank < self.world_size or request.rank == self.rank:
            return f"{self._me}: caller rank {request.rank} is not a peer"
        if self._peers[request.rank].task != request.task:
            return (f"{self._me}: rank {request.rank} is {self._peers[request.rank].task} here, "
                    f"but the caller says it is {request.task}")
        return ""

    # -- data path --------------------------------------------------------------------------

    def send(self, dst, key, payload, *, deadline: Deadline, signature: str = "") -> None:
        if self.closed:
            raise TransportClosedError(f"{self._me}: transport is closed")
        self._mailbox.check()
        if dst in self._tcp_routes:
            view = payload if isinstance(payload, bytes) else memoryview(payload).cast("B")
            try:
                self._data.send(dst, key, view, signature, deadline)
            except ClusterError as e:
                if isinstance(e, PeerUnavailableError) and dst in self._departed:
                    peer = self._peers[dst]
                    e = PeerUnavailableError(
                        f"{peer} left the group (closed its transport) before this rank's "
                        f"message for collective #{key.seq} of group {key.group!r}",
                        task=peer.task, address=peer.address)
                self._fail(e)  # a frame may be cut short: the group cannot go on
                raise e
            return
        outbox = self._outboxes.get(dst)
        if outbox is None:
            raise ValueError(f"{self._me}: no stream to rank {dst} (not a peer, or not connected)")
        view = payload if isinstance(payload, bytes) else memoryview(payload).cast("B")
        total = len(view)
        offset = 0
        while True:
            piece = view[offset:offset + self._max_frame]
            header = collective_pb2.Frame(
                src_rank=self.rank, group=key.group, seq=key.seq, step=key.step,
                chunk=key.chunk, signature=signature if offset == 0 else "",
                offset=offset, total_bytes=total)
            outbox.put(_framing.encode(header, piece), deadline, key)
            offset += len(piece)
            if offset >= total:
                return

    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        if self.closed:
            raise TransportClosedError(f"{self._me}: transport is closed")
        try:
            return self._mailbox.get(src, key, deadline)
        finally:
            if self._data is not None:
                self._data.unpost(src, key)

    def post_recv(self, src: int, key: MessageKey, into: memoryview) -> None:
        if self._data is not None and src in self._tcp_routes:
            self._data.post(src, key, into)

    def _deliver(self, src: int, header: collective_pb2.Frame, data: memoryview) -> None:
        done = self._reassembler.feed(src, header, data)
        if done is not None:
            self._mailbox.put(src, *done)

    # -- failure ----------------------------------------------------------------------------

    def _src_rank_from(self, context: grpc.ServicerContext) -> int:
        for k, v in context.invocation_metadata():
            if k == _SRC_RANK_KEY and v.isdigit() and int(v) < self.world_size:
                return int(v)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"missing or bad {_SRC_RANK_KEY}")

    def _fail(self, error: ClusterError) -> None:
        if not self.closed and self._mailbox.fail(error):
            log.debug("%s: group failed: %s", self._me, error)
        if self._data is not None:
            self._data.clear_posted()  # nothing more lands in a failed collective's buffers

    def _peer_lost_by_rank(self, rank: int, why: str) -> None:
        if self.closed or rank in self._departed:
            return
        peer = self._peers[rank]
        self._peer_lost(peer, PeerUnavailableError(f"{peer} is unavailable: {why}",
                                                   task=peer.task, address=peer.address))

    def _peer_lost(self, peer: PeerInfo, error: PeerUnavailableError) -> None:
        self._fail(error)
        if self._data is not None:
            self._data.drop(peer.rank)  # a send blocked on a hung peer must not wait forever

    def _peer_departed_by_rank(self, rank: int) -> None:
        """A peer closed its side cleanly: what it sent is delivered; later waits on it fail."""
        if self.closed:
            return
        self._departed.add(rank)
        peer = self._peers[rank]
        self._mailbox.depart(rank, PeerUnavailableError(
            f"{peer} left the group (closed its transport) while this rank still expected data "
            "from it", task=peer.task, address=peer.address))

    def _aborted_by_peer(self, task: str, reason: str) -> None:
        self._fail(CollectiveAbortedError(f"{task} aborted the group: {reason}", task=task))

    def abort(self, reason: str) -> None:
        """Tell every peer (best effort, 2 s at most) and fail this rank's group too."""
        if self.closed:
            return
        request = collective_pb2.AbortRequest(task=self._me.task, reason=reason)
        calls = []
        for channel in self._channels.values():
            method = channel.unary_unary(
                f"/{SERVICE}/Abort",
                request_serializer=collective_pb2.AbortRequest.SerializeToString,
                response_deserializer=collective_pb2.AbortReply.FromString,
            )
            calls.append(method.future(request, timeout=2.0, metadata=self.token.metadata))
        self._fail(CollectiveAbortedError(f"{self._me} aborted the group: {reason}",
                                          task=self._me.task))
        for call in calls:
            try:
                call.result()
            except grpc.RpcError:
                pass  # a peer that is gone cannot be told; its own detection covers it

    def check(self) -> None:
        self._mailbox.check()

    def close(self, deadline: Deadline | None = None) -> None:
        if self.closed:
            return
        deadline = deadline or Deadline.after(5.0)
        if self._monitor is not None:
            self._monitor.close()
        for outbox in self._outboxes.values():
            outbox.close(deadline)
        if self._data is not None:
            self._data.close(deadline)
        self.closed = True
        self._mailbox.close()
        for channel in self._channels.values():
            channel.close()
