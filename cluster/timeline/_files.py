"""The timeline's files: append-only line streams, and reading them back after any exit.

Two per-task files, both written a whole line at a time (:class:`LineStream`), so a task killed
by SIGKILL leaves complete lines only (at most the last ``FLUSH_SECONDS`` of events are lost):

- the trace (``CLUSTER_TIMELINE``): Chrome's *JSON Array Format* of the Trace Event Format, one
  event per line::

      [
      {"name": "process_name", "ph": "M", ...},
      {"name": "all_reduce #3 (float32[1024])", "ph": "X", "ts": ..., "dur": ..., ...},
      {"name": "process_name", "ph": "M", ...}]

  Closed, it is plain JSON; killed, it lacks the final line, which the format allows (Perfetto
  and ``chrome://tracing`` load it) and :func:`load_trace` repairs;
- the step records (``CLUSTER_STEPS``): JSON lines, a header (``{"task": ..., "pid": ...}``)
  then one object per step (:func:`load_steps`).

:func:`merge_traces` writes several tasks' traces as one Object Format file
(``{"traceEvents": [...]}``), one process track per task.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FLUSH_EVENTS", "FLUSH_SECONDS", "LineStream", "load_steps", "load_trace",
           "merge_traces"]

FLUSH_EVENTS = 512
"""Lines buffered before they are written (bounds the memory a long run's timeline takes)."""

FLUSH_SECONDS = 1.0
"""A line is written at most this long after it was added, if anything is added after it (a
step or a collective ends): what ``clusterctl status`` and a SIGKILLed task's file lag by."""


class LineStream:
    """Lines appended to ``path`` (created, parents too; truncated), written in batches.

    Each batch is one ``os.write`` of whole lines, so the file never ends inside a line unless
    the disk fills. ``head`` is written at once, ``tail`` by :meth:`close`. Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str], head: str = "", tail: str = "") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._tail = tail
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._flushed = time.monotonic()
        if head:
            self._write(head)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def add(self, line: str) -> None:
        """Buffer ``line`` (which ends with a newline); write the batch when it is due."""
        with self._lock:
            if self._fd < 0:
                return  # closed at exit while another thread still records: nothing to keep
            self._lines.append(line)
            if (len(self._lines) >= FLUSH_EVENTS
                    or time.monotonic() - self._flushed >= FLUSH_SECONDS):
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            if self._fd >= 0:
                self._flush_locked()

    def close(self) -> None:
        """Write what is buffered and the tail; later :meth:`add` calls are ignored."""
        with self._lock:
            if self._fd < 0:
                return
            self._lines.append(self._tail)
            try:
                self._flush_locked()
            finally:
                os.close(self._fd)
                self._fd = -1

    def _flush_locked(self) -> None:
        self._flushed = time.monotonic()
        if self._lines:
            text, self._lines = "".join(self._lines), []
            self._write(text)

    def _write(self, text: str) -> None:
        data = text.encode()
        while data:  # a regular file takes it whole; a short write only on a full disk
            written = os.write(self._fd, data)
            data = data[written:]


def _json_lines(text: str) -> Iterable[Any]:
    """Each line of ``text`` that is a JSON value once a trailing comma (and a closing bracket
    of the array format) is stripped; other lines (``[``, a line cut by a full disk) skipped."""
    for line in text.splitlines():
        line = line.strip().rstrip(",").removesuffix("]").rstrip(",")
        if not line or line == "[":
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a trace file: a complete one (either format), or one a killed task left.

    Raises:
        OSError: the file cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return [e for e in _json_lines(text) if isinstance(e, dict)]
    events = whole.get("traceEvents", []) if isinstance(whole, dict) else whole
    return [e for e in events if isinstance(e, dict)]


def load_steps(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(header, steps)`` of a step-record file (``header`` is ``{}`` when it has none).

    Raises:
        OSError: the file cannot be read.
    """
    header: dict[str, Any] = {}
    steps = []
    for record in _json_lines(Path(path).read_text(encoding="utf-8", errors="replace")):
        if not isinstance(record, dict):
            continue
        if "step" in record:
            steps.append(record)
        elif not header and "task" in record:
            header = record
    return header, steps


def merge_traces(sources: Sequence[tuple[str, str | os.PathLike[str]]],
                 out: str | os.PathLike[str]) -> int:
    """Write the traces of ``sources`` (``(task, path)`` in cluster order; missing files are
    skipped) as one Object Format trace at ``out``: task ``i`` is process ``i`` (named by a
    ``process_name`` event, ordered by ``process_sort_index``), each thread keeps its track.
    Returns the number of events written. Written to a temporary file, then renamed.
    """
    events: list[dict[str, Any]] = []
    for pid, (task, path) in enumerate(sources):
        try:
            loaded = load_trace(path)
        except FileNotFoundError:
            continue
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": task}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        for event in loaded:
            if event.get("ph") == "M" and event.get("name") in ("process_name",
                                                                 "process_sort_index"):
                continue  # named above, once
            events.append({**event, "pid": pid})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in events))
        f.write("\n]}\n")
    os.replace(tmp, out)
    return len(events)
