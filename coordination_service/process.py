"""``python -m coordination_service``: the coordination service in a process of its own.

By default the chief's task hosts its cluster's coordination service (registration, heartbeats,
failure detection, the elastic group's generations), so the service ends with the chief. An
elastic job whose chief may die runs it here instead: ``clusterctl launch --elastic`` starts
this process first and gives every task ``CLUSTER_COORDINATION_SERVICE`` (its address). It reads
the cluster from ``TF_CONFIG`` (no task needed), the token and the timing settings as a task
does, serves on ``CLUSTER_COORDINATION_SERVICE`` until SIGTERM or SIGINT (or its launcher's
exit), lets the tasks hear the last events (bounded), and exits 0.
"""

from __future__ import annotations

import sys
import threading

from cluster import _serving, exitcodes, lifecycle
from cluster._placement import cluster_tasks, collective_members
from cluster.deadline import Deadline
from cluster.errors import ClusterError
from cluster.settings import ENV_COORDINATION_SERVICE, TaskSettings
from cluster.transport.auth import resolve_token
from cluster.transport.coordination import SERVICE
from cluster.transport.coordination_plan import CoordinationPlan
from cluster.transport.server import TaskServer
from resolver import ClusterConfigError, TFConfigClusterResolver

__all__ = ["main", "run"]

USAGE = f"""\
usage: python -m coordination_service

Serve the coordination service of the cluster in TF_CONFIG on {ENV_COORDINATION_SERVICE}
until SIGTERM or SIGINT.

environment:
  TF_CONFIG                     the cluster (its "task" is not needed)
  {ENV_COORDINATION_SERVICE}  host:port to serve on (required)
  CLUSTER_TOKEN                 the cluster's shared secret (clusterctl sets it)
  CLUSTER_ELASTIC               MIN:MAX for an elastic group
"""


def _fail(message: str) -> None:
    print(f"coordination_service: error: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(sys.argv[1:] if argv is None else argv))


def run(argv: list[str]) -> int:
    """Everything ``python -m coordination_service`` does; returns the exit code."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return exitcodes.EXIT_OK
    if argv:
        _fail(f"unexpected arguments {' '.join(argv)!r}\n{USAGE}")
        return exitcodes.EXIT_USAGE
    lifecycle.setup_logging()
    lifecycle.install_termination_handlers(_serving.SERVING_SIGNALS)
    try:
        settings = TaskSettings.from_env()
        if settings.coordination_service is None:
            raise ClusterError(f"{ENV_COORDINATION_SERVICE} is unset: give the host:port this "
                               "service serves on (the tasks are given the same)")
        spec = TFConfigClusterResolver().cluster_spec()
        tasks = cluster_tasks(spec)
        if not tasks:
            raise ClusterError("TF_CONFIG has no cluster: the service needs every task's address")
        token = resolve_token([a for _, a in tasks], settings)
    except (ClusterError, ClusterConfigError) as e:
        _fail(str(e))
        return exitcodes.EXIT_USAGE
    plan = CoordinationPlan(tuple(tasks), tuple(t for t, _ in collective_members(spec)),
                            settings)
    try:
        server = TaskServer(settings.coordination_service, token)
    except OSError as e:
        _fail(f"cannot serve on {settings.coordination_service}: {e}")
        return exitcodes.EXIT_ADDRESS_IN_USE
    service = plan.service()
    server.add_handlers(SERVICE, service.handlers())
    server.start()
    service.start()
    print(f"{plan.coordinator}: serving the coordination service of {len(tasks)} task(s) on "
          f"{settings.coordination_service}", file=sys.stderr, flush=True)
    lifecycle.watch_launcher(settings.launcher_pid)
    forever = threading.Event()
    try:
        while not forever.wait(1.0):  # wakes for signals, which raise Terminated here
            pass
    except lifecycle.Terminated:
        pass
    finally:
        service.drain(Deadline.after(service.interval * 2))
        service.stop()
        server.stop(0.5)
    return exitcodes.EXIT_OK
