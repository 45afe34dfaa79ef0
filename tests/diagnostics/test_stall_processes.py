"""Stall warnings between real task processes: only worker:0 calls a collective, so it logs the
stall naming the collective and the rank it waits for (a 1 s threshold)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.testing import loopback_cluster, tf_config
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.parametrize("path", ["auto", "network"])
def test_the_task_in_a_collective_alone_logs_the_stall(task_processes, marker, path) -> None:
    cluster = loopback_cluster(worker=2)
    tasks = [task_processes.python(
        "-m", "worker", str(SCRIPTS / "stall.py"), tf_config=cluster_config, cwd=REPO,
        env={"CLUSTER_TEST_MARKER": marker, "CLUSTER_CONNECT_TIMEOUT": "30",
             "CLUSTER_STALL_WARNING": "1", "CLUSTER_COLLECTIVE_PATH": path})
        for cluster_config in (tf_config(cluster, "worker", i) for i in range(2))]
    for i, task in enumerate(tasks):
        task.read_until(f"worker:{i} first all_reduce done", timeout=45)
    out = tasks[0].read_until("Did every task call it?", timeout=30)
    line = next(x for x in out.splitlines() if "Did every task call it?" in x)
    assert line.startswith("WARNING cluster.collectives: worker:0 "), line
    assert "all_reduce #1 (float32[1024]) of group 'default' has waited" in line
    assert " for worker:1 (127.0.0.1:" in line
    assert "Did every task call it?" not in tasks[1].stdout


@pytest.mark.parametrize("path", ["auto", "network"])
def test_a_peer_that_finishes_its_script_mid_collective_is_named(task_processes, marker,
                                                                 path) -> None:
    cluster = loopback_cluster(worker=2)
    tasks = [task_processes.python(
        "-m", "worker", str(SCRIPTS / "depart.py"), tf_config=tf_config(cluster, "worker", i),
        cwd=REPO, env={"CLUSTER_TEST_MARKER": marker, "CLUSTER_CONNECT_TIMEOUT": "30",
                       "CLUSTER_COLLECTIVE_PATH": path})
        for i in range(2)]
    code, out = tasks[1].finish(timeout=60)  # worker:1 ends its script: a clean exit
    assert code == 0, out
    code, out = tasks[0].finish(timeout=60)
    assert code != 0, out
    assert ("PeerUnavailableError: worker:1 finished its script while this task waited in "
            "all_reduce #1 (float32[1024]): the tasks called different collectives") in out, \
        out[-3000:]
