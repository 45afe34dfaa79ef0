"""The multi-process test harness: real task processes on loopback, always reaped.

Like TensorFlow's ``multi_process_runner``, for tests and benchmarks:

- :func:`run_group` runs ``fn(transport, *args)`` on N spawned processes that form one gRPC
  group, and returns one :class:`RankOutcome` per rank;
- :class:`TaskProcess` runs one command (``python -m worker SCRIPT``, ``python -m ps``,
  ``python -m cluster.ctl.cli launch ...``) with its own environment and ``TF_CONFIG``; its
  output is captured as it comes (and copied to a log file if asked), so a test waits for a line
  with :meth:`TaskProcess.read_until` against a deadline, never by sleeping;
  :class:`TaskProcesses` reaps every process it started, however the test ends;
- :func:`processes_with`, :func:`wait_gone` and :func:`kill_and_wait` find a test's processes by
  a marker in their environment (the leak check) and wait until they are gone;
- :mod:`cluster.testing.netns` (imported on its own: it needs root) makes several hosts on this
  machine, each a network, mount, PID and UTS namespace on one switch, for multi-host and
  Kubernetes-pod tests, with silent partitions, links down and rate limits;
  :mod:`cluster.testing.pods` (imported on its own too) runs the manifests ``clusterctl render``
  prints as emulated pods on such hosts.

Every blocking call here takes a timeout and raises a typed error naming the task and what was
awaited (:class:`TaskTimeoutError`, :class:`TaskExitedError`, :class:`GroupTimeoutError`).

Example::

    with TaskProcesses() as tasks:
        ps = tasks.python("-m", "ps", env={"CLUSTER_TOKEN": token}, tf_config=config)
        ps.read_until("serving the variable store", timeout=30)
        ...
        ps.kill(signal.SIGTERM)
        code, output = ps.finish(timeout=30)
"""

from __future__ import annotations

from cluster.testing._group import GroupTimeoutError, RankOutcome, run_group
from cluster.testing._probes import (
    ConsoleWatch,
    console_lines,
    kill_and_wait,
    loopback_cluster,
    processes_with,
    task_pid,
    tf_config,
    wait_gone,
)
from cluster.testing._tasks import (
    TaskExitedError,
    TaskProcess,
    TaskProcessError,
    TaskProcesses,
    TaskTimeoutError,
)

__all__ = [
    "ConsoleWatch",
    "GroupTimeoutError",
    "RankOutcome",
    "TaskExitedError",
    "TaskProcess",
    "TaskProcessError",
    "TaskProcesses",
    "TaskTimeoutError",
    "console_lines",
    "kill_and_wait",
    "loopback_cluster",
    "processes_with",
    "run_group",
    "task_pid",
    "tf_config",
    "wait_gone",
]
