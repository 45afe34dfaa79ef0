"""A real parameter-server cluster for tests: ``ps`` and serving ``worker`` processes on
loopback, and the chief's script run as ``python -m worker SCRIPT`` (the coordinator)."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.testing import TaskProcess, TaskProcesses, loopback_cluster, tf_config
from tests.conftest import REPO

SCRIPTS = Path(__file__).resolve().parent / "scripts"


class PsCluster:
    """``workers`` serving workers and ``ps`` parameter servers, plus a chief slot, each task a
    :class:`~cluster.testing.TaskProcess` tagged with the test's marker and logging to
    ``TMP/TASK.log`` (a restarted task appends to its log)."""

    def __init__(self, tmp: Path, marker: str, workers: int, ps: int) -> None:
        self.spec = loopback_cluster(chief=1, worker=workers, ps=ps)
        self.tmp = tmp
        self.env = {"CLUSTER_TOKEN": uuid.uuid4().hex, "CLUSTER_TEST": marker,
                    "PYTHONPATH": str(REPO), "CLUSTER_HEARTBEAT_TIMEOUT": "3"}
        self.tasks = TaskProcesses()
        self.procs: dict[str, TaskProcess] = {}
        self.logs: dict[str, Path] = {}

    def _start(self, task: str, *args: str, **kwargs: Any) -> TaskProcess:
        job, index = task.split(":")
        return self.tasks.python(
            "-m", "ps" if job == "ps" else "worker", *args, name=task, cwd=REPO,
            tf_config=tf_config(self.spec, job, int(index)), **kwargs)

    def start(self, task: str) -> None:
        """Start (or start again) ``ps:N`` or ``worker:N``."""
        self.logs[task] = self.tmp / f"{task.replace(':', '-')}.log"
        self.procs[task] = self._start(task, env=self.env, log=self.logs[task])

    def start_all(self) -> None:
        for job in ("ps", "worker"):
            for i in range(len(self.spec[job])):
                self.start(f"{job}:{i}")

    def kill(self, task: str) -> None:
        """SIGKILL ``task`` and wait (10 s at most) until it is gone."""
        proc = self.procs[task]
        proc.kill(signal.SIGKILL)
        proc.wait(timeout=10)

    def run_chief(self, script: str, *args: str, timeout: float = 90.0,
                  env: dict[str, str] | None = None) -> tuple[int, str, dict]:
        """Run ``scripts/SCRIPT`` as the chief; (exit code, output, its RESULT json or {}).

        Raises ``TaskTimeoutError`` (having killed it) if it runs longer than ``timeout`` s.
        """
        # stderr kept apart: a log line cannot split the RESULT line of stdout.
        chief = self._start("chief:0", str(SCRIPTS / script), *args,
                            env={**self.env, **(env or {})}, merge_stderr=False)
        code, output = chief.finish(timeout)
        result = {}
        for line in chief.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        return code, output, result

    def log(self, task: str) -> str:
        return self.logs[task].read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM every task, SIGKILL those still running 10 s later; all reaped."""
        self.tasks.stop(grace=10)


@pytest.fixture
def ps_cluster(tmp_path: Path, marker: str) -> Iterator[Callable[..., PsCluster]]:
    """``ps_cluster(workers=2, ps=2)`` -> a started :class:`PsCluster`; all reaped after, before
    the marker's leak check."""
    clusters: list[PsCluster] = []

    def make(workers: int = 2, ps: int = 2) -> PsCluster:
        cluster = PsCluster(tmp_path, marker, workers, ps)
        clusters.append(cluster)
        cluster.start_all()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
