"""The TCP data plane: tensor bytes between the ranks of a group over plain, authenticated sockets.

gRPC stays the control plane (Hello, heartbeats, Abort: all authenticated by the token
interceptor); this module only moves payloads, because bare grpcio tops out near 1 GB/s per
direction here while a plain socket does ~3-4 GB/s (``bench/allreduce.py --planes``). Each rank
listens on one extra port, bound where its gRPC server is bound (``TaskServer.bind_host``) and
advertised to peers in the authenticated Hello reply. Each rank opens its own connections to each
peer it sends to (so one set per direction): one when the route opens, and a second one (its
*streams*, at most ``MAX_STREAMS``) when two threads send large frames to that peer at once
(:mod:`~cluster.transport._tcp_outbound`). Every connection is authenticated with the
challenge-response of :mod:`~cluster.transport._tcp_protocol`, which names its stream, before any
frame is read.

Data path:

- ``send`` writes header and payload straight from the caller's buffer with ``sendmsg`` in the
  caller's thread (no copy, no hand-off to a sender thread), on a stream no other thread is
  writing to; it returns when the kernel holds the bytes, so the buffer may be reused, as the
  Transport contract asks. Deadlines bound it through the socket timeout.
- One receiver thread per inbound connection always drains its socket (so two ranks sending to
  each other at once can never deadlock on full socket buffers), reading small frames through a
  staging buffer (one ``recv`` for header and payload) and large payloads with ``recv_into``
  straight into a fresh uninitialised buffer (or the buffer the receiver offered), then files
  them in the mailbox. Two streams from one peer are drained by two threads at once.

Handshakes, which strangers can start, are bounded three ways so that no one can keep a real
peer out. Each has one deadline (``HANDSHAKE_TIMEOUT`` from accept, passed down to every read,
so a connection that drips a byte now and then is still dropped on time). At most
``MAX_PENDING_HANDSHAKES`` run at once, at most ``MAX_PENDING_PER_SOURCE`` from one source
address (an IPv6 /64 counts as one). And when a new connection finds its source's share or
the whole table full, the *oldest* pending handshake of the source holding the most slots is
dropped, rather than the newcomer being refused: a real peer completes its handshake within a
round trip or two, so hostile connections opened earlier (which can only wait) are the ones
that go, and a flood from one source never evicts a peer from another unless the flood uses
more addresses than there are slots. A connector whose connection is closed before the
acceptor answered retries within its deadline: that is a busy or departing peer, never a wrong
token (see :mod:`~cluster.transport._tcp_protocol` for the refusal reasons it can tell apart).
The acceptor holds one connection per (source rank, stream).

Failure: a connection that ends without a goodbye frame (process killed, reset) reports the peer
lost, except a second stream that ends before its first frame (its connector gave up on it
mid-handshake: nothing was sent on it, nothing is missing). A peer has *departed* once every
connection it opened has ended with its goodbye, so a frame still arriving on one stream is
delivered whatever the other says. A failed send raises ``PeerUnavailableError`` naming the peer.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable

import numpy as np

from cluster.deadline import Deadline
from cluster.transport import _tcp_protocol as wire
from cluster.transport import _tcp_tls
from cluster.transport._sockio import Reader, recv_exact, send_all, shutdown, tune
from cluster.transport._tcp_admission import evictee, source_key
from cluster.transport._tcp_outbound import (
    MAX_STREAMS,
    SMALL_PAYLOAD,
    Dialer,
    HandshakeDroppedError,
    Streams,
)
from cluster.transport.api import MessageKey, PeerInfo, Received
from cluster.transport.names import listen

__all__ = ["MAX_STREAMS", "HandshakeDroppedError", "TcpDataPlane"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 5.0  # an accepted connection that has not proven itself by then is dropped
MAX_PENDING_HANDSHAKES = 64  # handshakes in progress at once (one thread each)
MAX_PENDING_PER_SOURCE = 16  # of which one source address (an IPv6 /64) may hold at most


class _Refused(Exception):
    """An inbound connection failed the handshake; the message says why (for the log only),
    ``reason`` what the connector is told (None: it is not told, the connection just closes)."""

    def __init__(self, message: str, reason: wire.Refusal | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class TcpDataPlane:
    """One rank's TCP data connections: a listener for inbound ones, up to ``MAX_STREAMS``
    outbound per peer.

    A :class:`~cluster.transport.dataplane.DataPlane`; ``port`` is the listener's port, which
    the rank advertises in its authenticated Hello reply, and :meth:`connect` opens a route.

    ``on_message(src, key, received)`` files a delivered message; ``on_lost(src, why)`` and
    ``on_departed(src, lost)`` report an inbound connection that broke, or the last of a peer's
    connections ending with its goodbye (``lost``: the task the peer named as the reason it left,
    or ""). Callbacks run on receiver threads.
    """

    name = "tcp"

    def __init__(
        self,
        me: PeerInfo,
        peers: list[PeerInfo],
        key: bytes,
        bind_host: str,
        *,
        on_message: Callable[[int, MessageKey, Received], None],
        on_lost: Callable[[int, str], None],
        on_departed: Callable[[int, str], None],
        tls: _tcp_tls.DataPlaneTls | None = None,
    ) -> None:
        self._me = me
        self._tls = tls
        self._magic = wire.MAGIC if tls is None else wire.MAGIC_TLS
        self._peers = peers
        self._key = key
        self._on_message = on_message
        self._on_lost = on_lost
        self._on_departed = on_departed
        self._closing = threading.Event()
        self._dialer = Dialer(me, len(peers), key, tls, self._closing)
        self._lock = threading.Lock()
        self._outbound: dict[int, Streams] = {}
        # Inbound connections past their handshake, by (source rank, stream); and the goodbyes
        # of peers with a connection still open (the task each named, or ""), not yet reported.
        self._inbound: dict[tuple[int, int], socket.socket] = {}
        self._farewells: dict[int, str] = {}
        self._accepted: set[socket.socket] = set()
        # Handshakes in progress, oldest first, with the source each is charged to.
        self._pending: dict[socket.socket, str] = {}
        self._threads: list[threading.Thread] = []
        self._groups: dict[str, bytes] = {}
        # Buffers offered by recv's caller (see Transport.post_recv). Receiver threads pop an
        # entry when the frame's header arrives; single dict operations are atomic in CPython.
        self._posted: dict[tuple[int, MessageKey], memoryview] = {}
        self._listener = listen(bind_host)  # the gRPC server's choice: the spec's host or all
        self.port: int = self._listener.getsockname()[1]
        accept = threading.Thread(target=self._accept_loop, name=f"data-accept-{me.task}",
                                  daemon=True)
        self._threads.append(accept)
        accept.start()

    # -- outbound --------------------------------------------------------------------------------

    def connect(self, peer: PeerInfo, host: str, port: int, deadline: Deadline) -> None:
        """Open and authenticate this rank's first connection to ``peer``'s data port, by
        ``deadline`` (see :meth:`~cluster.transport._tcp_outbound.Dialer.connect` for what it
        raises); :meth:`send` opens a second one when it pays."""
        sock = self._dialer.connect(peer, host, port, deadline)
        with self._lock:
            self._outbound[peer.rank] = Streams(peer, host, port, sock, self._dialer)

    def send(self, dst: int, key: MessageKey, payload: bytes | memoryview, signature: str,
             deadline: Deadline) -> None:
        """Write one frame to ``dst``; returns once the kernel holds every byte."""
        out = self._outbound[dst]
        group = self._groups.get(key.group)
        if group is None:
            group = self._groups[key.group] = key.group.encode()
        header = wire.encode_header(wire.DATA, group, signature.encode(), key.step, key.chunk,
                                     key.seq, len(payload))
        out.send(header, payload, deadline, key)

    def post(self, src: int, key: MessageKey, into: memoryview) -> None:
        self._posted[(src, key)] = into

    def unpost(self, src: int, key: MessageKey) -> None:
        """Forget an offer the frame did not use (it arrived before the offer was made)."""
        self._posted.pop((src, key), None)

    def clear_posted(self) -> None:
        self._posted.clear()

    def routes(self) -> set[int]:
        """Ranks this plane has an outbound connection to."""
        return set(self._outbound)

    def streams(self, rank: int) -> int:
        """How many connections this rank has opened to ``rank`` (0: no route)."""
        out = self._outbound.get(rank)
        return 0 if out is None else len(out.streams)

    def drop(self, rank: int) -> None:
        """Cut the connections to a peer found lost, waking a send blocked on one."""
        out = self._outbound.get(rank)
        if out is not None:
            out.drop()

    # -- inbound ---------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._listener.accept()
            except OSError as e:
                if not self._closing.is_set():
                    log.error("%s: data listener failed, accepting no more peers: %s",
                              self._me, e)
                return
            source = source_key(addr[0])
            evicted, evicted_from = None, ""
            with self._lock:
                if self._closing.is_set():
                    conn.close()
                    continue
                self._threads = [t for t in self._threads if t.is_alive()]
                order = list(self._pending)
                victim = evictee([self._pending[c] for c in order], source,
                                 MAX_PENDING_PER_SOURCE, MAX_PENDING_HANDSHAKES)
                if victim is not None:
                    evicted = order[victim]
                    evicted_from = self._pending.pop(evicted)  # its thread sees EOF, closes it
                self._pending[conn] = source
                self._accepted.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn, source), daemon=True,
                                          name=f"data-recv-{self._me.task}")
                self._threads.append(thread)
            if evicted is not None:
                # Debug, not warning: a flood would otherwise become a flood of log lines.
                log.debug("%s: dropped the oldest pending data handshake from %s to make room "
                          "for one from %s", self._me, evicted_from, source)
                shutdown(evicted)
            thread.start()

    def _serve(self, conn: socket.socket, source: str) -> None:
        src, stream = -1, -1
        try:
            deadline = Deadline.after(HANDSHAKE_TIMEOUT)
            try:
                src, stream, conn = self._check_proof(conn, deadline)
            except TimeoutError:
                log.info("%s: dropped a data connection from %s that did not finish its "
                         "handshake within %.1f s", self._me, source, HANDSHAKE_TIMEOUT)
                return
            except _Refused as e:
                log.warning("%s: refused a data connection from %s: %s", self._me, source, e)
                if e.reason is not None:
                    self._refuse(conn, e.reason, deadline)
                return
            except (OSError, EOFError) as e:
                # Closed or evicted before it said anything worth a warning (a scanner, a flood,
                # a connector that gave up): a warning each would let a flood flood the log.
                log.debug("%s: data connection from %s closed mid-handshake: %s", self._me,
                          source, e)
                return
            try:
                lost = self._receive(conn, src, stream)
            except Exception as e:  # EOF, reset, bad frame, no memory: never die silently
                if not self._closing.is_set():
                    self._on_lost(src, f"its data connection broke ({type(e).__name__}: {e})")
                return
            departed = self._ended(src, stream, conn, lost)
            if departed is not None and not self._closing.is_set():
                self._on_departed(src, departed)
        finally:
            with self._lock:
                self._pending.pop(conn, None)
                self._accepted.discard(conn)
                if self._inbound.get((src, stream)) is conn:
                    del self._inbound[(src, stream)]
            conn.close()

    def _ended(self, src: int, stream: int, conn: socket.socket, lost: str | None) -> str | None:
        """Connection ``stream`` from ``src`` ended cleanly: with its goodbye (naming ``lost``)
        or, for ``lost=None``, unused. Returns what to report departed (the task the goodbyes
        named, or "") once it was the peer's last connection and a goodbye came; else None."""
        with self._lock:
            if self._inbound.get((src, stream)) is conn:
                del self._inbound[(src, stream)]
            if lost is not None:
                self._farewells[src] = self._farewells.get(src, "") or lost
            if any(s == src for s, _ in self._inbound):
                return None  # another connection of the peer may still carry frames
            return self._farewells.pop(src, None)

    def _check_proof(self, conn: socket.socket,
                     deadline: Deadline) -> tuple[int, int, socket.socket]:
        """The acceptor's side of the handshake, all of it bounded by ``deadline``; returns the
        authenticated source rank, its stream, and the socket to read its frames from (a TLS
        one over ``conn`` when this plane runs TLS). Raises ``_Refused`` (with what to tell the
        connector, where it was heard out), ``TimeoutError``, ``EOFError`` or ``OSError``."""
        nonce = wire.new_nonce()
        send_all(conn, self._magic + nonce, deadline)
        magic = recv_exact(conn, len(wire.MAGIC), deadline)  # turn strangers away before the rest
        if magic != self._magic:
            if magic in (wire.MAGIC, wire.MAGIC_TLS):  # the connector saw our mode and stopped
                raise _Refused(f"caller {'does not run' if self._tls else 'runs'} TLS, this "
                               "data port does: the tasks have different tls: settings")
            raise _Refused("not a cluster-runtime data connection")
        _, src, dst, world, stream, client_nonce, mac = wire.HELLO.unpack(
            magic + recv_exact(conn, wire.HELLO.size - len(magic), deadline))
        if not 0 <= src < len(self._peers) or src == self._me.rank:
            raise _Refused(f"caller claims rank {src}, not a peer",
                           wire.Refusal.NOT_A_PEER)
        facts = wire.Facts(nonce, client_nonce, src, dst, world, stream, self._peers[src].task,
                           self._me.task)
        if not hmac.compare_digest(mac, wire.client_mac(self._key, facts)):
            raise _Refused(f"caller claiming to be {self._peers[src].task} failed to prove it "
                           "holds the cluster token",
                           wire.Refusal.BAD_MAC)
        if dst != self._me.rank or world != len(self._peers):
            raise _Refused(f"{self._peers[src]} sees a different group (rank {dst} of {world})",
                           wire.Refusal.OTHER_GROUP)
        if stream >= MAX_STREAMS:
            raise _Refused(f"{self._peers[src]} asked for data connection #{stream}; a peer may "
                           f"open {MAX_STREAMS}", wire.Refusal.BAD_STREAM)
        slot = (src, stream)
        with self._lock:
            if self._closing.is_set():
                reason: wire.Refusal | None = wire.Refusal.CLOSING
            elif slot in self._inbound:
                reason = wire.Refusal.DUPLICATE
            elif self._pending.pop(conn, None) is None:
                raise EOFError("evicted to make room for a newer handshake")
            else:
                reason = None
                self._inbound[slot] = conn  # no longer pending: never evicted from here on
        if reason is not None:
            raise _Refused(f"{self._peers[src]} (connection #{stream}): {reason.name.lower()}",
                           reason)
        current = [conn]  # the socket registered for this connection: plain, then TLS

        def adopt(tls_conn: socket.socket) -> None:  # so that close() can reach the TLS socket
            with self._lock:
                self._accepted.discard(current[0])
                self._accepted.add(tls_conn)
                self._inbound[slot] = current[0] = tls_conn

        try:
            send_all(conn, wire.MAGIC + wire.server_mac(self._key, facts), deadline)
            tune(conn)
            if self._tls is not None:
                conn = _tcp_tls.accept(conn, self._tls, deadline, adopt=adopt)
            conn.settimeout(None)  # the receiver waits for data for as long as the group lives
        except BaseException as e:
            with self._lock:  # registered above: unregister, so the peer may connect again
                if self._inbound.get(slot) is current[0]:
                    del self._inbound[slot]
                self._accepted.discard(current[0])
            if isinstance(e, ssl.SSLError):
                raise _Refused(f"{self._peers[src]} failed mutual TLS authentication: {e}") from e
            raise
        return src, stream, conn

    @staticmethod
    def _refuse(conn: socket.socket, reason: wire.Refusal, deadline: Deadline) -> None:
        """Tell a connector that was heard out why it is refused (best effort: it may be gone)."""
        try:
            send_all(conn, wire.encode_refusal(reason), deadline)
        except OSError:
            pass

    def _receive(self, conn: socket.socket, src: int, stream: int) -> str | None:
        """Deliver frames from ``src`` until its goodbye; returns the task the goodbye names
        ("" for none), or None when a stream other than 0 ended before its first frame;
        raises on EOF, reset or bad bytes."""
        reader = Reader(conn)
        groups: dict[bytes, str] = {}
        deliver = self._on_message
        posted = self._posted
        size = wire.FRAME.size
        try:
            h = wire.decode_header(reader.take(size))
        except (EOFError, OSError):
            if stream == 0:
                raise
            # Its connector gave up on it after the handshake (closing it with our proof
            # unread, which resets it): nothing was sent on it, nothing is missing.
            return None
        while True:
            if h.kind == wire.BYE:
                return bytes(reader.take(h.group_len)).decode("utf-8", "replace")
            names = bytes(reader.take(h.group_len + h.signature_len))
            raw_group = names[:h.group_len]
            group = groups.get(raw_group)
            if group is None:
                group = groups[raw_group] = raw_group.decode("utf-8", "replace")
            signature = names[h.group_len:].decode("utf-8", "replace") if h.signature_len else ""
            key = MessageKey(group, h.seq, h.step, h.chunk)
            payload = posted.pop((src, key), None) if posted else None
            if payload is not None and len(payload) == h.nbytes:
                reader.read_into(payload)  # straight into the collective's output
            elif h.nbytes <= SMALL_PAYLOAD:
                payload = memoryview(bytes(reader.take(h.nbytes)))
            else:
                buf = np.empty(h.nbytes, np.uint8)  # uninitialised: every byte is overwritten
                payload = memoryview(buf)
                reader.read_into(payload)
            deliver(src, key, Received(payload, signature))
            h = wire.decode_header(reader.take(size))

    # -- life ------------------------------------------------------------------------------------

    def close(self, deadline: Deadline, lost: str = "") -> None:
        """Say goodbye on every outbound connection (naming ``lost``, the task this rank leaves
        because of, if any), stop accepting, end every thread."""
        self._closing.set()
        for out in list(self._outbound.values()):
            out.close(deadline, lost)
        shutdown(self._listener)
        self._listener.close()
        with self._lock:
            accepted = list(self._accepted)
            threads = list(self._threads)
        for conn in accepted:
            shutdown(conn)  # wakes receivers blocked in recv
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(deadline.remaining(), 0.5))
