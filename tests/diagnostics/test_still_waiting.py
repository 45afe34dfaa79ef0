"""A task waiting for its peers at start-up says every few seconds whom it still waits for."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cluster.deadline import Deadline
from cluster.testing import loopback_cluster, tf_config
from cluster.transport._still_waiting import StillWaiting, describe_unregistered
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(90)

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_the_throttle_logs_once_per_period_and_not_before(caplog) -> None:
    caplog.set_level(logging.WARNING, "cluster.transport")
    now = [100.0]
    still = StillWaiting("worker:0", Deadline.after(None), every=5.0, clock=lambda: now[0])
    asked: list[int] = []

    def what() -> str:
        asked.append(1)
        return "worker:1"

    assert still.timeout(None) == 5.0 and still.timeout(2.0) == 2.0
    assert not still.tick(what)  # a start-up that goes well prints nothing
    now[0] = 104.9
    assert not still.tick(what) and not asked
    now[0] = 105.0
    assert still.tick(what)
    now[0] = 107.0
    assert not still.tick(what)
    assert still.timeout(None) == pytest.approx(3.0)
    now[0] = 110.5
    assert still.tick(what)
    assert [r.getMessage() for r in caplog.records] == [
        "worker:0: still waiting for worker:1 (5 s so far)",
        "worker:0: still waiting for worker:1 (10 s so far)"]


def test_describe_unregistered() -> None:
    assert describe_unregistered(["worker:1"], None) == "the coordination service's first answer"
    assert describe_unregistered(["chief:0", "worker:1", "ps:0"], (("worker:1", "ps:0"), 2)) \
        == "2 tasks to start: worker:1, ps:0"
    assert describe_unregistered(["worker:1"], (("worker:1",), 70)) \
        == "70 tasks to start: worker:1, and 69 more"


@pytest.mark.multiprocess
def test_a_task_alone_names_the_peers_it_waits_for(task_processes, marker) -> None:
    cluster = loopback_cluster(chief=1, worker=2)
    chief = task_processes.python(
        "-m", "worker", str(SCRIPTS / "hang.py"), tf_config=tf_config(cluster, "chief", 0),
        cwd=REPO, env={"CLUSTER_TEST_MARKER": marker, "CLUSTER_CONNECT_TIMEOUT": "60"})
    out = chief.read_until("still waiting for", timeout=45)
    line = next(x for x in out.splitlines() if "still waiting for" in x)
    assert line.startswith("WARNING cluster.transport: chief:0: still waiting for 2 tasks to "
                           "start: worker:0, worker:1 ("), line
    assert "giving up in" in line
