"""This rank's side of the TCP data plane's connections: dialling a peer's data port (the
connector's half of the handshake of :mod:`~cluster.transport._tcp_protocol`) and the streams
that frames to one peer are sent on.

Streams: a rank holds up to ``MAX_STREAMS`` connections to one peer. Stream 0 opens with the
route (:meth:`Dialer.connect`); :meth:`Streams.send` writes each frame whole on one stream, the
first whose lock is free. When every stream is busy and the frame is large (more than
:data:`SMALL_PAYLOAD`), it opens the next stream, authenticated exactly like the first, and
sends on it: two threads sending to one peer at once (a ring's two lanes at ``N = 2``, whose
neighbours on both sides are that peer) then copy into two sockets in parallel, and the peer
drains them on two receiver threads. A small frame never opens a stream (it waits for a free
one: a handshake costs more than it would wait), and neither does a peer that failed to take
one (logged at debug; no new try for :data:`RETRY_SECONDS`). A frame never waits past its
deadline for a stream. Frames are matched by (source, key) at the receiver, so their order across
streams does not matter.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
import time

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
from cluster.transport._sockio import recv_exact, send_all, shutdown, tune
from cluster.transport.api import MessageKey, PeerInfo

__all__ = [
    "MAX_STREAMS",
    "OPEN_SECONDS",
    "RETRY_SECONDS",
    "SMALL_PAYLOAD",
    "Dialer",
    "HandshakeDroppedError",
    "Stream",
    "Streams",
]

log = logging.getLogger("cluster.transport.tcp")

MAX_STREAMS = wire.MAX_STREAMS
SMALL_PAYLOAD = 64 << 10  # at most this: sent in one write, and never opens a stream
OPEN_SECONDS = 5.0  # an extra stream's handshake, at most (the acceptor drops one that is slower)
RETRY_SECONDS = 30.0  # after a peer failed to take an extra stream, no new try for this long


class HandshakeDroppedError(ConnectionError):
    """The peer's data port kept closing this rank's connection before answering its handshake,
    until the deadline: the peer is busy (its pending-handshake slots taken) or going away.

    Transient, and never a sign of a wrong token. An ``OSError``, so callers treat it like an
    unreachable port.
    """


class _Dropped(Exception):
    """One connection attempt ended before the acceptor answered (or with a transient refusal);
    the connector may try again."""


class Dialer:
    """Opens this rank's authenticated connections to peers' data ports (TLS after the token
    handshake when ``tls`` is given); ``closing`` is set once the plane closes."""

    def __init__(self, me: PeerInfo, world: int, key: bytes, tls: _tcp_tls.DataPlaneTls | None,
                 closing: threading.Event) -> None:
        self.me = me
        self.world = world
        self.tls = tls
        self.magic = wire.MAGIC if tls is None else wire.MAGIC_TLS
        self.closing = closing
        self._key = key

    def connect(self, peer: PeerInfo, host: str, port: int, deadline: Deadline,
                stream: int = 0) -> socket.socket:
        """Open and authenticate connection ``stream`` to ``peer``'s data port, by ``deadline``.

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
                return self.attempt(peer, host, port, deadline, stream)
            except _Dropped as e:
                last = str(e)
                if deadline.expired or self.closing.is_set():
                    raise self._dropped(peer, host, port, attempts, last) from e
                log.debug("%s: %s's data port dropped handshake #%d (%s); retrying",
                          self.me, peer, attempts, e)
                self.closing.wait(min(backoff, deadline.remaining()))
                backoff = min(backoff * 2, 0.5)
            except TimeoutError as e:
                if attempts == 1:
                    raise
                # The deadline ran out in a retry: the drops before it are the story.
                raise self._dropped(peer, host, port, attempts - 1, last) from e

    def _dropped(self, peer: PeerInfo, host: str, port: int, attempts: int,
                 last: str) -> HandshakeDroppedError:
        return HandshakeDroppedError(
            f"{self.me}: {peer}'s data port {host}:{port} took none of {attempts} "
            f"connection(s) before the deadline (last: {last}); the peer is busy (its "
            "pending-handshake slots taken, e.g. by a connection flood), still closing an "
            "earlier connection, or shutting down")

    def attempt(self, peer: PeerInfo, host: str, port: int, deadline: Deadline,
                stream: int) -> socket.socket:
        """One connection and handshake; raises ``_Dropped`` for a transient failure, else as
        :meth:`connect`."""
        timeout = max(deadline.remaining(), 0.05)
        sock = socket.create_connection((host.strip("[]"), port), timeout=min(timeout, 10.0))
        try:
            tune(sock)
            self._prove(sock, peer, deadline, stream)
            if self.tls is not None:
                sock = _tcp_tls.dial(sock, self.tls, host.strip("[]"), deadline)
            sock.settimeout(None)  # sends set their own timeout from their deadline
        except (EOFError, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError,
                ssl.SSLZeroReturnError) as e:
            sock.close()
            raise _Dropped(f"{type(e).__name__}: {e}") from e
        except ssl.SSLError as e:  # a certificate refused, by this side or the acceptor
            sock.close()
            raise UnauthenticatedError(
                f"{peer}'s data connection failed mutual TLS authentication with "
                f"{self.me.task} ({e}): both tasks' certificates must be signed by the CA "
                "each is given (CLUSTER_TLS_CA), and carry the host dialled as a SAN") from e
        except BaseException:
            sock.close()
            raise
        return sock

    def _prove(self, sock: socket.socket, peer: PeerInfo, deadline: Deadline,
               stream: int) -> None:
        """The connector's side of the handshake, every read bounded by ``deadline``."""
        first = recv_exact(sock, wire.SERVER_HELLO_BYTES, deadline)
        magic = first[:len(wire.MAGIC)]
        if magic in (wire.MAGIC, wire.MAGIC_TLS) and magic != self.magic:
            raise ClusterSpecMismatchError(
                f"{peer}'s data port {'runs' if magic == wire.MAGIC_TLS else 'does not run'} "
                f"TLS, {self.me.task}'s {'does' if self.tls else 'does not'}: give every task "
                "the same tls: setting (CLUSTER_TLS_CERT, _KEY, _CA)")
        if magic != self.magic:
            raise UnauthenticatedError(f"{peer}'s data port speaks another protocol")
        nonce = wire.new_nonce()
        facts = wire.Facts(first[len(wire.MAGIC):], nonce, self.me.rank, peer.rank, self.world,
                           stream, self.me.task, peer.task)
        send_all(sock, wire.HELLO.pack(self.magic, self.me.rank, peer.rank, self.world, stream,
                                       nonce, wire.client_mac(self._key, facts)), deadline)
        answer = recv_exact(sock, wire.SERVER_PROOF_BYTES, deadline)
        reason = wire.decode_refusal(answer)
        if reason is None:
            expected = wire.MAGIC + wire.server_mac(self._key, facts)
            if not hmac.compare_digest(answer, expected):
                raise UnauthenticatedError(
                    f"{peer} failed to prove it holds the cluster token on {self.me.task}'s "
                    "data connection (another CLUSTER_TOKEN, or not the peer at that port)")
            return
        if reason.transient:
            raise _Dropped(f"refused: {reason.name}")
        if reason == wire.Refusal.BAD_MAC:
            raise UnauthenticatedError(
                f"{peer} refused {self.me.task}'s data connection: its proof did not match. "
                "CLUSTER_TOKEN, or the task names of the cluster spec, differ between the tasks; "
                "give every task the same token and cluster")
        if reason == wire.Refusal.BAD_STREAM:
            raise ClusterSpecMismatchError(
                f"{peer} refused {self.me.task}'s data connection #{stream}: it takes fewer "
                "connections per peer; the tasks run different versions of cluster-runtime")
        raise ClusterSpecMismatchError(
            f"{peer} refused {self.me.task}'s data connection: it sees another group "
            f"({reason.name}: {self.me.task} as rank {self.me.rank} sending to rank "
            f"{peer.rank} of {self.world}); give every task the same cluster")


class Stream:
    """One connection to a peer; a sender holds ``lock`` for a whole frame, so frames never
    interleave. ``error``, once set, is what every later send on it raises."""

    def __init__(self, sock: socket.socket, peer: PeerInfo, index: int) -> None:
        self.sock = sock
        self.peer = peer
        self.index = index
        self.lock = threading.Lock()
        self.error: ClusterError | None = None
        self.tls = isinstance(sock, ssl.SSLSocket)  # no sendmsg: two writes instead

    def send_locked(self, header: bytes, payload: bytes | memoryview, deadline: Deadline,
                    key: MessageKey, closing: threading.Event) -> None:
        """Write one frame; the caller holds :attr:`lock`."""
        if self.error is not None:
            raise self.error
        timeout = deadline.timeout()
        if timeout is not None and timeout <= 0:
            raise _timed_out(self.peer, key)
        sock = self.sock
        try:
            sock.settimeout(timeout)
            if len(payload) <= SMALL_PAYLOAD:
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
            self.error = _timed_out(self.peer, key)
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


def _timed_out(peer: PeerInfo, key: MessageKey) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(
        f"sending to {peer} for collective #{key.seq} of group {key.group!r}: peer not "
        "receiving before the deadline")


class Streams:
    """This rank's streams to one peer (stream 0 is ``first``, at ``host:port``); see the module
    doc. Thread-safe: any number of threads may send at once."""

    def __init__(self, peer: PeerInfo, host: str, port: int, first: socket.socket,
                 dialer: Dialer) -> None:
        self.peer = peer
        self._host, self._port = host, port
        self._dialer = dialer
        self._cond = threading.Condition()  # guards what follows, and wakes senders waiting
        # Open (or closed or dropped) streams, by index; replaced whole, never changed in place,
        # so that senders read it without the lock.
        self.streams: tuple[Stream, ...] = (Stream(first, peer, 0),)
        self._opening = False
        self._retry_at = 0.0
        self._waiting = 0  # senders waiting in _wait: a releasing sender wakes one
        self._ended = ""  # "closed" or "dropped": no stream opens any more
        self._lost = ""  # what close() said in its goodbyes

    def send(self, header: bytes, payload: bytes | memoryview, deadline: Deadline,
             key: MessageKey) -> None:
        """Write one frame on one stream; returns once the kernel holds every byte."""
        stream = self._free()
        if stream is None and len(payload) > SMALL_PAYLOAD:
            stream = self._open(deadline)
        if stream is None:
            stream = self._wait(deadline, key)
        try:
            stream.send_locked(header, payload, deadline, key, self._dialer.closing)
        finally:
            stream.lock.release()
            if self._waiting:
                with self._cond:
                    self._cond.notify()

    def _free(self) -> Stream | None:
        """A stream whose lock this thread now holds, if one is free."""
        for stream in self.streams:
            if stream.lock.acquire(blocking=False):
                return stream
        return None

    def _wait(self, deadline: Deadline, key: MessageKey) -> Stream:
        """Wait for a free stream (holding its lock on return), at most until ``deadline``."""
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    stream = self._free()
                    if stream is not None:
                        return stream
                    timeout = deadline.timeout()
                    if timeout is not None and timeout <= 0:
                        raise _timed_out(self.peer, key)
                    self._cond.wait(timeout)
            finally:
                self._waiting -= 1

    def _open(self, deadline: Deadline) -> Stream | None:
        """Open the next stream and return it locked; None when that is not to be tried now
        (all open, another thread opening one, a recent failure, closed) or it failed."""
        with self._cond:
            if (self._ended or self._opening or len(self.streams) >= MAX_STREAMS
                    or time.monotonic() < self._retry_at):
                return None
            self._opening = True
            index = len(self.streams)
        stream = None
        try:
            bound = Deadline(min(deadline.at, time.monotonic() + OPEN_SECONDS))
            stream = Stream(self._dialer.attempt(self.peer, self._host, self._port, bound, index),
                            self.peer, index)
        except (_Dropped, OSError, EOFError, ClusterError) as e:
            # A stream more is an optimisation: the frame waits for an open one instead.
            log.debug("%s: no data connection #%d to %s (%s: %s); sending on %d for the next "
                      "%.0f s", self._dialer.me, index, self.peer, type(e).__name__, e, index,
                      RETRY_SECONDS)
        except BaseException:
            with self._cond:
                self._opening = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._opening = False
            ended = self._ended
            if stream is None:
                self._retry_at = time.monotonic() + RETRY_SECONDS
            elif not ended:
                stream.lock.acquire()  # free: no other thread has seen it
                self.streams = (*self.streams, stream)
            self._cond.notify_all()  # waiters look again, whatever came of it
        if stream is None or not ended:
            return stream
        if ended == "closed":  # closed meanwhile: say goodbye on it too (the peer counts them)
            stream.goodbye(Deadline.after(1.0), self._lost)
        else:
            shutdown(stream.sock)
            stream.sock.close()
        return None

    def drop(self) -> None:
        """Cut every stream (the peer is lost), waking senders blocked on one."""
        with self._cond:
            self._ended = self._ended or "dropped"
            streams = self.streams
        for stream in streams:
            shutdown(stream.sock)

    def close(self, deadline: Deadline, lost: str = "") -> None:
        """Say goodbye on every stream (naming ``lost``, see :meth:`Stream.goodbye`) and close."""
        with self._cond:
            self._ended, self._lost = "closed", lost
            streams = self.streams
        for stream in streams:
            stream.goodbye(deadline, lost)
