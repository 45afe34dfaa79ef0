"""Stall warnings (cluster.collectives._stall): a collective that waits past the threshold logs
which one it is and whom it waits for; with a timeout it fails naming them (runs on both paths:
the shared-memory arena's wait and the transport mailbox's)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import pytest

from cluster.collectives import _stall
from cluster.collectives.options import CommunicationOptions
from cluster.errors import CollectiveTimeoutError, TaskConfigError
from cluster.settings import TaskSettings

from ._threads import make_groups, run_ranks

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def threshold() -> Iterator[None]:
    previous = _stall.set_threshold(0.2)
    yield
    _stall.set_threshold(previous)


def _stall_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "cluster.collectives" and r.levelno == logging.WARNING]


def test_a_stalled_all_reduce_warns_naming_itself_and_the_missing_rank(
        threshold, caplog) -> None:
    caplog.set_level(logging.WARNING, "cluster.collectives")
    hub, groups = make_groups(2)
    run_ranks(lambda r: groups[r].all_reduce(np.ones(4, np.float32)), 2)  # #0: both call
    # #1: only rank 0 calls; it warns while it waits, then fails at its deadline.
    options = CommunicationOptions(timeout_seconds=3)
    with pytest.raises(CollectiveTimeoutError) as failure:
        groups[0].all_reduce(np.ones(1024, np.float32), options=options)
    warnings = _stall_records(caplog)
    assert warnings, "no stall warning in 3 s with a 0.2 s threshold"
    assert "worker:0: all_reduce #1 (float32[1024]) of group 'default' has waited" in warnings[0]
    assert "for worker:1" in warnings[0]
    assert "Did every task call it?" in warnings[0]
    # Once per threshold period, not once per check: 3 s / 0.2 s allows at most ~15.
    assert 2 <= len(warnings) <= 16, warnings
    text = str(failure.value)
    assert "all_reduce #1 of group 'default' on worker:0 timed out after 3 s" in text
    assert "worker:1" in text and "(input float32[1024])" in text


def test_the_first_call_stalls_in_the_set_up_and_names_the_missing_rank(
        threshold, caplog) -> None:
    caplog.set_level(logging.WARNING, "cluster.collectives")
    hub, groups = make_groups(3)
    done = run_ranks(lambda r: groups[r].barrier(options=CommunicationOptions(timeout_seconds=2)),
                     [0, 1], return_exceptions=True)  # rank 2 never calls
    assert all(isinstance(e, Exception) for e in done), done
    warnings = _stall_records(caplog)
    assert any("barrier #0 of group 'default' has waited" in w and "for worker:2" in w
               for w in warnings), warnings


def test_calls_that_do_not_stall_do_not_warn(caplog) -> None:
    caplog.set_level(logging.WARNING, "cluster.collectives")
    previous = _stall.set_threshold(30)
    try:
        hub, groups = make_groups(2)
        for _ in range(3):
            run_ranks(lambda r: groups[r].all_reduce(np.ones(4, np.float32)), 2)
        time.sleep(0.1)
    finally:
        _stall.set_threshold(previous)
    assert _stall_records(caplog) == []
    assert not _stall._active  # every call unregistered itself


def test_threshold_setting_and_its_errors() -> None:
    assert TaskSettings().stall_warning == 60.0
    assert TaskSettings.from_env({"CLUSTER_STALL_WARNING": "1.5"}).stall_warning == 1.5
    with pytest.raises(TaskConfigError, match="CLUSTER_STALL_WARNING"):
        TaskSettings.from_env({"CLUSTER_STALL_WARNING": "0"})
    with pytest.raises(ValueError, match="stall threshold"):
        _stall.set_threshold(-1)
