"""What a task records of its cluster's preemption notices and of its coordinator's exit (the
task runtime's notes, kept apart from its connections)."""

from __future__ import annotations

import threading

from cluster._latch import Latch
from cluster.deadline import Deadline

__all__ = ["Notices"]


class Notices:
    """Preemption notices heard from other tasks (``PREEMPTED`` events: informational, nothing
    stops on them), and the *release*: why a task that only serves may stop (the coordinator's
    task left or was lost, or shutdown was requested). Thread-safe; the first release wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notices: dict[str, str] = {}  # task: its notice's message, in the order heard
        self._noticed = threading.Event()
        self._released = Latch()  # main-thread waits: signals raise there
        self._released_why = ""

    def record(self, task: str, message: str) -> bool:
        """Record ``task``'s notice; False when it was recorded already (heard once from the
        service, again from a heartbeat)."""
        with self._lock:
            if task in self._notices:
                return False
            self._notices[task] = message
        self._noticed.set()
        return True

    @property
    def tasks(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._notices)

    def wait(self, deadline: Deadline) -> tuple[str, ...]:
        """Block until some notice came, or ``deadline``; returns :attr:`tasks`."""
        self._noticed.wait(deadline.timeout())
        return self.tasks

    def release(self, why: str) -> None:
        with self._lock:
            if self._released.is_set():
                return
            self._released_why = why
            self._released.set()

    @property
    def released_why(self) -> str:
        """Why the task may stop serving; "" while it may not."""
        return self._released_why if self._released.is_set() else ""

    def wait_released(self, deadline: Deadline) -> str:
        self._released.wait(deadline.timeout())
        return self.released_why
