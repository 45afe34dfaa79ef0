"""The network transport: a group's ranks over authenticated gRPC control and a data plane.

Set-up, in every process of the group::

    server = TaskServer("127.0.0.1:0", token)          # or the address from the cluster spec
    endpoint = CollectiveEndpoint.install(server, task="worker:0")
    server.start()
    transport = NetworkTransport(endpoint, rank, peers, token)
    transport.connect(Deadline.after(30))              # Hello to every peer, open routes

gRPC is the control plane (Hello, heartbeats, Abort). Payloads take a
:class:`~cluster.transport.dataplane.DataPlane`, chosen per transport by ``data_plane=`` (the
task's ``settings.data_plane``, ``CLUSTER_DATA_PLANE``: ``tcp``, the default, or ``grpc``):

- ``tcp`` (:mod:`~cluster.transport.tcp`): each rank listens on an extra port on its gRPC host and
  advertises it in the authenticated Hello reply; peers open an authenticated raw TCP connection
  per direction (a second one when two threads send large frames to one peer at once) and write
  payloads straight from their buffers (~3x the bandwidth of grpcio here).
  A peer whose data port cannot be reached is served over gRPC instead, with a warning.
- ``grpc`` (:mod:`~cluster.transport._grpc_plane`): one client-streaming ``Exchange`` call to
  each peer for the transport's whole life.

Either way a rank receives on both, so tasks configured differently still interoperate.

Connections are eager by default (``connect`` says Hello to every peer and watches each one's
heartbeats: simple, and what a small group wants). With ``lazy=True`` (the task runtime, whose
coordination service watches liveness) a peer's route opens when this rank first sends to it, so
a rank holds connections only to the peers its algorithms use (ring neighbours, doubling
partners, leaders): the per-task cost does not grow with the group. Then ``on_peer_lost`` tells
the caller of a loss this rank found, ``on_abort`` of an abort, and
:meth:`NetworkTransport.peer_lost` takes the losses the caller learns of.

Peer loss is noticed four ways: the inbound connection breaks, a send fails, heartbeats stop
(:class:`~cluster.transport.control.HeartbeatMonitor`, or the coordination service), or a peer
that lost it says so (``Abort`` with ``lost_task``: its abort of the failed group, and again
before it closes). That last one keeps the root cause: a peer told a bare abort instead would
fail without knowing who died, and a rank waiting on it when it closed would then report the
peer that left, not the task that died.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import NoReturn

import grpc

from cluster.deadline import Deadline
from cluster.errors import (
    ClusterError,
    ClusterSpecMismatchError,
    CollectiveAbortedError,
    PeerUnavailableError,
    TransportClosedError,
    UnauthenticatedError,
)
from cluster.settings import DATA_PLANES, ENV_DATA_PLANE
from cluster.transport import _malloc
from cluster.transport._aborts import Aborts, lost_cause
from cluster.transport._closing import close_channels
from cluster.transport._grpc_errors import (
    fails_at_connect,
    left_the_group,
    spec_mismatch,
    status_name,
    translate,
)
from cluster.transport._grpc_plane import MAX_FRAME_BYTES, GrpcDataPlane
from cluster.transport._mailbox import Mailbox
from cluster.transport._pb import collective_pb2
from cluster.transport._tcp_tls import DataPlaneTls
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport
from cluster.transport.auth import Token
from cluster.transport.control import HeartbeatMonitor
from cluster.transport.dataplane import DataPlane
from cluster.transport.endpoint import DATA_PORT_KEY, SERVICE, SRC_RANK_KEY, CollectiveEndpoint
from cluster.transport.names import NOT_RESOLVED, host_of, peer_names
from cluster.transport.server import CHANNEL_OPTIONS
from cluster.transport.tcp import TcpDataPlane
from cluster.transport.tls import open_channel

__all__ = ["MAX_FRAME_BYTES", "NetworkTransport"]

log = logging.getLogger(__name__)


class NetworkTransport(Transport):
    """The :class:`~cluster.transport.api.Transport` contract over the network; see the module
    docstring. It is also the endpoint's :class:`~cluster.transport.endpoint.InboundHandler`."""

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
        lazy: bool = False,
        route_timeout: float = 60.0,
        on_peer_lost: Callable[[PeerInfo, str], None] | None = None,
        on_abort: Callable[[str], None] | None = None,
        abort_timeout: float = 2.0,
        generation: int = 0,
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
        # An elastic group's generation (0: not elastic): Hello and Abort calls carry it, and a
        # peer in another generation refuses or ignores them (a survivor's old group must never
        # touch the new one).
        self.generation = generation
        self.token = token
        self.closed = False
        _malloc.tune_for_large_buffers()
        self._peers = list(peers)
        self._me = peers[rank]
        self._endpoint = endpoint
        self._heartbeat_timeout = heartbeat_timeout
        self._mailbox = Mailbox(lambda r: str(self._peers[r]))
        self._departed: set[int] = set()
        self._lost: set[int] = set()  # peers found or told lost: nothing more is sent to them
        self._lazy = lazy
        self._route_timeout = route_timeout
        self._on_peer_lost = on_peer_lost
        self._on_abort = on_abort
        self._abort_timeout = abort_timeout
        self._route_locks = {p.rank: threading.Lock() for p in peers}
        self._channels_lock = threading.Lock()
        self._failed_event = threading.Event()  # wakes a route's Hello retries on a failure
        self._channels: dict[int, grpc.Channel] = {}
        self._aborts = Aborts(self._me, token, generation, self._channel_list)
        self._monitor: HeartbeatMonitor | None = None
        self._routes: dict[int, DataPlane] = {}  # the plane each peer is sent to on
        self._grpc = GrpcDataPlane(
            self._me, f"/{SERVICE}/Exchange", (*token.metadata, (SRC_RANK_KEY, str(rank))),
            on_failed=self._fail, max_frame_bytes=max_frame_bytes)
        self._tcp: TcpDataPlane | None = None
        endpoint.attach(self)
        if data_plane == "tcp":
            self._tcp = TcpDataPlane(
                self._me, self._peers, (token.value or "").encode(),
                endpoint.server.bind_host,
                on_message=self._mailbox.put,
                on_lost=self._peer_lost_by_rank,
                on_departed=self.peer_said_goodbye,
                # With TLS configured, tensors are encrypted too (after the token handshake).
                tls=(DataPlaneTls(token.tls.server_ssl_context(), token.tls.client_ssl_context())
                     if token.tls is not None else None),
            )
        self._planes: tuple[DataPlane, ...] = tuple(
            p for p in (self._tcp, self._grpc) if p is not None)

    @property
    def peers(self) -> list[PeerInfo]:
        return list(self._peers)

    @property
    def data_planes(self) -> dict[int, str]:
        """How this rank sends to each connected peer: ``"tcp"`` or ``"grpc"``."""
        return {r: plane.name for r, plane in self._routes.items()}

    def _others(self) -> list[PeerInfo]:
        return [p for p in self._peers if p.rank != self.rank]

    # -- set-up -----------------------------------------------------------------------------

    def connect(self, deadline: Deadline) -> None:
        """Eager (the default): say Hello to every peer (retrying until each is up), then open
        routes and heartbeats. Lazy: nothing yet; each peer's route opens on first use, and
        liveness is the caller's (the coordination service).

        Raises ``PeerUnavailableError`` listing every peer that never answered, with its address;
        ``UnauthenticatedError`` when a peer refuses the token; ``ClusterSpecMismatchError`` when
        a peer sees a different group.
        """
        if self._lazy:
            return
        others = self._others()
        pending = {p.rank: p for p in others}
        data_ports: dict[int, int | None] = {}
        errors: dict[int, str] = {}
        wait = threading.Event()
        backoff = 0.02
        while pending:
            for rank in list(pending):
                peer = pending[rank]
                if not self._resolves(peer, deadline):
                    errors[rank] = NOT_RESOLVED
                    continue
                try:
                    data_ports[rank] = self._hello(peer, deadline)
                    del pending[rank]
                except grpc.RpcError as e:
                    if fails_at_connect(e):
                        self.close()
                        raise translate(e, peer, "connect") from e
                    errors[rank] = status_name(e)
                except ClusterSpecMismatchError:
                    self.close()
                    raise
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
            self._install_route(peer, data_ports.get(peer.rank), deadline, self._close_raise)
        self._monitor = HeartbeatMonitor(
            self._me, others, self._channels, self.token,
            on_lost=self._peer_lost,
            on_departed=lambda peer: self.peer_departed(peer.rank),
            interval=self._endpoint.control.interval, timeout=self._heartbeat_timeout,
        )
        self._monitor.start()

    def _channel(self, rank: int) -> grpc.Channel:
        with self._channels_lock:
            channel = self._channels.get(rank)
            if channel is None:
                channel = self._channels[rank] = open_channel(
                    self._peers[rank].address, CHANNEL_OPTIONS, self.token.tls)
            return channel

    def _channel_list(self) -> list[tuple[int, grpc.Channel]]:
        with self._channels_lock:
            return list(self._channels.items())

    def _close_raise(self, error: ClusterError) -> NoReturn:
        """Eager set-up gives up: the transport is unusable."""
        self.close()
        raise error

    def _fail_raise(self, error: ClusterError) -> NoReturn:
        """A lazy route gives up: the group has failed (naming the peer), the transport stays."""
        self._fail(error)
        raise error

    def _install_route(self, peer: PeerInfo, port: int | None, deadline: Deadline,
                       give_up: Callable[[ClusterError], NoReturn]) -> DataPlane:
        """After the Hello: the TCP data connection when ``peer`` offers one, else its gRPC
        stream; ``give_up`` ends set-up with an error."""
        if self._connect_tcp(peer, port, deadline, give_up):
            plane: DataPlane = self._tcp
        else:
            self._grpc.open(peer, self._channel(peer.rank))
            plane = self._grpc
        self._routes[peer.rank] = plane
        return plane

    def _open_route(self, dst: int, deadline: Deadline) -> DataPlane:
        """Lazy mode: Hello to ``dst`` (retrying while it is not up, at most ``route_timeout``)
        and open its route; a failure of the group meanwhile ends the wait."""
        with self._route_locks[dst]:
            plane = self._routes.get(dst)
            if plane is not None:
                return plane
            peer = self._peers[dst]
            bound = Deadline.after(self._route_timeout)
            deadline = bound if bound.at < deadline.at else deadline
            status, backoff = "no answer", 0.02
            while True:
                self._mailbox.check()
                try:
                    if self._resolves(peer, deadline):
                        port = self._hello(peer, deadline)
                        break
                    status = NOT_RESOLVED
                except grpc.RpcError as e:
                    if fails_at_connect(e):
                        self._fail_raise(translate(e, peer, "connect"))
                    if left_the_group(e):
                        # Departed, not lost: this rank's abort then tells the whole group
                        # (nobody died, so no LOST event will).
                        self.peer_departed(dst)
                        self._fail_raise(PeerUnavailableError(
                            f"{peer} left the group (closed its transport) before this rank's "
                            "first message to it", task=peer.task, address=peer.address))
                    status = status_name(e)
                except ClusterSpecMismatchError as e:
                    self._fail_raise(e)
                if deadline.expired:
                    self._fail_raise(PeerUnavailableError(
                        f"{self._me}: {peer} never answered before the deadline [{status}]",
                        task=peer.task, address=peer.address))
                self._failed_event.wait(min(backoff, deadline.remaining()))
                backoff = min(backoff * 2, 0.5)
            return self._install_route(peer, port, deadline, self._fail_raise)

    def _connect_tcp(self, peer: PeerInfo, port: int | None, deadline: Deadline,
                     give_up: Callable[[ClusterError], NoReturn]) -> bool:
        """Open the TCP data connection to ``peer``; False when gRPC must carry the data."""
        if self._tcp is None or port is None:
            return False
        host = peer.address.rsplit(":", 1)[0]
        try:
            self._tcp.connect(peer, host, port, deadline)
        except (UnauthenticatedError, ClusterSpecMismatchError) as e:
            give_up(e)
        except (OSError, EOFError) as e:
            if deadline.expired:
                give_up(PeerUnavailableError(
                    f"{self._me}: no data connection to {peer} (port {port}) before the "
                    f"deadline: {e}", task=peer.task, address=peer.address))
            log.warning("%s: data port %s:%d of %s unreachable (%s); sending to it over gRPC",
                        self._me, host, port, peer, e)
            return False
        return True

    @staticmethod
    def _resolves(peer: PeerInfo, deadline: Deadline) -> bool:
        """``peer``'s host name resolves: its channel may be dialled (see
        :mod:`~cluster.transport.names`)."""
        return peer_names.resolves(host_of(peer.address), timeout=min(1.0, deadline.remaining()))

    def _hello(self, peer: PeerInfo, deadline: Deadline) -> int | None:
        """Hello to ``peer``; returns its TCP data port, if it offers one."""
        method = self._channel(peer.rank).unary_unary(
            f"/{SERVICE}/Hello",
            request_serializer=collective_pb2.HelloRequest.SerializeToString,
            response_deserializer=collective_pb2.HelloReply.FromString,
        )
        request = collective_pb2.HelloRequest(rank=self.rank, world_size=self.world_size,
                                              task=self._me.task, generation=self.generation)
        timeout = min(deadline.remaining(), 2.0)
        reply, call = method.with_call(request, timeout=max(timeout, 0.05),
                                       metadata=self.token.metadata, wait_for_ready=True)
        if reply.rank != peer.rank or reply.task != peer.task:
            raise spec_mismatch(
                f"{self._me}: {peer.address} answered as {reply.task} (rank {reply.rank}), "
                f"expected {peer.task} (rank {peer.rank})")
        for k, v in call.trailing_metadata() or ():
            if k == DATA_PORT_KEY and isinstance(v, str) and v.isdigit() and 0 < int(v) < 65536:
                return int(v)
        return None

    # -- inbound (the endpoint's InboundHandler) -------------------------------------------------

    @property
    def data_port(self) -> int | None:
        return self._tcp.port if self._tcp is not None else None

    def hello_problem(self, request: collective_pb2.HelloRequest) -> str:
        if request.generation != self.generation:
            return (f"{self._me} is in generation {self.generation} of the elastic group, "
                    f"{request.task} in generation {request.generation}")
        if request.world_size != self.world_size:
            return (f"{self._me} is in a group of {self.world_size}, "
                    f"{request.task} thinks {request.world_size}")
        if not 0 <= request.rank < self.world_size or request.rank == self.rank:
            return f"{self._me}: caller rank {request.rank} is not a peer"
        if self._peers[request.rank].task != request.task:
            return (f"{self._me}: rank {request.rank} is {self._peers[request.rank].task} here, "
                    f"but the caller says it is {request.task}")
        return ""

    def src_rank(self, metadata: Iterable[tuple[str, str]]) -> int | None:
        for k, v in metadata:
            if k == SRC_RANK_KEY and v.isdigit() and int(v) < self.world_size:
                return int(v)
        return None

    def deliver_message(self, src: int, key: MessageKey, received: Received) -> None:
        self._mailbox.put(src, key, received)

    def peer_stream_broke(self, src: int) -> None:
        self._peer_lost_by_rank(src, "its stream to us broke")

    def peer_departed(self, src: int) -> None:
        """A peer closed its side cleanly: what it sent is delivered; later waits on it fail."""
        if self.closed:
            return
        self._departed.add(src)
        peer = self._peers[src]
        self._mailbox.depart(src, PeerUnavailableError(
            f"{peer} left the group (closed its transport) while this rank still expected data "
            "from it", task=peer.task, address=peer.address))

    def departed(self, task: str) -> bool:
        """Whether ``task`` left the group cleanly (its goodbye came: it closed its transport,
        e.g. because its script ended), as opposed to being lost."""
        return any(self._peers[r].task == task for r in tuple(self._departed))

    def peer_said_goodbye(self, src: int, lost: str) -> None:
        """``src`` closed its transport and said why on its data stream (TCP's goodbye frame,
        or the gRPC stream's last frame): because ``lost`` died (then so has this rank's group),
        or ("") not for a loss."""
        if lost:  # it left because it lost ``lost``: so have we
            peer = self._peers[src]
            self.lost_by_peer(peer.task, f"its goodbye says it lost {lost}", lost, "")
        else:
            self.peer_departed(src)

    def aborted_by_peer(self, task: str, reason: str) -> None:
        self._fail(CollectiveAbortedError(f"{task} aborted the group: {reason}", task=task))

    # -- data path --------------------------------------------------------------------------

    def send(self, dst, key, payload, *, deadline: Deadline, signature: str = "") -> None:
        if self.closed:
            raise TransportClosedError(f"{self._me}: transport is closed")
        self._mailbox.check()
        plane = self._routes.get(dst)
        if plane is None:
            if not self._lazy or not 0 <= dst < self.world_size or dst == self.rank:
                raise ValueError(
                    f"{self._me}: no route to rank {dst} (not a peer, or not connected)")
            plane = self._open_route(dst, deadline)
        view = payload if isinstance(payload, bytes) else memoryview(payload).cast("B")
        try:
            plane.send(dst, key, view, signature, deadline)
        except ClusterError as e:
            if plane is not self._tcp:
                raise  # the stream reported its failure to the group itself
            if isinstance(e, PeerUnavailableError) and dst in self._departed:
                peer = self._peers[dst]
                e = PeerUnavailableError(
                    f"{peer} left the group (closed its transport) before this rank's "
                    f"message for collective #{key.seq} of group {key.group!r}",
                    task=peer.task, address=peer.address)
            self._fail(e)  # a frame may be cut short: the group cannot go on
            raise e from None

    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        if self.closed:
            raise TransportClosedError(f"{self._me}: transport is closed")
        try:
            return self._mailbox.get(src, key, deadline)
        finally:
            if self._tcp is not None:
                self._tcp.unpost(src, key)

    def post_recv(self, src: int, key: MessageKey, into: memoryview) -> None:
        # The offer goes to the TCP plane whatever this rank's own route to ``src`` is: a
        # peer's frames come over the plane *it* sends on, and in lazy mode this rank has no
        # route at all to a peer it only receives from (a ring's left neighbour at N >= 3).
        # Offering through our route dropped every such offer, and each gathered chunk was
        # then copied out of a fresh buffer. The gRPC plane takes no offers.
        if self._tcp is not None:
            self._tcp.post(src, key, into)

    # -- failure ----------------------------------------------------------------------------

    def _fail(self, error: ClusterError) -> None:
        if not self.closed and self._mailbox.fail(error):
            log.debug("%s: group failed: %s", self._me, error)
        self._failed_event.set()
        for plane in self._planes:
            plane.clear_posted()  # nothing more lands in a failed collective's buffers

    def _peer_lost_by_rank(self, rank: int, why: str) -> None:
        if self.closed or rank in self._departed:
            return
        peer = self._peers[rank]
        self._peer_lost(peer, PeerUnavailableError(f"{peer} is unavailable: {why}",
                                                   task=peer.task, address=peer.address))

    def _peer_lost(self, peer: PeerInfo, error: PeerUnavailableError, *,
                   report: bool = True) -> None:
        self._lost.add(peer.rank)
        first = self._mailbox.error is None
        self._fail(error)
        plane = self._routes.get(peer.rank)
        if plane is not None:
            plane.drop(peer.rank)  # a send blocked on a hung peer must not wait forever
        if report and first and self._on_peer_lost is not None and not self.closed:
            self._on_peer_lost(peer, _reason(peer, str(error)))  # others learn the cause

    def peer_lost(self, task: str, why: str) -> None:
        """``task`` is lost, as the caller learnt elsewhere (the coordination service): fail
        the group naming it. Ignored for a task outside the group, or a closed transport."""
        peer = next((p for p in self._peers if p.task == task), None)
        if peer is None or peer.rank == self.rank or self.closed:
            return
        self._peer_lost(peer, PeerUnavailableError(f"{peer} is unavailable: {_reason(peer, why)}",
                                                   task=peer.task, address=peer.address),
                        report=False)

    def lost_by_peer(self, task: str, reason: str, lost_task: str, lost_address: str) -> None:
        """``task`` found ``lost_task`` dead and is leaving: this rank has lost it too."""
        peer = next((p for p in self._peers if p.task == lost_task), None)
        if peer is None or peer.rank == self.rank:  # not a peer here: only the abort is certain
            self.aborted_by_peer(task, reason)
            return
        self._peer_lost(peer, PeerUnavailableError(
            f"{peer} is unavailable, as {task} found: {_reason(peer, reason)}",
            task=peer.task, address=peer.address))

    def _lost_cause(self) -> PeerInfo | None:
        """The peer whose death failed this rank's group, if that is why it failed."""
        return lost_cause(self._mailbox.error, self._peers, self._departed, self.rank)

    def _pass_on_loss(self, deadline: Deadline, lost: PeerInfo | None) -> None:
        """Before this rank's goodbye: if its group failed because ``lost`` died, tell the
        others.

        A goodbye reads as "left the group", so a rank waiting on this one would otherwise name
        this rank, not the task that died. Each call is acknowledged only once the receiver's
        group has failed, so every peer that answers holds the root cause before the goodbye;
        the goodbye (on either plane) names ``lost`` too, so a late ack changes nothing there.
        """
        if self._aborts.told or lost is None:
            return
        timeout = max(min(deadline.remaining(), 2.0), 0.05)
        Aborts.wait(self._aborts.start(self._aborts.loss(lost, str(self._mailbox.error)), timeout,
                                       skip=frozenset({*self._lost, *self._departed})))

    @property
    def failed(self) -> bool:
        """Whether this rank's group has failed (aborted, or a peer lost)."""
        return self._mailbox.error is not None

    def abort(self, reason: str, *, deadline: Deadline | None = None) -> None:
        """Tell every peer not known lost (best effort, in parallel, until ``deadline``:
        default ``abort_timeout``) and fail this rank's group too.

        Where the group already failed because a peer died, the peers are told that loss
        instead of ``reason`` (which only wraps it): a peer told a bare abort would fail
        without knowing who died, and its goodbye could then read as a clean departure to a
        rank that has not failed yet."""
        if self.closed:
            return
        lost = self._lost_cause()
        request = (self._aborts.loss(lost, str(self._mailbox.error)) if lost is not None
                   else self._aborts.bare(reason))
        timeout = self._abort_timeout if deadline is None else max(deadline.remaining(), 0.05)
        # Lazy: only the peers this rank talked to.
        calls = self._aborts.start(request, timeout, skip=frozenset(self._lost))
        self._fail(CollectiveAbortedError(f"{self._me} aborted the group: {reason}",
                                          task=self._me.task))
        if self._on_abort is not None and lost is None:
            # And the caller tells the rest; a loss was told when it was found (a LOST event),
            # and an ABORTED one arriving first would fail a peer without naming who died.
            self._on_abort(reason)
        Aborts.wait(calls)

    def check(self) -> None:
        self._mailbox.check()

    def close(self, deadline: Deadline | None = None) -> None:
        if self.closed:
            return
        deadline = deadline or Deadline.after(5.0)
        lost = self._lost_cause()
        self._pass_on_loss(deadline, lost)  # before any goodbye, which peers take as the cause
        if self._monitor is not None:
            self._monitor.close(deadline)
        for plane in self._planes:
            plane.close(deadline, lost.task if lost is not None else "")
        self.closed = True
        self._mailbox.close()
        close_channels(self._channels.values(), deadline, what=f"{self._me.task}'s peer channel")


def _reason(peer: PeerInfo, message: str) -> str:
    """Why ``peer`` is lost, from ``message``: another task's error about it opens with
    ``"{peer} is unavailable: "`` too, and wrapped again it would say so twice."""
    return message.removeprefix(f"{peer} is unavailable: ")
