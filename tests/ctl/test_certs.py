"""``clusterctl certs`` and the cluster file's ``tls:`` key: the certificates
name every address a task is dialled at, the key is validated before anything starts, and the
quickstart and examples/ps train end to end over mutual TLS through ``clusterctl launch``;
a task whose certificate another CA signed cannot join."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cryptography import x509

from cluster.ctl.cli import main
from cluster.ctl.spec import load_cluster_file
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

QUICKSTART = REPO / "examples" / "quickstart"
PS = REPO / "examples" / "ps"
CONFIGS = Path(__file__).resolve().parent / "tls"


def _sans(path: Path) -> tuple[set[str], set[str]]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ({str(ip) for ip in names.get_values_for_type(x509.IPAddress)},
            set(names.get_values_for_type(x509.DNSName)))


def _issued_by(cert: Path, ca: Path) -> bool:
    try:
        x509.load_pem_x509_certificate(cert.read_bytes()).verify_directly_issued_by(
            x509.load_pem_x509_certificate(ca.read_bytes()))
    except (ValueError, TypeError, x509.InvalidSignature):
        return False
    return True


def _file(tmp_path: Path, body: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_certs_name_each_task_s_host_and_pod_names_and_are_signed_by_the_ca(tmp_path) -> None:
    path = _file(tmp_path, """\
        name: run
        entrypoint: train.py
        cluster: {chief: 1, worker: ["10.1.2.3:2222", "node-b:2222"], ps: 1}
        host: 127.0.0.1
        """)
    out = tmp_path / "certs"
    assert main(["certs", str(out), str(path), "--namespace", "ml"]) == 0
    ca = out / "ca.pem"
    for task in ("chief-0", "worker-0", "worker-1", "ps-0", "pod"):
        assert _issued_by(out / f"{task}.pem", ca), task
        assert stat.S_IMODE((out / f"{task}.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    ips, dns = _sans(out / "worker-0.pem")
    assert ips == {"10.1.2.3", "127.0.0.1", "::1"}
    assert dns == {"localhost", "run-worker-0.run.ml.svc", "run-worker-0.ml.svc"}
    ips, dns = _sans(out / "worker-1.pem")
    assert "node-b" in dns and "10.1.2.3" not in ips
    _, dns = _sans(out / "pod.pem")  # every pod's names: the Kubernetes Secret's certificate
    assert {f"run-{t}.run.ml.svc" for t in ("chief-0", "worker-0", "worker-1", "ps-0")} <= dns
    # Again (another namespace): the CA is kept, so certificates made before stay valid.
    before = ca.read_bytes()
    assert main(["certs", str(out), str(path), "--hosts", "n1", "10.0.0.9"]) == 0
    assert ca.read_bytes() == before
    ips, dns = _sans(out / "cluster.pem")
    assert "10.0.0.9" in ips and "n1" in dns and _issued_by(out / "cluster.pem", ca)
    assert all(ipaddress.ip_address(ip) for ip in ips)


def test_certs_needs_a_file_or_hosts(tmp_path, capsys) -> None:
    assert main(["certs", str(tmp_path / "x")]) == 2
    assert "give a cluster FILE, --hosts, or both" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


BASE = """\
    name: run
    entrypoint: train.py
    cluster: {worker: 2}
    """


@pytest.mark.parametrize(("tls", "expected"), [
    ("automatic", r"tls: expected `auto` or a mapping, got str 'automatic'"),
    ("yes", r"tls: expected `auto` or a mapping, got a boolean"),
    ("3", r"tls: expected `auto` or a mapping, got int 3"),
    ("{dri: certs}", r"tls\.dri"),
    ("{}", r"tls\.dir: missing"),
    ("{dir: nowhere}", r"tls\.dir: directory not found: .*nowhere"),
    ("{dir: half}", r"tls\.dir: .*half lacks worker-1\.key, worker-1\.pem"),
])
def test_a_bad_tls_key_exits_2_naming_the_field(tmp_path, capsys, tls, expected) -> None:
    path = _file(tmp_path, BASE + f"tls: {tls}\n")
    (tmp_path / "half").mkdir()
    for name in ("ca.pem", "worker-0.pem", "worker-0.key"):
        (tmp_path / "half" / name).write_text("x")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert re.search(expected, err), err
    assert not (tmp_path / "runs").exists()


def test_tls_auto_and_a_complete_dir_validate(tmp_path) -> None:
    assert load_cluster_file(_file(tmp_path, BASE + "tls: auto\n")).tls.dir is None
    path = _file(tmp_path, BASE + "tls: {dir: certs}\n")
    assert main(["certs", str(tmp_path / "certs"), str(path)]) == 0  # before the dir exists
    assert load_cluster_file(path).tls.dir == (tmp_path / "certs").resolve()


# -- end to end through clusterctl launch -----------------------------------------------------


def _launch(path: Path, run_dir: Path, marker: str, timeout: float = 100, **env_extra: str):
    env = {**os.environ, "CLUSTER_TEST_MARKER": marker, **env_extra}
    return subprocess.run([sys.executable, "-m", "cluster.ctl.cli", "launch", str(path),
                           "--run-dir", str(run_dir), "--color", "never"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def _config(tmp_path: Path, name: str) -> Path:
    """A test config of tests/ctl/tls/ with its entrypoint made absolute."""
    text = (CONFIGS / name).read_text()
    example = QUICKSTART if "quickstart" in name else PS
    path = tmp_path / name
    path.write_text(text.replace("entrypoint: train.py", f"entrypoint: {example / 'train.py'}"))
    return path


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["auto", "network"])
def test_the_quickstart_trains_over_mutual_tls(tmp_path, marker, path) -> None:
    # network: the gradients travel on the TCP data plane, wrapped in TLS after its handshake.
    proc = _launch(_config(tmp_path, "quickstart.yaml"), tmp_path / "run", marker,
                   CLUSTER_COLLECTIVE_PATH=path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    found = re.search(r"\[chief:0\] +test accuracy (\d\.\d+) on 360 held-out digits", out)
    assert found and float(found.group(1)) >= 0.9, out
    made = sorted(p.name for p in (tmp_path / "run" / "tls").iterdir())
    assert made == ["ca.key", "ca.pem", "chief-0.key", "chief-0.pem", "worker-0.key",
                    "worker-0.pem", "worker-1.key", "worker-1.pem"]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_ps_example_trains_over_mutual_tls(tmp_path, marker) -> None:
    proc = _launch(_config(tmp_path, "ps.yaml"), tmp_path / "run", marker)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "2 workers, 2 parameter servers" in out, out
    found = re.search(r"\[chief:0\] +test accuracy (\d\.\d+) on 360 held-out digits", out)
    assert found and float(found.group(1)) >= 0.85, out


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_task_whose_certificate_another_ca_signed_cannot_join(tmp_path, marker) -> None:
    path = _config(tmp_path, "quickstart.yaml")
    path.write_text(path.read_text().replace("tls: auto", "tls: {dir: certs}")
                    .replace("startup: 60", "startup: 8").replace("max_restarts: 2",
                                                                   "max_restarts: 0"))
    assert main(["certs", str(tmp_path / "certs"), str(path)]) == 0
    assert main(["certs", str(tmp_path / "stranger"), str(path)]) == 0
    for name in ("worker-1.pem", "worker-1.key"):
        shutil.copy(tmp_path / "stranger" / name, tmp_path / "certs" / name)
    proc = _launch(path, tmp_path / "run", marker)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "test accuracy" not in out, out
