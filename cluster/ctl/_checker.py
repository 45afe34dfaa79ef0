"""The cluster file's problem list: :class:`Problem` (``FILE:LINE: KEY: what`` + hint) and the
:class:`Checker` that collects problems while :mod:`cluster.ctl.spec` reads a located YAML tree.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from cluster.ctl._yaml import Located

__all__ = ["Checker", "Problem", "kind_of", "scalar_text"]


@dataclass(frozen=True)
class Problem:
    """One problem of a cluster file, printed as ``FILE:LINE: KEY: message`` + hint."""

    file: str
    line: int
    key: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class Checker:
    """Collects problems while reading a Located tree."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def add(self, line: int, key: str, message: str, hint: str = "") -> None:
        self.problems.append(Problem(self.file, line, key, message, hint))

    def mapping(self, node: Located, key: str, allowed: tuple[str, ...],
                what: str) -> dict[str, Located] | None:
        if not isinstance(node.value, dict):
            self.add(node.line, key, f"expected a mapping of {what}, got {kind_of(node.value)}")
            return None
        for name, line in node.key_lines.items():
            if name not in allowed:
                full = f"{key}.{name}" if key else name
                close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                known = "jobs are" if key == "cluster" else "known keys:"
                hint = (f'did you mean "{close[0]}"?' if close
                        else f"{known} {', '.join(allowed)}")
                kind = "job" if key == "cluster" else "key"
                self.add(line, full, f"unknown {kind} {name!r}", hint)
        return node.value

    def number(self, node: Located, key: str, *, minimum: float, strict: bool,
               integer: bool = False, maximum: float = math.inf,
               hint: str = "") -> float | None:
        """``node``'s number when it is finite, >= ``minimum`` (> when ``strict``) and <=
        ``maximum``; else a problem (with ``hint``) and None."""
        value = node.value
        ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type:
            kind = "an integer" if integer else "a number"
            self.add(node.line, key, f"expected {kind}, got {kind_of(value)}")
            return None
        if not math.isfinite(value):  # .nan passes every comparison below; .inf means "never"
            self.add(node.line, key, f"expected a finite number, got {value}", hint)
            return None
        if value < minimum or (strict and value == minimum) or value > maximum:
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            if maximum < math.inf:
                bound = f"{bound} and <= {maximum:g}"
            self.add(node.line, key, f"must be {bound}, got {value}", hint)
            return None
        return value

    def string(self, node: Located, key: str) -> str | None:
        if not isinstance(node.value, str) or not node.value:
            self.add(node.line, key, f"expected a non-empty string, got {kind_of(node.value)}")
            return None
        return node.value


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def scalar_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None
