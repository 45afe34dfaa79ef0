"""The membership record of a run: every task clusterctl restarted alone, gave up on or lost.

``RUN_DIR/membership.jsonl`` holds one JSON object per event, appended as it happens (a line at
a time, so a reader never sees half of one)::

    {"time": 1764330000.12, "task": "worker:1", "event": "restarting", "code": 137,
     "cause": "killed by SIGKILL", "running": 3, "restart": 1, "elastic": "2:4"}

``event`` is one of :data:`EVENTS`: ``restarting`` (it exited and is started again alone),
``started`` (it was), ``given-up`` (its restarts are used up: the run goes on without it),
``below-min`` (its exit left fewer than ``min`` running: the run fails). ``running`` counts the
chief and worker tasks still running after the event. ``clusterctl status`` lists the events
(:func:`load`); a run's timeline shows them as instants on a ``clusterctl`` track
(:func:`trace_events`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EVENTS", "FILE", "MembershipLog", "load", "trace_events"]

FILE = "membership.jsonl"
EVENTS = ("restarting", "started", "given-up", "below-min")


class MembershipLog:
    """Appends events to ``RUN_DIR/membership.jsonl`` (made on the first event)."""

    def __init__(self, run_dir: Path, elastic: str = "") -> None:
        self.path = run_dir / FILE
        self.elastic = elastic

    def write(self, event: str, task: str, *, code: int | None = None, cause: str = "",
              running: int, restart: int = 0) -> None:
        """Append one event; ``OSError`` when the run directory cannot be written."""
        assert event in EVENTS, event
        record: dict[str, Any] = {"time": round(time.time(), 6), "task": task, "event": event,
                                  "code": code, "cause": cause, "running": running,
                                  "restart": restart, "elastic": self.elastic}
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)  # one write of one line: O_APPEND keeps lines whole
        finally:
            os.close(fd)


def load(run_dir: Path) -> list[dict[str, Any]]:
    """The events of the run in ``run_dir``, oldest first (``[]`` when there are none); lines
    that are not an event object are skipped."""
    try:
        text = (run_dir / FILE).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("event") in EVENTS and "task" in record:
            events.append(record)
    return events


def trace_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` as Chrome trace instants (global scope, microseconds of wall time, as the
    tasks' traces), for a ``clusterctl`` process track of the merged timeline."""
    return [{"name": f"{e['task']} {e['event']}", "cat": "membership", "ph": "i", "s": "g",
             "pid": 0, "tid": 0, "ts": round(float(e["time"]) * 1e6, 1),
             "args": {k: e[k] for k in ("code", "cause", "running", "restart", "elastic")
                      if k in e}}
            for e in events if isinstance(e.get("time"), (int, float))]
