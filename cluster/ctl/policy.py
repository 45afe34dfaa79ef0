"""The launcher's decisions as pure functions (table-tested, no processes): is the run over, which
task is the root cause, what to do with one task that exited, and what to do after a failure.

Exit codes follow Kubeflow's convention (``cluster.exitcodes``): 1-127 permanent, 128 and above
retryable. Tasks that only stopped because another failed (exit 201) or that the launcher stopped
itself are never the root cause while a task that failed on its own exists.

Two modes (``cluster.yaml`` ``mode:``): ``collective`` (every chief and worker runs the entrypoint;
any failure fails the run) and ``coordinator`` (parameter-server training: only the chief runs the
entrypoint and its exit is the run's outcome; workers serve the chief's ClusterCoordinator and one
that dies is restarted alone, a bounded number of times; a parameter server that dies is not
restarted, and is the root cause when the chief then fails).

An elastic ``collective`` run (``elastic: {min, max}``) acts on single tasks too
(:func:`on_elastic_exit`): a chief or worker that dies is restarted alone while at least ``min``
of them still run.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from cluster import exitcodes

__all__ = [
    "COLLECTIVE",
    "COORDINATOR",
    "MODES",
    "Decision",
    "Phase",
    "TaskAction",
    "TaskExit",
    "assess",
    "blame_chain",
    "decide",
    "declared_code",
    "failed_exit_code",
    "is_secondary",
    "on_elastic_exit",
    "on_task_exit",
    "root_cause",
    "unresponsive",
]

COLLECTIVE = "collective"
COORDINATOR = "coordinator"
MODES = (COLLECTIVE, COORDINATOR)


class Phase(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Decision(enum.Enum):
    SUCCEED = "succeed"  # the run succeeded: exit 0
    RESTART = "restart"  # stop everything, start the whole cluster again (counts a restart)
    REPICK_PORTS = "repick-ports"  # a chosen port was taken meanwhile: relaunch, not counted
    FAIL = "fail"  # stop everything, exit non-zero


class TaskAction(enum.Enum):
    """What to do with one task that exited on its own while the run goes on."""

    NONE = "none"  # nothing for this task alone: :func:`assess` says what the exit means
    RESTART = "restart"  # start this task again, alone (same TF_CONFIG, same port)
    GIVE_UP = "give-up"  # its restarts are used up: leave it dead, the run goes on without it
    LOST = "lost"  # a parameter server: not restarted (its variables are gone); the chief decides
    BELOW_MIN = "below-min"  # elastic: fewer than min chief/worker tasks run: the run fails


@dataclass(frozen=True)
class TaskExit:
    """A task's exit as the launcher saw it: ``order`` counts exits (0 = first);
    ``stopped`` is True when the launcher had already signalled it. ``declared``: the exit
    code the task's own error record had declared when the launcher's signal ended it (it
    failed, recorded why, then outlasted the grace on its way out: an exit hook that hangs, a
    slow teardown), else ``None``."""

    task: str
    code: int
    order: int
    stopped: bool = False
    declared: int | None = None

    @property
    def verdict(self) -> int:
        """The code that says why the task ended: what it declared before it was killed, else
        its exit code. A permanent failure stays permanent when a SIGKILL ends its exit."""
        return self.code if self.declared is None else self.declared

    def ended(self) -> str:
        """How it ended, for a root-cause line: ``exited 1 (uncaught exception)``, or for a
        task killed after it recorded its own failure, both codes: ``failed 1 (uncaught
        exception), then was killed 137 (SIGKILL) on its way out``."""
        if self.declared is None:
            return f"exited {exitcodes.describe(self.code)}"
        return (f"failed {exitcodes.describe(self.declared)}, then was killed "
                f"{exitcodes.describe(self.code)} on its way out")


def _job(task: str) -> str:
    return task.split(":", 1)[0]


def assess(exits: Mapping[str, int], tasks: list[str], mode: str = COLLECTIVE) -> Phase:
    """Where the run stands given the exit codes so far (``exits``: task -> last code).

    ``collective``: succeeded when the chief exited 0, or, with no chief, every worker exited 0;
    failed when any task exited non-zero, or a parameter server exited at all (they serve until
    stopped). ``coordinator``: the chief's exit decides (0 succeeded, else failed); an evaluator
    that exits non-zero fails the run; exits of workers and parameter servers decide nothing
    (see :func:`on_task_exit`).
    """
    if mode == COORDINATOR:
        for task, code in exits.items():
            if _job(task) == "evaluator" and code != 0:
                return Phase.FAILED
        if "chief:0" not in exits:
            return Phase.RUNNING
        return Phase.SUCCEEDED if exits["chief:0"] == 0 else Phase.FAILED
    for task, code in exits.items():
        if code != 0 or _job(task) == "ps":
            return Phase.FAILED
    if "chief:0" in tasks:
        return Phase.SUCCEEDED if exits.get("chief:0") == 0 else Phase.RUNNING
    workers = [t for t in tasks if _job(t) == "worker"]
    if workers and all(exits.get(t) == 0 for t in workers):
        return Phase.SUCCEEDED
    return Phase.RUNNING


def on_task_exit(task: str, code: int, *, mode: str, restarts_done: int,
                 max_restarts: int) -> TaskAction:
    """What to do with ``task``, which exited with ``code`` on its own (not stopped by the
    launcher) while the run is still going.

    Only ``coordinator`` mode acts on single tasks: a worker that failed (non-zero, or killed by
    a signal) is restarted while ``restarts_done`` (its own restarts so far) is below
    ``max_restarts``, then given up on; a worker that exited 0 was shut down by the coordinator
    and stays down; a parameter server is lost. A worker or parameter server that exits
    ``EXIT_PREEMPTED`` (204) served through a preemption notice until the chief saved and left:
    :attr:`TaskAction.NONE`, the chief's exit decides. Everything else is
    :attr:`TaskAction.NONE`.
    """
    if mode != COORDINATOR:
        return TaskAction.NONE
    job = _job(task)
    if code == exitcodes.EXIT_PREEMPTED:
        return TaskAction.NONE
    if job == "ps":
        return TaskAction.LOST
    if job != "worker" or code == 0:
        return TaskAction.NONE
    return TaskAction.RESTART if restarts_done < max_restarts else TaskAction.GIVE_UP


def on_elastic_exit(task: str, code: int, *, restarts_done: int, max_restarts: int,
                    policy: str, running: int, minimum: int) -> TaskAction:
    """What to do with ``task``, which exited with ``code`` on its own while an elastic run
    goes on with ``running`` chief and worker tasks (not counting ``task``) and needs at
    least ``minimum``.

    Only chief and worker failures that ``policy`` retries act on the task alone (``exit-code``:
    128 and above, i.e. killed by a signal or retryable; ``on-failure``: any non-zero code;
    ``never``: none): :attr:`TaskAction.BELOW_MIN` when ``running < minimum`` (the run fails),
    else :attr:`TaskAction.RESTART` while ``restarts_done`` (this task's own restarts) is
    below ``max_restarts``, then :attr:`TaskAction.GIVE_UP` (the run goes on without it).
    Everything else (an exit 0, a permanent failure, another job) is :attr:`TaskAction.NONE`:
    :func:`assess` decides, as without elastic.
    """
    if code == 0 or _job(task) not in ("chief", "worker"):
        return TaskAction.NONE
    retried = policy == "on-failure" or (policy == "exit-code" and exitcodes.is_retryable(code))
    if not retried:
        return TaskAction.NONE
    if running < minimum:
        return TaskAction.BELOW_MIN
    return TaskAction.RESTART if restarts_done < max_restarts else TaskAction.GIVE_UP


def root_cause(exits: list[TaskExit], mode: str = COLLECTIVE) -> TaskExit | None:
    """The task whose failure the others followed: the first to fail on its own.

    Each exit counts with its :attr:`TaskExit.verdict` (a task the launcher killed after it
    recorded its own failure failed with the code it recorded). Preference: the earliest
    failure that is neither a "peer failed" exit (201) nor the effect of the launcher's own
    signal (a stopped task exiting 128 or more); then the earliest not
    stopped by the launcher; then the earliest failure. A task that exits 1 after the launcher
    signalled it failed on its own (it was reporting its exception when the stop came).
    ``None`` when no task failed.

    ``coordinator``: a parameter server that failed on its own comes first (the earliest: the
    chief's error follows from losing its variables); then failures of any task but the workers
    that exited on their own (the launcher restarted them or went on without them) by the rules
    above; then any failure by those rules.
    """
    if mode == COORDINATOR:
        # A server that exited 0 on its own (the chief had left) failed nothing.
        lost = [e for e in exits if _job(e.task) == "ps" and not e.stopped and e.code != 0]
        if lost:
            return min(lost, key=lambda e: e.order)
        # A server the launcher stopped that exited 0 did what it was asked, and one that exited
        # 0 on its own had seen the chief leave: neither is a failure.
        exits = [e for e in exits if not (e.code == 0 and (e.stopped or _job(e.task) == "ps"))]
        handled = [e for e in exits if not (_job(e.task) == "worker" and not e.stopped)]
        return _first_failure(handled) or _first_failure(exits)
    return _first_failure(exits)


def _first_failure(exits: list[TaskExit]) -> TaskExit | None:
    failures = sorted((e for e in exits if e.verdict != 0 or _job(e.task) == "ps"),
                      key=lambda e: e.order)
    for keep in (lambda e: e.verdict not in exitcodes.SECONDARY
                 and not (e.stopped and exitcodes.is_retryable(e.verdict)),
                 lambda e: not e.stopped,
                 lambda e: True):
        chosen = [e for e in failures if keep(e)]
        if chosen:
            return chosen[0]
    return None


def declared_code(task: str, code: int, stopped: bool, record_code: int | None,
                  record_root: str = "") -> int | None:
    """:attr:`TaskExit.declared` for ``task``, which exited with ``code`` (``stopped``: after
    the launcher's or Slurm's signal), given the exit code and ``root_task`` of the error
    record its process wrote (``record_code`` ``None``: none). The recorded code when a
    signalled task's own failure is on record (the record is written first thing; the signal
    only says it was slow to leave), else ``None``."""
    if not stopped or not exitcodes.is_retryable(code) or record_code in (None, 0, code):
        return None
    return None if is_secondary(task, record_code, record_root) else record_code


def is_secondary(task: str, code: int, root_task: str) -> bool:
    """Whether a task's error record (``task``, its ``exit_code``, its ``root_task``) says it
    only stopped because a peer failed: exit 201, or another task named as the root."""
    return code in exitcodes.SECONDARY or bool(root_task and root_task != task)


def blame_chain(task: str, blames: Mapping[str, str]) -> list[str]:
    """``[task, the task it blames, the task that one blames, ...]``, following ``blames``
    (task -> the ``root_task`` of its error record) until a task blames no one (or a task
    already on the chain): the last is the one the others followed."""
    chain = [task]
    while chain[-1] in blames and blames[chain[-1]] and blames[chain[-1]] not in chain:
        chain.append(blames[chain[-1]])
    return chain


def unresponsive(root: TaskExit, exits: list[TaskExit],
                 blames: Mapping[str, str]) -> tuple[str, str] | None:
    """``(culprit, witness)`` when the root cause only stopped because of a peer that never
    failed by itself: the peer stopped answering (frozen, e.g. by SIGSTOP, or cut off) and
    exited only when the launcher stopped it. ``None`` otherwise.

    ``blames[task]`` is the task that ``task``'s error record names as the reason it stopped
    (its ``root_task``). From a ``root`` that exited "peer failed" (201), the links are
    followed (``worker:0 -> chief:0 -> worker:1``) to the task they end at, the culprit; the
    witness is the last task on the way, the one that saw the culprit go silent. The culprit
    must have exited only after the launcher's signal (or not at all): a task that failed on
    its own would be the root cause already (:func:`root_cause`).
    """
    if root.code not in exitcodes.SECONDARY:
        return None
    chain = blame_chain(root.task, blames)
    if len(chain) < 2:
        return None
    culprit = chain[-1]
    ended = [e for e in exits if e.task == culprit]
    if ended and not ended[-1].stopped:
        return None
    return culprit, chain[-2]


def decide(root_code: int | None, *, restarts_done: int, max_restarts: int,
           policy: str = "exit-code", ports_chosen: bool = True,
           port_retries_left: int = 0) -> Decision:
    """What to do after a run ends with the root cause's exit code (``None``/0: no failure).

    ``policy``: ``exit-code`` restarts only retryable codes (>= 128), ``on-failure`` any failure,
    ``never`` none; restarts stop once ``restarts_done`` reaches ``max_restarts``. A task that
    could not bind a port clusterctl chose (exit 203) relaunches with new ports, not counted,
    while ``port_retries_left``.
    """
    if not root_code:
        return Decision.SUCCEED
    code = exitcodes.normalize(root_code)
    if code == exitcodes.EXIT_ADDRESS_IN_USE and ports_chosen and port_retries_left > 0:
        return Decision.REPICK_PORTS
    if policy == "never" or restarts_done >= max_restarts:
        return Decision.FAIL
    if policy == "on-failure" or exitcodes.is_retryable(code):
        return Decision.RESTART
    return Decision.FAIL


def failed_exit_code(exits: list[TaskExit], mode: str, default: int) -> int:
    """clusterctl's exit code for a failed run that is not restarted: in ``coordinator`` mode
    the chief's own non-zero exit code (the run's outcome is the chief's), else ``default``."""
    if mode == COORDINATOR:
        chief = [e for e in exits if e.task == "chief:0" and not e.stopped and e.code != 0]
        if chief:
            return chief[-1].code
    return default
