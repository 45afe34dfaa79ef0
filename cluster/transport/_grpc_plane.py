"""The gRPC data plane: tensor frames on persistent Exchange streams (``CLUSTER_DATA_PLANE=grpc``).

:class:`GrpcDataPlane` is the :class:`~cluster.transport.dataplane.DataPlane`. Sending,
:class:`Outbox`: one client-streaming Exchange call per peer; payloads above ``max_frame_bytes``
are split into frames (``_framing``: a protobuf ``Frame`` with the payload appended), queued by
``put`` and written by gRPC from the stream's iterator; ``put`` blocks (against its deadline) when
more than ``MAX_INFLIGHT_BYTES`` wait for one peer. Receiving (the Exchange handler of
:mod:`~cluster.transport.endpoint`, one :class:`Reassembler` per stream): joins payloads that
arrived as several frames, holding only the bytes that arrived.
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
from cluster.transport._tcp_protocol import MAX_PAYLOAD_BYTES
from cluster.transport.api import MessageKey, PeerInfo, Received

__all__ = ["MAX_FRAME_BYTES", "MAX_INFLIGHT_BYTES", "MAX_PARTIAL_MESSAGES", "GrpcDataPlane",
           "Outbox", "Reassembler"]

MAX_FRAME_BYTES = 4 << 20  # payloads above this travel as several frames

MAX_INFLIGHT_BYTES = 64 << 20  # per peer: put() blocks (against its deadline) beyond this

MAX_PARTIAL_MESSAGES = 64  # unfinished messages one stream may hold (a sender has a few at once)


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

    def close(self, deadline: Deadline, goodbye: bytes = b"") -> None:
        """Finish the stream after queued frames and then ``goodbye`` (its last frame, if
        given) are written, waiting until ``deadline``."""
        with self._cond:
            if goodbye and not self._closing and self._failed is None:
                self._queue.append(goodbye)  # past the in-flight bound: it is a few bytes
                self._queued_bytes += len(goodbye)
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
    """Joins the payloads of ONE Exchange stream (frames of a message come in order, offset 0
    first: ``GrpcDataPlane.send`` writes them so); the endpoint makes one per stream, so what a
    stream left unfinished dies with it.

    Memory follows the data that arrived, never a size a frame claims: a message grows as its
    frames come. :meth:`feed` raises :class:`~cluster.transport._framing.FrameError` (the
    endpoint answers INVALID_ARGUMENT) for a frame that does not continue its message exactly,
    claims more than :data:`MAX_PAYLOAD_BYTES` or less than it carries, or would open more than
    ``max_partial`` unfinished messages at once.
    """

    def __init__(self, max_partial: int = MAX_PARTIAL_MESSAGES) -> None:
        self._max_partial = max_partial
        # key -> [data so far, signature]
        self._partial: dict[MessageKey, list] = {}

    def feed(self, header: collective_pb2.Frame,
             data: memoryview) -> tuple[MessageKey, Received] | None:
        """Take one frame; returns the key and whole message once its last frame is in."""
        key = MessageKey(header.group, header.seq, header.step, header.chunk)
        total, offset = header.total_bytes, header.offset
        if total > MAX_PAYLOAD_BYTES:
            raise _framing.FrameError(f"frame claims a {total}-byte message, more than the "
                                      f"{MAX_PAYLOAD_BYTES} bytes any message may have")
        if offset + len(data) > total:
            raise _framing.FrameError(f"frame carries bytes {offset}..{offset + len(data)} of a "
                                      f"{total}-byte message")
        entry = self._partial.get(key)
        if entry is None:
            if offset != 0:
                raise _framing.FrameError(f"frame at offset {offset} of collective #{key.seq} "
                                          "of a message that never started")
            if len(data) == total:
                return key, Received(data, header.signature)
            if len(self._partial) >= self._max_partial:
                raise _framing.FrameError(f"more than {self._max_partial} unfinished messages "
                                          "on one stream")
            self._partial[key] = [bytearray(data), header.signature]
            return None
        buf = entry[0]
        if offset != len(buf):
            raise _framing.FrameError(f"frame at offset {offset} of collective #{key.seq}, "
                                      f"expected {len(buf)} (frames out of order or repeated)")
        buf += data
        if len(buf) < total:
            return None
        del self._partial[key]
        return key, Received(memoryview(buf), entry[1])

    @property
    def unfinished(self) -> int:
        """Messages begun and not finished."""
        return len(self._partial)


class GrpcDataPlane:
    """Payloads on one Exchange stream per peer; a :class:`~cluster.transport.dataplane.DataPlane`.

    ``open(peer, channel)`` starts the stream to ``peer`` (``method_path`` on ``channel``, with
    ``metadata``: the token and this rank's number); a stream that fails reports the error
    through ``on_failed``. Inbound streams are the endpoint's (it joins their frames with a
    :class:`Reassembler` each). Offers of receive buffers are ignored: gRPC hands over its own
    buffers.
    """

    name = "grpc"

    def __init__(
        self,
        me: PeerInfo,
        method_path: str,
        metadata: tuple[tuple[str, str], ...],
        *,
        on_failed: Callable[[ClusterError], None],
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self._me = me
        self._method_path = method_path
        self._metadata = metadata
        self._on_failed = on_failed
        self._max_frame = max_frame_bytes
        self._outboxes: dict[int, Outbox] = {}

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
        """End every stream with a goodbye frame naming ``lost`` (the task this rank leaves
        because of, if any), after what is queued."""
        goodbye = _framing.encode(
            collective_pb2.Frame(src_rank=self._me.rank, goodbye=True, lost_task=lost), b"")
        for outbox in self._outboxes.values():
            outbox.close(deadline, goodbye)
