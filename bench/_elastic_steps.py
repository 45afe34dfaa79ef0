"""What ``bench/elastic.py`` reads from its tasks' output, and the times it derives from it.

Pure functions over the lines ``bench/_elastic_task.py`` prints (``IMPORTED <time>``, ``STEP
<step> <time> n=<replicas>``) and the launcher's own ``time.time()`` of a kill or a start: no
processes here, so the arithmetic is tested on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Step", "TaskLog", "first_step", "join_pause", "median", "parse", "recovery",
           "step_seconds"]

_STEP = re.compile(r"^STEP (\d+) (\d+\.\d+) n=(\d+)$", re.M)
_IMPORTED = re.compile(r"^IMPORTED (\d+\.\d+)$", re.M)


@dataclass(frozen=True)
class Step:
    """A completed step: its number (the state's step after it), when, with how many replicas."""

    step: int
    time: float
    replicas: int


@dataclass(frozen=True)
class TaskLog:
    """One task process's output: when its imports were done, and its completed steps."""

    imported: float | None
    steps: tuple[Step, ...]


def parse(output: str) -> TaskLog:
    """The lines of one task process's ``output``, in order; other lines are ignored."""
    imported = _IMPORTED.search(output)
    return TaskLog(float(imported.group(1)) if imported else None,
                   tuple(Step(int(s), float(t), int(n)) for s, t, n in _STEP.findall(output)))


def first_step(log: TaskLog, after: float, replicas: int | None = None) -> Step | None:
    """The first step ``log`` completed after time ``after`` (with ``replicas`` replicas, when
    given), or ``None``."""
    return next((s for s in log.steps if s.time > after
                 and (replicas is None or s.replicas == replicas)), None)


def recovery(logs: Iterable[TaskLog], after: float, replicas: int | None = None) -> float:
    """Seconds from ``after`` until every one of ``logs`` completed a step (with ``replicas``
    replicas, when given): the slowest task's first such step.

    A step the group had finished before a kill can still be printed after it; counting only
    steps of the new group's size (``replicas``) leaves those out.

    Raises:
        ValueError: a log has no such step (the launcher waits for them before asking).
    """
    times = []
    for i, log in enumerate(logs):
        step = first_step(log, after, replicas)
        if step is None:
            raise ValueError(f"task log {i} has no step after {after:.3f}"
                             + (f" with {replicas} replicas" if replicas else ""))
        times.append(step.time)
    if not times:
        raise ValueError("no task logs")
    return max(times) - after


def join_pause(logs: Iterable[TaskLog], after: float, replicas: int) -> float:
    """The longest time any of ``logs`` (the members while a task joins, which starts at
    ``after``) went without completing a step around its first step with ``replicas``
    replicas after ``after``: what admitting the joiner cost the members."""
    pauses = []
    for log in logs:
        grown = first_step(log, after, replicas)
        if grown is None:
            raise ValueError(f"a member has no step with {replicas} replicas after {after:.3f}")
        before = [s.time for s in log.steps if s.time < grown.time]
        pauses.append(grown.time - before[-1] if before else 0.0)
    return max(pauses)


def step_seconds(log: TaskLog, before: float, last: int = 20) -> float | None:
    """The median time between consecutive steps among the ``last`` steps ``log`` completed
    before time ``before``; ``None`` with fewer than two."""
    times = [s.time for s in log.steps if s.time < before][-last:]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return median(gaps) if gaps else None


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count); ``ValueError`` when empty."""
    if not values:
        raise ValueError("median of nothing")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
