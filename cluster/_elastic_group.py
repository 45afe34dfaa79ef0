"""One task's place in an elastic collective group (``CLUSTER_ELASTIC=MIN:MAX``).

The coordination service decides who trains together, generation after generation
(:mod:`~cluster.transport.generations`); an :class:`ElasticGroup` is a task's side of it: it asks
for the next generation, and opens that generation's transport (ranks in the members' order)
through the task runtime. A task that starts while a group is already running (a restarted
task, a replacement pod) is a *joiner*: its strategy starts local, and it enters the group when
``cluster.elastic.run`` regroups (the members regroup at their next commit, having heard that it
waits). Every generation's transport carries its number, so nothing of an old group (a late
abort, a Hello) reaches the new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from cluster.deadline import Deadline
from cluster.errors import ElasticGroupError
from cluster.transport.api import Transport
from cluster.transport.generations import Answer, Status

__all__ = ["ElasticGroup"]

log = logging.getLogger(__name__)

Ask = Callable[..., Answer]  # ask(after, *, enlist, deadline, wait) -> Answer
Open = Callable[[Sequence[str], int, Deadline], Transport]  # open(members, generation, deadline)
Close = Callable[[Deadline], None]  # closes the current generation's transport, bounded


class ElasticGroup:
    """A task's side of the elastic group; see the module docstring.

    ``ask`` is the coordination client's ``regroup``; ``open_group`` opens a generation's
    transport and makes it the task's; ``close_group`` closes the current one within a deadline;
    ``news()`` is ``(generation, joining)`` as the last heartbeat reported it.
    """

    def __init__(self, task: str, bounds: tuple[int, int], *, ask: Ask, open_group: Open,
                 close_group: Close, news: Callable[[], tuple[int, int]],
                 close_timeout: float) -> None:
        self.task = task
        self.minimum, self.maximum = bounds
        self._ask = ask
        self._open = open_group
        self._close = close_group
        self._news = news
        self._close_timeout = close_timeout
        self._lock = threading.Lock()
        self.generation = 0
        self.members: tuple[str, ...] = ()
        self.joining = False  # started while a group was running, not in it yet

    def first(self, deadline: Deadline) -> Transport | None:
        """The first group this task trains in: generation 1 (the cluster as configured, once
        every collective task has asked), or ``None`` for a joiner, which enters at a regroup.

        Raises :class:`ElasticGroupError` when the group never forms by ``deadline``, or the
        service refuses this task.
        """
        with self._lock:
            while True:
                answer = self._ask(0, enlist=False, deadline=deadline, wait=False)
                if answer.status is Status.FORMED:
                    return self._adopt(answer, deadline)
                if answer.status is Status.WAITING and answer.generation > 0:
                    self.joining = True
                    log.info("%s: the elastic group is running (generation %d: %s); this task "
                             "joins it at its next commit", self.task, answer.generation,
                             ", ".join(answer.members))
                    return None
                self._raise_if_over(answer)
                if deadline.expired:
                    raise ElasticGroupError(
                        f"{self.task}: the elastic group never formed: every collective task of "
                        "the cluster must start and create its strategy (CLUSTER_CONNECT_TIMEOUT "
                        "bounds the wait)")
                time.sleep(min(0.05, max(deadline.remaining(), 0.0)))

    def pending(self) -> bool:
        """Whether this task has heard that the group must re-form: a task waits to join it,
        or a newer generation formed (this task is a joiner, or was left behind)."""
        generation, joining = self._news()
        if generation < self.generation:
            return False  # heard before this generation formed (so not a joiner): stale
        return self.joining or joining > 0 or generation > self.generation

    def regroup(self, deadline: Deadline) -> Transport:
        """Leave the current generation (its transport closed, bounded) and enter the next,
        once every live member has asked too; returns its transport.

        Raises :class:`ElasticGroupError` when fewer than the minimum are left (naming who is
        gone), when the service counts this task lost, or when no generation forms by
        ``deadline``.
        """
        with self._lock:
            self._close(Deadline.after(min(self._close_timeout, max(deadline.remaining(), 0.05))))
            answer = self._ask(self.generation, enlist=True, deadline=deadline, wait=True)
            if answer.status is Status.FORMED:
                return self._adopt(answer, deadline)
            self._raise_if_over(answer)
            raise ElasticGroupError(
                f"{self.task}: no new generation of the elastic group formed before the deadline "
                f"(generation {answer.generation}: {', '.join(answer.members)}); a member that "
                "neither fails nor reaches a commit holds it back")

    def _raise_if_over(self, answer: Answer) -> None:
        if answer.status is Status.BELOW_MIN:
            raise ElasticGroupError(f"{self.task}: the elastic run cannot go on: {answer.message}",
                                    gone=answer.gone)
        if answer.status is Status.REFUSED:
            raise ElasticGroupError(f"{self.task}: {answer.message}")

    def _adopt(self, answer: Answer, deadline: Deadline) -> Transport:
        before = self.members
        transport = self._open(answer.members, answer.generation, deadline)
        self.generation, self.members, self.joining = answer.generation, answer.members, False
        if answer.members and answer.members[0] == self.task:
            # Logged once per change, by the new group's first rank; a warning, as a lost
            # task's error is: the run goes on with other replicas than it was started with.
            left = [t for t in before if t not in answer.members]
            joined = [t for t in answer.members if t not in before] if before else []
            level = logging.WARNING if answer.generation > 1 else logging.INFO
            log.log(level, "%s: elastic group generation %d: %d replica(s) (%s)%s%s", self.task,
                    answer.generation, len(answer.members), ", ".join(answer.members),
                    f"; left: {', '.join(left)}" if left else "",
                    f"; joined: {', '.join(joined)}" if joined else "")
        return transport
