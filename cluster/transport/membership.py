"""Who is alive in a cluster, as the coordination service sees it: a pure state machine.

No sockets, threads or clocks: every method takes ``now`` (seconds on one monotonic clock), so
the whole behaviour is table-tested (``tests/transport/test_membership.py``). The service of
:mod:`~cluster.transport.coordination` wraps it with a lock and the wire.

Rules:

- The cluster's tasks are fixed at construction. A task joins with :meth:`Membership.register`
  (a new incarnation replaces an old one: the task restarted, and is alive again).
- Every heartbeat refreshes the task; :meth:`Membership.expire` declares a registered task
  ``LOST`` once it has been silent for ``timeout`` seconds, unless it reported ``LEFT`` (a clean
  shutdown, which is never logged: peers learn of it from their own connections). A task is
  declared lost at most once per incarnation, and a report of its loss by a peer (a broken
  connection) counts the same.
- Events (``LOST``, ``FAILED``, ``ABORTED``, ``PREEMPTED``: each at most once per task
  incarnation) go to one append-only log; a heartbeat returns the events the caller has not
  seen, at most ``max_events`` at a time, so a reply's size is bounded whatever happened.
- ``PREEMPTED`` is a notice, not a failure: the task got SIGTERM and keeps serving (and
  heartbeating) for its grace period so that the coordinator can save. It changes nothing in
  the task's liveness; a notice from a task already lost, failed or gone is stale and dropped.
- Memory is O(tasks + events); events are few (each task is lost or fails at most once per
  incarnation), and their text is capped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Event", "EventKind", "HeartbeatAnswer", "Membership", "UnknownTaskError"]

MAX_EVENT_TEXT = 2000  # characters of an event's message kept (a report is not a log)


class EventKind(enum.Enum):
    LOST = "LOST"
    FAILED = "FAILED"
    LEFT = "LEFT"  # a clean shutdown: the task stops heartbeating without being lost
    ABORTED = "ABORTED"  # the task aborted its collective group
    # The task received a preemption notice and serves on for its grace period: informational.
    PREEMPTED = "PREEMPTED"


@dataclass(frozen=True)
class Event:
    """Something every task must learn: ``task`` was lost, failed (``error_type``...), aborted
    its group, or received a preemption notice."""

    kind: EventKind
    task: str
    reporter: str = ""
    error_type: str = ""
    message: str = ""
    exit_code: int = 0


@dataclass(frozen=True)
class HeartbeatAnswer:
    """What a heartbeat returns: new events, the caller's next ``events_seen``, the first
    ``max_listed`` tasks that have not registered yet, and how many have not."""

    events: tuple[Event, ...]
    next_event: int
    unregistered: tuple[str, ...]
    unregistered_count: int = 0


class UnknownTaskError(ValueError):
    """A caller named a task that is not in the cluster (or an incarnation it does not have)."""


@dataclass
class _Member:
    incarnation: int | None = None
    last_seen: float = 0.0
    lost: bool = False
    failed: bool = False
    left: bool = False
    aborted: bool = False
    preempted: bool = False
    seen: int = 0  # events of the log this task has been sent


@dataclass
class Membership:
    """The liveness of ``tasks``; see the module docstring."""

    tasks: tuple[str, ...]
    timeout: float
    max_events: int = 256
    max_listed: int = 64
    startup_timeout: float | None = None  # the silence allowed until every task registered
    _members: dict[str, _Member] = field(init=False)
    _waiting: int = field(init=False, default=0)  # tasks never registered: no scan per beat
    _events: list[Event] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError("tasks must be distinct")
        self._members = {t: _Member() for t in self.tasks}
        self._waiting = len(self.tasks)

    def _member(self, task: str) -> _Member:
        member = self._members.get(task)
        if member is None:
            raise UnknownTaskError(f"{task!r} is not a task of this cluster")
        return member

    # -- calls from tasks -----------------------------------------------------------------------

    def register(self, task: str, incarnation: int, now: float) -> None:
        """``task`` (re)joins with ``incarnation``; raises :class:`UnknownTaskError`."""
        member = self._member(task)
        if member.incarnation is None:
            self._waiting -= 1
            if self._waiting == 0 and self.startup_timeout is not None:
                # Start-up is over: every task's silence counts from now (a coordinator starved
                # while interpreters start must not then declare them all lost at once).
                for other in self._members.values():
                    other.last_seen = max(other.last_seen, now)
        if member.incarnation != incarnation:
            self._members[task] = _Member(incarnation, now)
        else:
            member.last_seen = now

    def heartbeat(self, task: str, incarnation: int, events_seen: int,
                  now: float) -> HeartbeatAnswer:
        """Refresh ``task`` and return the events from ``events_seen`` on.

        Raises :class:`UnknownTaskError` for a task not in the cluster, or not registered with
        this incarnation (it must register first: after a restart, or a coordinator restart).
        """
        member = self._member(task)
        if member.incarnation != incarnation:
            raise UnknownTaskError(f"{task} is not registered with incarnation {incarnation:#x}")
        if not member.lost:
            member.last_seen = now
        start = min(max(events_seen, 0), len(self._events))
        events = tuple(self._events[start:start + self.max_events])
        member.seen = start + len(events)
        listed = self.unregistered()[:self.max_listed] if self._waiting else ()
        return HeartbeatAnswer(events, member.seen, listed, self._waiting)

    def report(self, event: Event, now: float) -> bool:
        """A task reports ``event`` (it failed, found a peer's connection broken, or received
        a preemption notice); True when it is news (first failure, first loss or first notice
        of that incarnation), then logged."""
        member = self._member(event.task)
        event = Event(event.kind, event.task, event.reporter, event.error_type,
                      event.message[:MAX_EVENT_TEXT], event.exit_code)
        if event.kind is EventKind.LEFT:
            member.left = True
            return False
        if event.kind is EventKind.FAILED:
            if member.failed:
                return False
            member.failed = True
        elif event.kind is EventKind.ABORTED:
            if member.aborted:
                return False
            member.aborted = True
        elif event.kind is EventKind.PREEMPTED:
            if member.preempted or member.lost or member.failed or member.left:
                return False
            member.preempted = True
        else:
            if member.lost or member.failed:
                return False
            member.lost = True
        self._events.append(event)
        return True

    def announce(self, event: Event) -> None:
        """Put ``event`` in the log as it is, for every task to hear: the coordinator's own
        clean departure (``LEFT`` of other tasks is recorded, never told), which tells tasks
        that only serve that the run is over."""
        self._events.append(event)

    # -- the coordinator's clock ---------------------------------------------------------------

    def expire(self, now: float) -> list[Event]:
        """Declare every registered task silent for more than ``timeout`` lost (more than
        ``startup_timeout``, when given, until every task has registered); the new events."""
        bound = self.timeout
        if self._waiting and self.startup_timeout is not None:
            bound = max(self.timeout, self.startup_timeout)
        found = []
        for task, member in self._members.items():
            if member.incarnation is None or member.lost or member.failed or member.left:
                continue
            silent = now - member.last_seen
            if silent > bound:
                event = Event(EventKind.LOST, task,
                              message=f"no heartbeat for {silent:.1f} s")
                member.lost = True
                self._events.append(event)
                found.append(event)
        return found

    # -- views ----------------------------------------------------------------------------------

    def unregistered(self) -> tuple[str, ...]:
        """Tasks that never registered, in cluster order."""
        return tuple(t for t, m in self._members.items() if m.incarnation is None)

    def undelivered(self) -> tuple[str, ...]:
        """Live tasks (registered, not lost, failed or gone) not yet sent every event: the
        coordinator's task waits for them (bounded) before it shuts down."""
        total = len(self._events)
        return tuple(t for t, m in self._members.items()
                     if m.incarnation is not None and not (m.lost or m.failed or m.left)
                     and m.seen < total)

    def lost(self) -> tuple[str, ...]:
        return tuple(t for t, m in self._members.items() if m.lost)

    def preempted(self) -> tuple[str, ...]:
        """Tasks whose current incarnation reported a preemption notice, in cluster order."""
        return tuple(t for t, m in self._members.items() if m.preempted)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)
