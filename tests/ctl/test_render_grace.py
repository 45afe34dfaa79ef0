"""``timeouts.grace`` reaches every render: Kubernetes' ``terminationGracePeriodSeconds`` and
Slurm's ``--signal`` lead time follow it, and the tasks get it as ``CLUSTER_GRACE_PERIOD``; the
sbatch script warns when the cluster's KillWait is shorter (checked by running its lines)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster.ctl.render import RenderOptions, render
from cluster.ctl.spec import parse_cluster_file

pytestmark = pytest.mark.timeout(60)


def spec_with(tmp_path: Path, grace: str, mode: str = "collective"):
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    path.write_text("name: grace-test\n"
                    f"mode: {mode}\n"
                    "entrypoint: train.py\n"
                    "cluster: {chief: 1, worker: 1, ps: 1}\n"
                    f"timeouts: {{grace: {grace}}}\n")
    return parse_cluster_file(path.read_text(), path)


@pytest.mark.parametrize(("grace", "seconds"), [("45", 45), ("2.5", 3), ("0", 0)])
@pytest.mark.parametrize("fmt", ["k8s", "tfjob"])
def test_kubernetes_pods_get_the_grace_and_tasks_see_it(tmp_path, fmt, grace, seconds) -> None:
    text = render(spec_with(tmp_path, grace), fmt, RenderOptions())
    pods = []
    for doc in yaml.safe_load_all(text):
        if doc and doc["kind"] == "Job":
            pods.append(doc["spec"]["template"]["spec"])
        elif doc and doc["kind"] == "TFJob":
            pods += [r["template"]["spec"] for r in doc["spec"]["tfReplicaSpecs"].values()]
    assert len(pods) == 3
    for pod in pods:
        assert pod["terminationGracePeriodSeconds"] == seconds
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["CLUSTER_GRACE_PERIOD"] == str(seconds)


@pytest.mark.parametrize("mode", ["collective", "coordinator"])
def test_slurm_signals_the_tasks_the_grace_before_the_time_limit(tmp_path, mode) -> None:
    script = render(spec_with(tmp_path, "45", mode), "slurm", RenderOptions(time="2:00:00"))
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --signal=TERM@45" in sbatch  # the tasks, not the batch shell (no B:)
    assert "export CLUSTER_GRACE_PERIOD=45\n" in script
    no_grace = render(spec_with(tmp_path, "0", mode), "slurm", RenderOptions())
    assert "#SBATCH --signal" not in no_grace and "kill_wait" not in no_grace
    assert "export CLUSTER_GRACE_PERIOD=0\n" in no_grace


def _kill_wait_lines(script: str) -> str:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("kill_wait="))
    return "\n".join(lines[start:start + 4]) + "\n"


@pytest.mark.parametrize(("kill_wait", "warned"), [("5", True), ("45", False), ("120", False),
                                                   (None, False)])
def test_the_sbatch_script_warns_when_kill_wait_is_shorter_than_the_grace(
        tmp_path, kill_wait, warned) -> None:
    check = _kill_wait_lines(render(spec_with(tmp_path, "45"), "slurm", RenderOptions()))
    assert check.rstrip().endswith("fi")
    bin_dir = tmp_path / "bin"  # the PATH: awk, and scontrol only where the case has one
    bin_dir.mkdir()
    (bin_dir / "awk").symlink_to(shutil.which("awk"))
    if kill_wait is not None:  # a fake scontrol printing what Slurm's prints
        fake = bin_dir / "scontrol"
        fake.write_text("#!/bin/sh\necho 'JobCompType             = jobcomp/none'\n"
                        f"echo 'KillWait                = {kill_wait} sec'\n")
        fake.chmod(0o755)
    # No scontrol at all must not stop the script (set -euo pipefail, as in the script).
    proc = subprocess.run(["/bin/bash", "-c", "set -euo pipefail\n" + check + "echo went-on"],
                          env={**os.environ, "PATH": str(bin_dir)}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "went-on\n"
    found = re.search(r"warning: KillWait is (\d+) s, less than timeouts.grace \(45 s\)",
                      proc.stderr)
    assert bool(found) is warned, proc.stderr
