"""Mutual TLS on the TCP data plane: certificates made here with
``cryptography``; a plaintext or wrong-CA peer cannot connect."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
import time

import pytest

from cluster.deadline import Deadline
from cluster.errors import ClusterSpecMismatchError, UnauthenticatedError
from cluster.transport._tcp_tls import DataPlaneTls
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.tcp import TcpDataPlane

x509 = pytest.importorskip("cryptography.x509")  # a dependency of cluster.transport.tls
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

pytestmark = pytest.mark.timeout(60)

PEERS = [PeerInfo(0, "worker:0", "127.0.0.1:1"), PeerInfo(1, "worker:1", "127.0.0.1:2")]
KEY = MessageKey("g", 0, 0)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class _Ca:
    """A CA and the files of the certificates it signs, under ``directory``."""

    def __init__(self, directory, name: str) -> None:
        self.dir, self.name = directory, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca_file.write_bytes(_cert(name, self.key, name, self.key, ca=True)
                                 .public_bytes(serialization.Encoding.PEM))

    def issue(self, task: str) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert_file = self.dir / f"{self.name}-{task}.pem"
        key_file = self.dir / f"{self.name}-{task}.key"
        cert_file.write_bytes(_cert(task, key, self.name, self.key, ca=False)
                              .public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return str(cert_file), str(key_file)


def _tls(cert: tuple[str, str], trusts: _Ca) -> DataPlaneTls:
    contexts = []
    for side in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(side)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(*cert)
        context.load_verify_locations(str(trusts.ca_file))
        contexts.append(context)
    return DataPlaneTls(server=contexts[0], client=contexts[1])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    good, other = _Ca(directory, "cluster"), _Ca(directory, "other")
    return {"good": good, "other": other,
            "w0": good.issue("worker-0"), "w1": good.issue("worker-1"),
            "stranger": other.issue("worker-0")}


class _Inbox:
    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.arrived = threading.Condition()

    def __call__(self, src, key, received) -> None:
        with self.arrived:
            self.got.append(bytes(received.payload))
            self.arrived.notify_all()

    def wait_for(self, n: int, timeout: float = 10) -> list[bytes]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.got) >= n, timeout)
            return list(self.got)


def _plane(me: int, tls: DataPlaneTls | None, inbox=None) -> TcpDataPlane:
    return TcpDataPlane(PEERS[me], PEERS, b"token", "127.0.0.1", tls=tls,
                        on_message=inbox or (lambda *a: None), on_lost=lambda *a: None,
                        on_departed=lambda *a: None)


def test_frames_travel_over_mutual_tls(pki) -> None:
    inbox = _Inbox()
    acceptor = _plane(1, _tls(pki["w1"], pki["good"]), inbox)
    dialer = _plane(0, _tls(pki["w0"], pki["good"]))
    try:
        dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(10))
        sock = dialer._outbound[1].streams[0].sock
        assert isinstance(sock, ssl.SSLSocket) and sock.version() == "TLSv1.3"
        assert sock.getpeercert()["subject"] == ((("commonName", "worker-1"),),)
        small, large = b"s" * 4096, bytes(range(256)) * (32 << 10)  # 4 KiB, 8 MiB
        for payload in (small, large, small):
            dialer.send(1, KEY, payload, "", Deadline.after(10))
        assert inbox.wait_for(3) == [small, large, small]
        with acceptor._lock:
            assert all(isinstance(c, ssl.SSLSocket) for c in acceptor._inbound.values())
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))


def test_a_second_stream_runs_mutual_tls_too(pki) -> None:
    inbox = _Inbox()
    acceptor = _plane(1, _tls(pki["w1"], pki["good"]), inbox)
    dialer = _plane(0, _tls(pki["w0"], pki["good"]))
    try:
        dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(10))
        large = bytes(range(256)) * (4 << 10)  # 1 MiB: a frame that opens a stream when needed
        with dialer._outbound[1].streams[0].lock:  # stream 0 busy: this frame opens stream 1
            dialer.send(1, KEY, large, "", Deadline.after(10))
        assert inbox.wait_for(1) == [large]
        assert dialer.streams(1) == 2
        sock = dialer._outbound[1].streams[1].sock
        assert isinstance(sock, ssl.SSLSocket) and sock.version() == "TLSv1.3"
        with acceptor._lock:
            assert set(acceptor._inbound) == {(0, 0), (0, 1)}
            assert all(isinstance(c, ssl.SSLSocket) for c in acceptor._inbound.values())
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))


@pytest.mark.parametrize(("cert", "trusts"), [("stranger", "good"), ("w0", "other")],
                         ids=["acceptor-refuses-our-cert", "we-refuse-its-cert"])
def test_a_wrong_ca_peer_cannot_connect(pki, cert, trusts) -> None:
    inbox = _Inbox()
    acceptor = _plane(1, _tls(pki["w1"], pki["good"]), inbox)
    dialer = _plane(0, _tls(pki[cert], pki[trusts]))
    try:
        with pytest.raises(UnauthenticatedError, match="mutual TLS.*CLUSTER_TLS_CA"):
            dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(10))
        assert dialer.routes() == set()
        # Nothing stays registered, so the real peer may still come. The acceptor's thread
        # unregisters after the TLS handshake fails, which may be just after the dialer's error.
        deadline = Deadline.after(10)
        while True:
            with acceptor._lock:
                if acceptor._inbound == {}:
                    break
                assert not deadline.expired, f"still registered: {acceptor._inbound}"
            time.sleep(0.01)
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))


@pytest.mark.parametrize("tls_side", ["acceptor", "dialer"])
def test_plaintext_and_tls_ranks_fail_with_a_clear_error(pki, tls_side) -> None:
    acceptor = _plane(1, _tls(pki["w1"], pki["good"]) if tls_side == "acceptor" else None)
    dialer = _plane(0, _tls(pki["w0"], pki["good"]) if tls_side == "dialer" else None)
    try:
        with pytest.raises(ClusterSpecMismatchError, match="TLS.*tls: setting"):
            dialer.connect(PEERS[1], "127.0.0.1", acceptor.port, Deadline.after(10))
        assert dialer.routes() == set()
    finally:
        dialer.close(Deadline.after(2))
        acceptor.close(Deadline.after(2))


def test_data_plane_tls_must_be_mutual(pki) -> None:
    tls = _tls(pki["w0"], pki["good"])
    lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    lax.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError, match="server must require the peer's certificate"):
        DataPlaneTls(server=lax, client=tls.client)
