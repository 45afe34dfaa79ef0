"""Console output of ``clusterctl launch``: every task's lines prefixed ``[worker:1]``, coloured on
a terminal, and the launcher's own lines prefixed ``[clusterctl]``."""

from __future__ import annotations

import threading
from typing import TextIO

__all__ = ["Console", "LineSplitter", "use_color"]

_PALETTE = ("36", "32", "33", "34", "35", "96", "92", "93", "94", "95")  # ANSI foregrounds
_RESET = "\033[0m"


def use_color(stream: TextIO, choice: str = "auto") -> bool:
    """``always``/``never``, or ``auto``: whether ``stream`` is a terminal. (``NO_COLOR`` is
    the CLI's to apply: :func:`cluster.ctl.cli.color_choice`.)"""
    if choice in ("always", "never"):
        return choice == "always"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Console:
    """Thread-safe prefixed writer; the prefix of each task gets its own colour."""

    def __init__(self, stream: TextIO, *, color: bool = False, tasks: list[str] = ()) -> None:
        self._stream = stream
        self._color = color
        self._lock = threading.Lock()
        self._colors = {t: _PALETTE[i % len(_PALETTE)] for i, t in enumerate(tasks)}
        self._width = max((len(t) for t in tasks), default=0)

    def _prefix(self, name: str, code: str | None) -> str:
        text = f"[{name}]".ljust(self._width + 2)
        return f"\033[{code}m{text}{_RESET}" if self._color and code else text

    def task_line(self, task: str, line: str) -> None:
        self._write(f"{self._prefix(task, self._colors.get(task, '37'))} {line}\n")

    def info(self, message: str, *, error: bool = False) -> None:
        prefix = self._prefix("clusterctl", "1;31" if error else "1")
        self._write("".join(f"{prefix} {line}\n" for line in message.splitlines() or [""]))

    def _write(self, text: str) -> None:
        with self._lock:
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


class LineSplitter:
    """Turns chunks of bytes into complete text lines, keeping a partial last line."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        return [_visible(line) for line in lines]

    def flush(self) -> list[str]:
        rest, self._partial = self._partial, b""
        return [_visible(rest)] if rest.strip() else []
