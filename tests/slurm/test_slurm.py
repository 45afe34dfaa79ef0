"""Slurm end to end on a real two-node Slurm (cluster.testing.slurm): the rendered sbatch script
runs the quickstart and examples/ps across both nodes; `srun python -m worker` needs no
TF_CONFIG; a failing task fails the job with its own exit code; scancel leaves nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline
from cluster.testing import processes_with, wait_gone
from cluster.testing.slurm import LocalSlurm
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

EXAMPLES = REPO / "examples"
SCRIPTS = REPO / "tests" / "processes" / "scripts"


def _cluster_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(body + f"log_dir: {tmp_path / 'runs'}\n")
    return path


def _render(path: Path, *extra: str) -> Path:
    """`clusterctl render PATH --format slurm --nodes 2`, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "cluster.ctl.cli", "render", str(path),
                           "--format", "slurm", "--nodes", "2", *extra],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    script = path.parent / "job.sh"
    script.write_text(proc.stdout)
    return script


def _sbatch_wait(slurm: LocalSlurm, script: Path, marker: str,
                 timeout: float = 100) -> tuple[int, str, float]:
    """``sbatch --wait``: (its exit code, the job's output, seconds it took)."""
    out = script.parent / "job.out"
    began = time.monotonic()
    proc = subprocess.run(["sbatch", "--wait", f"--output={out}", str(script)],
                          env=slurm.env({"CLUSTER_TEST_MARKER": marker}), cwd=script.parent,
                          capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - began
    text = out.read_text() if out.exists() else ""
    return proc.returncode, f"{proc.stdout}{proc.stderr}{text}", took


def _exit_records(tmp_path: Path) -> list[list[str]]:
    """Every task's ``CODE TIME STOPPED NODE`` line left by the script's wrapper."""
    return [p.read_text().split() for p in sorted(tmp_path.glob("runs/*-slurm-*/*.exit"))]


def test_quickstart_through_the_rendered_sbatch_script(slurm, marker, tmp_path):
    saved = tmp_path / "params.npz"
    shipped = (EXAMPLES / "quickstart" / "cluster.yaml").read_text()
    script = _render(_cluster_file(tmp_path, shipped.replace(
        "entrypoint: train.py", f"entrypoint: {EXAMPLES / 'quickstart' / 'train.py'}").replace(
        'args: ["--epochs", "10"]', f'args: ["--epochs", "10", "--save", "{saved}"]')))
    code, output, _ = _sbatch_wait(slurm, script, marker)
    assert code == 0, output
    assert "[chief:0] training on 1437 digits" in output and "3 replica(s) in sync" in output
    assert "[slurm] the run succeeded (3 tasks)" in output
    with np.load(saved) as params:
        assert float(params["test_accuracy"]) >= 0.95, output
    records = _exit_records(tmp_path)
    assert [r[0] for r in records] == ["0", "0", "0"], records
    assert {r[3] for r in records} == set(slurm.nodes), records  # both nodes ran tasks


def test_srun_runs_python_m_worker_without_tf_config(slurm, marker):
    port_base = pick_free_ports("127.0.0.1", 1)[0]
    env = slurm.env({"CLUSTER_TEST_MARKER": marker, "CLUSTER_TOKEN": os.urandom(16).hex(),
                     "PYTHONPATH": str(REPO), "CLUSTER_SLURM_PORT_BASE": str(port_base),
                     "CUDA_VISIBLE_DEVICES": "4,5"})  # 2 "GPUs" per node: one per task
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(["srun", "-N2", "-n3", "--kill-on-bad-exit=1", sys.executable, "-m",
                           "worker", str(REPO / "tests" / "slurm" / "scripts" / "step.py")],
                          env=env, capture_output=True, text=True, timeout=90, cwd=REPO)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    lines = sorted(re.findall(r"^worker:\d rank \d of 3 on \S+: .*$", proc.stdout, re.M))
    first, second = slurm.nodes
    assert lines == [  # 1 + 2 + 3, exactly; block placement: ranks 0 and 1 on the first node
        f"worker:0 rank 0 of 3 on {first}: sum [6.0, 6.0, 6.0, 6.0, 6.0] gpus 4",
        f"worker:1 rank 1 of 3 on {first}: sum [6.0, 6.0, 6.0, 6.0, 6.0] gpus 5",
        f"worker:2 rank 2 of 3 on {second}: sum [6.0, 6.0, 6.0, 6.0, 6.0] gpus 4",
    ], output


@pytest.mark.timeout(240)  # 18 s on a quiet machine, 60 s at a load of 45 on 2 cores
def test_parameter_server_example_through_sbatch(slurm, marker, tmp_path):
    shipped = (EXAMPLES / "ps" / "cluster.yaml").read_text()
    assert 'args: ["--epochs", "20"]' in shipped
    script = _render(_cluster_file(tmp_path, shipped.replace(  # 5 epochs: light on 2 cores
        "entrypoint: train.py", f"entrypoint: {EXAMPLES / 'ps' / 'train.py'}").replace(
        'args: ["--epochs", "20"]', 'args: ["--epochs", "5"]')))
    assert "--multi-prog" in script.read_text()
    code, output, _ = _sbatch_wait(slurm, script, marker, timeout=220)
    assert code == 0, output
    accuracy = re.search(r"^\[chief:0\] test accuracy ([0-9.]+)", output, re.M)
    assert accuracy is not None and float(accuracy.group(1)) >= 0.85, output  # ~0.95
    for task in ("ps:0", "ps:1", "worker:0", "worker:1"):  # stopped when the chief succeeded:
        # on their own (CLUSTER_STOP_WITH_COORDINATOR) or by the step's SIGTERM, whichever first;
        # a SIGTERM that comes after the chief is gone also says the chief could not be told.
        assert re.search(rf"^\[{task}\] {task}: shutting down \((chief:0 has finished\)|"
                         r"received SIGTERM[;)])", output, re.M), output
    assert "[slurm] the run succeeded (5 tasks)" in output


def test_a_task_that_raises_fails_the_job_with_its_own_exit_code(slurm, marker, tmp_path):
    script = _render(_cluster_file(tmp_path, f"""\
name: fails
entrypoint: {SCRIPTS / 'allreduce.py'}
args: ["--fail", "worker:1", "--check-token"]
cluster: {{chief: 1, worker: 2}}
"""))
    assert "CLUSTER_TOKEN=\"$(head -c 32 /dev/urandom" in script.read_text()
    code, output, took = _sbatch_wait(slurm, script, marker, timeout=90)
    assert code == 1, output  # the root cause's permanent 1, not srun's highest code (201)
    assert took < 60, f"sbatch --wait took {took:.1f} s\n{output}"
    assert "[worker:1] ValueError: boom from worker:1" in output
    assert re.search(r"^\[slurm\] the run failed: worker:1 on \S+ exited 1 \(uncaught "
                     r"exception\): ValueError: boom from worker:1$", output, re.M), output
    assert output.count("token in env: True, in any command line: False") == 3, output


def test_scancel_stops_every_task_and_leaves_nothing(slurm, marker, tmp_path):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    script = _render(_cluster_file(tmp_path, f"""\
name: hangs
entrypoint: {SCRIPTS / 'allreduce.py'}
args: ["--hang", "all", "--pidfile-dir", "{pids_dir}"]
cluster: {{chief: 1, worker: 2}}
"""))
    proc = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}",
                           str(script)], env=slurm.env({"CLUSTER_TEST_MARKER": marker}),
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    deadline = Deadline.after(60)
    while len(list(pids_dir.glob("*.pid"))) < 3 and not deadline.expired:
        time.sleep(0.2)  # the tasks announce themselves in files: nothing else to wait on
    pids = [int(p.read_text()) for p in pids_dir.glob("*.pid")]
    assert len(pids) == 3, (tmp_path / "job.out").read_text()
    assert slurm.run("scancel", job).returncode == 0
    assert wait_gone(pids, 30) == [], "tasks outlived scancel"
    assert slurm.wait_jobs_gone(30) == [], slurm.run("squeue").stdout
    stepds = _pids_with_cmdline(f"[{job}.")  # slurmstepd: [JOB.STEP]
    assert wait_gone(stepds, 30) == [], f"slurmstepd of job {job} left"
    assert wait_gone(processes_with(marker), 30) == []  # nothing of the job is left
    assert "CANCELLED" in (tmp_path / "job.out").read_text()


def _pids_with_cmdline(needle: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_the_local_slurm_resolves_its_nodes_to_distinct_loopback_addresses(slurm):
    hosts = Path("/etc/hosts").read_text()
    for node, address in zip(slurm.nodes, slurm.addresses, strict=True):
        assert re.search(rf"^{re.escape(address)} {node}\s", hosts, re.M), hosts
    assert len(set(slurm.addresses)) == 2
    assert set(slurm.node_states().values()) <= {"idle", "mix", "alloc"}
