"""Mutual TLS on a real task server: only a client holding a certificate from
the cluster's CA *and* the token gets an answer; a plaintext client, a client without a
certificate and one whose certificate another CA signed cannot connect at all."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from cluster.ctl.certs import write_host_cert
from cluster.deadline import Deadline
from cluster.errors import TaskConfigError
from cluster.settings import TaskSettings
from cluster.transport._pb import control_pb2
from cluster.transport.api import MessageKey
from cluster.transport.auth import Token, resolve_token
from cluster.transport.control_client import ControlClient
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.server import TaskServer
from cluster.transport.tls import TlsConfig, open_channel

from .conftest import NetworkGroup

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]

SECRET = "tls-test-token"
_CHECK = "/cluster_runtime.v1.Control/Check"


def _tls(directory: Path) -> TlsConfig:
    write_host_cert(directory, [], name=directory.name)
    return TlsConfig.load(cert=directory / "cluster.pem", key=directory / "cluster.key",
                          ca=directory / "ca.pem")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[TlsConfig, TlsConfig]:
    """The cluster's certificates and a stranger's (same names, another CA)."""
    return (_tls(tmp_path_factory.mktemp("cluster")), _tls(tmp_path_factory.mktemp("other")))


@pytest.fixture
def server(certs):
    srv = TaskServer("127.0.0.1:0", Token(SECRET, certs[0]))
    CollectiveEndpoint.install(srv, "worker:0")
    srv.start()
    yield srv
    srv.stop(0)


def _check(channel: grpc.Channel, metadata=()) -> control_pb2.HealthCheckResponse:
    method = channel.unary_unary(
        _CHECK, request_serializer=control_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=control_pb2.HealthCheckResponse.FromString)
    return method(control_pb2.HealthCheckRequest(), timeout=10, metadata=metadata)


def _refused(channel: grpc.Channel, metadata=()) -> grpc.StatusCode:
    with channel, pytest.raises(grpc.RpcError) as info:
        _check(channel, metadata)
    return info.value.code()


def test_a_member_with_the_token_is_answered(server, certs) -> None:
    with open_channel(server.address, (), certs[0]) as channel:
        reply = _check(channel, Token(SECRET).metadata)
    assert reply.status == control_pb2.HealthCheckResponse.SERVING


def test_a_plaintext_client_cannot_connect(server) -> None:
    assert _refused(grpc.insecure_channel(server.address),
                    Token(SECRET).metadata) == grpc.StatusCode.UNAVAILABLE


def test_a_client_whose_certificate_another_ca_signed_cannot_connect(server, certs) -> None:
    stranger = certs[1]
    assert _refused(open_channel(server.address, (), stranger),
                    Token(SECRET).metadata) == grpc.StatusCode.UNAVAILABLE


def test_a_client_without_a_certificate_cannot_connect(server, certs) -> None:
    # Trusts the right CA but presents nothing: require_client_auth refuses the handshake.
    credentials = grpc.ssl_channel_credentials(root_certificates=certs[0].ca_pem)
    channel = grpc.secure_channel(server.address, credentials)
    assert _refused(channel, Token(SECRET).metadata) == grpc.StatusCode.UNAVAILABLE


def test_a_member_without_the_token_is_still_refused(server, certs) -> None:
    for metadata in ((), Token("wrong").metadata):
        assert _refused(open_channel(server.address, (), certs[0]),
                        metadata) == grpc.StatusCode.UNAUTHENTICATED


def test_a_client_does_not_trust_a_server_another_ca_signed(certs) -> None:
    srv = TaskServer("127.0.0.1:0", Token(SECRET, certs[1]))
    CollectiveEndpoint.install(srv, "worker:0")
    srv.start()
    try:
        assert _refused(open_channel(srv.address, (), certs[0]),
                        Token(SECRET).metadata) == grpc.StatusCode.UNAVAILABLE
    finally:
        srv.stop(0)


def test_the_runtime_s_own_clients_speak_tls(server, certs) -> None:
    client = ControlClient("chief:0", Token(SECRET, certs[0]))
    try:
        answers = client.check({"worker:0": server.address}, timeout=10)
    finally:
        client.close()
    assert answers["worker:0"].serving, answers
    plain = ControlClient("chief:0", Token(SECRET))
    try:
        answers = plain.check({"worker:0": server.address}, timeout=2)
    finally:
        plain.close()
    assert not answers["worker:0"].serving, answers


def test_tensors_travel_over_tls_on_the_grpc_plane(certs) -> None:
    group = NetworkGroup(2, token=Token(SECRET, certs[0]), data_plane="grpc")
    try:
        a, b = group.transports
        payload = np.arange(1 << 16, dtype=np.float32).tobytes()
        key = MessageKey(group="tls", seq=0, step=0, chunk=0)
        a.send(1, key, payload, deadline=Deadline.after(10))
        assert bytes(b.recv(0, key, deadline=Deadline.after(10)).payload) == payload
    finally:
        group.close()


def test_the_ssl_contexts_authenticate_both_sides(certs) -> None:
    ours, stranger = certs
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    outcome: list[object] = []

    def accept(count: int) -> None:
        context = ours.server_ssl_context()
        for _ in range(count):
            conn, _ = listener.accept()
            conn.settimeout(10)
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(tls.recv(5))
                    outcome.append("ok")
            except (ssl.SSLError, OSError) as e:
                outcome.append(e)

    thread = threading.Thread(target=accept, args=(2,))
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ours.client_ssl_context().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"hello")
            assert tls.recv(5) == b"hello"
        with pytest.raises((ssl.SSLError, OSError)), \
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                stranger.client_ssl_context().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"hello")
            tls.recv(5)
    finally:
        thread.join(15)
        listener.close()
    assert outcome[0] == "ok" and isinstance(outcome[1], ssl.SSLError), outcome


def test_settings_want_all_three_variables_and_usable_files(tmp_path, certs) -> None:
    with pytest.raises(TaskConfigError, match="CLUSTER_TLS_KEY, CLUSTER_TLS_CA unset"):
        TaskSettings.from_env({"CLUSTER_TLS_CERT": certs[0].cert_file})
    good = {"CLUSTER_TLS_CERT": certs[0].cert_file, "CLUSTER_TLS_KEY": certs[0].key_file,
            "CLUSTER_TLS_CA": certs[0].ca_file}
    token = resolve_token(["127.0.0.1:1"], TaskSettings.from_env({**good,
                                                                  "CLUSTER_TOKEN": SECRET}))
    assert token.tls == certs[0] and SECRET not in repr(token)
    assert resolve_token(["127.0.0.1:1"], TaskSettings.from_env({})).tls is None
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(TaskConfigError, match=f"CLUSTER_TLS_CA={missing}: cannot read"):
        resolve_token([], TaskSettings.from_env({**good, "CLUSTER_TLS_CA": missing}))
    with pytest.raises(TaskConfigError, match="CLUSTER_TLS_CERT=.*cannot be used together"):
        TlsConfig.load(cert=certs[0].cert_file, key=certs[1].key_file, ca=certs[0].ca_file)
    with pytest.raises(TaskConfigError, match="CLUSTER_TLS_KEY=.*not a PEM"):
        TlsConfig.load(cert=certs[0].cert_file, key=certs[0].cert_file, ca=certs[0].ca_file)
