"""Mutual TLS for every connection of a task: one frozen configuration, one place that chooses
between a secure and an insecure gRPC port or channel.

A task with ``CLUSTER_TLS_CERT``, ``CLUSTER_TLS_KEY`` and ``CLUSTER_TLS_CA`` (paths to PEM files;
:class:`~cluster.settings.TaskSettings` reads them, all three or none) runs TLS on every gRPC
server and channel, and each side proves itself to the other with a certificate signed by the
cluster's CA (``require_client_auth``): a plaintext client, or one whose certificate another CA
signed, fails the handshake before any RPC reaches a handler. The cluster token stays required
on top (:mod:`cluster.transport.auth`): TLS says "a member of this cluster", the token says the
same again, so a leaked key alone or a leaked token alone is not enough.

Host names are checked: peers dial the addresses of the cluster spec, so a task's certificate
carries those hosts as subject alternative names (IP addresses as IP SANs, names as DNS SANs;
``clusterctl certs`` writes them, :mod:`cluster.ctl.certs`). No ``ssl_target_name_override``.

Every gRPC server port and channel of the runtime goes through :func:`add_port` and
:func:`open_channel` with the :class:`TlsConfig` the task's :class:`~cluster.transport.auth.Token`
carries (``token.tls``; ``None``: plaintext, as before)::

    tls = TlsConfig.load(cert="worker-0.pem", key="worker-0.key", ca="ca.pem")
    port = add_port(server, "127.0.0.1:0", tls)
    channel = open_channel("127.0.0.1:%d" % port, CHANNEL_OPTIONS, tls)

The TCP data plane wraps its sockets with :meth:`TlsConfig.server_ssl_context` and
:meth:`TlsConfig.client_ssl_context` (the same certificates, mutual authentication).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from cluster.errors import TaskConfigError

if TYPE_CHECKING:
    from cluster.settings import TaskSettings

__all__ = ["TlsConfig", "add_port", "open_channel"]

# The variables a TlsConfig comes from (cluster.settings defines them; named here for messages).
_CERT, _KEY, _CA = "CLUSTER_TLS_CERT", "CLUSTER_TLS_KEY", "CLUSTER_TLS_CA"
_MAX_PEM_BYTES = 1 << 20  # a certificate chain is a few KiB: a bigger file is the wrong file


def _read_pem(var: str, path: str, marker: bytes) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_PEM_BYTES + 1)
    except OSError as e:
        raise TaskConfigError(f"{var}={path}: cannot read the file ({e.strerror or e}); "
                              "make it with `clusterctl certs DIR FILE`") from e
    if len(data) > _MAX_PEM_BYTES or marker not in data:
        raise TaskConfigError(f"{var}={path}: not a PEM file with a {marker.decode()} block; "
                              "make it with `clusterctl certs DIR FILE`")
    return data


@dataclass(frozen=True)
class TlsConfig:
    """A task's certificate, its private key and the cluster's CA: the PEM bytes (read once, at
    :meth:`load`) and the paths they came from (:mod:`ssl` loads certificate chains from files).
    ``repr`` shows only the paths."""

    cert_file: str
    key_file: str
    ca_file: str
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    ca_pem: bytes = field(repr=False)

    @classmethod
    def load(cls, *, cert: str | Path, key: str | Path, ca: str | Path) -> TlsConfig:
        """Read and check the three files: PEM blocks of the right kind, a key that belongs to
        the certificate.

        Raises:
            TaskConfigError: a file is missing, unreadable or not the right PEM, or the key does
                not match the certificate; the message names the variable and the path.
        """
        cert, key, ca = str(cert), str(key), str(ca)
        config = cls(cert, key, ca,
                     _read_pem(_CERT, cert, b"-----BEGIN CERTIFICATE-----"),
                     _read_pem(_KEY, key, b"PRIVATE KEY-----"),
                     _read_pem(_CA, ca, b"-----BEGIN CERTIFICATE-----"))
        config.server_ssl_context()  # checks now, at the edge, that key and certificate match
        return config

    @classmethod
    def from_settings(cls, settings: TaskSettings) -> TlsConfig | None:
        """The configuration ``settings.tls_files`` names, or ``None`` (TLS off) when it names
        none. Raises :class:`TaskConfigError` as :meth:`load`."""
        if settings.tls_files is None:
            return None
        cert, key, ca = settings.tls_files
        return cls.load(cert=cert, key=key, ca=ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that demand and verify the client's certificate."""
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)],
                                           root_certificates=self.ca_pem,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials: verify the server against the CA, present our certificate."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem,
                                            private_key=self.key_pem,
                                            certificate_chain=self.cert_pem)

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        side = ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH \
            else ssl.PROTOCOL_TLS_CLIENT
        context = ssl.SSLContext(side)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED  # both sides: mutual authentication
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise TaskConfigError(f"{_CERT}={self.cert_file} with {_KEY}={self.key_file}: "
                                  f"cannot be used together ({e}); the key must be the "
                                  "certificate's (`clusterctl certs` writes matching pairs)"
                                  ) from e
        try:
            context.load_verify_locations(cadata=self.ca_pem.decode("ascii", "replace"))
        except ssl.SSLError as e:
            raise TaskConfigError(f"{_CA}={self.ca_file}: not a CA certificate ({e})") from e
        return context

    def server_ssl_context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` for the accepting side of a TCP connection: presents this
        task's certificate and requires the peer's, signed by the CA."""
        return self._context(ssl.Purpose.CLIENT_AUTH)

    def client_ssl_context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` for the dialling side: verifies the server's certificate
        against the CA and its host name (pass ``server_hostname=`` the host dialled, an IP or a
        name, to ``wrap_socket``), and presents this task's certificate."""
        return self._context(ssl.Purpose.SERVER_AUTH)


def add_port(server: grpc.Server, listen: str, tls: TlsConfig | None) -> int:
    """Bind ``server`` to ``listen`` (``host:port``), with mutual TLS when ``tls`` is given;
    returns the port bound (0 when gRPC could not bind, as ``add_insecure_port``)."""
    if tls is None:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, tls.server_credentials())


def open_channel(address: str, options: Sequence[tuple[str, Any]],
                 tls: TlsConfig | None) -> grpc.Channel:
    """A channel to ``address`` with ``options``, with mutual TLS when ``tls`` is given."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)
