"""Mutual TLS under Slurm: the rendered sbatch script makes a CA and a
certificate naming the allocation's nodes at job start, and the quickstart trains across the two
nodes of the local Slurm over TLS."""

from __future__ import annotations

import pytest
from cryptography import x509

from tests.slurm.test_slurm import EXAMPLES, _cluster_file, _render, _sbatch_wait

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def test_quickstart_over_tls_through_the_rendered_sbatch_script(slurm, marker, tmp_path):
    shipped = (EXAMPLES / "quickstart" / "cluster.yaml").read_text()
    script = _render(_cluster_file(tmp_path, shipped.replace(
        "entrypoint: train.py", f"entrypoint: {EXAMPLES / 'quickstart' / 'train.py'}").replace(
        'args: ["--epochs", "10"]', 'args: ["--epochs", "3"]') + "tls: auto\n"))
    code, output, _ = _sbatch_wait(slurm, script, marker)
    assert code == 0, output
    assert "[chief:0] test accuracy" in output and "[slurm] the run succeeded (3 tasks)" in output
    (cert,) = tmp_path.glob("runs/*-slurm-*/tls/cluster.pem")
    names = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert set(slurm.nodes) <= set(names), names
