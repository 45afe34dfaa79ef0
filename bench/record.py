"""The result file of one benchmark run: what ran, where, when, at which commit, and its figures.

The schema's module, not a benchmark: the bench scripts write result files through it and
``tools/bench_pages.py`` reads them.

One JSON file per benchmark under ``bench/results/`` (``tools/bench_pages.py`` turns them into
the pages under ``docs/benchmarks/``). A bench script writes one with :func:`write_result` when
given ``--json PATH``; :func:`load_result` reads and validates one. The schema::

    {"schema": 1, "name": "strategy", "title": "...", "summary": "...",
     "command": "uv run python bench/strategy.py ...",
     "machine": {"cores": 2, "cpu": "AMD EPYC", "memory_gib": 23.5, "os": "Linux-..."},
     "date": "2026-11-25", "commit": "28da316", "source": "measured",
     "figures": [{"label": "...", "value": 2.79, "unit": "x"}],
     "tables": [{"title": "...", "columns": [{"name": "N", "unit": "", "digits": null}, ...],
                 "rows": [[2, "all_reduce 64 MiB", 20.49, ...]], "notes": ""}],
     "plots": [{"title": "...", "table": 0, "kind": "bar", "x": ["N", "case"],
                "y": ["shm", "gloo"], "ylabel": "ms", "group": null, "log_y": false}]}

A cell is a number, a string or ``null`` (not measured, or not applicable to the row).
``figures`` are the few numbers the index page's summary shows. A column of unit ``x`` holds a
ratio its name states: ``x gloo`` is gloo's time over ours (above 1 we are faster). ``source``
is ``measured`` for a file a bench wrote, or says where figures were transcribed from.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CORES_PER_RANK", "Column", "Figure", "Machine", "Plot", "Result", "ResultError",
           "Table", "cores_per_rank", "load_result", "machine_here", "machine_line",
           "result_json", "write_result"]

SCHEMA = 1
REPO = Path(__file__).resolve().parent.parent
UNITS = ("", "x", "ms", "us", "s", "GB/s", "MB/s", "MiB", "%", "steps/s", "count", "ns/B")
PLOT_KINDS = ("bar", "line")
Cell = int | float | str | None


class ResultError(ValueError):
    """A result file or a value for one breaks the schema; the message names the field."""


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ResultError(f"{where}: {what}")


@dataclass(frozen=True)
class Machine:
    """Where a benchmark ran. ``memory_gib`` is ``None`` where it was not recorded."""

    cores: int
    cpu: str
    memory_gib: float | None
    os: str

    def __post_init__(self) -> None:
        _need(isinstance(self.cores, int) and self.cores >= 1, "machine.cores",
              f"a core count >= 1, got {self.cores!r}")
        _need(isinstance(self.cpu, str) and bool(self.cpu), "machine.cpu",
              "the CPU model name (/proc/cpuinfo's 'model name')")
        _need(self.memory_gib is None or (isinstance(self.memory_gib, int | float)
                                          and self.memory_gib > 0),
              "machine.memory_gib", f"GiB of memory > 0 or null, got {self.memory_gib!r}")
        _need(isinstance(self.os, str) and bool(self.os), "machine.os", "platform.platform()")


@dataclass(frozen=True)
class Column:
    """A table column; ``unit`` is one of :data:`UNITS` (``x``: a ratio its name states);
    ``digits``: the decimals its numbers are shown with (``None``: as they are stored)."""

    name: str
    unit: str = ""
    digits: int | None = None

    def __post_init__(self) -> None:
        _need(isinstance(self.name, str) and bool(self.name), "column.name", "a non-empty name")
        _need(self.unit in UNITS, f"column {self.name!r}.unit",
              f"one of {', '.join(repr(u) for u in UNITS)}, got {self.unit!r}")
        _need(self.digits is None or isinstance(self.digits, int) and 0 <= self.digits <= 6,
              f"column {self.name!r}.digits", f"0 to 6 or null, got {self.digits!r}")


@dataclass(frozen=True)
class Table:
    """Rows of cells under named columns; every row has one cell per column."""

    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    notes: str = ""

    def __post_init__(self) -> None:
        where = f"table {self.title!r}"
        _need(bool(self.columns), where, "at least one column")
        names = [c.name for c in self.columns]
        _need(len(set(names)) == len(names), where, f"column names repeat: {names}")
        _need(bool(self.rows), where, "at least one row")
        for i, row in enumerate(self.rows):
            _need(len(row) == len(self.columns), f"{where} row {i}",
                  f"{len(row)} cells for {len(self.columns)} columns")
            for cell in row:
                _need(cell is None or isinstance(cell, int | float | str)
                      and not isinstance(cell, bool), f"{where} row {i}",
                      f"cells are numbers, strings or null, got {cell!r}")

    def column(self, name: str) -> int:
        """The index of column ``name``; raises :class:`ResultError` naming the table."""
        for i, c in enumerate(self.columns):
            if c.name == name:
                return i
        raise ResultError(f"table {self.title!r}: no column {name!r} "
                          f"(has {[c.name for c in self.columns]})")


@dataclass(frozen=True)
class Plot:
    """A chart of one table: ``bar`` (a group of bars per row, labelled by the ``x`` columns'
    cells, one bar per ``y`` column) or ``line`` (``x`` is one column whose cells are evenly
    spaced categories in row order; one line per ``y`` column, or per value of ``group`` and
    ``y`` column)."""

    title: str
    table: int
    kind: str
    x: tuple[str, ...]
    y: tuple[str, ...]
    ylabel: str
    group: str | None = None
    log_y: bool = False

    def __post_init__(self) -> None:
        where = f"plot {self.title!r}"
        _need(self.kind in PLOT_KINDS, where, f"kind is one of {PLOT_KINDS}, got {self.kind!r}")
        _need(bool(self.x) and bool(self.y), where, "x and y name at least one column each")
        _need(self.kind == "bar" or len(self.x) == 1, where, "a line plot has one x column")


@dataclass(frozen=True)
class Figure:
    """One headline number for the index's summary table."""

    label: str
    value: float
    unit: str = ""

    def __post_init__(self) -> None:
        _need(isinstance(self.value, int | float) and not isinstance(self.value, bool),
              f"figure {self.label!r}", f"a number, got {self.value!r}")
        _need(self.unit in UNITS, f"figure {self.label!r}.unit", f"one of {UNITS}")


@dataclass(frozen=True)
class Result:
    """One benchmark's result file (the module docstring shows its JSON)."""

    name: str
    title: str
    summary: str
    command: str
    machine: Machine
    date: str
    commit: str
    source: str
    tables: tuple[Table, ...]
    figures: tuple[Figure, ...] = ()
    plots: tuple[Plot, ...] = ()
    schema: int = field(default=SCHEMA)

    def __post_init__(self) -> None:
        _need(self.schema == SCHEMA, "schema", f"{SCHEMA}, got {self.schema!r}")
        _need(bool(re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.name)), "name",
              f"lower-case letters, digits, '_' and '-' (a file name), got {self.name!r}")
        for key in ("title", "summary", "command", "source"):
            _need(isinstance(getattr(self, key), str) and bool(getattr(self, key)), key,
                  "a non-empty string")
        _need(bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", self.date)), "date",
              f"YYYY-MM-DD, got {self.date!r}")
        _need(bool(re.fullmatch(r"[0-9a-f]{7,40}", self.commit)), "commit",
              f"a git commit hash (7 to 40 hex digits), got {self.commit!r}")
        _need(bool(self.tables), "tables", "at least one table")
        for plot in self.plots:
            _need(0 <= plot.table < len(self.tables), f"plot {plot.title!r}.table",
                  f"an index below {len(self.tables)}, got {plot.table}")
            table = self.tables[plot.table]
            for name in (*plot.x, *plot.y, *([plot.group] if plot.group else [])):
                table.column(name)


def machine_here() -> Machine:
    """This machine: core count, /proc/cpuinfo's model name, /proc/meminfo's MemTotal and
    ``platform.platform()`` (the CPU from ``platform.processor()`` where /proc is absent)."""
    cpu = ""
    memory = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / (1 << 20), 1)  # kB -> GiB
                break
    except OSError:  # not Linux: the fields below say what little is known
        pass
    return Machine(cores=os.cpu_count() or 1, cpu=cpu or platform.processor() or "unknown",
                   memory_gib=memory, os=platform.platform())


CORES_PER_RANK = Column("cores/rank", "", 2)
"""The column every table with a row per rank count carries: this machine's cores over N."""


def cores_per_rank(ranks: int, cores: int | None = None) -> float:
    """``cores`` (this machine's by default) over ``ranks``, to 2 decimals: the machine's shape
    as a rank sees it (0.5: two ranks take turns on each core)."""
    return round((cores or os.cpu_count() or 1) / ranks, 2)


def machine_line(ranks: Sequence[int] = ()) -> str:
    """The line a bench prints above its tables: this machine's cores, CPU model and memory,
    and the cores per rank at each of ``ranks`` (the rank counts the tables show).

    >>> machine_line([2, 4]).startswith("machine: ")
    True
    """
    m = machine_here()
    memory = f", {m.memory_gib:g} GiB" if m.memory_gib is not None else ""
    text = f"machine: {m.cores} cores, {m.cpu}{memory}"
    if ranks:
        text += "; cores per rank: " + ", ".join(
            f"{cores_per_rank(n, m.cores):g} at N={n}" for n in ranks)
    return text


def _commit_here() -> tuple[str, bool]:
    """HEAD's short hash and whether the work tree has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    try:
        return git("rev-parse", "--short=12", "HEAD"), bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError) as e:
        raise ResultError(f"commit: git could not name the commit of {REPO}: {e}") from e


def write_result(path: Path, *, name: str, title: str, summary: str, script: str,
                 argv: Sequence[str], tables: Sequence[Table], figures: Sequence[Figure] = (),
                 plots: Sequence[Plot] = ()) -> Result:
    """Write the result of a run of ``bench/SCRIPT ARGV`` measured here, now, to ``path``.

    The machine, today's date (UTC) and HEAD's commit are collected here; ``source`` says
    ``measured``, with a note where the work tree had uncommitted changes. Returns what was
    written. Raises :class:`ResultError` where a value breaks the schema (nothing is written).
    """
    commit, dirty = _commit_here()
    result = Result(
        name=name, title=title, summary=summary,
        command=shlex.join(["uv", "run", "python", f"bench/{script}", *argv]),
        machine=machine_here(), date=datetime.datetime.now(datetime.UTC).date().isoformat(),
        commit=commit,
        source="measured" + (" (uncommitted changes on top of the commit)" if dirty else ""),
        tables=tuple(tables), figures=tuple(figures), plots=tuple(plots))
    Path(path).write_text(result_json(result))
    return result


def result_json(result: Result) -> str:
    """The file's text: stable key order, one trailing newline (same result, same bytes)."""
    return json.dumps(asdict(result), indent=1, ensure_ascii=False) + "\n"


def load_result(path: Path) -> Result:
    """Read and validate a result file; raises :class:`ResultError` naming the file and field."""
    try:
        data = json.loads(Path(path).read_text())
        return _result_from(data)
    except KeyError as e:
        raise ResultError(f"{path}: missing key {e}") from e
    except (ResultError, TypeError, json.JSONDecodeError) as e:
        raise ResultError(f"{path}: {e}") from e


def _result_from(data: dict[str, Any]) -> Result:
    known = set(Result.__dataclass_fields__)
    _need(isinstance(data, dict), "file", "a JSON object")
    _need(set(data) <= known, "file", f"unknown keys {sorted(set(data) - known)}")
    return Result(
        **{k: data[k] for k in ("name", "title", "summary", "command", "date", "commit",
                                "source")},
        schema=data["schema"],
        machine=Machine(**data["machine"]),
        tables=tuple(Table(title=t["title"], notes=t.get("notes", ""),
                           columns=tuple(Column(**c) for c in t["columns"]),
                           rows=tuple(tuple(r) for r in t["rows"]))
                     for t in data["tables"]),
        figures=tuple(Figure(**f) for f in data.get("figures", ())),
        plots=tuple(Plot(**{**p, "x": tuple(p["x"]), "y": tuple(p["y"])})
                    for p in data.get("plots", ())))
