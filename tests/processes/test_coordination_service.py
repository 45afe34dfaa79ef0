"""``python -m coordination_service``: the coordination service in a process of its own. Tasks
given its address (``CLUSTER_COORDINATION_SERVICE``) register and heartbeat there instead of
with the chief; it refuses to start without an address or a cluster, and SIGTERM ends it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cluster.testing import loopback_cluster, tf_config
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

ALLREDUCE = Path(__file__).resolve().parent / "scripts" / "allreduce.py"


def test_tasks_coordinate_through_a_service_of_its_own(task_processes, marker) -> None:
    cluster = loopback_cluster(chief=1, worker=1)
    service_address = loopback_cluster(worker=1)["worker"][0]  # a free port of 127.0.0.1
    env = {"CLUSTER_TEST_MARKER": marker, "CLUSTER_COORDINATION_SERVICE": service_address,
           "CLUSTER_CONNECT_TIMEOUT": "30", "CLUSTER_TOKEN": "s3cret-for-the-test"}
    service = task_processes.python("-m", "coordination_service", cwd=REPO, env=env,
                                    tf_config=tf_config(cluster, "chief", 0))
    service.read_until(f"serving the coordination service of 2 task(s) on {service_address}")
    tasks = [task_processes.python("-m", "worker", ALLREDUCE, cwd=REPO, env=env,
                                   tf_config=tf_config(cluster, job, 0))
             for job in ("chief", "worker")]
    for task in tasks:
        code, out = task.finish(60)
        assert code == 0, out[-3000:]
    service.kill(signal.SIGTERM)
    code, out = service.finish(15)
    assert code == 0, out[-3000:]
    assert "s3cret" not in out


@pytest.mark.parametrize(("env", "message"), [
    ({}, "CLUSTER_COORDINATION_SERVICE is unset"),
    ({"CLUSTER_COORDINATION_SERVICE": "nowhere"}, "expected the service's host:port"),
])
def test_it_refuses_to_start_without_an_address(task_processes, marker, env, message) -> None:
    cluster = loopback_cluster(worker=2)
    service = task_processes.python("-m", "coordination_service", cwd=REPO,
                                    env={"CLUSTER_TEST_MARKER": marker, **env},
                                    tf_config=tf_config(cluster, "worker", 0))
    code, out = service.finish(30)
    assert code == 2, out
    assert message in out, out
