"""Fixtures for every test directory: a per-test process marker with its leak check, the task
processes a test starts (reaped before the leak check), and emulated hosts in network namespaces
(removed, and checked gone, after the test)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cluster.testing import TaskProcesses, processes_with
from cluster.testing import netns as _netns

__all__ = ["REPO", "marker", "netns_hosts", "processes_with", "task_processes"]

# The ``example_runs`` fixture: each documented example run once per session, shared; and how
# a parallel run groups and orders the tests.
pytest_plugins = ["tests._examples", "tests._schedule"]

REPO = Path(__file__).resolve().parents[1]

# Property tests check what is true, not how fast examples are made: on a loaded 2-core machine
# Hypothesis' timing health checks and per-example deadline fail tests that are correct.
settings.register_profile("cluster", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.load_profile("cluster")


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique value for this test to put in its processes' environment (any variable, e.g.
    ``CLUSTER_TEST_MARKER``); asserts none of them is left afterwards, and kills those that
    are, even when the test failed."""
    value = f"cluster-test-{uuid.uuid4().hex}"
    yield value
    leaked = processes_with(value)
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not leaked, f"processes left behind: {leaked}"


@pytest.fixture
def task_processes(marker: str) -> Iterator[TaskProcesses]:
    """Start task processes through this (``task_processes.python("-m", "worker", ...)``): every
    one is killed and reaped when the test ends, before ``marker``'s leak check. The marker is
    not added to their environment: pass it in ``env`` where the leak check should see them."""
    with TaskProcesses() as tasks:
        yield tasks


@pytest.fixture
def netns_hosts(task_processes: TaskProcesses) -> Iterator[Callable[..., _netns.NetnsCluster]]:
    """``netns_hosts(["h1", "h2"], **kwargs)``: a :class:`cluster.testing.netns.NetnsCluster`
    torn down when the test ends (after its task processes), with a check that its namespaces
    are gone. Skips, with the reason, where namespaces cannot be made (not root, no iproute2)."""
    reason = _netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    made: list[_netns.NetnsCluster] = []

    def make(names, **kwargs) -> _netns.NetnsCluster:
        cluster = _netns.NetnsCluster(names, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    task_processes.stop()
    for cluster in made:
        cluster.close()
    left = [ns for ns in _netns.leftover_namespaces()
            if any(ns.startswith(c.switch[:-3]) for c in made)]
    assert not left, f"network namespaces left behind: {left}"
