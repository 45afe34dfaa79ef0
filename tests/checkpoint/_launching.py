"""Helpers of the resume and chaos tests: write a cluster file, launch it through clusterctl's
launcher, read one task's console lines, find a task's pid."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file

__all__ = ["launch", "step_counts", "write_cluster_file"]


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



def step_counts(lines: list[str]) -> dict[int, int]:
    """How many times each ``step <k>`` line was printed."""
    counts: dict[int, int] = {}
    for line in lines:
        if line.startswith("step ") and line[5:].isdigit():
            counts[int(line[5:])] = counts.get(int(line[5:]), 0) + 1
    return counts
