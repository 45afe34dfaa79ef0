"""What one attempt of an elastic run keeps besides its tasks, and how it treats a task's exit.

:class:`ElasticRun` holds the exits acted on alone (no cause of the attempt's end), the tasks
given up on, why the attempt failed (too few tasks left, or the coordination service gone), the
membership record (:mod:`cluster.ctl._membership`) and the coordination service's process
(:mod:`cluster.ctl._service`). :meth:`ElasticRun.on_exit` applies
:func:`cluster.ctl.policy.on_elastic_exit` to a chief or worker that exited on its own, says it
on the console once and records it; :class:`cluster.ctl._attempt.Attempt` stops everything when
it returns :attr:`~cluster.ctl.policy.TaskAction.BELOW_MIN`.
"""

from __future__ import annotations

from pathlib import Path

from cluster import exitcodes
from cluster.ctl import policy
from cluster.ctl._elastic import ELASTIC_JOBS, ENV_ELASTIC
from cluster.ctl._membership import MembershipLog
from cluster.ctl._output import Console
from cluster.ctl._service import ENV_COORDINATION_SERVICE, ServiceProcess, service_address
from cluster.ctl._task_process import TaskProcess
from cluster.ctl.spec import ClusterFile
from cluster.deadline import Deadline

__all__ = ["ElasticRun"]


class ElasticRun:
    """The elastic side of one attempt of ``spec`` (whose ``elastic`` is set), with tasks at
    ``addresses``; events go to ``console`` and ``RUN_DIR/membership.jsonl``."""

    def __init__(self, spec: ClusterFile, console: Console, run_dir: Path,
                 addresses: dict[str, list[str]], *, timestamps: bool = False) -> None:
        assert spec.elastic is not None
        self.spec, self.console, self.bounds = spec, console, spec.elastic
        self.handled: set[int] = set()  # the order of each exit acted on alone
        self.given_up: set[str] = set()
        self.note = ""  # why the attempt failed, when this side decided it
        self.membership = MembershipLog(run_dir, str(spec.elastic))
        self.service = ServiceProcess(run_dir, service_address(spec.host, addresses),
                                      timestamps=timestamps)
        self._record_failed = False

    def task_env(self, job: str) -> dict[str, str]:
        """What a task of ``job`` gets: the service's address; chief and workers the bounds."""
        env = {ENV_COORDINATION_SERVICE: self.service.address}
        if job in ELASTIC_JOBS:
            env[ENV_ELASTIC] = str(self.bounds)  # MIN:MAX
        return env

    @staticmethod
    def running(tasks: list[TaskProcess]) -> int:
        """How many chief and worker tasks run (started, not exited, not being stopped)."""
        return sum(1 for t in tasks if t.job in ELASTIC_JOBS and t.running and not t.stopped)

    def record(self, event: str, task: TaskProcess, tasks: list[TaskProcess]) -> None:
        """Append ``event`` of ``task`` to the membership record; a record that cannot be
        written costs ``clusterctl status`` its list, not the run (said once)."""
        exited = event != "started"
        try:
            self.membership.write(event, task.name, code=task.code if exited else None,
                                  cause=task.cause() if exited else "",
                                  running=self.running(tasks), restart=task.restarts)
        except OSError as e:
            if not self._record_failed:
                self._record_failed = True  # the events still reach the console
                self.console.info(f"cannot record {event} of {task.name} in "
                                  f"{self.membership.path}: {e}", error=True)

    def on_exit(self, task: TaskProcess, order: int, tasks: list[TaskProcess],
                restart_delay: float) -> policy.TaskAction:
        """``task`` (its exit number ``order``) exited on its own: restart it alone after
        ``restart_delay`` (its ``restart_at``), give up on it, or, too few left, cancel the
        restarts that were due and return :attr:`~policy.TaskAction.BELOW_MIN` (the caller
        stops everything). Each outcome is one console line and one record."""
        limit = self.spec.restart.max_worker_restarts
        running = self.running(tasks)
        action = policy.on_elastic_exit(task.name, task.code, restarts_done=task.restarts,
                                        max_restarts=limit, policy=self.spec.restart.policy,
                                        running=running, minimum=self.bounds.min)
        cause = task.cause()
        what = (f"{task.name} exited ({cause})" if cause.startswith("killed by ")
                else f"{task.name} exited {exitcodes.describe(task.code)} ({cause})")
        where = f"elastic {self.bounds}, {running} running"
        if action is policy.TaskAction.RESTART:
            self.handled.add(order)
            task.restarts += 1
            task.restart_at = Deadline.after(restart_delay)
            self.console.info(f"{what}; restarting it alone in {restart_delay:g} s (restart "
                              f"{task.restarts} of {limit}; {where})", error=True)
            self.record("restarting", task, tasks)
        elif action is policy.TaskAction.GIVE_UP:
            self.handled.add(order)
            self.given_up.add(task.name)
            self.console.info(f"{what}; not restarting it: restart.max_worker_restarts = "
                              f"{limit} used up; the run goes on without it ({where})",
                              error=True)
            self.record("given-up", task, tasks)
        elif action is policy.TaskAction.BELOW_MIN:
            gone = [t for t in tasks if t.job in ELASTIC_JOBS and t.code not in (None, 0)]
            listed = ", ".join(f"{t.name} (exit {exitcodes.describe(t.code)})" for t in gone)
            self.note = (f"elastic {self.bounds}: {running} chief/worker task"
                         f"{'s' if running != 1 else ''} running, below min "
                         f"{self.bounds.min}; gone: {listed}")
            self.console.info(f"{what}; {self.note}: the run fails", error=True)
            self.record("below-min", task, tasks)
            for other in tasks:
                if other.restart_at is not None:  # a restart due, now never made
                    other.restart_at = None
                    other.restarts -= 1
        return action
