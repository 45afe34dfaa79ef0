"""TLS on the TCP data plane: after the token handshake, each connection runs mutual TLS.

The API the data plane needs, and nothing more: :class:`DataPlaneTls` holds a pair of
:class:`ssl.SSLContext` (``server`` for connections this rank accepts, ``client`` for those it
dials; both demand the other side's certificate), and :func:`accept` / :func:`dial` turn an
authenticated plain socket into a TLS one within a deadline. Where the contexts come from is the
caller's business (:meth:`cluster.transport.tls.TlsConfig.server_ssl_context` and
``client_ssl_context`` make them from ``CLUSTER_TLS_CERT``/``_KEY``/``_CA``)::

    tls = DataPlaneTls(server=config.server_ssl_context(), client=config.client_ssl_context())
    plane = TcpDataPlane(me, peers, key, bind_host, tls=tls, ...)

Order: the token handshake first, in plaintext, then TLS. A stranger is turned away by the cheap
HMAC exchange (and the per-source handshake slots) before it can make this rank do any
public-key work, so TLS adds no lever to a connection flood. Which mode a port runs is announced
in its first bytes (``MAGIC_TLS`` instead of ``MAGIC``), and each side insists on its own: a
plaintext connector and a TLS acceptor (or the reverse) fail at once with a clear error, and no
one in the middle can downgrade a connection by rewriting those bytes.

After the TLS handshake the acceptor sends one byte (``READY``) over TLS and the dialer waits for
it. With TLS 1.3 the client finishes its handshake before the server has checked the client's
certificate; without this byte a dialer whose certificate the acceptor refuses would believe it
had connected, and its first frames would vanish.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from cluster.deadline import Deadline
from cluster.transport._sockio import recv_exact, send_all

__all__ = ["READY", "DataPlaneTls", "accept", "dial"]

READY = b"\x01"


@dataclass(frozen=True)
class DataPlaneTls:
    """The two ssl contexts of one rank's TCP data plane.

    ``server`` wraps connections this rank accepts, ``client`` those it dials; both must require
    the peer's certificate (``verify_mode == ssl.CERT_REQUIRED``): the data plane runs mutual
    TLS or none. Raises ``ValueError`` otherwise (a programming error, not user input).
    """

    server: ssl.SSLContext
    client: ssl.SSLContext

    def __post_init__(self) -> None:
        for side, context in (("server", self.server), ("client", self.client)):
            if not isinstance(context, ssl.SSLContext):
                raise ValueError(f"DataPlaneTls.{side} must be an ssl.SSLContext")
            if context.verify_mode != ssl.CERT_REQUIRED:
                raise ValueError(f"DataPlaneTls.{side} must require the peer's certificate "
                                 "(verify_mode=CERT_REQUIRED): the data plane runs mutual TLS")


def _handshake(tls_sock: ssl.SSLSocket, deadline: Deadline) -> None:
    left = deadline.timeout()
    if left is not None and left <= 0:
        raise TimeoutError("the deadline passed before the TLS handshake")
    tls_sock.settimeout(left)
    tls_sock.do_handshake()


def accept(sock: socket.socket, tls: DataPlaneTls, deadline: Deadline,
           adopt: Callable[[ssl.SSLSocket], None] | None = None) -> ssl.SSLSocket:
    """The acceptor's TLS handshake on ``sock`` (which it takes over), then ``READY``.

    ``adopt(tls_sock)``, when given, is called before any I/O: the caller swaps the new socket
    into its registries so that closing the plane can shut it down mid-handshake. Raises
    ``ssl.SSLError`` (the peer's certificate is refused), ``TimeoutError``, ``OSError``; the TLS
    socket is closed on any failure.
    """
    tls_sock = tls.server.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    try:
        if adopt is not None:
            adopt(tls_sock)
        _handshake(tls_sock, deadline)
        send_all(tls_sock, READY, deadline)
    except BaseException:
        tls_sock.close()
        raise
    return tls_sock


def dial(sock: socket.socket, tls: DataPlaneTls, host: str, deadline: Deadline) -> ssl.SSLSocket:
    """The dialer's TLS handshake on ``sock`` (which it takes over), checking the acceptor's
    certificate against ``host`` (an IP address or a name, as dialled), then waits for
    ``READY``: the acceptor has accepted this rank's certificate too.

    Raises ``ssl.SSLError`` (a certificate refused, by either side), ``EOFError`` (closed
    before ``READY``), ``TimeoutError``, ``OSError``; the TLS socket is closed on any failure.
    """
    tls_sock = tls.client.wrap_socket(sock, server_side=False, do_handshake_on_connect=False,
                                      server_hostname=host)
    try:
        _handshake(tls_sock, deadline)
        if recv_exact(tls_sock, len(READY), deadline) != READY:
            raise ssl.SSLError("the acceptor answered the TLS handshake with unexpected bytes")
    except BaseException:
        tls_sock.close()
        raise
    return tls_sock
