"""``tls:`` in the renders: the Kubernetes formats mount the run's tls Secret and point
``CLUSTER_TLS_*`` at it (strictly valid objects, no key material in the text); the sbatch script
makes a CA and a certificate naming the allocation's nodes at job start. No process is started
except the script's own ``clusterctl certs`` line, run here as the job would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from cluster.ctl.render import RenderOptions, render
from cluster.ctl.spec import load_cluster_file
from cluster.transport.tls import TlsConfig
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

VERSIONS = ("1.29", kubernetes_validate.latest_version())
TLS_ENV = {"CLUSTER_TLS_CERT": "/etc/cluster-runtime/tls/pod.pem",
           "CLUSTER_TLS_KEY": "/etc/cluster-runtime/tls/pod.key",
           "CLUSTER_TLS_CA": "/etc/cluster-runtime/tls/ca.pem"}


def _spec(tmp_path: Path, tls: str | None = "auto"):
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent("""\
        name: run
        entrypoint: train.py
        cluster: {chief: 1, worker: 2, ps: 1}
        """) + (f"tls: {tls}\n" if tls else ""))
    return load_cluster_file(path)


def _pods(text: str) -> list[dict]:
    """Every pod template spec of the rendered Jobs or TFJob."""
    pods = []
    for doc in yaml.safe_load_all(text):
        if doc["kind"] == "Job":
            pods.append(doc["spec"]["template"]["spec"])
        elif doc["kind"] == "TFJob":
            pods += [r["template"]["spec"] for r in doc["spec"]["tfReplicaSpecs"].values()]
    return pods


@pytest.mark.parametrize("fmt", ["k8s", "tfjob"])
def test_kubernetes_pods_mount_the_tls_secret(tmp_path, fmt) -> None:
    text = render(_spec(tmp_path), fmt, RenderOptions(namespace="ml"))
    pods = _pods(text)
    assert len(pods) == 3
    for pod in pods:
        assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": "run-tls"}}]
        (container,) = pod["containers"]
        assert container["volumeMounts"] == [
            {"name": "tls", "mountPath": "/etc/cluster-runtime/tls", "readOnly": True}]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env.get(k) for k in TLS_ENV} == TLS_ENV
    assert "the Secret run-tls: `clusterctl certs DIR cluster.yaml --namespace ml`" in text
    assert "PRIVATE KEY" not in text and "CERTIFICATE-----" not in text


@pytest.mark.parametrize("fmt", ["k8s", "tfjob"])
def test_without_tls_nothing_is_mounted(tmp_path, fmt) -> None:
    text = render(_spec(tmp_path, None), fmt, RenderOptions())
    assert "CLUSTER_TLS" not in text and "run-tls" not in text
    assert all("volumes" not in pod for pod in _pods(text))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_tls_objects_pass_strict_schema_validation(tmp_path, version) -> None:
    spec = _spec(tmp_path)
    for doc in yaml.safe_load_all(render(spec, "k8s", RenderOptions())):
        kubernetes_validate.validate(doc, version, strict=True)
    (tfjob,) = yaml.safe_load_all(render(spec, "tfjob", RenderOptions()))
    for rtype, replica in tfjob["spec"]["tfReplicaSpecs"].items():
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": rtype.lower()},
             "template": replica["template"]}, version, strict=True)


def test_the_sbatch_script_makes_certificates_for_the_allocation_s_nodes(tmp_path) -> None:
    script = render(_spec(tmp_path), "slurm", RenderOptions(nodes=2))
    lines = script.splitlines()
    (certs,) = [i for i, line in enumerate(lines) if " certs " in line]
    (export,) = [i for i, line in enumerate(lines) if line.startswith("export CLUSTER_TLS_CERT")]
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    run_dir = next(i for i, line in enumerate(lines) if line.startswith("export CLUSTER_RUN_DIR"))
    assert run_dir < certs < export < srun
    assert '--hosts $(scontrol show hostnames "$SLURM_JOB_NODELIST")' in lines[certs]
    # The line as the job runs it (scontrol replaced by two node names): the files work.
    command = lines[certs].replace('$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
                                   "node-a node-b").replace('"$PYTHON"', sys.executable)
    command = command.replace("$CLUSTER_RUN_DIR", str(tmp_path / "run"))
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True,
                          timeout=30, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    made = tmp_path / "run" / "tls"
    config = TlsConfig.load(cert=made / "cluster.pem", key=made / "cluster.key",
                            ca=made / "ca.pem")
    sans = x509.load_pem_x509_certificate(config.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"node-a", "node-b", "localhost"} <= set(sans)


def test_without_tls_the_sbatch_script_makes_none(tmp_path) -> None:
    assert "CLUSTER_TLS" not in render(_spec(tmp_path, None), "slurm", RenderOptions())
