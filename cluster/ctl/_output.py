"""Console output of ``clusterctl launch``: every task's lines prefixed ``[worker:1]``, coloured on
a terminal, the launcher's own lines prefixed ``[clusterctl]``, and partial lines (progress bars
that redraw with ``\\r``) shown while they are drawn.

Partial lines (a line the task has started but not ended with ``\\n``):

- on a terminal (``live``), the partial line of one task, the *live task* (``chief:0``, else the
  first task shown), is drawn in place on the bottom row, prefixed, and redrawn at each update;
  every complete line of any task is written above it. Other tasks' partial lines appear when
  they end. The row is cut to the terminal's width, so ``\\r`` + erase redraws it exactly;
- in a pipe or file, a task's partial line is written as a line once it has been unchanged for
  :data:`PIPE_QUIET` seconds (``Loading...`` before a long step), or at most every
  :data:`PIPE_EVERY` seconds while it keeps changing (a progress bar), so a log shows progress
  without one line per redraw; the finished line is written when it ends (not twice).

``--tasks`` (``show``) limits the tasks whose output reaches the console; the log files always get
everything (:mod:`cluster.ctl._task_process`). ``--timestamps`` starts each console line with the
wall-clock time it was written.

Native log lines (:func:`is_native_log_line`) go to the task's log file only: gRPC's C core
writes its own log (``Got goaway``, ``Socket closed``, epoll errors while a peer dies or the run
is stopped) straight to file descriptor 2, bypassing Python's logging, and those lines say
nothing the launcher's failure lines and the Python traceback do not. They are recognised by
the fixed prefix of the absl/glog format, never by their text, so ``GRPC_VERBOSITY`` and
``GRPC_TRACE`` keep working and what they turn on is in the log.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Collection
from typing import TextIO

__all__ = ["PIPE_EVERY", "PIPE_QUIET", "Console", "LineSplitter", "is_native_log_line", "stamp",
           "use_color"]

_PALETTE = ("36", "32", "33", "34", "35", "96", "92", "93", "94", "95")  # ANSI foregrounds
_RESET = "\033[0m"
_ERASE_ROW = "\r\033[K"  # carriage return, erase to the end of the row
PIPE_QUIET = 0.5  # seconds a partial line must stay unchanged before a pipe gets it
PIPE_EVERY = 5.0  # seconds: a partial line that keeps changing reaches a pipe at most this often


# absl's (and glog's, and gRPC's older gpr) line prefix: severity and MMDD, wall time to the micro-
# or nanosecond (``00:00:<epoch seconds>`` before absl::InitializeLog), thread id, then the C/C++
# source file and line. A Python source file (absl-py uses the same prefix) is the user's own log.
_NATIVE_PREFIX = re.compile(r"[IWEFD]\d{4} \d\d:\d\d:\d+\.\d{6,9} +\d+ "
                            r"[^\s\]]+\.(?:cc|c|cpp|cxx|h|hh|hpp|inc):\d+\] ")
# absl's own first line when a library logs before absl::InitializeLog() (gRPC's C core does).
_ABSL_PREINIT = ("WARNING: All log messages before absl::InitializeLog() is called are written "
                 "to STDERR")


def is_native_log_line(line: str) -> bool:
    """Whether ``line`` is a native (C/C++) library's log line in the absl/glog format, as
    gRPC's C core writes them to fd 2, e.g.
    ``I1128 06:48:40.287768    8148 chttp2_transport.cc:1403] ipv4:...: Got goaway [2] ...``.

    >>> is_native_log_line("E0000 00:00:1732790000.123456   12345 ev_epoll1_linux.cc:123] x")
    True
    >>> is_native_log_line("I1128 06:48:40.287768 140 train.py:12] absl-py: the user's log")
    False
    """
    return line == _ABSL_PREINIT or _NATIVE_PREFIX.match(line) is not None


def use_color(stream: TextIO, choice: str = "auto") -> bool:
    """``always``/``never``, or ``auto``: whether ``stream`` is a terminal. (``NO_COLOR`` is
    the CLI's to apply: :func:`cluster.ctl.cli.color_choice`.)"""
    if choice in ("always", "never"):
        return choice == "always"
    return _isatty(stream)


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def stamp(wall: float | None = None) -> str:
    """``12:03:04.567``: local wall-clock time to the millisecond (``--timestamps``)."""
    wall = time.time() if wall is None else wall
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 1000):03d}"


class _Pending:
    """A task's partial line as a pipe sees it: its text, when it last changed, and what was
    forwarded last (and when)."""

    __slots__ = ("changed", "forwarded", "forwarded_at", "text")

    def __init__(self, now: float) -> None:
        self.text = ""
        self.changed = now
        self.forwarded = ""
        self.forwarded_at = now  # the first PIPE_EVERY counts from the line's first text

    def due_at(self) -> float | None:
        if not self.text or self.text == self.forwarded:
            return None
        return min(self.changed + PIPE_QUIET, self.forwarded_at + PIPE_EVERY)


class Console:
    """Thread-safe prefixed writer; the prefix of each task gets its own colour.

    ``show``: the tasks whose output is written (None: all). ``live``: draw the live task's
    partial line in place (default: whether ``stream`` is a terminal). ``clock`` is
    ``time.monotonic`` (injectable for tests).
    """

    def __init__(self, stream: TextIO, *, color: bool = False, tasks: Collection[str] = (),
                 show: Collection[str] | None = None, timestamps: bool = False,
                 live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._color = color
        self._lock = threading.Lock()
        self._colors = {t: _PALETTE[i % len(_PALETTE)] for i, t in enumerate(tasks)}
        self._width = max((len(t) for t in tasks), default=0)
        self._show = None if show is None else frozenset(show)
        self._timestamps = timestamps
        self._live = _isatty(stream) if live is None else live
        self._clock = clock
        shown = [t for t in tasks if self.shows(t) and t != "clusterctl"]
        self.live_task = "chief:0" if "chief:0" in shown else (shown[0] if shown else None)
        self._drawn = ""  # the live row as drawn (terminal), "" when none
        self._pending: dict[str, _Pending] = {}

    def shows(self, task: str) -> bool:
        """Whether ``task``'s output reaches the console (``--tasks``)."""
        return self._show is None or task in self._show

    def _prefix(self, name: str, code: str | None) -> str:
        text = f"[{name}]".ljust(self._width + 2)
        text = f"\033[{code}m{text}{_RESET}" if self._color and code else text
        return f"{stamp()} {text}" if self._timestamps else text

    def _task_prefix(self, task: str) -> str:
        return self._prefix(task, self._colors.get(task, "37"))

    def task_line(self, task: str, line: str) -> None:
        """A complete line of ``task``'s output."""
        if not self.shows(task):
            return
        if self._live:
            if task == self.live_task:
                self._redraw("")
        else:
            pending = self._pending.get(task)
            if pending is not None:
                already = pending.forwarded == line.rstrip() and pending.forwarded
                self._pending.pop(task)
                if already:
                    return  # the pipe got this text as a partial line already
        self._write(f"{self._task_prefix(task)} {line}\n")

    def task_partial(self, task: str, text: str) -> None:
        """``task``'s partial line is now ``text`` (what a terminal shows of it; "" for none)."""
        if not self.shows(task):
            return
        if self._live:
            if task == self.live_task:
                self._redraw(text)
            return
        now = self._clock()
        pending = self._pending.get(task)
        if pending is None:
            pending = self._pending[task] = _Pending(now)
        if text != pending.text:
            pending.text, pending.changed = text, now
        if not text and not pending.forwarded:
            self._pending.pop(task)

    def due(self) -> float | None:
        """Seconds until a pipe's pending partial line must be written (None: nothing due)."""
        times = [t for p in self._pending.values() if (t := p.due_at()) is not None]
        return max(0.0, min(times) - self._clock()) if times else None

    def tick(self) -> None:
        """Write every pending partial line that is due (pipes; a terminal draws at once)."""
        now = self._clock()
        for task, pending in list(self._pending.items()):
            at = pending.due_at()
            if at is not None and at <= now:
                pending.forwarded, pending.forwarded_at = pending.text, now
                self._write(f"{self._task_prefix(task)} {pending.text}\n")

    def info(self, message: str, *, error: bool = False) -> None:
        prefix = self._prefix("clusterctl", "1;31" if error else "1")
        self._write("".join(f"{prefix} {line}\n" for line in message.splitlines() or [""]))

    def _columns(self) -> int:
        try:
            columns = os.get_terminal_size(self._stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        return columns or 80  # 0: a terminal whose size was never set (a bare pty)

    def _redraw(self, text: str) -> None:
        """Draw the live task's partial line ``text`` on the bottom row ("" erases it)."""
        with self._lock:
            if text:
                # Cut what shows, not the escape codes: the row must not wrap, or the next
                # carriage return would leave its first part on the row above.
                room = max(self._columns() - len(f"[{self.live_task}]".ljust(self._width + 2))
                           - (13 if self._timestamps else 0) - 2, 8)
                shown = text if len(text) <= room else text[:room - 1] + "…"
                row = f"{self._task_prefix(self.live_task)} {shown}"
            else:
                row = ""
            if row == self._drawn:
                return
            self._emit(_ERASE_ROW + row if self._drawn or row else "")
            self._drawn = row

    def _write(self, text: str) -> None:
        with self._lock:
            if self._drawn:  # lift the live row, write above it, draw it again below
                text = _ERASE_ROW + text + self._drawn
            self._emit(text)

    def _emit(self, text: str) -> None:
        if not text:
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed terminal must not stop the supervisor


def _visible(line: bytes) -> str:
    """What a terminal shows of a line redrawn with carriage returns (progress bars): the last
    segment that is not blank."""
    segments = [s for s in line.split(b"\r") if s.strip()]
    return (segments[-1] if segments else b"").rstrip().decode("utf-8", "replace")


def _compact(partial: bytes) -> bytes:
    """``partial`` without the redraws a terminal no longer shows (what :func:`_visible` makes
    of it, with more text appended, is unchanged): a progress bar that redraws for an hour
    without a newline must not grow a megabyte that every read splits again."""
    cut = partial.rfind(b"\r")
    while cut > 0 and not partial[cut + 1:].split(b"\r", 1)[0].strip():
        cut = partial.rfind(b"\r", 0, cut)  # keep the last segment that shows something
    return partial[cut:] if cut > 0 else partial


class LineSplitter:
    """Turns chunks of bytes into complete text lines, keeping a partial last line."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *lines, partial = data.split(b"\n")
        self._partial = _compact(partial)
        return [_visible(line) for line in lines]

    def partial(self) -> str:
        """What a terminal shows of the line not yet ended (``\\r`` redraws applied)."""
        return _visible(self._partial) if self._partial else ""

    def flush(self) -> list[str]:
        rest, self._partial = self._partial, b""
        return [_visible(rest)] if rest.strip() else []
