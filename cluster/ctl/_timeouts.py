"""The cluster file's ``timeouts:`` section: how long the launcher and its tasks wait, and the
task variables each key sets.

Each key owns its variable: ``startup`` is ``CLUSTER_CONNECT_TIMEOUT``, ``heartbeat``
``CLUSTER_HEARTBEAT_TIMEOUT``, ``grace`` ``CLUSTER_GRACE_PERIOD`` (clusterctl sets those for
every task, so ``env:`` may not), and ``stall``, when given, ``CLUSTER_STALL_TIMEOUT`` (left to
``env:`` or the tasks' default otherwise). ``launch``, ``render`` and the Slurm script all take
the variables from :meth:`Timeouts.task_env`, so the three agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.ctl._checker import Checker
from cluster.ctl._yaml import Located
from cluster.settings import (
    ENV_CONNECT_TIMEOUT,
    ENV_GRACE_PERIOD,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_STALL_TIMEOUT,
    TaskSettings,
)

__all__ = ["HEARTBEAT_RANGE", "KEYS", "STALL_MAX", "Timeouts", "env_problems", "parse_timeouts"]

# timeouts.heartbeat: at least two heartbeat intervals (0.5 s each), or a busy machine's
# scheduling delay reads as a lost peer; at most an hour, or a frozen task goes unnoticed for
# longer than any checkpoint interval (a hard limit on a run is timeouts.run).
HEARTBEAT_RANGE = (1.0, 3600.0)
# timeouts.stall: never below the heartbeat timeout (the tasks would raise it to that anyway);
# at most a day: a task stalled for longer is gone for any purpose a run has.
STALL_MAX = 86400.0
KEYS = ("startup", "grace", "run", "heartbeat", "stall")
_OWNED = {ENV_CONNECT_TIMEOUT: "startup", ENV_HEARTBEAT_TIMEOUT: "heartbeat",
          ENV_GRACE_PERIOD: "grace"}


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``startup``: tasks wait this long for their peers; ``grace``: SIGTERM to SIGKILL;
    ``run``: optional limit on each attempt; ``heartbeat``: a silent peer is lost after this;
    ``stall``: a silent peer whose host still answers (busy, not dead) is lost after this (None:
    the tasks' own default, or ``env:``)."""

    startup: float = 60.0
    grace: float = 10.0
    run: float | None = None
    heartbeat: float = 3.0  # TaskSettings.heartbeat_timeout: docs/guide/across-hosts.md
    stall: float | None = None  # TaskSettings.stall_timeout

    def __post_init__(self) -> None:
        low, high = HEARTBEAT_RANGE
        if not (0 < self.startup < math.inf and 0 <= self.grace < math.inf
                and low <= self.heartbeat <= high):
            raise ValueError(f"timeouts must be finite and positive, heartbeat {low:g} to "
                             f"{high:g}: {self}")
        if self.run is not None and not 0 < self.run < math.inf:
            raise ValueError(f"timeouts.run must be > 0 and finite, or None; got {self.run!r}")
        if self.stall is not None and not self.heartbeat <= self.stall <= STALL_MAX:
            raise ValueError(f"timeouts.stall must be from timeouts.heartbeat "
                             f"({self.heartbeat:g}) to {STALL_MAX:g}, or None; got {self.stall!r}")

    def task_env(self) -> dict[str, str]:
        """The variables these timeouts set in every task (the grace period aside: where the
        tasks run decides what SIGTERM to SIGKILL is)."""
        env = {ENV_CONNECT_TIMEOUT: f"{self.startup:g}",
               ENV_HEARTBEAT_TIMEOUT: f"{self.heartbeat:g}"}
        if self.stall is not None:
            env[ENV_STALL_TIMEOUT] = f"{self.stall:g}"
        return env


def parse_timeouts(c: Checker, node: Located) -> Timeouts | None:
    """The ``timeouts:`` mapping; problems go to ``c`` (then None)."""
    timeouts = c.mapping(node, "timeouts", KEYS, "timeouts in seconds")
    if timeouts is None:
        return None
    kwargs: dict[str, float] = {}
    for key in KEYS:
        if key not in timeouts or (key in ("run", "stall") and timeouts[key].value is None):
            continue
        if key == "heartbeat":
            low, high = HEARTBEAT_RANGE
            v = c.number(timeouts[key], "timeouts.heartbeat", minimum=low, strict=False,
                         maximum=high, hint=f"seconds of silence before a peer is lost: "
                         f"{low:g} to {high:g} (default {Timeouts.heartbeat:g})")
        elif key == "stall":
            heartbeat = kwargs.get("heartbeat", Timeouts.heartbeat)
            v = c.number(timeouts[key], "timeouts.stall", minimum=heartbeat, strict=False,
                         maximum=STALL_MAX, hint=f"seconds of silence before a peer whose host "
                         f"still answers is lost: from timeouts.heartbeat ({heartbeat:g}) to "
                         f"{STALL_MAX:g} (default {TaskSettings.stall_timeout:g})")
        else:
            v = c.number(timeouts[key], f"timeouts.{key}", minimum=0, strict=key != "grace",
                         hint="leave timeouts.run out for no limit" if key == "run"
                         else "a number of seconds")
        if v is not None:
            kwargs[key] = float(v)
    return Timeouts(**kwargs)


def env_problems(c: Checker, env_node: Located, env: dict[str, str],
                 timeouts: Timeouts | None) -> None:
    """Refuse an ``env:`` variable that a ``timeouts`` key sets: clusterctl sets the startup,
    heartbeat and grace variables for every task, and the stall one where ``timeouts.stall``
    is given (two values for one setting would leave which one wins to the reader)."""
    owned = dict(_OWNED)
    if timeouts is not None and timeouts.stall is not None:
        owned[ENV_STALL_TIMEOUT] = "stall"
    for var in env:
        if var in owned:
            c.add(env_node.key_lines[var], f"env.{var}",
                  f"is set from timeouts.{owned[var]} for each task",
                  f"set timeouts.{owned[var]} instead and remove it from env")
