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

Failure: a connection that ends without a goodbye frame (process killed, reset) reports the peer
lost; a goodbye reports it departed; a failed send raises ``PeerUnavailableError`` naming it.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable

import numpy as np

from cluster.deadline import Deadline
from cluster.errors import (
    ClusterError,
    CollectiveTimeoutError,
    PeerUnavailableError,
    TransportClosedError,
    UnauthenticatedError,
)
from cluster.transport import _tcp_protocol as wire
from cluster.transport._sockio import Reader, recv_exact, shutdown, tune
from cluster.transport.api import MessageKey, PeerInfo, Received
from cluster.transport.names import listen

__all__ = ["TcpDataPlane"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 5.0  # an accepted connection that has not proven itself by then is dropped
MAX_PENDING_HANDSHAKES = 64  # stray connections beyond this are closed unheard
_SMALL_PAYLOAD = 64 << 10  # at most this: copied out of the staging buffer / sent in one write


class _Outbound:
    """This rank's connection to one peer; ``send`` holds its lock so frames never interleave."""

    def __init__(self, sock: socket.socket, peer: PeerInfo) -> None:
        self.sock = sock
        self.peer = peer
        self.lock = threading.Lock()
        self.error: ClusterError | None = None

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
    """An inbound connection failed the handshake; the message says why (for the log only)."""


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
    ) -> None:
        self._me = me
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
        """Open and authenticate this rank's connection to ``peer``'s data port.

        Raises ``OSError`` when the port cannot be reached (the caller may fall back to gRPC),
        ``UnauthenticatedError`` when the peer refuses or fails to prove itself.
        """
        timeout = max(deadline.remaining(), 0.05)
        sock = socket.create_connection((host.strip("[]"), port), timeout=min(timeout, 10.0))
        try:
            tune(sock)
            sock.settimeout(max(deadline.remaining(), 0.05))
            self._prove(sock, peer)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._outbound[peer.rank] = _Outbound(sock, peer)

    def _prove(self, sock: socket.socket, peer: PeerInfo) -> None:
        refused = UnauthenticatedError(
            f"{peer} refused {self._me.task}'s data connection: CLUSTER_TOKEN or the cluster "
            "spec differs between tasks")
        try:
            first = recv_exact(sock, wire.SERVER_HELLO_BYTES)
        except EOFError as e:
            raise refused from e
        if not first.startswith(wire.MAGIC):
            raise UnauthenticatedError(f"{peer}'s data port speaks another protocol")
        server_nonce = first[len(wire.MAGIC):]
        nonce = wire.new_nonce()
        facts = (server_nonce, nonce, self._me.rank, peer.rank, len(self._peers),
                 self._me.task, peer.task)
        mac = wire.client_mac(self._key, *facts)
        sock.sendall(wire.HELLO.pack(wire.MAGIC, self._me.rank, peer.rank, len(self._peers),
                                      nonce, mac))
        try:
            proof = recv_exact(sock, wire.SERVER_PROOF_BYTES)
        except EOFError as e:
            raise refused from e
        expected = wire.MAGIC + wire.server_mac(self._key, *facts)
        if not hmac.compare_digest(proof, expected):
            raise UnauthenticatedError(f"{peer} failed to prove it holds the cluster token")

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
                conn, _ = self._listener.accept()
            except OSError as e:
                if not self._closing.is_set():
                    log.error("%s: data listener failed, accepting no more peers: %s",
                              self._me, e)
                return
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                pending = len(self._accepted) - len(self._inbound)
                if self._closing.is_set() or pending >= MAX_PENDING_HANDSHAKES:
                    conn.close()
                    continue
                self._accepted.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                          name=f"data-recv-{self._me.task}")
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        src = -1
        try:
            try:
                src = self._check_proof(conn)
            except (OSError, EOFError, _Refused) as e:
                log.warning("%s: refused a data connection: %s", self._me, e)
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
                self._accepted.discard(conn)
                if self._inbound.get(src) is conn:
                    del self._inbound[src]
            conn.close()

    def _check_proof(self, conn: socket.socket) -> int:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        nonce = wire.new_nonce()
        conn.sendall(wire.MAGIC + nonce)
        magic = recv_exact(conn, len(wire.MAGIC))  # turn strangers away before the rest
        if magic != wire.MAGIC:
            raise _Refused("not a cluster-runtime data connection")
        _, src, dst, world, client_nonce, mac = wire.HELLO.unpack(
            magic + recv_exact(conn, wire.HELLO.size - len(magic)))
        if not 0 <= src < len(self._peers) or src == self._me.rank:
            raise _Refused(f"caller claims rank {src}, not a peer")
        facts = (nonce, client_nonce, src, dst, world, self._peers[src].task, self._me.task)
        if not hmac.compare_digest(mac, wire.client_mac(self._key, *facts)):
            raise _Refused(f"caller claiming to be {self._peers[src].task} failed to prove it "
                           "holds the cluster token")
        if dst != self._me.rank or world != len(self._peers):
            raise _Refused(f"{self._peers[src]} sees a different group (rank {dst} of {world})")
        with self._lock:
            if src in self._inbound or self._closing.is_set():
                raise _Refused(f"{self._peers[src]} is already connected")
            self._inbound[src] = conn
        conn.sendall(wire.MAGIC + wire.server_mac(self._key, *facts))
        tune(conn)
        conn.settimeout(None)  # the receiver waits for data for as long as the group lives
        return src

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
