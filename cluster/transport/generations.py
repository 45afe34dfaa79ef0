"""Which tasks train together in an elastic cluster, generation after generation: a pure state
machine (no sockets, threads or clocks), table-tested in ``tests/transport/test_generations.py``.
The coordination service (:mod:`~cluster.transport.coordination`) wraps it with its lock and
the ``Regroup`` call.

Rules:

- Generation 0 is the group as configured: every collective task (chief, workers) of the
  cluster spec, in cluster order. It forms generation 1 as soon as every one of them has asked.
- A task asks for the generation after the one it knows (:meth:`Generations.ask`, ``after``);
  the next one forms once every member of the current generation that is still alive has asked:
  survivors ask when their collective failed (a member is gone) or at a commit where they agreed
  that a task waits to join. A member is gone once the coordination service counts it lost,
  failed or left, or a new incarnation of it registered (it restarted).
- A task outside the current generation (a restarted task, a replacement) is a *joiner*: asking
  with ``enlist`` puts it on the list (:attr:`Generations.joining` counts it; members hear of it
  and regroup at their next commit); asking without ``enlist`` only tells it a group is running,
  so a starting task does not make the group wait while it builds its model.
- The new generation is every asker whose incarnation is still the live one, in cluster order
  (ranks follow it), at most ``maximum``; the rest wait for the next. Fewer than ``minimum``
  ends the elastic run: every asker is answered ``BELOW_MIN``, naming who is gone, and the
  answer stays (the job fails as a non-elastic one does).
- A task whose incarnation the service no longer counts live (declared lost while it was cut
  off) is ``REFUSED``: its process must restart and join as a new incarnation.
- News of a task's loss or failure found in some generation can arrive late (a report still on
  its way, a reporter's old group): :meth:`Generations.predates` tells the service when it is
  about an earlier incarnation than the live one, which the service must not count lost.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Answer", "Generations", "Status"]


class Status(enum.Enum):
    WAITING = "WAITING"  # not formed yet (or a joiner's look at a running group): ask again
    FORMED = "FORMED"  # the caller is a member of ``generation``
    BELOW_MIN = "BELOW_MIN"  # fewer than the minimum are left: the elastic run is over
    REFUSED = "REFUSED"  # the caller's incarnation is not live: it must restart


@dataclass(frozen=True)
class Answer:
    """What an asker hears: the status, the current generation and its members (rank order),
    for ``BELOW_MIN``/``REFUSED`` why, and for ``BELOW_MIN`` who is gone."""

    status: Status
    generation: int
    members: tuple[str, ...]
    message: str = ""
    gone: tuple[str, ...] = ()


@dataclass
class Generations:
    """The generations of one elastic group; see the module docstring.

    ``tasks``: the collective tasks of the cluster spec, in cluster order; ``minimum`` and
    ``maximum``: the bounds of a generation's size.
    """

    tasks: tuple[str, ...]
    minimum: int
    maximum: int
    generation: int = field(init=False, default=0)
    members: tuple[str, ...] = field(init=False)
    # The live incarnation of each member of the current generation (None: generation 0,
    # whichever incarnation registers).
    _incarnations: dict[str, int | None] = field(init=False)
    _asking: dict[str, int] = field(init=False, default_factory=dict)
    # Each task's live incarnation and the generation current when it registered.
    _registered_in: dict[str, tuple[int, int]] = field(init=False, default_factory=dict)
    _below: str = field(init=False, default="")
    _gone: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"elastic bounds must satisfy 1 <= min <= max, got "
                             f"{self.minimum}:{self.maximum}")
        self.members = tuple(self.tasks)
        self._incarnations = dict.fromkeys(self.tasks)

    def _is_gone(self, task: str, live: Callable[[str], int | None],
                 registered: Callable[[str], bool]) -> bool:
        """A member of the current generation is gone: lost, failed, left, or restarted."""
        if not registered(task):
            return self.generation > 0  # generation 0 waits for tasks still starting
        incarnation = live(task)
        if incarnation is None:
            return True
        wanted = self._incarnations.get(task)
        return wanted is not None and wanted != incarnation

    def ask(self, task: str, incarnation: int, after: int, *, enlist: bool,
            live: Callable[[str], int | None], registered: Callable[[str], bool]) -> Answer:
        """``task`` (``incarnation``) asks for a generation after ``after``.

        ``live(task)`` is the incarnation the coordination service counts alive (None when
        lost, failed, left or not registered); ``registered(task)`` whether it ever
        registered. Returns the caller's :class:`Answer`.
        """
        if task not in self.tasks:
            return Answer(Status.REFUSED, self.generation, self.members,
                          f"{task} is not a collective task of this cluster")
        if live(task) != incarnation:
            return Answer(Status.REFUSED, self.generation, self.members,
                          f"{task} (incarnation {incarnation:#x}) is not counted alive by the "
                          "coordination service (declared lost while cut off?): restart it to "
                          "join again")
        if self._below:
            return Answer(Status.BELOW_MIN, self.generation, self.members, self._below,
                          self._gone)
        if self.generation > after and self._is_member(task, incarnation):
            return Answer(Status.FORMED, self.generation, self.members)
        if enlist or self.generation == 0:
            self._asking[task] = incarnation
        self._try_form(live, registered)
        if self._below:
            return Answer(Status.BELOW_MIN, self.generation, self.members, self._below,
                          self._gone)
        if self.generation > after and self._is_member(task, incarnation):
            return Answer(Status.FORMED, self.generation, self.members)
        return Answer(Status.WAITING, self.generation, self.members)

    def registered(self, task: str, incarnation: int) -> None:
        """The coordination service saw ``task`` register ``incarnation`` (anew, or again)."""
        known = self._registered_in.get(task)
        if known is None or known[0] != incarnation:
            self._registered_in[task] = (incarnation, self.generation)

    def predates(self, task: str, incarnation: int | None, found_in: int) -> bool:
        """News of ``task``'s loss or failure, found in generation ``found_in`` (0: not known),
        is about an earlier incarnation than the live one, ``incarnation`` (None: none is
        live): it was found no later than the generation current when that incarnation
        registered (no group of then held it), or before the current generation, of which
        that incarnation is a member (it was counted alive when that one formed)."""
        if found_in <= 0 or incarnation is None:
            return False
        known = self._registered_in.get(task)
        if known is not None and known[0] == incarnation and found_in <= known[1]:
            return True
        return (found_in < self.generation and task in self.members
                and self._is_member(task, incarnation))

    def _is_member(self, task: str, incarnation: int) -> bool:
        if task not in self._incarnations:
            return False
        wanted = self._incarnations[task]
        return wanted is None or wanted == incarnation

    def _try_form(self, live: Callable[[str], int | None],
                  registered: Callable[[str], bool]) -> None:
        # Askers that died or restarted since they asked are dropped (a restart asks anew).
        self._asking = {t: i for t, i in self._asking.items() if live(t) == i}
        if not self._asking:
            return  # nobody waits for a group (all left: the run is over)
        remaining = [m for m in self.members if not self._is_gone(m, live, registered)]
        if any(m not in self._asking for m in remaining):
            return  # a live member has not asked yet: it is still training, or failing
        askers = [t for t in self.tasks if t in self._asking]
        if len(askers) < self.minimum:
            gone = [m for m in self.members if m not in remaining]
            self._gone = tuple(gone)
            self._below = (
                f"{len(askers)} collective task(s) left ({', '.join(askers) or 'none'}), fewer "
                f"than the elastic minimum of {self.minimum}; gone: {', '.join(gone) or 'none'}")
            return
        chosen = askers[:self.maximum]
        self.generation += 1
        self.members = tuple(chosen)
        self._incarnations = {t: self._asking.pop(t) for t in chosen}

    def joining(self) -> int:
        """How many tasks outside the current generation wait to join it."""
        return sum(1 for t, i in self._asking.items() if not self._is_member(t, i))
