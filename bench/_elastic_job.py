"""The jobs ``bench/elastic.py`` measures: N tasks of ``bench/_elastic_task.py`` on this host
or on emulated hosts (network namespaces), started, killed, replaced and restarted by the bench
itself, as a launcher does.

- :func:`measure_elastic`: an elastic job (``CLUSTER_ELASTIC=2:N``, the coordination service in
  a process of its own, as ``clusterctl launch --elastic`` runs it). Per repeat: SIGKILL one
  worker mid-run, wait until every survivor completed a step in the smaller group, start the
  dead task again (same ``TF_CONFIG``, same address), wait until it completed a step in the
  group.
- :func:`measure_restart`: the same job without ``CLUSTER_ELASTIC``, checkpointing with
  ``cluster.checkpoint.CheckpointManager``, as a launcher runs it today. Per repeat: SIGKILL one
  worker, stop every other task (SIGTERM, SIGKILL after :data:`GRACE` s, as ``clusterctl`` does),
  start all N again, each restores the newest checkpoint; wait until each completed a step.

Times are ``time.time()`` of this process (the kill, a start) against the tasks' own (their
``STEP`` lines): one clock, one kernel, also across the emulated hosts. Waits are on the tasks'
output (:meth:`cluster.testing.TaskProcess.read_until`), each bounded by ``timeout``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench._elastic_steps import TaskLog, join_pause, parse, recovery, step_seconds
from cluster.ctl.ports import pick_free_ports
from cluster.testing import TaskProcess, TaskProcessError, TaskProcesses, tf_config

if TYPE_CHECKING:
    from cluster.testing.netns import NetnsCluster, NetnsHost

__all__ = ["GRACE", "BenchError", "Site", "TrainArgs", "local_site", "measure_elastic",
           "measure_restart", "netns_site"]

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "bench" / "_elastic_task.py"
GRACE = 10.0  # SIGTERM to SIGKILL when the whole job is stopped (clusterctl's default grace)
SETTLE_STEPS = 3  # steps the group completes between a change and the next one


class BenchError(RuntimeError):
    """A task failed, or did not reach a step in time; the message names the case and the task,
    with its output."""


@dataclass(frozen=True)
class TrainArgs:
    """The training every task runs (``bench/_elastic_task.py``'s options)."""

    features: int = 4096
    batch: int = 64
    step_time: float = 0.05
    checkpoint_every: int = 10

    def argv(self) -> list[str]:
        return ["--features", str(self.features), "--batch", str(self.batch),
                "--step-time", str(self.step_time), "--checkpoint-every",
                str(self.checkpoint_every)]


@dataclass
class Site:
    """Where a job's tasks run: each task's address, the coordination service's (on the first
    task's host), and how to run a command where a task lives."""

    name: str
    addresses: dict[str, str]  # task ("chief:0", "worker:1") -> host:port
    service: str
    host_of: dict[str, NetnsHost] = field(default_factory=dict)  # task -> its emulated host

    @property
    def tasks(self) -> list[str]:
        return list(self.addresses)

    @property
    def cluster(self) -> dict[str, list[str]]:
        jobs: dict[str, list[str]] = {}
        for task, address in self.addresses.items():
            jobs.setdefault(task.split(":")[0], []).append(address)
        return jobs

    def command(self, task: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run where ``task`` lives."""
        host = self.host_of.get(task)
        return host.command(argv, cwd=REPO) if host is not None else list(argv)


def task_names(n: int) -> list[str]:
    """A chief and ``n - 1`` workers, in cluster order."""
    return ["chief:0"] + [f"worker:{i}" for i in range(n - 1)]


def local_site(n: int) -> Site:
    """``n`` tasks on ports of 127.0.0.1 free right now (a taken one makes a task exit 203)."""
    *ports, service = pick_free_ports("127.0.0.1", n + 1)
    return Site("1 host", {t: f"127.0.0.1:{p}" for t, p in zip(task_names(n), ports, strict=True)},
                f"127.0.0.1:{service}")


def netns_site(hosts: NetnsCluster, n: int, port: int = 2222) -> Site:
    """``n`` tasks over the hosts of ``hosts`` (a :class:`cluster.testing.netns.NetnsCluster`)
    in contiguous blocks, named by hostname as on a real cluster; the coordination service on the
    first host, on ``port - 1``."""
    names = list(hosts.hosts)
    per = -(-n // len(names))
    addresses, host_of = {}, {}
    for i, task in enumerate(task_names(n)):
        host = names[i // per]
        addresses[task] = f"{host}:{port + i % per}"
        host_of[task] = hosts[host]
    return Site(f"{len(names)} hosts", addresses, f"{names[0]}:{port - 1}", host_of)


class _Job:
    """A job's processes on a site: the service (elastic), one process per task start."""

    def __init__(self, site: Site, processes: TaskProcesses, env: dict[str, str],
                 task_argv: list[str], timeout: float, case: str) -> None:
        self.site, self.processes, self.env = site, processes, env
        self.task_argv, self.timeout, self.case = task_argv, timeout, case
        self.running: dict[str, TaskProcess] = {}

    def start_service(self) -> TaskProcess:
        return self.processes.start(
            self.site.command(self.site.tasks[0], [sys.executable, "-m", "coordination_service"]),
            name="coordination service", tf_config=json.dumps({"cluster": self.site.cluster}),
            env=self.env, cwd=REPO)

    def start(self, task: str) -> float:
        """Start ``task``'s process; returns the time just before."""
        job, index = task.split(":")
        argv = [sys.executable, "-m", "worker", os.fspath(TASK), *self.task_argv]
        started = time.time()
        self.running[task] = self.processes.start(
            self.site.command(task, argv), name=task, cwd=REPO, env=self.env,
            tf_config=tf_config(self.site.cluster, job, int(index)))
        return started

    def kill(self, task: str) -> float:
        """SIGKILL ``task`` (its process group: under ``nsenter`` the task is a child); returns
        the time just before."""
        killed = time.time()
        self.running[task].kill(signal.SIGKILL, group=True)
        return killed

    def wait_line(self, task: str, text: str, count: int) -> None:
        """Until ``task``'s output holds ``text`` ``count`` times."""
        proc = self.running[task]
        try:
            proc.read_until(text, self.timeout, count=count)
        except TaskProcessError as e:
            raise BenchError(f"{self.case}: {e}") from e

    def count(self, task: str, text: str) -> int:
        return self.running[task].stdout.count(text)

    def wait_steps(self, tasks: Sequence[str], steps: int, replicas: int) -> None:
        """Until each of ``tasks`` completed ``steps`` more steps with ``replicas`` replicas."""
        needle = f" n={replicas}\n"
        for task in tasks:
            self.wait_line(task, needle, self.count(task, needle) + steps)

    def stop(self, tasks: Sequence[str], grace: float = GRACE) -> None:
        """SIGTERM each of ``tasks`` (its group), SIGKILL what is left after ``grace`` s, and
        reap them all."""
        procs = [self.running.pop(t) for t in tasks if t in self.running]
        for proc in procs:
            proc.kill(signal.SIGTERM, group=True)
        deadline = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(TaskProcessError):  # still running: close() SIGKILLs it
                proc.wait(max(deadline - time.monotonic(), 0.01))
            proc.close()

    def log(self, task: str) -> TaskLog:
        return parse(self.running[task].stdout)


def _env(site: Site, extra: dict[str, str]) -> dict[str, str]:
    return {"CLUSTER_TOKEN": os.urandom(16).hex(), "OMP_NUM_THREADS": "1",
            "CLUSTER_CONNECT_TIMEOUT": str(60 + 4 * len(site.tasks)), **extra}


def _victims(site: Site, repeats: int) -> Iterator[str]:
    workers = [t for t in site.tasks if t.startswith("worker:")]
    for r in range(repeats):
        yield workers[(len(workers) - 1 - r) % len(workers)]  # the last worker first


def measure_elastic(site: Site, repeats: int, train: TrainArgs, *, warmup: int = 10,
                    timeout: float = 180.0) -> list[dict[str, float]]:
    """Per repeat: ``recovery`` (kill to every survivor's first step in the smaller group),
    ``join_start`` and ``join_imported`` (the replacement's start, and its ``IMPORTED``, to its
    first step), ``join_pause`` (the members' longest gap between steps while it joined) and
    ``step`` (the median step time before the kill), in seconds."""
    n = len(site.tasks)
    case = f"elastic, N={n}, {site.name}"
    env = _env(site, {"CLUSTER_ELASTIC": f"2:{n}", "CLUSTER_COORDINATION_SERVICE": site.service})
    rows = []
    with TaskProcesses() as processes:
        job = _Job(site, processes, env, ["--mode", "elastic", *train.argv()], timeout, case)
        service = job.start_service()
        for task in site.tasks:
            job.start(task)
        job.wait_steps(site.tasks, warmup, n)
        for victim in _victims(site, repeats):
            survivors = [t for t in site.tasks if t != victim]
            step = step_seconds(job.log(survivors[0]), time.time())
            killed = job.kill(victim)
            job.wait_steps(survivors, 1, n - 1)
            job.running.pop(victim).close()
            lost = recovery([job.log(t) for t in survivors], killed, n - 1)
            job.wait_steps(survivors[:1], SETTLE_STEPS, n - 1)
            started = job.start(victim)
            job.wait_steps(site.tasks, 1, n)
            joiner = job.log(victim)
            first = joiner.steps[0].time
            rows.append({"recovery": lost, "join_start": first - started,
                         "join_imported": (first - joiner.imported
                                           if joiner.imported is not None else None),
                         "join_pause": join_pause([job.log(t) for t in survivors], started, n),
                         "step": step})
            job.wait_steps(site.tasks, SETTLE_STEPS, n)
        job.stop(site.tasks)
        service.kill(signal.SIGTERM, group=True)
        with contextlib.suppress(TaskProcessError):  # still running: TaskProcesses SIGKILLs it
            service.wait(GRACE)
    return rows


def measure_restart(site: Site, repeats: int, train: TrainArgs, *, warmup: int = 10,
                    timeout: float = 180.0) -> list[dict[str, float]]:
    """Per repeat: ``restart`` (kill to every restarted task's first step), ``stopped`` (kill
    to the last old task's exit) and ``step`` (the median step time before the kill), in
    seconds."""
    n = len(site.tasks)
    case = f"whole restart, N={n}, {site.name}"
    env = _env(site, {})
    rows = []
    with TaskProcesses() as processes, tempfile.TemporaryDirectory(prefix="elastic-bench-") as ckpt:
        job = _Job(site, processes, env,
                   ["--mode", "restart", "--checkpoint-dir", ckpt, *train.argv()], timeout, case)
        for task in site.tasks:
            job.start(task)
        job.wait_steps(site.tasks, max(warmup, train.checkpoint_every + 1), n)
        for victim in _victims(site, repeats):
            step = step_seconds(job.log(site.tasks[0]), time.time())
            killed = job.kill(victim)
            job.stop(site.tasks)
            stopped = time.time() - killed
            for task in site.tasks:
                job.start(task)
            for task in site.tasks:
                job.wait_line(task, "STEP ", 1)
            rows.append({"restart": recovery([job.log(t) for t in site.tasks], killed),
                         "stopped": stopped, "step": step})
            job.wait_steps(site.tasks, max(SETTLE_STEPS, train.checkpoint_every + 1), n)
        job.stop(site.tasks)
    return rows
