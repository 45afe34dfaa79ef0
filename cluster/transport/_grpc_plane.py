"""The gRPC data plane: tensor frames on persistent Exchange streams (``CLUSTER_DATA_PLANE=grpc``).

:class:`GrpcDataPlane` is the :class:`~cluster.transport.dataplane.DataPlane`. Sending,
:class:`Outbox`: one client-streaming Exchange call per peer; payloads above ``max_frame_bytes``
are split into frames (``_framing``: a protobuf ``Frame`` with the payload appended), queued by
``put`` and written by gRPC from the stream's iterator; ``put`` blocks (against its deadline) when
more than ``MAX_INFLIGHT_BYTES`` wait for one peer. Receiving (the Exchange handler of
:mod:`~cluster.transport.endpoint` calls :meth:`GrpcDataPlane.deliver`), :class:`Reassembler`:
joins payloads that arrived as several frames.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from cluster.deadline import Deadline
from cluster.errors import (
    ClusterError,
    CollectiveTimeoutError,
    PeerUnavailableError,
    TransportClosedError,
)
from cluster.transport import _framing
from cluster.transport._grpc_errors import translate
from cluster.transport._pb import collective_pb2
from cluster.transport.api import MessageKey, PeerInfo, Received

__all__ = ["MAX_FRAME_BYTES", "MAX_INFLIGHT_BYTES", "GrpcDataPlane", "Outbox", "Reassembler"]

MAX_FRAME_BYTES = 4 << 20  # payloads above this travel as several frames

MAX_INFLIGHT_BYTES = 64 << 20  # per peer: put() blocks (against its deadline) beyond this


class Outbox:
    """One persistent client-streaming Exchange call to a peer, fed from a bounded queue."""

    def __init__(
        self,
        peer: PeerInfo,
        channel: grpc.Channel,
        method_path: str,
        metadata: tuple[tuple[str, str], ...],
        on_failed: Callable[[ClusterError], None],
    ) -> None:
        self._on_failed = on_failed
        self._peer = peer
        self._cond = threading.Condition()
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._closing = False
        self._failed: ClusterError | None = None
        method = channel.stream_unary(
            method_path,
            request_serializer=None,
            response_deserializer=collective_pb2.ExchangeSummary.FromString,
        )
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
        except (grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError,
                futures.TimeoutError, futures.CancelledError):
            # A gRPC future's timeout is its own class, not concurrent.futures': a stream to a
            # peer that went silent (a partition) ends here, cancelled, not in a traceback.
            self._future.cancel()

    def cancel(self) -> None:
        """End the stream now, dropping what is queued: its peer is lost (a send waiting on
        the queue raises that)."""
        with self._cond:
            self._closing = True
            self._failed = self._failed or PeerUnavailableError(
                f"{self._peer} is unavailable: found lost, its stream was cut",
                task=self._peer.task, address=self._peer.address)
            self._cond.notify_all()
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
            self._failed = self._failed or error  # cancel() put the cause there first
            self._cond.notify_all()
        if not self._closing:
            self._on_failed(error)


class Reassembler:
    """Joins a payload split into frames (``offset``, ``total_bytes``); thread-safe."""

    def __init__(self) -> None:
        # (src, key) -> [buffer, bytes so far, signature]
        self._partial: dict[tuple[int, MessageKey], list] = {}
        self._lock = threading.Lock()

    def feed(self, src: int, header: collective_pb2.Frame,
             data: memoryview) -> tuple[MessageKey, Received] | None:
        """Take one frame; returns the key and whole message once its last frame is in."""
        key = MessageKey(header.group, header.seq, header.step, header.chunk)
        if header.offset == 0 and len(data) == header.total_bytes:
            return key, Received(data, header.signature)
        with self._lock:
            slot = (src, key)
            entry = self._partial.setdefault(slot, [bytearray(header.total_bytes), 0, ""])
            buf = entry[0]
            buf[header.offset:header.offset + len(data)] = data
            entry[1] += len(data)
            if header.offset == 0:
                entry[2] = header.signature  # only the first frame of a payload carries it
            if entry[1] < header.total_bytes:
                return None
            del self._partial[slot]
        return key, Received(memoryview(buf), entry[2])


class GrpcDataPlane:
    """Payloads on one Exchange stream per peer; a :class:`~cluster.transport.dataplane.DataPlane`.

    ``open(peer, channel)`` starts the stream to ``peer`` (``method_path`` on ``channel``, with
    ``metadata``: the token and this rank's number); a stream that fails reports the error
    through ``on_failed``. Inbound frames come from the endpoint through :meth:`deliver`; whole
    messages go to ``on_message(src, key, received)``. Offers of receive buffers are ignored:
    gRPC hands over its own buffers.
    """

    name = "grpc"

    def __init__(
        self,
        me: PeerInfo,
        method_path: str,
        metadata: tuple[tuple[str, str], ...],
        *,
        on_message: Callable[[int, MessageKey, Received], None],
        on_failed: Callable[[ClusterError], None],
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self._me = me
        self._method_path = method_path
        self._metadata = metadata
        self._on_message = on_message
        self._on_failed = on_failed
        self._max_frame = max_frame_bytes
        self._outboxes: dict[int, Outbox] = {}
        self._reassembler = Reassembler()

    def open(self, peer: PeerInfo, channel: grpc.Channel) -> None:
        """Start the stream to ``peer``; sends to it then travel on this plane."""
        self._outboxes[peer.rank] = Outbox(peer, channel, self._method_path, self._metadata,
                                           self._on_failed)

    def routes(self) -> set[int]:
        return set(self._outboxes)

    def send(self, dst: int, key: MessageKey, payload: bytes | memoryview, signature: str,
             deadline: Deadline) -> None:
        outbox = self._outboxes[dst]
        total = len(payload)
        offset = 0
        while True:
            piece = payload[offset:offset + self._max_frame]
            header = collective_pb2.Frame(
                src_rank=self._me.rank, group=key.group, seq=key.seq, step=key.step,
                chunk=key.chunk, signature=signature if offset == 0 else "",
                offset=offset, total_bytes=total)
            outbox.put(_framing.encode(header, piece), deadline, key)
            offset += len(piece)
            if offset >= total:
                return

    def deliver(self, src: int, header: collective_pb2.Frame, data: memoryview) -> None:
        """One frame from ``src``'s Exchange stream; files the message once it is whole."""
        done = self._reassembler.feed(src, header, data)
        if done is not None:
            self._on_message(src, *done)

    def post(self, src: int, key: MessageKey, into: memoryview) -> None:
        pass

    def unpost(self, src: int, key: MessageKey) -> None:
        pass

    def clear_posted(self) -> None:
        pass

    def drop(self, rank: int) -> None:
        """Cut the stream to a peer found lost: a silent one (a partition) never fails it by
        itself, and a send blocked on its full queue, or the close, would wait on it."""
        outbox = self._outboxes.get(rank)
        if outbox is not None:
            outbox.cancel()

    def close(self, deadline: Deadline, lost: str = "") -> None:
        # A stream's end carries no reason: the transport's Abort (with lost_task) says it.
        for outbox in self._outboxes.values():
            outbox.close(deadline)
