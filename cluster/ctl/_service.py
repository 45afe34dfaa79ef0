"""The coordination service of an elastic run, in a process of its own.

By default the chief's task hosts its cluster's coordination service, so the service would end
with the chief. In an elastic run the chief may die and come back like any worker, so
clusterctl starts ``python -m coordination_service`` first, at an address of its own on
``host``, and gives every task ``CLUSTER_COORDINATION_SERVICE`` (that address). The process is
no task: it is not in ``TF_CONFIG``'s cluster, the summary or the policy; its output goes to
``RUN_DIR/coordination-service.log`` only. It lives as long as the attempt: stopped (SIGTERM,
SIGKILL after ``timeouts.grace``) once every task has exited. If it dies while the tasks run,
the attempt fails: without it they cannot coordinate.
"""

from __future__ import annotations

import json
import select
import selectors
import signal
from pathlib import Path

from cluster.ctl._task_process import TaskProcess
from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline
from cluster.settings import ENV_COORDINATION_SERVICE

__all__ = ["ENV_COORDINATION_SERVICE", "SERVICE_ARGV", "ServiceProcess", "cluster_only",
           "service_address"]

SERVICE_ARGV = ("-m", "coordination_service")
_NAME = "coordination-service"


def cluster_only(addresses: dict[str, list[str]]) -> str:
    """``TF_CONFIG`` with the cluster and no task (the service is none of the tasks), written
    as :func:`cluster.ctl.task_config.tf_config` writes a task's."""
    doc = {"cluster": {job: addresses[job] for job in sorted(addresses)},
           "environment": "cloud"}
    return json.dumps(doc, separators=(",", ":"))


def service_address(host: str, addresses: dict[str, list[str]]) -> str:
    """A free address on ``host`` for the service, none of the tasks' (``OSError`` when
    ``host`` cannot be bound)."""
    used = {a for listed in addresses.values() for a in listed}
    bracketed = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    count = len(used) + 1
    for port in pick_free_ports(host, count):
        if f"{bracketed}:{port}" not in used:
            return f"{bracketed}:{port}"
    raise OSError(f"no free port for the coordination service on {host}")


class ServiceProcess:
    """The service's process during one attempt: started before the tasks, stopped after."""

    def __init__(self, run_dir: Path, address: str, *, timestamps: bool = False) -> None:
        self.address = address
        self.process = TaskProcess(_NAME, 0, run_dir, timestamps=timestamps)
        self.process.name = _NAME
        self.process.log_path = run_dir / f"{_NAME}.log"
        self.process.error_path = run_dir / f"{_NAME}.error.json"

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, header: str,
              sel: selectors.BaseSelector) -> None:
        """Start the process; ``sel`` watches its output and exit (``service-out``,
        ``service-exit``), for :meth:`on_event`."""
        self.process.start(argv, cwd=cwd, env=env, header=header)
        sel.register(self.process.out_fd, selectors.EVENT_READ, ("service-out", None))
        sel.register(self.process.pidfd, selectors.EVENT_READ, ("service-exit", None))

    def on_event(self, kind: str, sel: selectors.BaseSelector) -> bool:
        """Handle what ``sel`` reported; True when the process has exited (it is reaped,
        its output read to the end and unwatched)."""
        process = self.process
        if kind == "service-out":
            fd = process.out_fd
            if fd >= 0:
                self.drain_output()
                if process.out_fd < 0:
                    sel.unregister(fd)
            return False
        self.shutdown(sel, 0.0)
        return True

    def shutdown(self, sel: selectors.BaseSelector, grace: float) -> None:
        """Stop watching it and :meth:`stop` it (nothing when it was never started)."""
        if self.process.proc is None:
            return
        for fd in (self.process.pidfd, self.process.out_fd):
            if fd >= 0 and fd in sel.get_map():
                sel.unregister(fd)
        self.stop(grace)

    def drain_output(self) -> None:
        """Read what it wrote (into its log only); close the pipe once it ended."""
        process = self.process
        if process.out_fd < 0:
            return
        _, ended = process.read()
        if ended:
            process.close_output()

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL when it has not exited ``grace`` seconds later; its output
        read to the end and the process reaped. The selector must no longer watch it."""
        process = self.process
        if process.proc is None or (process.pidfd < 0 and process.out_fd < 0):
            return  # never started, or stopped already
        if process.running:
            if not select.select([process.pidfd], [], [], 0)[0]:  # still alive: stop it
                process.stopped = True
                process.signal_group(signal.SIGTERM)
                deadline = Deadline.after(grace)
                while not deadline.expired:
                    watched = [process.pidfd] + ([process.out_fd] if process.out_fd >= 0 else [])
                    ready, _, _ = select.select(watched, [], [], deadline.remaining())
                    if process.pidfd in ready:
                        break
                    if process.out_fd in ready:
                        self.drain_output()
                if not select.select([process.pidfd], [], [], 0)[0]:
                    process.signal_group(signal.SIGKILL)
            process.reap()  # waits (bounded) for a SIGKILLed process
        if process.out_fd >= 0:
            process.drain()  # the rest of its output, into its log
            process.close_output()
        process.close()
