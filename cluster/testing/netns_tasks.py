"""One cluster's tasks spread over emulated hosts: :class:`HostTasks`.

Each task is ``python -m worker ARGS`` (or ``python -m ps``) run on its host
(:meth:`cluster.testing.netns.NetnsHost.command`), with a ``TF_CONFIG`` that names hosts by their
hostnames (``h1:2222``), as on a real cluster: every host resolves them through its
``/etc/hosts``. Tasks of one host listen on consecutive ports from ``port``; tasks of one host
share its namespaces, so co-location detection sees them together.

The processes are started through a :class:`~cluster.testing.TaskProcesses`, which reaps them;
:meth:`HostTasks.wait_exits` records when each one exits (pidfds, one deadline), for the tests
that measure how fast a failure stops every task::

    hosts = NetnsCluster(["h1", "h2"])
    run = HostTasks(hosts, {"h1": ["chief:0", "worker:0"], "h2": ["worker:1", "worker:2"]},
                    ["-m", "worker", "train.py"], processes=tasks, env={"CLUSTER_TOKEN": t})
    run["chief:0"].read_until("STEP 3", timeout=60)
    exits = run.wait_exits(timeout=30)          # {task: (exit code, time.monotonic())}
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Mapping, Sequence

from cluster.deadline import Deadline
from cluster.testing._tasks import TaskProcess, TaskProcesses, TaskTimeoutError
from cluster.testing.netns import NetnsCluster

__all__ = ["HostTasks", "task_order"]


def task_order(task: str) -> tuple[int, int]:
    """Cluster order of ``"job:index"`` (chief, then workers, then the rest)."""
    job, index = task.split(":")
    return ({"chief": 0, "worker": 1}.get(job, 2), int(index))


class HostTasks:
    """The tasks of ``layout`` (``{host: [task, ...]}``), each running ``python ARGS`` on its
    host; see the module docstring.

    ``env`` is added to every task's environment (pass ``CLUSTER_TOKEN``: the cluster is not on
    loopback); ``env_for`` adds per-task variables. ``cwd`` is the tasks' working directory.
    """

    def __init__(self, hosts: NetnsCluster, layout: Mapping[str, Sequence[str]],
                 args: Sequence[str | os.PathLike], *, processes: TaskProcesses,
                 env: Mapping[str, str] | None = None,
                 env_for: Mapping[str, Mapping[str, str]] | None = None,
                 cwd: str | os.PathLike | None = None, port: int = 2222) -> None:
        self.hosts = hosts
        self.host_of: dict[str, str] = {}
        addresses: dict[str, str] = {}
        for host, tasks in layout.items():
            for i, task in enumerate(tasks):
                self.host_of[task] = host
                addresses[task] = f"{host}:{port + i}"
        order = sorted(addresses, key=task_order)
        self.cluster: dict[str, list[str]] = {}
        for task in order:
            self.cluster.setdefault(task.split(":")[0], []).append(addresses[task])
        self.addresses = addresses
        self.tasks: dict[str, TaskProcess] = {}
        for task in order:
            job, index = task.split(":")
            config = json.dumps({"cluster": self.cluster,
                                 "task": {"type": job, "index": int(index)}})
            argv = hosts[self.host_of[task]].command([sys.executable, *args])
            self.tasks[task] = processes.start(
                argv, name=task, tf_config=config, cwd=cwd,
                env={"OMP_NUM_THREADS": "1", **(env or {}), **(env_for or {}).get(task, {})})

    def __getitem__(self, task: str) -> TaskProcess:
        return self.tasks[task]

    def on(self, host: str) -> list[str]:
        """The tasks of ``host``, in cluster order."""
        return [t for t in self.tasks if self.host_of[t] == host]

    def wait_exits(self, timeout: float) -> dict[str, tuple[int, float]]:
        """Wait until every task has exited; ``{task: (exit code, time.monotonic() of its
        exit)}``. The times are when each exit was seen (within a few milliseconds).

        Raises:
            TaskTimeoutError: some task still runs after ``timeout`` s (naming it, with its
                output); the tasks keep running (the :class:`TaskProcesses` reaps them).
        """
        deadline = Deadline.after(timeout)
        exits: dict[str, tuple[int, float]] = {}
        fds = {}
        try:
            for task, proc in self.tasks.items():
                fds[os.pidfd_open(proc.pid)] = task
            while len(exits) < len(self.tasks):
                ready, _, _ = select.select(list(fds), [], [], deadline.timeout())
                now = time.monotonic()
                if not ready:
                    left = [t for t in self.tasks if t not in exits]
                    raise TaskTimeoutError(
                        f"{', '.join(left)} still running after {timeout} s:\n" + "\n".join(
                            f"--- {t}:\n{self.tasks[t].output}" for t in left))
                for fd in ready:
                    task = fds.pop(fd)
                    os.close(fd)
                    exits[task] = (self.tasks[task].wait(max(deadline.remaining(), 1.0)), now)
        finally:
            for fd in fds:
                os.close(fd)
        return exits
