"""``clusterctl status [RUN_DIR]``: a table of a running or finished run's tasks.

Where the figures come from (nothing is asked of the tasks; the run directory is enough):

- the tasks: ``summary.json`` (written by clusterctl when the run ends: each task's exit code,
  whether clusterctl stopped it, its cause); while the run goes on, the tasks' log files;
- state: finished runs from the summary; running ones from the step records' header (the task's
  pid: alive or not) and the task's error file (it failed);
- last step, steps/s, samples/s, share of time in collectives: the tasks' step records
  (``RUN_DIR/steps/*.jsonl``, :mod:`cluster.timeline`), over the last :data:`WINDOW` steps;
- membership (elastic runs): each task clusterctl restarted alone, gave up on or lost, from
  ``RUN_DIR/membership.jsonl`` (:mod:`cluster.ctl._membership`), listed under the table.

``RUN_DIR`` defaults to the newest run under ``./runs`` (where ``clusterctl launch`` puts the
runs of a cluster file or script in the current directory), as ``git status`` shows the
repository it is run in; when ``./runs`` holds no run, to the newest run clusterctl launched
anywhere (:mod:`cluster.ctl._telemetry`). :func:`default_run_dir` decides.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from cluster import exitcodes
from cluster.ctl import _membership
from cluster.ctl._telemetry import latest_run_pointer, steps_path
from cluster.timeline import load_steps

__all__ = ["RunStatus", "TaskStatus", "WINDOW", "collect", "default_run_dir", "main", "render"]

WINDOW = 50
"""Steps/s and samples/s are measured over this many of a task's latest steps."""

_JOB_ORDER = ("chief", "worker", "ps", "evaluator")
_LOG = re.compile(r"^([a-z]+)-(\d+)\.log$")


@dataclass
class TaskStatus:
    """One task's row. ``state``: running, exited, failed, stopped, succeeded, unknown."""

    task: str
    state: str
    exit_code: int | None = None
    last_step: int | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    collective_share: float | None = None
    last_step_age: float | None = None


@dataclass
class RunStatus:
    """A run: its tasks, and the membership events of an elastic run (oldest first)."""

    run_dir: Path
    name: str
    state: str
    elapsed: float | None
    tasks: list[TaskStatus]
    membership: list[dict[str, Any]] = field(default_factory=list)


def _order(task: str) -> tuple[int, int]:
    job, _, index = task.partition(":")
    rank = _JOB_ORDER.index(job) if job in _JOB_ORDER else len(_JOB_ORDER)
    return rank, int(index) if index.isdigit() else 0


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process holds the pid: it exists
    return True


def _rates(task: TaskStatus, steps: list[dict[str, Any]], now: float) -> None:
    """Fill ``task``'s step figures from its step records."""
    if not steps:
        return
    window = steps[-WINDOW:]
    task.last_step = int(window[-1]["step"])
    task.last_step_age = max(0.0, now - (window[-1]["start"] + window[-1]["time"]))
    if len(window) >= 2:
        span = (window[-1]["start"] + window[-1]["time"]) - window[0]["start"]
        if span > 0:
            task.steps_per_s = len(window) / span
            samples = [s.get("samples") for s in window]
            if all(isinstance(n, int) for n in samples):
                task.samples_per_s = sum(samples) / span
    busy = sum(s["time"] for s in window)
    if busy > 0:
        task.collective_share = sum(s["collective_time"] for s in window) / busy


def collect(run_dir: Path, now: float | None = None) -> RunStatus:
    """The status of the run in ``run_dir`` (which must exist)."""
    now = time.time() if now is None else now
    summary_file = run_dir / "summary.json"
    summary: dict[str, Any] | None = None
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
    tasks: dict[str, TaskStatus] = {}
    if summary is not None:
        for t in summary.get("tasks", []):
            code = t.get("exit_code")
            state = ("stopped" if t.get("stopped") else "succeeded" if code == 0
                     else "failed" if code is not None else "unknown")
            tasks[t["task"]] = TaskStatus(t["task"], state, code)
    else:
        for path in run_dir.glob("*.log"):
            match = _LOG.match(path.name)
            if match:
                name = f"{match[1]}:{match[2]}"
                tasks[name] = TaskStatus(name, "starting")
    for task in tasks.values():
        path = steps_path(run_dir, task.task)
        header, steps = load_steps(path) if path.exists() else ({}, [])
        _rates(task, steps, now)
        if summary is None:
            failed = (run_dir / (task.task.replace(":", "-") + ".error.json")).exists()
            if failed:
                task.state = "failed"
            elif header:
                task.state = "running" if _alive(header.get("pid")) else "exited"
    ordered = sorted(tasks.values(), key=lambda t: _order(t.task))
    events = _membership.load(run_dir)
    if summary is not None:
        code = summary.get("exit_code")
        state = "succeeded" if code == 0 else f"failed (exit {code})"
        if summary.get("interrupted") is not None:
            state = "interrupted"
        return RunStatus(run_dir, summary.get("name", run_dir.name), state,
                         summary.get("elapsed"), ordered, events)
    return RunStatus(run_dir, run_dir.name, "running", None, ordered, events)


def _event_line(event: dict[str, Any]) -> str:
    """``13:23:31  worker:1 restarting: exit 137 (SIGKILL), killed by SIGKILL; 3 running``."""
    when = time.strftime("%H:%M:%S", time.localtime(float(event.get("time") or 0)))
    what = f"{event['task']} {event['event']}"
    if event["event"] == "started":
        what += f" (restart {event.get('restart')})"
    elif isinstance(event.get("code"), int):
        what += f": exit {exitcodes.describe(event['code'])}"
        if event.get("cause"):
            what += f", {event['cause']}"
    return f"{when}  {what}; {event.get('running')} running"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(status: RunStatus) -> str:
    """The table, plain text (one line per task)."""
    took = f" after {status.elapsed:.1f} s" if status.elapsed is not None else ""
    lines = [f"run {status.name}: {status.state}{took}", f"  {status.run_dir}"]
    header = ("TASK", "STATE", "EXIT", "STEP", "STEPS/S", "SAMPLES/S", "COLLECTIVES", "LAST STEP")
    rows = [header]
    for t in status.tasks:
        rows.append((
            t.task, t.state, "-" if t.exit_code is None
            else str(t.exit_code) if t.exit_code == 0 else exitcodes.describe(t.exit_code),
            "-" if t.last_step is None else str(t.last_step), _fmt(t.steps_per_s, 2),
            _fmt(t.samples_per_s, 0),
            "-" if t.collective_share is None else f"{100 * t.collective_share:.0f}%",
            "-" if t.last_step_age is None else f"{t.last_step_age:.0f} s ago",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                     .rstrip())
    if not status.tasks:
        lines.append("  (no task has started yet)")
    if status.membership:
        bounds = status.membership[-1].get("elastic")
        lines.append(f"membership (elastic {bounds}):" if bounds else "membership:")
        lines += [f"  {_event_line(e)}" for e in status.membership]
    return "\n".join(lines) + "\n"


def _is_run(path: Path) -> bool:
    """Whether ``path`` is a run directory: clusterctl wrote a task's log or the summary."""
    try:
        return path.is_dir() and ((path / "summary.json").exists()
                                  or any(_LOG.match(p.name) for p in path.iterdir()))
    except OSError:
        return False


def _changed(path: Path) -> float:
    """When ``path`` last changed (an entry written), 0 when it is gone meanwhile."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _pointed_run(pointer: Path) -> Path | None:
    try:
        return Path(pointer.read_text().strip())
    except OSError:
        return None


def default_run_dir(cwd: Path, pointer: Path) -> Path | None:
    """The run ``clusterctl status`` shows without ``RUN_DIR``: the newest run under
    ``cwd/runs``, else the one ``pointer`` (the newest run launched on this machine) names;
    None when there is neither.

    Under ``cwd/runs`` the pointer's run wins when it is there (it is the newest launched);
    otherwise the run directory that changed last (a task log or the summary was written).
    """
    pointed = _pointed_run(pointer)
    local = cwd / "runs"
    try:
        runs = [p for p in local.iterdir() if _is_run(p)]
    except OSError:  # no ./runs (or unreadable): the machine's newest run
        runs = []
    if runs:
        if pointed is not None and pointed.resolve().parent == local.resolve() \
                and _is_run(pointed):
            return pointed
        return max(runs, key=lambda p: (_changed(p), p.name))
    return pointed


def main(run_dir: str | None, out: TextIO, err: TextIO, *, cwd: Path | None = None) -> int:
    """``clusterctl status``: 0 with the table on ``out``; 2 with a message on ``err`` when
    there is no such run directory (or no run to default to: :func:`default_run_dir` from
    ``cwd``, the current directory by default)."""
    if run_dir is None:
        pointer = latest_run_pointer()
        found = default_run_dir(Path.cwd() if cwd is None else cwd, pointer)
        if found is None:
            err.write("clusterctl status: no run to show: ./runs holds none and clusterctl has "
                      f"not launched one on this machine ({pointer} is missing); pass RUN_DIR\n")
            return 2
        run_dir = str(found)
    path = Path(run_dir)
    if not path.is_dir():
        err.write(f"clusterctl status: {path}: no such run directory (clusterctl launch prints "
                  "it: `logs in DIR`)\n")
        return 2
    try:
        out.write(render(collect(path)))
    except (OSError, ValueError, KeyError) as e:
        err.write(f"clusterctl status: {path}: cannot read the run's records: {e}\n")
        return 2
    return 0
