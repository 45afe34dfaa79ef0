"""The launcher's decisions as tables: no processes."""

from __future__ import annotations

import pytest

from cluster import exitcodes
from cluster.ctl.policy import (
    Decision,
    Phase,
    TaskAction,
    TaskExit,
    assess,
    decide,
    declared_code,
    failed_exit_code,
    on_task_exit,
    root_cause,
    unresponsive,
)

pytestmark = pytest.mark.timeout(30)

TASKS = ["chief:0", "worker:0", "worker:1", "ps:0"]
NO_CHIEF = ["worker:0", "worker:1", "ps:0"]


@pytest.mark.parametrize(("exits", "tasks", "phase"), [
    ({}, TASKS, Phase.RUNNING),
    ({"worker:0": 0}, TASKS, Phase.RUNNING),  # workers may finish before the chief
    ({"chief:0": 0}, TASKS, Phase.SUCCEEDED),  # the chief decides
    ({"worker:1": 1}, TASKS, Phase.FAILED),
    ({"worker:1": 137}, TASKS, Phase.FAILED),
    ({"ps:0": 0}, TASKS, Phase.FAILED),  # a parameter server never ends by itself
    ({"chief:0": 0, "worker:0": 1}, TASKS, Phase.FAILED),
    ({"worker:0": 0}, NO_CHIEF, Phase.RUNNING),
    ({"worker:0": 0, "worker:1": 0}, NO_CHIEF, Phase.SUCCEEDED),  # every worker, no chief
    ({"worker:0": 0, "worker:1": 2}, NO_CHIEF, Phase.FAILED),
])
def test_assess(exits, tasks, phase) -> None:
    assert assess(exits, tasks) is phase


def E(task, code, order, stopped=False, declared=None):  # noqa: N802
    return TaskExit(task, code, order, stopped, declared)


@pytest.mark.parametrize(("exits", "root"), [
    ([], None),
    ([E("chief:0", 0, 0)], None),
    ([E("worker:1", 1, 0), E("chief:0", 143, 1, True)], "worker:1"),
    # a task that stopped because of a peer exits 201: the peer that failed on its own wins
    ([E("worker:0", 201, 0), E("worker:1", 1, 1), E("chief:0", 143, 2, True)], "worker:1"),
    ([E("worker:0", 201, 0), E("chief:0", 143, 1, True)], "worker:0"),
    # launcher-stopped tasks are never the root while another failure exists
    ([E("chief:0", 143, 0, True), E("worker:1", 137, 1)], "worker:1"),
    ([E("chief:0", 143, 0, True)], "chief:0"),
    # the peer reacted first (201), and the root cause exited 1 after being told to stop
    ([E("worker:0", 201, 0), E("worker:1", 1, 1, True), E("chief:0", 143, 2, True)],
     "worker:1"),
    ([E("ps:0", 0, 0)], "ps:0"),
    # the root cause recorded exit 1, then outlasted the grace on its way out and was killed
    ([E("worker:0", 201, 0), E("chief:0", 143, 1, True), E("worker:1", 137, 2, True, 1)],
     "worker:1"),
])
def test_root_cause(exits, root) -> None:
    found = root_cause(exits)
    assert (found.task if found else None) == root


@pytest.mark.parametrize(("task", "code", "stopped", "record", "root", "declared"), [
    ("worker:1", 137, True, 1, "", 1),  # its own failure, then killed on its way out
    ("worker:1", 143, True, 2, "", 2),
    ("worker:1", 137, False, 1, "", None),  # not signalled by the launcher: the code stands
    ("worker:1", 1, True, 1, "", None),  # it exited as it recorded
    ("worker:1", 137, True, None, "", None),  # nothing on record
    ("worker:1", 137, True, 0, "", None),
    ("worker:0", 137, True, 201, "worker:1", None),  # it only followed a peer
    ("worker:0", 137, True, 1, "worker:1", None),
])
def test_declared_code(task, code, stopped, record, root, declared) -> None:
    assert declared_code(task, code, stopped, record, root) == declared


@pytest.mark.parametrize(("exit_", "verdict", "decision"), [
    (E("worker:1", 137, 2, True, 1), 1, Decision.FAIL),  # permanent, though killed
    (E("worker:1", 137, 2, True, 202), 202, Decision.RESTART),  # what it declared: retryable
    (E("worker:1", 137, 2, True), 137, Decision.RESTART),  # nothing declared: the signal
])
def test_a_declared_code_decides_over_the_signal_that_ended_the_exit(exit_, verdict,
                                                                      decision) -> None:
    assert exit_.verdict == verdict
    assert decide(exit_.verdict, restarts_done=0, max_restarts=2) is decision


@pytest.mark.parametrize(("code", "done", "max_restarts", "policy", "decision"), [
    (None, 0, 0, "exit-code", Decision.SUCCEED),
    (0, 0, 3, "exit-code", Decision.SUCCEED),
    (1, 0, 3, "exit-code", Decision.FAIL),  # permanent
    (2, 0, 3, "exit-code", Decision.FAIL),
    (127, 0, 3, "exit-code", Decision.FAIL),
    (128, 0, 3, "exit-code", Decision.RESTART),  # retryable from 128 up
    (137, 0, 3, "exit-code", Decision.RESTART),  # SIGKILL, e.g. OOM
    (-9, 0, 3, "exit-code", Decision.RESTART),  # as subprocess reports it
    (143, 2, 3, "exit-code", Decision.RESTART),
    (143, 3, 3, "exit-code", Decision.FAIL),  # restarts used up
    (137, 0, 0, "exit-code", Decision.FAIL),  # no restarts allowed
    (1, 0, 3, "on-failure", Decision.RESTART),
    (1, 3, 3, "on-failure", Decision.FAIL),
    (137, 0, 3, "never", Decision.FAIL),
    (exitcodes.EXIT_PEER_FAILED, 0, 1, "exit-code", Decision.RESTART),
])
def test_decide(code, done, max_restarts, policy, decision) -> None:
    assert decide(code, restarts_done=done, max_restarts=max_restarts, policy=policy) is decision


@pytest.mark.parametrize(("chosen", "left", "decision"), [
    (True, 2, Decision.REPICK_PORTS),  # not counted as a restart
    (True, 0, Decision.RESTART),  # 203 is retryable: a counted restart once retries run out
    (False, 2, Decision.RESTART),  # fixed ports: choosing again would not help
])
def test_address_in_use(chosen, left, decision) -> None:
    assert decide(exitcodes.EXIT_ADDRESS_IN_USE, restarts_done=0, max_restarts=1,
                  ports_chosen=chosen, port_retries_left=left) is decision


@pytest.mark.parametrize(("code", "text", "retryable"), [
    (0, "0 (succeeded)", False),
    (1, "1 (uncaught exception)", False),
    (137, "137 (SIGKILL)", True),
    (-15, "143 (SIGTERM)", True),
    (201, "201 (stopped because another task failed)", True),
    (42, "42", False),
])
def test_exit_codes(code, text, retryable) -> None:
    assert exitcodes.describe(code) == text
    assert exitcodes.is_retryable(code) is retryable


# -- mode: coordinator (parameter-server training) ----------------------------------------------

PS_TASKS = ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1"]


@pytest.mark.parametrize(("exits", "phase"), [
    ({}, Phase.RUNNING),
    ({"chief:0": 0}, Phase.SUCCEEDED),  # the chief's exit is the run's outcome
    ({"chief:0": 1}, Phase.FAILED),
    ({"chief:0": 137}, Phase.FAILED),
    ({"worker:1": 137}, Phase.RUNNING),  # a dead worker is restarted or left down, not fatal
    ({"worker:1": 1}, Phase.RUNNING),
    ({"worker:0": 0}, Phase.RUNNING),  # shut down by the coordinator
    ({"ps:0": 137}, Phase.RUNNING),  # not restarted; the chief fails by itself, naming it
    ({"ps:0": 137, "chief:0": 1}, Phase.FAILED),
    ({"worker:0": 137, "ps:1": 0, "chief:0": 0}, Phase.SUCCEEDED),
    ({"evaluator:0": 1}, Phase.FAILED),  # the evaluator runs the entrypoint: fails as ever
    ({"evaluator:0": 0}, Phase.RUNNING),
])
def test_assess_coordinator(exits, phase) -> None:
    assert assess(exits, [*PS_TASKS, "evaluator:0"], "coordinator") is phase


@pytest.mark.parametrize(("task", "code", "done", "limit", "action"), [
    ("worker:1", 137, 0, 3, TaskAction.RESTART),  # SIGKILL: restart that task alone
    ("worker:1", 1, 0, 3, TaskAction.RESTART),
    ("worker:1", 203, 2, 3, TaskAction.RESTART),  # its port was taken: try again, counted
    ("worker:1", 137, 3, 3, TaskAction.GIVE_UP),  # bound used up: keep running without it
    ("worker:0", 137, 0, 0, TaskAction.GIVE_UP),
    ("worker:0", 0, 0, 3, TaskAction.NONE),  # the coordinator shut it down
    ("ps:0", 137, 0, 3, TaskAction.LOST),  # its variables are gone: never restarted
    ("ps:0", 0, 0, 3, TaskAction.LOST),
    ("ps:0", 204, 0, 3, TaskAction.NONE),  # served through a preemption until the chief saved
    ("worker:1", 204, 0, 3, TaskAction.NONE),  # not restarted: the chief is exiting 204 too
    ("chief:0", 1, 0, 3, TaskAction.NONE),  # the chief's exit is assess()'s business
    ("evaluator:0", 1, 0, 3, TaskAction.NONE),
])
def test_on_task_exit_coordinator(task, code, done, limit, action) -> None:
    assert on_task_exit(task, code, mode="coordinator", restarts_done=done,
                        max_restarts=limit) is action


@pytest.mark.parametrize("task", ["chief:0", "worker:1", "ps:0", "evaluator:0"])
def test_on_task_exit_collective_acts_on_no_single_task(task) -> None:
    assert on_task_exit(task, 137, mode="collective", restarts_done=0,
                        max_restarts=3) is TaskAction.NONE


@pytest.mark.parametrize(("exits", "root"), [
    ([], None),
    # success: the servers were stopped (exit 0 on SIGTERM, or killed after the grace)
    ([E("chief:0", 0, 0), E("worker:0", 0, 1, True), E("ps:0", 0, 2, True)], None),
    ([E("chief:0", 0, 0), E("worker:0", 137, 1, True)], "worker:0"),  # run succeeded anyway
    ([E("chief:0", 1, 0), E("worker:0", 0, 1, True), E("ps:0", 0, 2, True)], "chief:0"),
    # a ps died, then the chief failed because of it: the ps is the root cause
    ([E("ps:0", 137, 0), E("chief:0", 1, 1), E("worker:0", 0, 2, True)], "ps:0"),
    ([E("ps:1", 1, 0), E("ps:0", 137, 1), E("chief:0", 2, 2)], "ps:1"),  # the first ps
    ([E("ps:0", 137, 0), E("chief:0", 201, 1)], "ps:0"),
    # preempted: the ps exits 204 before the chief's own 204 is reaped; either is retryable
    ([E("ps:1", 204, 0), E("chief:0", 204, 1)], "ps:1"),
    # a ps that exited 0 on its own (the chief had left) hides nothing: the chief's failure
    ([E("ps:0", 0, 0), E("chief:0", 201, 1)], "chief:0"),
    # a worker that died and was restarted is not the root cause of the chief's failure
    ([E("worker:1", 137, 0), E("chief:0", 1, 1), E("worker:1", 143, 2, True)], "chief:0"),
    ([E("worker:1", 137, 0), E("worker:1", 137, 1), E("chief:0", 143, 2, True)], "chief:0"),
    ([E("worker:1", 137, 0), E("chief:0", 0, 1)], "worker:1"),  # no other failure to name
])
def test_root_cause_coordinator(exits, root) -> None:
    found = root_cause(exits, "coordinator")
    assert (found.task if found else None) == root


@pytest.mark.parametrize(("exits", "mode", "code"), [
    ([E("chief:0", 3, 0)], "coordinator", 3),  # the chief's code passes through
    ([E("chief:0", 137, 1), E("ps:0", 137, 0)], "coordinator", 137),
    ([E("ps:0", 137, 0), E("chief:0", 143, 1, True)], "coordinator", 1),  # stopped: ours
    ([E("evaluator:0", 4, 0), E("chief:0", 143, 1, True)], "coordinator", 1),
    ([E("chief:0", 3, 0)], "collective", 1),
])
def test_failed_exit_code(exits, mode, code) -> None:
    assert failed_exit_code(exits, mode, 1) == code


W0_201 = TaskExit("worker:0", 201, 0)
C_201 = TaskExit("chief:0", 201, 1, stopped=True)
W1_STOPPED = TaskExit("worker:1", 137, 2, stopped=True)


@pytest.mark.parametrize(("root", "exits", "blames", "found"), [
    # worker:1 frozen: the chief lost it, worker:0 followed the chief; clusterctl killed worker:1
    (W0_201, [W0_201, C_201, W1_STOPPED], {"worker:0": "chief:0", "chief:0": "worker:1"},
     ("worker:1", "chief:0")),
    (C_201, [C_201, W1_STOPPED], {"chief:0": "worker:1"}, ("worker:1", "chief:0")),
    # the blamed task has not exited at all (still frozen when the attempt was judged)
    (C_201, [C_201], {"chief:0": "worker:1"}, ("worker:1", "chief:0")),
    # the blamed task exited on its own: it failed, it is no silent peer (root_cause's job)
    (C_201, [C_201, TaskExit("worker:1", 1, 1)], {"chief:0": "worker:1"}, None),
    (C_201, [C_201, TaskExit("worker:1", 0, 1)], {"chief:0": "worker:1"}, None),
    # no record names anyone, or the root failed by itself
    (C_201, [C_201, W1_STOPPED], {}, None),
    (TaskExit("worker:1", 1, 0), [TaskExit("worker:1", 1, 0)], {"worker:1": "chief:0"}, None),
    # records blaming each other: the chain stops at the repeat
    (W0_201, [W0_201, C_201], {"worker:0": "chief:0", "chief:0": "worker:0"},
     ("chief:0", "worker:0")),
])
def test_unresponsive(root, exits, blames, found) -> None:
    assert unresponsive(root, exits, blames) == found
