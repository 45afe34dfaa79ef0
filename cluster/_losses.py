"""Which tasks one task knows lost, and which news of a loss is stale.

A task hears that a peer is lost (or failed) from its own transport, from a peer's abort, and
from the coordination service. In an elastic cluster a lost task can come back: a replacement
pod or a restarted process is a new incarnation under the same name, and the group re-forms
with it. News of the old incarnation's loss can then arrive after the group took the new one
in: the service tells its own host of every event twice (at once, and again in a heartbeat
reply), and any task hears an event up to a heartbeat late. Applied to the new group, that news
would fail it for a loss that is over.

So every ``LOST`` and ``FAILED`` event carries the elastic generation it was found in
(:class:`~cluster.transport.membership.Event`). The service forms a generation only of tasks it
counts alive; so news found in an older generation than the one this task opened, about a
member of that one, is about an incarnation the group has since re-admitted, and
:meth:`Losses.record` drops it. News with no generation (0: not elastic, or found before any
group) is always news.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["Losses"]


class Losses:
    """The tasks this task knows lost (with why), and the elastic generation it last opened;
    safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._why: dict[str, str] = {}
        self._generation = 0
        self._members: frozenset[str] = frozenset()

    @property
    def generation(self) -> int:
        """The elastic generation this task opened last (0: none)."""
        return self._generation

    def new_generation(self, generation: int, members: Iterable[str]) -> None:
        """This task opens ``generation`` of ``members``: the service counted every member
        alive when it formed, so their earlier losses are over."""
        with self._lock:
            self._generation = generation
            self._members = frozenset(members)
            for task in self._members:
                self._why.pop(task, None)

    def record(self, task: str, why: str, found_in: int = 0) -> bool:
        """Note ``task`` lost, as found in generation ``found_in`` (the first reason stays);
        False, noting nothing, when the news is stale: found before the generation this task
        opened, about a member of it (see the module docstring)."""
        with self._lock:
            if 0 < found_in < self._generation and task in self._members:
                return False
            self._why.setdefault(task, why)
            return True

    def items(self) -> list[tuple[str, str]]:
        """``(task, why)`` for every task known lost."""
        with self._lock:
            return list(self._why.items())

    def tasks(self) -> set[str]:
        with self._lock:
            return set(self._why)

    def __bool__(self) -> bool:
        return bool(self._why)
