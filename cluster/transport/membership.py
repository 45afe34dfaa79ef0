"""Who is alive in a cluster, as the coordination service sees it: a pure state machine.

No sockets, threads or clocks: every method takes ``now`` (seconds on one monotonic clock), so
the whole behaviour is table-tested (``tests/transport/test_membership.py``). The service of
:mod:`~cluster.transport.coordination` wraps it with a lock and the wire.

Rules:

- The cluster's tasks are fixed at construction. A task joins with :meth:`Membership.register`
  (a new incarnation replaces an old one: the task restarted, and is alive again).
- Every heartbeat refreshes the task. A registered task silent for ``timeout`` seconds is a
  suspect (:meth:`Membership.suspects`): the service probes its address
  (:mod:`~cluster.transport._reachable`) and :meth:`Membership.expire` declares it ``LOST``
  unless its host answered. One that answers is alive but busy (a long call holding the GIL, a
  stop): it is *stalled* (:meth:`Membership.stalled`), not lost, until it has been silent for
  ``stall_timeout`` seconds; a stalled task is probed again at most every
  :data:`REPROBE_PERIOD` seconds. Without ``stall_timeout`` a silent task is lost after
  ``timeout`` whatever its host says. A task that reported ``LEFT`` (a clean shutdown, which is
  never logged: peers learn of it from their own connections) is never lost. A task is declared
  lost at most once per incarnation, and a report of its loss by a peer (a broken connection)
  counts the same.
- :meth:`Membership.refresh` restarts every task's silence: the service calls it when its own
  clock was stalled (the silence it would measure is its own).
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
from collections.abc import Container
from dataclasses import dataclass, field

__all__ = ["REPROBE_PERIOD", "Event", "EventKind", "HeartbeatAnswer", "Membership",
           "UnknownTaskError"]

MAX_EVENT_TEXT = 2000  # characters of an event's message kept (a report is not a log)
REPROBE_PERIOD = 1.0  # seconds between probes of a stalled task (each one lands in its backlog)


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
    # The elastic generation (0: not elastic). ABORTED: the aborted group's; LOST and FAILED:
    # the one the loss or failure was found in (a task in a later generation that took the
    # task back knows the news stale: cluster._losses).
    generation: int = 0


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
    answered: float | None = None  # when its host last answered a probe while it was silent


@dataclass
class Membership:
    """The liveness of ``tasks``; see the module docstring."""

    tasks: tuple[str, ...]
    timeout: float
    max_events: int = 256
    max_listed: int = 64
    startup_timeout: float | None = None  # the silence allowed until every task registered
    stall_timeout: float | None = None  # the silence allowed to a task whose host answers
    _members: dict[str, _Member] = field(init=False)
    _waiting: int = field(init=False, default=0)  # tasks never registered: no scan per beat
    _events: list[Event] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if self.stall_timeout is not None and not self.stall_timeout >= self.timeout:
            raise ValueError(f"stall_timeout must be >= timeout ({self.timeout:g} s), got "
                             f"{self.stall_timeout!r}")
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
            member.answered = None
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
                      event.message[:MAX_EVENT_TEXT], event.exit_code, event.generation)
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

    def _bound(self) -> float:
        if self._waiting and self.startup_timeout is not None:
            return max(self.timeout, self.startup_timeout)
        return self.timeout

    def _silent(self, now: float) -> list[tuple[str, _Member, float]]:
        """Registered tasks still counted alive, silent for more than the bound, with their
        silence."""
        bound = self._bound()
        found = []
        for task, member in self._members.items():
            if member.incarnation is None or member.lost or member.failed or member.left:
                continue
            silent = now - member.last_seen
            if silent > bound:
                found.append((task, member, silent))
        return found

    def suspects(self, now: float) -> tuple[str, ...]:
        """The tasks whose address to probe before :meth:`expire`: silent for more than
        ``timeout`` (``startup_timeout``, when given, until every task has registered), except
        stalled ones whose host answered less than :data:`REPROBE_PERIOD` ago."""
        return tuple(task for task, member, _ in self._silent(now)
                     if member.answered is None or now - member.answered >= REPROBE_PERIOD)

    def expire(self, now: float, answering: Container[str] = (),
               generation: int = 0) -> list[Event]:
        """Declare lost every silent task (see :meth:`suspects`) unless its host is among
        ``answering`` (or answered within :data:`REPROBE_PERIOD`) and it has been silent for at
        most ``stall_timeout``; those are stalled. Returns the new ``LOST`` events, found in
        elastic ``generation`` (the current one)."""
        found = []
        for task, member, silent in self._silent(now):
            if self.stall_timeout is not None and silent <= max(self.stall_timeout,
                                                                self._bound()):
                if task in answering:
                    member.answered = now
                    continue
                if member.answered is not None and now - member.answered < REPROBE_PERIOD:
                    continue  # not probed this round: its last answer stands
            why = f"no heartbeat for {silent:.1f} s"
            if self.stall_timeout is None:
                pass
            elif member.answered is None:
                why += " and its address does not answer"
            elif task in answering:
                why += f": stalled (its host answers) beyond {self.stall_timeout:g} s"
            else:
                why += ": stalled, then its address stopped answering"
            event = Event(EventKind.LOST, task, message=why, generation=generation)
            member.lost = True
            self._events.append(event)
            found.append(event)
        return found

    def refresh(self, now: float) -> None:
        """Restart every task's silence at ``now`` (the caller's own clock was stalled)."""
        for member in self._members.values():
            if member.incarnation is not None:
                member.last_seen = max(member.last_seen, now)
                member.answered = None

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

    def stalled(self, now: float) -> dict[str, float]:
        """``{task: seconds silent}`` of the tasks counted alive because their host answers."""
        return {task: now - member.last_seen for task, member in self._members.items()
                if member.answered is not None and not member.lost}

    def live(self, task: str) -> int | None:
        """The incarnation of ``task`` counted alive (registered, not lost, failed or left),
        else None (also for a task outside the cluster)."""
        member = self._members.get(task)
        if member is None or member.lost or member.failed or member.left:
            return None
        return member.incarnation

    def registered(self, task: str) -> bool:
        """Whether some incarnation of ``task`` ever registered."""
        member = self._members.get(task)
        return member is not None and member.incarnation is not None

    def lost(self) -> tuple[str, ...]:
        return tuple(t for t, m in self._members.items() if m.lost)

    def preempted(self) -> tuple[str, ...]:
        """Tasks whose current incarnation reported a preemption notice, in cluster order."""
        return tuple(t for t, m in self._members.items() if m.preempted)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)
