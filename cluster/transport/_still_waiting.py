""""Still waiting for ..." lines while a task waits for its peers at start-up.

A task that waits silently for a peer that never comes looks hung; one that says every few
seconds whom it still waits for points at the task to look at. :class:`StillWaiting` is the
throttle: the waiting loop asks :meth:`StillWaiting.timeout` how long it may sleep and calls
:meth:`StillWaiting.tick` after each wake-up; a line is logged (WARNING, logger
``cluster.transport``) once per :data:`EVERY` seconds, the first after :data:`EVERY` seconds,
so a start-up that goes well prints nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cluster.deadline import Deadline

__all__ = ["EVERY", "StillWaiting", "describe_unregistered"]

EVERY = 5.0
"""Seconds between two "still waiting" lines."""

_log = logging.getLogger("cluster.transport")


class StillWaiting:
    """Logs ``"{me}: still waiting for {what()} ({t} s so far, {r} s left)"`` every ``every``
    seconds of a wait that ends at ``deadline``; ``what`` is called only when a line is due."""

    def __init__(self, me: str, deadline: Deadline, every: float = EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._me, self._deadline, self._every, self._clock = me, deadline, every, clock
        self._start = clock()
        self._next = self._start + every

    def timeout(self, limit: float | None) -> float:
        """How long the waiting loop may sleep: ``limit`` (``None``: no limit of its own),
        but no longer than until the next line is due."""
        due = max(0.0, self._next - self._clock())
        return due if limit is None else min(limit, due)

    def tick(self, what: Callable[[], str]) -> bool:
        """Log the line if it is due; True when it did."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._every
        left = self._deadline.remaining()
        ends = "" if left == float("inf") else f", giving up in {max(left, 0.0):.0f} s"
        _log.warning("%s: still waiting for %s (%.0f s so far%s)", self._me, what(),
                     now - self._start, ends)
        return True


def describe_unregistered(wanted: list[str], known: tuple[tuple[str, ...], int] | None) -> str:
    """Whom the start-up barrier waits for: the ``wanted`` tasks among the coordination
    service's last list of unregistered ones (``known``: its first names and their count;
    ``None``: the service has not answered yet)."""
    if known is None:
        return "the coordination service's first answer"
    names, count = known
    listed = [t for t in wanted if t in names]
    more = count - len(names)  # the service lists only the first ones
    if not listed and more <= 0:
        return "the coordination service's next answer"
    text = ", ".join(listed)
    if more > 0:
        text += f"{', ' if text else ''}and {more} more"
    return f"{count} task{'s' if count != 1 else ''} to start: {text}"
