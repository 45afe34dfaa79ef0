"""Elastic runs: the cluster file's ``elastic: {min: MIN, max: MAX}`` and ``--elastic MIN:MAX``.

An elastic run keeps training while at least ``min`` of its chief and worker tasks run: one that
dies is started again alone (:func:`cluster.ctl.policy.on_elastic_exit`) while the others go on,
and each of them learns the bounds from :data:`ENV_ELASTIC` (``CLUSTER_ELASTIC=MIN:MAX``).

The rules, checked here for the file and the flag alike (one message per rule, with its fix):
``1 <= min <= max <=`` the number of chief and worker tasks; a ``collective`` run (every chief
and worker runs the entrypoint) without parameter servers, whose variables live in one task and
cannot be regrouped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cluster.ctl._checker import Checker, Problem
from cluster.ctl._yaml import Located
from cluster.errors import ClusterFileError

if TYPE_CHECKING:
    from cluster.ctl.spec import ClusterFile, JobSpec

__all__ = ["ELASTIC_JOBS", "ENV_ELASTIC", "Elastic", "elastic_problems", "parse_elastic",
           "parse_elastic_flag", "with_elastic"]

ENV_ELASTIC = "CLUSTER_ELASTIC"
"""Set to ``MIN:MAX`` (e.g. ``2:4``) for every chief and worker task of an elastic run."""

ELASTIC_JOBS = ("chief", "worker")
_FLAG_RE = re.compile(r"^\s*(-?\d+)\s*:\s*(-?\d+)\s*$")
_FORM = "`elastic: {min: 2, max: 4}` in the file, or `--elastic 2:4`"


@dataclass(frozen=True)
class Elastic:
    """The bounds of an elastic run: it goes on while at least ``min`` chief and worker tasks
    run, and grows back up to ``max``."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"elastic bounds need 1 <= min <= max, got {self.min}:{self.max}")

    def __str__(self) -> str:
        """``MIN:MAX``, the value of :data:`ENV_ELASTIC` and of ``--elastic``."""
        return f"{self.min}:{self.max}"


def _members(jobs: Iterable[JobSpec]) -> int:
    return sum(j.count for j in jobs if j.name in ELASTIC_JOBS)


def elastic_problems(low: int, high: int, jobs: Iterable[JobSpec] | None, mode: str,
                     flag: bool = False) -> list[tuple[str, str]]:
    """``(message, hint)`` for each rule ``low:high`` breaks in a cluster of ``jobs`` run in
    ``mode``; ``[]`` when it is a valid elastic run. ``jobs=None`` (the cluster is invalid
    already) checks the bounds alone. ``flag``: word the hints for ``--elastic`` (and ``-n``)
    instead of the file's keys."""
    problems = []
    if low < 1:
        problems.append((f"min must be >= 1, got {low}", "at least one chief or worker must "
                         "run: e.g. " + ("--elastic 1:4" if flag else "`min: 1`")))
    if high < low:
        problems.append((f"min {low} is above max {high}", "min is the fewest tasks the run "
                         "goes on with, max the most: " + (f"--elastic {high}:{low}" if flag
                                                          else f"min: {high}, max: {low}")))
    if jobs is None:
        return problems
    jobs = list(jobs)
    members = _members(jobs)
    if members and high > members:
        more = (f"-n {high}" if flag else f"{high - members} more task"
                f"{'s' if high - members > 1 else ''} under `cluster:`")
        problems.append((f"max {high} is above the {members} chief and worker task"
                         f"{'s' if members > 1 else ''} of this cluster",
                         f"use max <= {members}, or start {more}"))
    if any(j.name == "ps" and j.count for j in jobs):
        problems.append(("parameter servers are not elastic (the variables they hold would be "
                         "lost with them)", "run a collective job of chief and workers (no "
                         "`ps:`, no --ps), or drop " + ("--elastic" if flag else "`elastic:`")))
    elif mode != "collective":
        problems.append((f"elastic runs need `mode: collective` (this file's mode is {mode})",
                         "in an elastic run every chief and worker runs the entrypoint"))
    if not members:
        problems.append(("no chief and no worker to be elastic", "add `worker: 2` (or more)"))
    return problems


def parse_elastic(c: Checker, node: Located, jobs: Iterable[JobSpec] | None,
                  mode: str | None) -> Elastic | None:
    """The ``elastic:`` value, or ``None`` after adding a problem to ``c``. ``jobs`` and
    ``mode``: the cluster, when valid (``None``: the bounds are checked alone)."""
    value = c.mapping(node, "elastic", ("min", "max"), "bounds (min, max)")
    if value is None:
        c.problems[-1] = replace(c.problems[-1], hint=_FORM)
        return None
    bounds = {}
    for key in ("min", "max"):
        if key not in value:
            c.add(node.line, f"elastic.{key}", "missing", _FORM)
            continue
        n = c.number(value[key], f"elastic.{key}", minimum=1, strict=False, integer=True,
                     hint="a number of chief and worker tasks")
        if n is not None:
            bounds[key] = int(n)
    if len(bounds) < 2:
        return None
    problems = elastic_problems(bounds["min"], bounds["max"], jobs, mode or "collective")
    for message, hint in problems:
        key = "elastic.max" if message.startswith("max") else "elastic"
        line = value["max"].line if key == "elastic.max" else node.line
        c.add(line, key, message, hint)
    return None if problems else Elastic(bounds["min"], bounds["max"])


def parse_elastic_flag(text: str) -> tuple[int, int]:
    """``--elastic MIN:MAX`` as two integers; ``ValueError`` (saying the form) otherwise."""
    match = _FLAG_RE.match(text)
    if match is None:
        raise ValueError(f"expected MIN:MAX (two whole numbers, e.g. 2:4), got {text!r}")
    return int(match[1]), int(match[2])


def with_elastic(spec: ClusterFile, text: str, label: str) -> ClusterFile:
    """``spec`` made elastic by ``--elastic TEXT`` (which wins over the file's ``elastic:``).

    Raises:
        ClusterFileError: ``TEXT`` is no ``MIN:MAX``, or breaks a rule for this cluster; each
            problem names ``label`` (the command line) and ``--elastic``.
    """
    try:
        low, high = parse_elastic_flag(text)
    except ValueError as e:
        raise ClusterFileError([Problem(label, 0, "--elastic", str(e),
                                        "e.g. --elastic 2:4: go on with 2 to 4 tasks")]) from None
    problems = elastic_problems(low, high, spec.jobs, spec.mode, flag=True)
    if problems:
        raise ClusterFileError([Problem(label, 0, "--elastic", message, hint)
                                for message, hint in problems])
    return replace(spec, elastic=Elastic(low, high))
