"""The gRPC transport: persistent, authenticated Exchange streams between the ranks of a group.

Set-up, in every process of the group::

    server = TaskServer("127.0.0.1:0", token)          # or the address from the cluster spec
    endpoint = CollectiveEndpoint.install(server, task="worker:0")
    server.start()
    transport = GrpcTransport(endpoint, rank, peers, token)
    transport.connect(Deadline.after(30))              # Hello to every peer, open streams

Each rank keeps one client-streaming ``Exchange`` call open to each peer for its whole life
(no per-message connection or call set-up) and receives on the peers' streams to it. Frames are
raw bytes on the wire (``_framing``: a protobuf ``Frame`` with the payload appended), so tensor
bytes never go through protobuf field by field. Peer loss is noticed three ways: the inbound stream
breaks, the outbound stream fails, or heartbeats stop (``health.HeartbeatMonitor``).
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent import futures

import grpc

from cluster.errors import (
    ClusterError,
    CollectiveAbortedError,
    CollectiveTimeoutError,
    PeerUnavailableError,
    TransportClosedError,
)
from cluster.transport import _framing, _malloc
from cluster.transport._grpc_errors import translate
from cluster.transport._mailbox import Mailbox
from cluster.transport._pb import collective_pb2
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport
from cluster.transport.auth import Token
from cluster.transport.deadline import Deadline
from cluster.transport.health import ControlService, HeartbeatMonitor
from cluster.transport.server import CHANNEL_OPTIONS, TaskServer

__all__ = ["CollectiveEndpoint", "GrpcTransport", "MAX_FRAME_BYTES"]

log = logging.getLogger(__name__)

SERVICE = "cluster_runtime.v1.Collective"
MAX_FRAME_BYTES = 4 << 20  # payloads above this travel as several frames
MAX_INFLIGHT_BYTES = 64 << 20  # per peer: send() blocks (against its deadline) beyond this
_SRC_RANK_KEY = "x-src-rank"


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


class _Outbox:
    """One persistent client-streaming Exchange call to a peer, fed from a bounded queue."""

    def __init__(self, transport: GrpcTransport, peer: PeerInfo, channel: grpc.Channel) -> None:
        self._transport = transport
        self._peer = peer
        self._cond = threading.Condition()
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._closing = False
        self._failed: ClusterError | None = None
        method = channel.stream_unary(
            f"/{SERVICE}/Exchange",
            request_serializer=None,
            response_deserializer=collective_pb2.ExchangeSummary.FromString,
        )
        metadata = (*transport.token.metadata, (_SRC_RANK_KEY, str(transport.rank)))
        self._future = method.future(self._frames(), metadata=metadata)
        self._future.add_done_callback(self._done)

    def _frames(self):
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                raw = self._queue.popleft()
                self._queued_bytes -= len(raw)
                self._cond.notify_all()
            yield raw

    def put(self, raw: bytes, deadline: Deadline, key: MessageKey) -> None:
        with self._cond:
            while (self._queued_bytes + len(raw) > MAX_INFLIGHT_BYTES and self._queue
                   and self._failed is None and not self._closing):
                if deadline.expired:
                    raise CollectiveTimeoutError(
                        f"sending to {self._peer} for collective #{key.seq} of group "
                        f"{key.group!r}: peer not receiving before the deadline")
                self._cond.wait(deadline.timeout())
            if self._failed is not None:
                raise self._failed
            if self._closing:
                raise TransportClosedError(f"stream to {self._peer} is closed")
            self._queue.append(raw)
            self._queued_bytes += len(raw)
            self._cond.notify_all()

    def close(self, deadline: Deadline) -> None:
        """Finish the stream after queued frames are written, waiting until ``deadline``."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        try:
            self._future.result(timeout=deadline.timeout())
        except (grpc.RpcError, futures.TimeoutError, futures.CancelledError):
            self._future.cancel()

    def _done(self, future: grpc.Future) -> None:
        if future.cancelled():
            error: ClusterError = TransportClosedError(f"stream to {self._peer} cancelled")
        else:
            exc = future.exception()
            if exc is None:
                return
            error = translate(exc, self._peer, "collective exchange")
        with self._cond:
            self._failed = error
            self._cond.notify_all()
        if not self._closing:
            self._transport._fail(error)


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
    ) -> None:
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
        # Payloads that arrive as several frames: (src, key) -> [buffer, bytes so far, signature].
        self._partial: dict[tuple[int, MessageKey], list] = {}
        self._partial_lock = threading.Lock()
        self._channels: dict[int, grpc.Channel] = {}
        self._outboxes: dict[int, _Outbox] = {}
        self._monitor: HeartbeatMonitor | None = None
        endpoint.attach(self)

    @property
    def peers(self) -> list[PeerInfo]:
        return list(self._peers)

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
        errors: dict[int, str] = {}
        wait = threading.Event()
        backoff = 0.02
        while pending:
            for rank in list(pending):
                peer = pending[rank]
                try:
                    self._hello(peer, deadline)
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
        for peer in others:
            self._outboxes[peer.rank] = _Outbox(self, peer, self._channels[peer.rank])
        self._monitor = HeartbeatMonitor(
            self._me, others, self._channels, self.token,
            on_lost=lambda peer, err: self._fail(err),
            on_departed=lambda peer: self._peer_departed_by_rank(peer.rank),
            interval=self._endpoint.control.interval, timeout=self._heartbeat_timeout,
        )
        self._monitor.start()

    def _hello(self, peer: PeerInfo, deadline: Deadline) -> None:
        method = self._channels[peer.rank].unary_unary(
            f"/{SERVICE}/Hello",
            request_serializer=collective_pb2.HelloRequest.SerializeToString,
            response_deserializer=collective_pb2.HelloReply.FromString,
        )
        request = collective_pb2.HelloRequest(rank=self.rank, world_size=self.world_size,
                                              task=self._me.task)
        timeout = min(deadline.remaining(), 2.0)
        reply = method(request, timeout=max(timeout, 0.05), metadata=self.token.metadata,
                       wait_for_ready=True)
        if reply.rank != peer.rank or reply.task != peer.task:
            self.close()
            raise ClusterError(
                f"{self._me}: {peer.address} answered as {reply.task} (rank {reply.rank}), "
                f"expected {peer.task} (rank {peer.rank}): the cluster spec differs between tasks")

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
        return self._mailbox.get(src, key, deadline)

    def _deliver(self, src: int, header: collective_pb2.Frame, data: memoryview) -> None:
        key = MessageKey(header.group, header.seq, header.step, header.chunk)
        if header.offset == 0 and len(data) == header.total_bytes:
            self._mailbox.put(src, key, Received(data, header.signature))
            return
        with self._partial_lock:
            slot = (src, key)
            entry = self._partial.setdefault(slot, [bytearray(header.total_bytes), 0, ""])
            buf = entry[0]
            buf[header.offset:header.offset + len(data)] = data
            entry[1] += len(data)
            if header.offset == 0:
                entry[2] = header.signature  # only the first frame of a payload carries it
            done = entry[1] >= header.total_bytes
            if done:
                del self._partial[slot]
        if done:
            self._mailbox.put(src, key, Received(memoryview(buf), entry[2]))

    # -- failure ----------------------------------------------------------------------------

    def _src_rank_from(self, context: grpc.ServicerContext) -> int:
        for k, v in context.invocation_metadata():
            if k == _SRC_RANK_KEY and v.isdigit() and int(v) < self.world_size:
                return int(v)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"missing or bad {_SRC_RANK_KEY}")

    def _fail(self, error: ClusterError) -> None:
        if not self.closed and self._mailbox.fail(error):
            log.debug("%s: group failed: %s", self._me, error)

    def _peer_lost_by_rank(self, rank: int, why: str) -> None:
        if self.closed or rank in self._departed:
            return
        peer = self._peers[rank]
        self._fail(PeerUnavailableError(f"{peer} is unavailable: {why}",
                                        task=peer.task, address=peer.address))

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
        self.closed = True
        self._mailbox.close()
        for channel in self._channels.values():
            channel.close()
