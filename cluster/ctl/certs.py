"""``clusterctl certs``: a certificate authority and the certificates of a cluster's tasks.

What :func:`write_certs` writes into a directory (keys readable by their owner only)::

    ca.pem, ca.key             the cluster's CA (kept and reused when the directory has one)
    JOB-INDEX.pem / .key       one per task of the cluster file (FILE given)
    pod.pem / pod.key          for the Kubernetes formats: every pod of the run shares it (FILE)
    cluster.pem / cluster.key  for hosts named with --hosts (Slurm makes it at job start)

Peers check host names (:mod:`cluster.transport.tls`), so each certificate names the hosts its
task is dialled at as subject alternative names: IP addresses as IP SANs, names as DNS SANs,
always with ``127.0.0.1``, ``::1`` and ``localhost``. A task's: its host from the file (``host``
or its listed address), and its pod names under ``clusterctl render --format k8s`` and ``tfjob``
(:func:`cluster.ctl.render.k8s.pod_address`, :func:`cluster.ctl.render.tfjob.controller_address`,
in ``--namespace``). Keys are ECDSA P-256: made in about a millisecond, and fast handshakes.

``tls: auto`` in a cluster file makes :func:`prepare_run` write the CA and the tasks'
certificates into the run directory at launch (:class:`RunTls` gives each task its
``CLUSTER_TLS_*`` variables).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster.ctl._tls_spec import CA_FILE, task_files
from cluster.ctl.render import k8s, tfjob
from cluster.ctl.render.api import DEFAULT_NAMESPACE
from cluster.ctl.spec import ClusterFile
from cluster.settings import ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY

__all__ = ["DEFAULT_DAYS", "LOOPBACK_NAMES", "RunTls", "main", "prepare_run",
           "task_hosts", "write_certs", "write_host_cert"]

DEFAULT_DAYS = 365
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
_CA_KEY = "ca.key"
_Key = ec.EllipticCurvePrivateKey


def _host_of(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def task_hosts(spec: ClusterFile, namespace: str = DEFAULT_NAMESPACE) -> dict[str, list[str]]:
    """``{"worker:0": [hosts...]}``: what each task's certificate must name (see the module
    docstring); the Kubernetes names only when the run's name can name pods."""
    out: dict[str, list[str]] = {}
    for job in spec.jobs:
        for i in range(job.count):
            hosts = [_host_of(job.addresses[i]) if job.addresses else spec.host.strip("[]")]
            hosts += [_host_of(k8s.pod_address(spec, job.name, i, namespace)),
                      _host_of(tfjob.controller_address(spec, job.name, i, namespace))]
            out[f"{job.name}:{i}"] = list(dict.fromkeys([*hosts, *LOOPBACK_NAMES]))
    return out


def _names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip("[]") for h in hosts):  # "[::1]" is an IPv6 address
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _certificate(subject: str, key: _Key, issuer: x509.Name, signer: _Key, days: int,
                 *, ca: bool, hosts: Iterable[str] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None),
                              critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:  # each task is a server to some peers and a client of others
        builder = (builder
                   .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False))
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    """Write ``data`` to ``path``; a key is created mode 0600 (never readable in between)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_pair(directory: Path, stem: str, key: _Key, cert: x509.Certificate) -> None:
    _write(directory / f"{stem}.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()), secret=True)
    _write(directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM),
           secret=False)


def _ca(directory: Path, name: str, days: int) -> tuple[_Key, x509.Certificate]:
    """The CA in ``directory`` (reused: certificates made before stay valid), or a new one."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / CA_FILE, directory / _CA_KEY
    if cert_path.is_file() and key_path.is_file():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, _Key):
            raise ValueError(f"{key_path}: not an ECDSA key made by clusterctl certs")
        return key, x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} cluster CA")])
    cert = _certificate(f"{name} cluster CA", key, issuer, key, days, ca=True)
    _write_pair(directory, "ca", key, cert)
    return key, cert


def _issue(directory: Path, stem: str, hosts: Iterable[str], ca: tuple[_Key, x509.Certificate],
           days: int) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(stem, key, ca[1].subject, ca[0], days, ca=False, hosts=hosts)
    _write_pair(directory, stem, key, cert)


def write_certs(directory: Path, spec: ClusterFile, *, namespace: str = DEFAULT_NAMESPACE,
                days: int = DEFAULT_DAYS, pods: bool = True) -> list[Path]:
    """The CA, every task's certificate and (``pods``) the Kubernetes pods' shared one, in
    ``directory`` (created); returns the files written or reused. Raises ``OSError`` when the
    directory cannot be written, ``ValueError`` for a foreign ``ca.key``."""
    ca = _ca(directory, spec.name, days)
    hosts = task_hosts(spec, namespace)
    for task, names in hosts.items():
        _issue(directory, task.replace(":", "-"), names, ca, days)
    if pods:
        _issue(directory, "pod", [h for names in hosts.values() for h in names], ca, days)
    return sorted(directory.iterdir())


def write_host_cert(directory: Path, hosts: Iterable[str], *, name: str = "cluster",
                    days: int = DEFAULT_DAYS) -> list[Path]:
    """The CA and ``cluster.pem``/``cluster.key`` naming ``hosts`` (and the loopback names),
    for launchers that learn the hosts only at start (Slurm's allocation)."""
    ca = _ca(directory, name, days)
    _issue(directory, "cluster", [*hosts, *LOOPBACK_NAMES], ca, days)
    return sorted(directory.iterdir())


@dataclass(frozen=True)
class RunTls:
    """Where each task of a launched run finds its certificates (``directory``: the one
    ``clusterctl certs`` wrote, or the run's own under ``tls: auto``)."""

    directory: Path

    def env(self, job: str, index: int) -> dict[str, str]:
        """The task's ``CLUSTER_TLS_CERT``, ``CLUSTER_TLS_KEY``, ``CLUSTER_TLS_CA``."""
        cert, key, ca = task_files(self.directory, job, index)
        return {ENV_TLS_CERT: str(cert), ENV_TLS_KEY: str(key), ENV_TLS_CA: str(ca)}


def prepare_run(spec: ClusterFile, run_dir: Path) -> RunTls | None:
    """``None`` when ``spec`` has no ``tls:``; the files of ``tls: {dir:}``; under
    ``tls: auto`` a new CA and the tasks' certificates in ``RUN_DIR/tls`` (valid 30 days: a
    run's, not a deployment's). Raises ``OSError`` when they cannot be written."""
    if spec.tls is None:
        return None
    if spec.tls.dir is not None:
        return RunTls(spec.tls.dir)
    directory = run_dir / "tls"
    write_certs(directory, spec, days=30, pods=False)
    return RunTls(directory)


def main(args: argparse.Namespace, spec: ClusterFile | None) -> int:
    """Run ``clusterctl certs`` (``spec``: FILE, loaded and validated by the caller); prints
    what was written; 2 for a bad command line, 1 when the files cannot be written."""
    if spec is None and not args.hosts:
        print("clusterctl: certs: give a cluster FILE, --hosts, or both", file=sys.stderr)
        return 2
    if args.days < 1:
        print(f"clusterctl: certs: --days {args.days}: expected 1 or more", file=sys.stderr)
        return 2
    directory = Path(args.dir)
    try:
        if spec is not None:
            write_certs(directory, spec, namespace=args.namespace, days=args.days)
        if args.hosts:
            write_host_cert(directory, args.hosts, days=args.days)
    except (OSError, ValueError) as e:
        print(f"clusterctl: certs: cannot write {directory}: {e}", file=sys.stderr)
        return 1
    print(f"{directory}: CA {directory / CA_FILE}"
          + (f"; {len(spec.tasks())} task certificates and pod.pem" if spec else "")
          + ("; cluster.pem" if args.hosts else ""))
    return 0
