"""Helpers of the resume and chaos tests: write a cluster file, launch it through clusterctl's
launcher, read one task's console lines, find a task's pid."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import processes_with

__all__ = ["launch", "lines_of", "step_counts", "task_pid", "write_cluster_file"]


def write_cluster_file(tmp_path: Path, marker: str, entrypoint: Path, args: list[str], *,
                       jobs: str, extra: str = "", run: int = 200) -> Path:
    """``tmp_path/cluster.yaml`` running ``entrypoint args`` on ``jobs``, marked with
    ``marker`` (the leak check), logs under ``tmp_path/runs``; ``extra`` is appended."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: resume-test\n"
        f"entrypoint: {entrypoint}\n"
        f"args: {[str(a) for a in args]!r}\n"
        f"cluster: {jobs}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        f"timeouts: {{startup: 60, grace: 20, run: {run}}}\n" + extra)
    return path


def launch(path: Path, out: TextIO | None = None) -> tuple[launcher.LaunchResult, str]:
    """``clusterctl launch path``; returns the result and the console output."""
    console = out if out is not None else io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=console,
                             color="never")
    return result, console.getvalue()


def lines_of(out: str, task: str) -> list[str]:
    """The console lines of ``task`` (``worker:1``), without the prefix."""
    prefix = f"[{task}]"
    return [line[len(prefix):].strip() for line in out.splitlines() if line.startswith(prefix)]


def step_counts(lines: list[str]) -> dict[int, int]:
    """How many times each ``step <k>`` line was printed."""
    counts: dict[int, int] = {}
    for line in lines:
        if line.startswith("step ") and line[5:].isdigit():
            counts[int(line[5:])] = counts.get(int(line[5:]), 0) + 1
    return counts


def task_pid(marker: str, job: str, index: int) -> int | None:
    """The pid of this test's live task ``job:index`` (found by its TF_CONFIG), or ``None``."""
    found = processes_with(marker, f'"task":{{"type":"{job}","index":{index}}}')
    # The task's own process, not a child that inherited its environment.
    roots = [pid for pid in found if _parent(pid) not in found]
    return roots[0] if roots else None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
