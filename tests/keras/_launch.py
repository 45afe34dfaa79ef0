"""Launch ``tests/keras/_fit_task.py`` on a chief and two workers with ``clusterctl`` (a cluster
file with room for importing Keras and torch on a loaded machine), bounded and reaped."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from cluster.testing import processes_with
from tests.conftest import REPO
from tests.ctl._cli_run import env_with, run_cli

__all__ = ["TASK", "launch_with_reference"]

TASK = Path(__file__).with_name("_fit_task.py")


def _cluster_file(folder: Path, name: str, args: list[str], restart: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        f"entrypoint: {TASK}\n"
        f"args: {args!r}\n"
        "cluster: {chief: 1, worker: 2}\n"
        "env: {OMP_NUM_THREADS: '1', KERAS_BACKEND: torch}\n"
        f"restart: {restart}\n"
        # Importing torch and Keras can starve a task's heartbeat thread for seconds.
        "timeouts: {startup: 120, grace: 60, heartbeat: 15}\n")
    return path


def launch_with_reference(out: Path, variants: list[str], args: list[str], *,
                          restart: str = "{max_restarts: 0}") -> tuple[str, int]:
    """Run the variants on 3 tasks (``out/tasks``, extra task ``args``) and, beside them, in one
    process with plain Keras (``out/plain``). Returns the launch's console and how many attempts
    it took; raises ``AssertionError`` with the output when either run fails or leaves a
    process behind."""
    marker = f"cluster-test-{uuid.uuid4().hex}"
    env = env_with(marker, KERAS_BACKEND="torch")
    env.pop("TF_CONFIG", None)
    path = _cluster_file(out, "keras-fit", [str(out / "tasks"), *variants, *args], restart)
    plain = subprocess.Popen([sys.executable, str(TASK), str(out / "plain"), *variants,
                              "--strategy", "none"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        launch = run_cli(["launch", "--run-dir", str(out / "run"), str(path)], cwd=REPO,
                         env=env, timeout=700)
        plain_output, _ = plain.communicate(timeout=300)
    finally:
        plain.kill()
        plain.wait()
        leaked = processes_with(marker)
    assert not leaked, f"processes left behind: {leaked}"
    assert launch.returncode == 0, launch.stdout[-6000:] + launch.stderr[-3000:]
    assert plain.returncode == 0, plain_output[-4000:]
    return launch.stdout, launch.stdout.count("] run keras-fit attempt ")
