"""A preemption notice on any task under ParameterServerStrategy, through
``clusterctl launch`` with real processes (``mode: coordinator``: chief + 2 workers + 2 ps).

SIGTERM to a parameter server, or to a serving worker, during step 25: the task reports the
notice and serves on; the chief's PreemptionCheckpointHandler saves at the next ``run`` call
(step 26) and exits 204; clusterctl restarts the cluster; the chief resumes at 26. Every step
runs exactly once and the final parameters equal the uninterrupted run's bit for bit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.fspath(Path(__file__).parent))
import _launching  # noqa: E402
import _resume_ps_train  # noqa: E402 - the same training: its reference

from cluster.testing import console_lines

pytestmark = [pytest.mark.multiprocess]

HERE = Path(__file__).parent
STEPS, NOTICE_AT = 40, 25
SAVED_AT = NOTICE_AT + 1  # the run call after the one during which the notice was heard


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("victim", "optimizer"), [("ps:1", "adam"), ("worker:0", "momentum")])
def test_sigterm_on_a_serving_task_saves_restarts_and_resumes_with_zero_steps_lost(
        tmp_path, marker, victim, optimizer) -> None:
    out = tmp_path / "final.npy"
    path = _launching.write_cluster_file(
        tmp_path, marker, HERE / "_preempt_ps_train.py",
        ["--dir", tmp_path / "ckpt", "--out", out, "--steps", STEPS, "--optimizer", optimizer,
         "--notice", victim, "--notice-at", NOTICE_AT],
        jobs="{chief: 1, worker: 2, ps: 2}",
        extra="mode: coordinator\nrestart: {max_restarts: 1, policy: exit-code}\n")
    # timeouts.grace: 20 s (_launching), passed to every task as CLUSTER_GRACE_PERIOD.
    result, text = _launching.launch(path)
    assert result.exit_code == 0, text
    assert result.attempts == 2, text
    assert "restarting the cluster" in text, text

    served = console_lines(text, victim)
    assert (f"{victim}: preemption notice (received SIGTERM): serving up to 20 s for the "
            "coordinator's checkpoint") in served, served
    assert f"{victim}: shutting down after the preemption notice (chief:0 has finished)" \
        in served, served

    chief = console_lines(text, "chief:0")
    assert f"sent SIGTERM to {victim}" in chief, chief
    assert f"preemption notices heard: {victim}" in chief, chief
    saved = [line for line in chief if line.startswith(f"preemption notice on {victim}: saved")]
    assert len(saved) == 1 and f"ckpt-{SAVED_AT} at run call {SAVED_AT}" in saved[0], chief
    assert [line for line in chief if line.startswith("resumed at")] == [
        "resumed at 0", f"resumed at {SAVED_AT}"], chief
    # Zero steps lost and none redone: the step after the notice ran once, after the restart.
    assert _launching.step_counts(chief) == {k: 1 for k in range(STEPS)}, chief
    np.testing.assert_array_equal(np.load(out),
                                  _resume_ps_train.reference(STEPS, optimizer))


class _Runtime:
    """What the handler reads of the chief's runtime: the notices its heartbeat heard."""

    def __init__(self) -> None:
        self.preemption_notices: tuple[str, ...] = ()
        self.settings = None


class _Coordinator:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def join(self) -> None:
        self.events.append("join")


class _Exited(Exception):
    pass


def _exit(code: int) -> None:
    raise _Exited(code)


@pytest.mark.timeout(60)
def test_a_notice_heard_by_the_runtime_saves_at_the_next_run_call_after_joining(
        tmp_path, monkeypatch, capsys) -> None:
    import cluster
    import cluster.runtime
    from cluster import exitcodes
    from cluster.checkpoint import Checkpoint, CheckpointManager, PreemptionCheckpointHandler

    runtime = _Runtime()
    monkeypatch.setattr(cluster.runtime, "current", lambda: runtime)
    w = cluster.Variable(np.zeros(3, np.float32), name="w")
    events: list[str] = []
    manager = CheckpointManager(Checkpoint(model=[w]), tmp_path)
    save = manager.save
    monkeypatch.setattr(manager, "save", lambda **kw: (events.append("save"), save(**kw))[1])
    handler = PreemptionCheckpointHandler(None, manager, exit_fn=_exit, grace_period=30,
                                          coordinator=_Coordinator(events))
    try:
        for _ in range(2):
            handler.run(lambda: (w.assign_add(np.ones(3, np.float32)), events.append("step")))
        runtime.preemption_notices = ("ps:1",)  # heard during step 1, after its run call began
        with pytest.raises(_Exited) as exited:  # read at the start of the next call
            handler.run(lambda: events.append("step"))
    finally:
        handler.close()
    assert exited.value.args == (exitcodes.EXIT_PREEMPTED,)
    assert events == ["step", "step", "join", "save"]  # joined first; step 2 did not run
    assert os.path.basename(manager.latest_checkpoint) == "ckpt-2"
    assert "preemption notice on ps:1: saved" in capsys.readouterr().err
    assert not handler.preemption_received  # this task was not signalled itself
