"""Fixtures for every test directory: a per-test process marker with its leak check, and the
task processes a test starts (reaped before the leak check)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.testing import TaskProcesses, processes_with

__all__ = ["REPO", "marker", "processes_with", "task_processes"]

REPO = Path(__file__).resolve().parents[1]


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
