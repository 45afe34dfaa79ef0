"""The cluster token: where it comes from, how it travels, how servers check it.

Every RPC carries ``authorization: Bearer <CLUSTER_TOKEN>``; servers compare it in constant time
before any handler runs (or any byte of the request is deserialised) and answer UNAUTHENTICATED
otherwise. The token is never logged and never appears in error messages or ``repr``.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from cluster.errors import ClusterError
from cluster.settings import ENV_ALLOW_INSECURE, ENV_TOKEN
from cluster.transport.tls import TlsConfig

if TYPE_CHECKING:
    from cluster.settings import TaskSettings

__all__ = [
    "InsecureClusterError",
    "Token",
    "TokenInterceptor",
    "resolve_token",
]

_METADATA_KEY = "authorization"
_SCHEME = "Bearer "

log = logging.getLogger(__name__)


class InsecureClusterError(ClusterError):
    """No token was given for a cluster that is not confined to this host."""


@dataclass(frozen=True)
class Token:
    """The shared secret, or ``None`` for an insecure loopback cluster. ``repr`` hides it.
    ``tls``: the task's certificates when it runs mutual TLS (:mod:`cluster.transport.tls`),
    carried with the token to every server and channel the task makes."""

    value: str | None = field(repr=False)
    tls: TlsConfig | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata to send with every RPC (empty when insecure)."""
        return () if self.value is None else ((_METADATA_KEY, _SCHEME + self.value),)

    def accepts(self, metadata: Iterable[tuple[str, str | bytes]]) -> bool:
        """True when ``metadata`` carries this token (always True when insecure)."""
        if self.value is None:
            return True
        expected = (_SCHEME + self.value).encode()
        for key, got in metadata:
            if key == _METADATA_KEY:
                got_bytes = got if isinstance(got, bytes) else got.encode()
                return hmac.compare_digest(got_bytes, expected)
        return False


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(addresses: Iterable[str], settings: TaskSettings) -> Token:
    """The token of ``settings`` (``CLUSTER_TOKEN``) under the cluster's token policy.

    No token: a cluster whose addresses are all loopback runs with a warning; any other raises
    :class:`InsecureClusterError` unless ``settings.allow_insecure`` (``CLUSTER_ALLOW_INSECURE=1``).
    The token carries ``settings.tls_files`` as a :class:`TlsConfig` (:class:`TaskConfigError`
    when those files are unusable).
    """
    value, tls = settings.token, TlsConfig.from_settings(settings)
    if value is not None:
        return Token(value, tls)
    addresses = list(addresses)
    if all(_is_loopback(a) for a in addresses):
        log.warning("%s is not set: running unauthenticated on loopback", ENV_TOKEN)
        return Token(None, tls)
    if settings.allow_insecure:
        log.warning("%s is not set and %s=1: RPCs are unauthenticated", ENV_TOKEN,
                    ENV_ALLOW_INSECURE)
        return Token(None, tls)
    remote = sorted(a for a in addresses if not _is_loopback(a))
    raise InsecureClusterError(
        f"{ENV_TOKEN} is not set and the cluster has non-loopback addresses ({', '.join(remote)}):"
        f" set {ENV_TOKEN} to a shared secret on every task (clusterctl does this for you),"
        f" or set {ENV_ALLOW_INSECURE}=1 to run without authentication"
    )


def _deny(request_iterator, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster token")


# Request streaming, whatever the method's real cardinality: gRPC Python reads a unary request
# whole before calling its handler, a streaming one only when the handler iterates, which this
# one never does. The call ends before its body is read (the server's flow-control window, a
# few KiB with BDP probing off, is all that can arrive: server.SERVER_OPTIONS).
_DENY = grpc.stream_stream_rpc_method_handler(_deny)


class TokenInterceptor(grpc.ServerInterceptor):
    """Answers UNAUTHENTICATED to a call without the cluster token, before routing and before
    reading its request.

    Every method, real or not, gets the same answer (a caller without the token learns nothing
    of which services a task runs), from a handler that never reads the request: nothing an
    unauthenticated caller sends is buffered beyond the stream's window, parsed or unpickled.
    """

    def __init__(self, token: Token) -> None:
        self._token = token

    def intercept_service(self, continuation, handler_call_details):
        if self._token.accepts(handler_call_details.invocation_metadata):
            return continuation(handler_call_details)
        return _DENY
