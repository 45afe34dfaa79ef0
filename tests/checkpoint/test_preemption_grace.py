"""The grace period a preemption save must fit in: ``CLUSTER_GRACE_PERIOD`` (set by clusterctl
and the renders) parsed once in ``TaskSettings``, picked up by ``PreemptionCheckpointHandler``,
which reports the notice-to-saved time against it and warns past half of it."""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest

import cluster
from cluster import exitcodes
from cluster import settings as task_settings
from cluster.checkpoint import Checkpoint, PreemptionCheckpointHandler
from cluster.errors import TaskConfigError
from cluster.settings import TaskSettings

pytestmark = pytest.mark.timeout(60)


class Exited(Exception):
    pass


def _exit(code: int) -> None:
    assert code == exitcodes.EXIT_PREEMPTED
    raise Exited


def _checkpoint() -> Checkpoint:
    return Checkpoint(model=[cluster.Variable(np.arange(4, dtype=np.float32), name="w")])


@pytest.mark.parametrize(("text", "value"), [("", None), ("10", 10.0), ("2.5", 2.5),
                                             ("0", 0.0), (" 30 ", 30.0)])
def test_the_grace_period_variable_is_parsed_once(text, value) -> None:
    assert TaskSettings.from_env({"CLUSTER_GRACE_PERIOD": text}).grace_period == value


@pytest.mark.parametrize("text", ["-1", "soon", "nan", "inf"])
def test_a_bad_grace_period_names_the_variable(text) -> None:
    with pytest.raises(TaskConfigError, match=r"CLUSTER_GRACE_PERIOD: expected a number of "
                                              r"seconds >= 0"):
        TaskSettings.from_env({"CLUSTER_GRACE_PERIOD": text})


def test_the_handler_takes_the_launchers_grace_period(tmp_path, monkeypatch) -> None:
    # No runtime here: the process's settings, read from the environment (forgotten first, so
    # that cluster.settings.current() reads it again).
    monkeypatch.setenv("CLUSTER_GRACE_PERIOD", "7.5")
    previous = task_settings.install(None)
    try:
        with PreemptionCheckpointHandler(None, _checkpoint(), tmp_path, exit_fn=_exit) as handler:
            assert handler.grace_period == 7.5
        with PreemptionCheckpointHandler(None, _checkpoint(), tmp_path, exit_fn=_exit,
                                         grace_period=3) as handler:
            assert handler.grace_period == 3  # an explicit value wins
        monkeypatch.delenv("CLUSTER_GRACE_PERIOD")
        task_settings.install(None)
        with PreemptionCheckpointHandler(None, _checkpoint(), tmp_path, exit_fn=_exit) as handler:
            assert handler.grace_period is None
    finally:
        task_settings.install(previous)
    with pytest.raises(ValueError, match="grace_period must be >= 0"):
        PreemptionCheckpointHandler(None, _checkpoint(), tmp_path, grace_period=-1)


def _preempt_and_save(tmp_path, grace: float | None) -> None:
    handler = PreemptionCheckpointHandler(None, _checkpoint(), tmp_path, exit_fn=_exit,
                                          grace_period=grace)
    try:
        handler.run(lambda: os.kill(os.getpid(), signal.SIGTERM))  # the notice, mid-step
        with pytest.raises(Exited):
            handler.run(lambda: None)
    finally:
        handler.close()


@pytest.mark.parametrize(("grace", "budget", "warned"), [
    (1e6, "of a 1e+06 s grace period", False),  # a save never takes half of 11 days
    (0.0, "of a 0 s grace period", True),  # any save takes more than half of nothing
    (None, "grace period unknown", False),
])
def test_the_save_is_timed_against_the_grace_period(tmp_path, capsys, caplog, grace, budget,
                                                    warned) -> None:
    with caplog.at_level(logging.WARNING, logger="cluster.checkpoint._preemption"):
        _preempt_and_save(tmp_path, grace)
    err = capsys.readouterr().err
    assert "preemption notice on this task: saved " in err
    assert f"s after the notice ({budget}); exiting 204" in err, err
    warnings = [r.getMessage() for r in caplog.records if "grace period (more than half)" in
                r.getMessage()]
    assert bool(warnings) is warned, caplog.records
    if warned:
        assert "raise the grace period (timeouts.grace" in warnings[0]
