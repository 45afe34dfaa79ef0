"""The TCP data plane: tensor bytes between the ranks of a group over plain, authenticated sockets.

gRPC stays the control plane (Hello, heartbeats, Abort: all authenticated by the token
interceptor); this module only moves payloads, because bare grpcio tops out near 1 GB/s per
direction here while a plain socket does ~3-4 GB/s (``bench/allreduce.py --planes``). Each rank
listens on one extra port, bound where its gRPC server is bound (``TaskServer.bind_host``) and
advertised to peers in the authenticated Hello reply. Each rank opens one connection to each peer
it sends to (one per direction) and authenticates it with the challenge-response of
:mod:`~cluster.transport._tcp_protocol` before any frame is read.

Data path, chosen for this 2-core machine:

- ``send`` writes header and payload straight from the caller's buffer with ``sendmsg`` in the
  caller's thread (no copy, no hand-off to a sender thread); it returns when the kernel holds
  the bytes, so the buffer may be reused, as the Transport contract asks. Deadlines bound it
  through the socket timeout.
- One receiver thread per inbound connection always drains its socket (so two ranks sending to
  each other at once can never deadlock on full socket buffers), reading small frames through a
  staging buffer (one ``recv`` for header and payload) and large payloads with ``recv_into``
  straight into a fresh uninitialised buffer, then files them in the mailbox.

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

Failure: a connection that ends without a goodbye frame (process killed, reset) reports the peer
lost; a goodbye reports it departed; a failed send raises ``PeerUnavailableError`` naming it.
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
from cluster.errors import (
    ClusterError,
    ClusterSpecMismatchError,
    CollectiveTimeoutError,
    PeerUnavailableError,
    TransportClosedError,
    UnauthenticatedError,
)
from cluster.transport import _tcp_protocol as wire
from cluster.transport import _tcp_tls
from cluster.transport._sockio import Reader, recv_exact, send_all, shutdown, tune
from cluster.transport._tcp_admission import evictee, source_key
from cluster.transport.api import MessageKey, PeerInfo, Received
from cluster.transport.names import listen

__all__ = ["HandshakeDroppedError", "TcpDataPlane"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 5.0  # an accepted connection that has not proven itself by then is dropped
MAX_PENDING_HANDSHAKES = 64  # handshakes in progress at once (one thread each)
MAX_PENDING_PER_SOURCE = 16  # of which one source address (an IPv6 /64) may hold at most
_SMALL_PAYLOAD = 64 << 10  # at most this: copied out of the staging buffer / sent in one write


class HandshakeDroppedError(ConnectionError):
    """The peer's data port kept closing this rank's connection before answering its handshake,
    until the deadline: the peer is busy (its pending-handshake slots taken) or going away.

    Transient, and never a sign of a wrong token. An ``OSError``, so callers treat it like an
    unreachable port.
    """


class _Dropped(Exception):
    """One connection attempt ended before the acceptor answered (or with a transient refusal);
    the connector may try again."""


class _Outbound:
    """This rank's connection to one peer; ``send`` holds its lock so frames never interleave."""

    def __init__(self, sock: socket.socket, peer: PeerInfo) -> None:
        self.sock = sock
        self.peer = peer
        self.lock = threading.Lock()
        self.error: ClusterError | None = None
        self.tls = isinstance(sock, ssl.SSLSocket)  # no sendmsg: two writes instead

    def send(self, header: bytes, payload: bytes | memoryview, deadline: Deadline,
             key: MessageKey, closing: threading.Event) -> None:
        with self.lock:
            if self.error is not None:
                raise self.error
            timeout = deadline.timeout()
            if timeout is not None and timeout <= 0:
                raise self._timeout(key)
            sock = self.sock
            try:
                sock.settimeout(timeout)
                if len(payload) <= _SMALL_PAYLOAD:
                    sock.sendall(header + payload)  # one small copy beats a second syscall
                    return
                if self.tls:  # ssl encrypts into its own records anyway
                    sock.sendall(header)
                    sock.sendall(payload)
                    return
                sent = sock.sendmsg((header, payload))
                if sent < len(header):
                    sock.sendall(header[sent:])
                    sent = len(header)
                if sent - len(header) < len(payload):
                    sock.sendall(payload[sent - len(header):])
            except TimeoutError as e:
                # Part of a frame may be on the wire: the stream is unusable from here on.
                self.error = self._timeout(key)
                raise self.error from e
            except OSError as e:
                if closing.is_set():
                    self.error = TransportClosedError(f"connection to {self.peer} is closed")
                else:
                    self.error = PeerUnavailableError(
                        f"{self.peer} unreachable: its data connection failed while sending "
                        f"collective #{key.seq} of group {key.group!r}: {e}",
                        task=self.peer.task, address=self.peer.address)
                raise self.error from e

    def _timeout(self, key: MessageKey) -> CollectiveTimeoutError:
        return CollectiveTimeoutError(
            f"sending to {self.peer} for collective #{key.seq} of group {key.group!r}: peer not "
            "receiving before the deadline")

    def goodbye(self, deadline: Deadline, lost: str = "") -> None:
        """Send the goodbye frame (if the stream is whole) and close, within ``deadline``;
        ``lost`` names the task this rank is leaving because of, if any."""
        if self.lock.acquire(timeout=min(deadline.remaining(), 1.0)):
            try:
                if self.error is None:
                    self.sock.settimeout(max(min(deadline.remaining(), 1.0), 0.01))
                    self.sock.sendall(wire.encode_header(wire.BYE, lost.encode(), b"", 0, 0, 0,
                                                         0))
                    self.error = TransportClosedError(f"connection to {self.peer} is closed")
            except OSError:
                pass  # a peer that is gone needs no goodbye
            finally:
                self.lock.release()
        shutdown(self.sock)
        self.sock.close()


class _Refused(Exception):
    """An inbound connection failed the handshake; the message says why (for the log only),
    ``reason`` what the connector is told (None: it is not told, the connection just closes)."""

    def __init__(self, message: str, reason: wire.Refusal | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class TcpDataPlane:
    """One rank's TCP data connections: a listener for inbound ones, one outbound per peer.

    A :class:`~cluster.transport.dataplane.DataPlane`; ``port`` is the listener's port, which
    the rank advertises in its authenticated Hello reply, and :meth:`connect` opens a route.

    ``on_message(src, key, received)`` files a delivered message; ``on_lost(src, why)`` and
    ``on_departed(src, lost)`` report an inbound connection that broke or said goodbye (``lost``:
    the task the peer named as the reason it left, or ""). Callbacks run
    on receiver threads.
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
        self._lock = threading.Lock()
        self._outbound: dict[int, _Outbound] = {}
        self._inbound: dict[int, socket.socket] = {}
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
        """Open and authenticate this rank's connection to ``peer``'s data port, by ``deadline``.

        A connection the peer closes before answering (its handshake slots are busy, it is going
        away) is retried with backoff until the deadline. Raises ``OSError`` when the port
        cannot be reached (the caller may fall back to gRPC): ``HandshakeDroppedError`` when
        every attempt was dropped unanswered, ``TimeoutError`` when the deadline passed
        mid-handshake; ``UnauthenticatedError`` when the peer refuses this rank's proof of the
        token or fails to prove its own; ``ClusterSpecMismatchError`` when it sees another group.
        """
        backoff, attempts, last = 0.02, 0, ""
        while True:
            attempts += 1
            try:
                sock = self._attempt(peer, host, port, deadline)
                break
            except _Dropped as e:
                last = str(e)
                if deadline.expired or self._closing.is_set():
                    raise self._dropped(peer, host, port, attempts, last) from e
                log.debug("%s: %s's data port dropped handshake #%d (%s); retrying",
                          self._me, peer, attempts, e)
                self._closing.wait(min(backoff, deadline.remaining()))
                backoff = min(backoff * 2, 0.5)
            except TimeoutError as e:
                if attempts == 1:
                    raise
                # The deadline ran out in a retry: the drops before it are the story.
                raise self._dropped(peer, host, port, attempts - 1, last) from e
        with self._lock:
            self._outbound[peer.rank] = _Outbound(sock, peer)

    def _dropped(self, peer: PeerInfo, host: str, port: int, attempts: int,
                 last: str) -> HandshakeDroppedError:
        return HandshakeDroppedError(
            f"{self._me}: {peer}'s data port {host}:{port} took none of {attempts} "
            f"connection(s) before the deadline (last: {last}); the peer is busy (its "
            "pending-handshake slots taken, e.g. by a connection flood), still closing an "
            "earlier connection, or shutting down")

    def _attempt(self, peer: PeerInfo, host: str, port: int, deadline: Deadline) -> socket.socket:
        """One connection and handshake; raises ``_Dropped`` for a transient failure."""
        timeout = max(deadline.remaining(), 0.05)
        sock = socket.create_connection((host.strip("[]"), port), timeout=min(timeout, 10.0))
        try:
            tune(sock)
            self._prove(sock, peer, deadline)
            if self._tls is not None:
                sock = _tcp_tls.dial(sock, self._tls, host.strip("[]"), deadline)
            sock.settimeout(None)  # sends set their own timeout from their deadline
        except (EOFError, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError,
                ssl.SSLZeroReturnError) as e:
            sock.close()
            raise _Dropped(f"{type(e).__name__}: {e}") from e
        except ssl.SSLError as e:  # a certificate refused, by this side or the acceptor
            sock.close()
            raise UnauthenticatedError(
                f"{peer}'s data connection failed mutual TLS authentication with "
                f"{self._me.task} ({e}): both tasks' certificates must be signed by the CA "
                "each is given (CLUSTER_TLS_CA), and carry the host dialled as a SAN") from e
        except BaseException:
            sock.close()
            raise
        return sock

    def _prove(self, sock: socket.socket, peer: PeerInfo, deadline: Deadline) -> None:
        """The connector's side of the handshake, every read bounded by ``deadline``."""
        first = recv_exact(sock, wire.SERVER_HELLO_BYTES, deadline)
        magic = first[:len(wire.MAGIC)]
        if magic in (wire.MAGIC, wire.MAGIC_TLS) and magic != self._magic:
            raise ClusterSpecMismatchError(
                f"{peer}'s data port {'runs' if magic == wire.MAGIC_TLS else 'does not run'} "
                f"TLS, {self._me.task}'s {'does' if self._tls else 'does not'}: give every task "
                "the same tls: setting (CLUSTER_TLS_CERT, _KEY, _CA)")
        if magic != self._magic:
            raise UnauthenticatedError(f"{peer}'s data port speaks another protocol")
        server_nonce = first[len(wire.MAGIC):]
        nonce = wire.new_nonce()
        facts = (server_nonce, nonce, self._me.rank, peer.rank, len(self._peers),
                 self._me.task, peer.task)
        mac = wire.client_mac(self._key, *facts)
        send_all(sock, wire.HELLO.pack(self._magic, self._me.rank, peer.rank, len(self._peers),
                                       nonce, mac), deadline)
        answer = recv_exact(sock, wire.SERVER_PROOF_BYTES, deadline)
        reason = wire.decode_refusal(answer)
        if reason is None:
            expected = wire.MAGIC + wire.server_mac(self._key, *facts)
            if not hmac.compare_digest(answer, expected):
                raise UnauthenticatedError(
                    f"{peer} failed to prove it holds the cluster token on {self._me.task}'s "
                    "data connection (another CLUSTER_TOKEN, or not the peer at that port)")
            return
        if reason.transient:
            raise _Dropped(f"refused: {reason.name}")
        if reason == wire.Refusal.BAD_MAC:
            raise UnauthenticatedError(
                f"{peer} refused {self._me.task}'s data connection: its proof did not match. "
                "CLUSTER_TOKEN, or the task names of the cluster spec, differ between the tasks; "
                "give every task the same token and cluster")
        raise ClusterSpecMismatchError(
            f"{peer} refused {self._me.task}'s data connection: it sees another group "
            f"({reason.name}: {self._me.task} as rank {self._me.rank} sending to rank "
            f"{peer.rank} of {len(self._peers)}); give every task the same cluster")

    def send(self, dst: int, key: MessageKey, payload: bytes | memoryview, signature: str,
             deadline: Deadline) -> None:
        """Write one frame to ``dst``; returns once the kernel holds every byte."""
        out = self._outbound[dst]
        group = self._groups.get(key.group)
        if group is None:
            group = self._groups[key.group] = key.group.encode()
        header = wire.encode_header(wire.DATA, group, signature.encode(), key.step, key.chunk,
                                     key.seq, len(payload))
        out.send(header, payload, deadline, key, self._closing)

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

    def drop(self, rank: int) -> None:
        """Cut the connections to a peer found lost, waking a send blocked on it."""
        out = self._outbound.get(rank)
        if out is not None:
            shutdown(out.sock)

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
        src = -1
        try:
            deadline = Deadline.after(HANDSHAKE_TIMEOUT)
            try:
                src, conn = self._check_proof(conn, deadline)
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
                lost = self._receive(conn, src)
            except Exception as e:  # EOF, reset, bad frame, no memory: never die silently
                if not self._closing.is_set():
                    self._on_lost(src, f"its data connection broke ({type(e).__name__}: {e})")
                return
            if not self._closing.is_set():
                self._on_departed(src, lost)
        finally:
            with self._lock:
                self._pending.pop(conn, None)
                self._accepted.discard(conn)
                if self._inbound.get(src) is conn:
                    del self._inbound[src]
            conn.close()

    def _check_proof(self, conn: socket.socket, deadline: Deadline) -> tuple[int, socket.socket]:
        """The acceptor's side of the handshake, all of it bounded by ``deadline``; returns the
        authenticated source rank and the socket to read its frames from (a TLS one over
        ``conn`` when this plane runs TLS). Raises ``_Refused`` (with what to tell the
        connector, where it was heard out), ``TimeoutError``, ``EOFError`` or ``OSError``."""
        nonce = wire.new_nonce()
        send_all(conn, self._magic + nonce, deadline)
        magic = recv_exact(conn, len(wire.MAGIC), deadline)  # turn strangers away before the rest
        if magic != self._magic:
            if magic in (wire.MAGIC, wire.MAGIC_TLS):  # the connector saw our mode and stopped
                raise _Refused(f"caller {'does not run' if self._tls else 'runs'} TLS, this "
                               "data port does: the tasks have different tls: settings")
            raise _Refused("not a cluster-runtime data connection")
        _, src, dst, world, client_nonce, mac = wire.HELLO.unpack(
            magic + recv_exact(conn, wire.HELLO.size - len(magic), deadline))
        if not 0 <= src < len(self._peers) or src == self._me.rank:
            raise _Refused(f"caller claims rank {src}, not a peer",
                           wire.Refusal.NOT_A_PEER)
        facts = (nonce, client_nonce, src, dst, world, self._peers[src].task, self._me.task)
        if not hmac.compare_digest(mac, wire.client_mac(self._key, *facts)):
            raise _Refused(f"caller claiming to be {self._peers[src].task} failed to prove it "
                           "holds the cluster token",
                           wire.Refusal.BAD_MAC)
        if dst != self._me.rank or world != len(self._peers):
            raise _Refused(f"{self._peers[src]} sees a different group (rank {dst} of {world})",
                           wire.Refusal.OTHER_GROUP)
        with self._lock:
            if self._closing.is_set():
                reason: wire.Refusal | None = wire.Refusal.CLOSING
            elif src in self._inbound:
                reason = wire.Refusal.DUPLICATE
            elif self._pending.pop(conn, None) is None:
                raise EOFError("evicted to make room for a newer handshake")
            else:
                reason = None
                self._inbound[src] = conn  # no longer pending: never evicted from here on
        if reason is not None:
            raise _Refused(f"{self._peers[src]}: {reason.name.lower()}", reason)
        current = [conn]  # the socket registered for this connection: plain, then TLS

        def adopt(tls_conn: socket.socket) -> None:  # so that close() can reach the TLS socket
            with self._lock:
                self._accepted.discard(current[0])
                self._accepted.add(tls_conn)
                self._inbound[src] = current[0] = tls_conn

        try:
            send_all(conn, wire.MAGIC + wire.server_mac(self._key, *facts), deadline)
            tune(conn)
            if self._tls is not None:
                conn = _tcp_tls.accept(conn, self._tls, deadline, adopt=adopt)
            conn.settimeout(None)  # the receiver waits for data for as long as the group lives
        except BaseException as e:
            with self._lock:  # registered above: unregister, so the peer may connect again
                if self._inbound.get(src) is current[0]:
                    del self._inbound[src]
                self._accepted.discard(current[0])
            if isinstance(e, ssl.SSLError):
                raise _Refused(f"{self._peers[src]} failed mutual TLS authentication: {e}") from e
            raise
        return src, conn

    @staticmethod
    def _refuse(conn: socket.socket, reason: wire.Refusal, deadline: Deadline) -> None:
        """Tell a connector that was heard out why it is refused (best effort: it may be gone)."""
        try:
            send_all(conn, wire.encode_refusal(reason), deadline)
        except OSError:
            pass

    def _receive(self, conn: socket.socket, src: int) -> str:
        """Deliver frames from ``src`` until its goodbye; returns the task the goodbye names
        ("" for none); raises on EOF, reset or bad bytes."""
        reader = Reader(conn)
        groups: dict[bytes, str] = {}
        deliver = self._on_message
        posted = self._posted
        size = wire.FRAME.size
        while True:
            h = wire.decode_header(reader.take(size))
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
            elif h.nbytes <= _SMALL_PAYLOAD:
                payload = memoryview(bytes(reader.take(h.nbytes)))
            else:
                buf = np.empty(h.nbytes, np.uint8)  # uninitialised: every byte is overwritten
                payload = memoryview(buf)
                reader.read_into(payload)
            deliver(src, key, Received(payload, signature))

    # -- life ------------------------------------------------------------------------------------

    def close(self, deadline: Deadline, lost: str = "") -> None:
        """Say goodbye on every outbound connection (naming ``lost``, the task this rank leaves
        because of, if any), stop accepting, end every thread."""
        self._closing.set()
        for out in list(self._outbound.values()):
            out.goodbye(deadline, lost)
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
