"""A real parameter-server cluster for tests: ``ps`` and serving ``worker`` processes on
loopback, and the chief's script run as ``python -m worker SCRIPT`` (the coordinator)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cluster.ctl.ports import pick_free_ports
from tests.processes.conftest import processes_with

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


class PsCluster:
    """``workers`` serving workers and ``ps`` parameter servers, plus a chief slot."""

    def __init__(self, tmp: Path, marker: str, workers: int, ps: int) -> None:
        ports = pick_free_ports("127.0.0.1", 1 + workers + ps)
        self.spec = {
            "chief": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{p}" for p in ports[1:1 + workers]],
            "ps": [f"127.0.0.1:{p}" for p in ports[1 + workers:]],
        }
        self.tmp = tmp
        self.env = {**os.environ, "CLUSTER_TOKEN": uuid.uuid4().hex, "CLUSTER_TEST": marker,
                    "PYTHONPATH": str(REPO), "CLUSTER_HEARTBEAT_TIMEOUT": "3"}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def _env(self, job: str, index: int) -> dict[str, str]:
        return {**self.env, "TF_CONFIG": json.dumps(
            {"cluster": self.spec, "task": {"type": job, "index": index}})}

    def start(self, task: str) -> None:
        job, index = task.split(":")
        command = [sys.executable, "-m", "ps" if job == "ps" else "worker"]
        log = self.tmp / f"{task.replace(':', '-')}.log"
        self.logs[task] = log
        with open(log, "ab") as out:
            self.procs[task] = subprocess.Popen(command, env=self._env(job, int(index)),
                                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def start_all(self) -> None:
        for job in ("ps", "worker"):
            for i in range(len(self.spec[job])):
                self.start(f"{job}:{i}")

    def kill(self, task: str) -> None:
        proc = self.procs[task]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def run_chief(self, script: str, *args: str, timeout: float = 90.0,
                  env: dict[str, str] | None = None) -> tuple[int, str, dict]:
        """Run ``scripts/SCRIPT`` as the chief; (exit code, output, its RESULT json or {})."""
        proc = subprocess.run(
            [sys.executable, "-m", "worker", str(SCRIPTS / script), *args],
            env={**self._env("chief", 0), **(env or {})}, cwd=REPO, capture_output=True,
            text=True, timeout=timeout)
        output = proc.stdout + proc.stderr
        result = {}
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        return proc.returncode, output, result

    def log(self, task: str) -> str:
        return self.logs[task].read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture
def ps_cluster(tmp_path):
    """``ps_cluster(workers=2, ps=2)`` -> a started :class:`PsCluster`; all reaped after."""
    marker = f"cluster-test-{uuid.uuid4().hex}"
    clusters = []

    def make(workers: int = 2, ps: int = 2) -> PsCluster:
        cluster = PsCluster(tmp_path, marker, workers, ps)
        clusters.append(cluster)
        cluster.start_all()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
    leaked = processes_with(marker)
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"processes left behind: {leaked}"
