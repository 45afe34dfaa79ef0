"""Small helpers around task processes: ``TF_CONFIG`` and loopback clusters to start them with,
the leak check's process finder, waits until processes are gone, a console stream to watch."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import threading
from collections.abc import Iterable, Mapping, Sequence

from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline

__all__ = ["ConsoleWatch", "console_lines", "kill_and_wait", "loopback_cluster", "processes_with",
           "task_pid", "tf_config", "wait_gone"]


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` JSON of task ``task_type:index`` in ``cluster`` (not validated: tests
    also hand tasks wrong ones)."""
    return json.dumps({"cluster": {job: list(addresses) for job, addresses in cluster.items()},
                       "task": {"type": task_type, "index": index}})


def loopback_cluster(**jobs: int) -> dict[str, list[str]]:
    """A cluster of ``jobs`` (``chief=1, worker=2``) on ports of 127.0.0.1 free right now.

    The ports are not reserved (see :mod:`cluster.ctl.ports`): a task that loses one to another
    process exits 203 (address in use).
    """
    ports = iter(pick_free_ports("127.0.0.1", sum(jobs.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}


def processes_with(*needles: str) -> list[int]:
    """Pids of live processes whose environment holds every one of ``needles`` (a test's marker,
    and say its ``TF_CONFIG`` task). Only processes whose ``/proc/PID/environ`` is readable
    (ours) are seen; zombies have an empty environment and do not count."""
    wanted = [n.encode() for n in needles]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if all(n in environ for n in wanted):
            found.append(int(entry))
    return found


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """The pids of ``pids`` still alive after at most ``timeout`` s (waits on pidfds, without
    polling; any process, not only children)."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        deadline = Deadline.after(timeout)
        pending = set(fds)
        while pending:
            ready, _, _ = select.select(list(pending), [], [], deadline.remaining())
            if not ready:
                break
            pending -= set(ready)
        return [fds[fd] for fd in pending]
    finally:
        for fd in fds:
            os.close(fd)


def kill_and_wait(pid: int, timeout: float, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid`` (any process, not only a child) and wait at most ``timeout`` s for
    it to be gone; ``True`` if it is. Signals through a pidfd opened first, so a pid reused in
    between is never signalled; a process already gone counts as gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        signal.pidfd_send_signal(pidfd, sig)
        return bool(select.select([pidfd], [], [], timeout)[0])
    except ProcessLookupError:
        return True
    finally:
        os.close(pidfd)


def task_pid(marker: str, job: str, index: int) -> int:
    """The pid of a test's live task ``job:index`` (found by the test's ``marker`` and the
    task's ``TF_CONFIG``): the task's own process, not a child that inherited its environment.
    Raises ``AssertionError`` naming the task when there is none."""
    found = processes_with(marker, f'"task":{{"type":"{job}","index":{index}}}')
    roots = [pid for pid in found if _parent(pid) not in found]
    if not roots:
        raise AssertionError(f"no process for {job}:{index}")
    return roots[0]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def console_lines(out: str, task: str) -> list[str]:
    """What ``task`` (``worker:1``) printed on a launcher's console ``out``, without the
    ``[worker:1]`` prefix."""
    prefix = f"[{task}]"
    return [line[len(prefix):].strip() for line in out.splitlines() if line.startswith(prefix)]


class ConsoleWatch(io.StringIO):
    """A console stream (``launcher.launch(out=...)``) whose :attr:`event` is set once ``text``
    was written, for a thread that acts at that moment."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def write(self, s: str) -> int:
        written = super().write(s)
        if not self.event.is_set() and self.text in self.getvalue():
            self.event.set()
        return written
