"""Launch without a file: ``clusterctl launch -n 3 train.py -- ARGS``,
``clusterctl launch cluster.yaml -- ARGS``, and ``clusterctl launch train.py`` without ``-n``.
The CLI runs as a real command; the runs start real task processes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cluster.ctl.oneline import spec_for_script
from cluster.errors import ClusterFileError
from tests.ctl._cli_run import env_with, run_cli

pytestmark = pytest.mark.timeout(180)

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _argv_lines(out: str) -> dict[str, list[str]]:
    """``{task: argv}`` from the ``ARGV task [...]`` lines of scripts/argv.py."""
    found = re.findall(r"\[([a-z]+:\d+)\]\s+ARGV \S+ (\[.*\])", out)
    return {task: json.loads(args) for task, args in found}


@pytest.mark.multiprocess
def test_n_runs_a_chief_and_workers_with_the_args_after_the_dashes(tmp_path, marker) -> None:
    shutil.copy(SCRIPTS / "argv.py", tmp_path / "train.py")
    proc = run_cli(["launch", "-n", "3", "train.py", "--color", "never", "--",
                    "--epochs", "3", "-n", "2"], cwd=tmp_path, env=env_with(marker))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _argv_lines(proc.stdout) == {task: ["--epochs", "3", "-n", "2"]
                                        for task in ("chief:0", "worker:0", "worker:1")}
    assert "run train succeeded" in proc.stdout
    runs = list((tmp_path / "runs").iterdir())  # ./runs, named after the script
    assert len(runs) == 1 and runs[0].name.startswith("train-"), runs
    assert (runs[0] / "worker-1.log").exists()


@pytest.mark.multiprocess
def test_args_after_the_dashes_are_appended_to_the_files_args(tmp_path, marker) -> None:
    shutil.copy(SCRIPTS / "argv.py", tmp_path / "train.py")
    (tmp_path / "cluster.yaml").write_text(
        'entrypoint: train.py\nargs: ["--lr", "0.1"]\ncluster: {worker: 2}\n')
    proc = run_cli(["launch", "cluster.yaml", "--color", "never", "--", "--epochs", "3"],
                   cwd=tmp_path, env=env_with(marker))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _argv_lines(proc.stdout) == {t: ["--lr", "0.1", "--epochs", "3"]
                                        for t in ("worker:0", "worker:1")}


@pytest.mark.parametrize(("args", "expected"), [
    (["launch", "train.py"], "train.py is a Python script, not a cluster file"),
    (["launch", "train.py"], "clusterctl launch -n 2 train.py -- ARGS"),
    (["launch", "--ps", "1", "train.py"], "--ps needs -n N"),
    (["launch", "-n", "0", "train.py"], "-n: 0 tasks: at least 1"),
    (["launch", "-n", "1", "--ps", "1", "train.py"], "needs a worker besides the chief"),
    (["launch", "-n", "2", "missing.py"], "SCRIPT: file not found"),
    (["launch", "-n", "2", "cluster.yaml"], "-n runs a script, but cluster.yaml is a cluster"),
    (["launch", "-n", "2000", "train.py"], "exceed limits.max_tasks = 1024"),
    (["launch", "-n", "2", "--tasks", "worker:7", "train.py"], "'worker:7' is no task"),
    (["validate", "cluster.yaml", "--", "--epochs", "3"], "takes no script arguments"),
])
def test_a_launch_that_cannot_run_exits_2_saying_what_to_do(tmp_path, args, expected) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "cluster.yaml").write_text("entrypoint: train.py\ncluster: {worker: 1}\n")
    proc = run_cli(args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "invalid YAML" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_the_one_line_cluster_is_validated_like_a_file(tmp_path) -> None:
    (tmp_path / "train.py").write_text("")
    spec = spec_for_script("train.py", 3, args=("--epochs", "3"), cwd=tmp_path)
    assert spec.tasks() == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert spec.mode == "collective"
    assert spec.task_argv("worker") == ("-m", "worker", str(tmp_path / "train.py"),
                                        "--epochs", "3")
    assert spec.log_dir == tmp_path / "runs" and spec.name == "train"
    ps = spec_for_script("train.py", 3, ps=2, cwd=tmp_path)  # as examples/ps
    assert ps.mode == "coordinator"
    assert ps.tasks() == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)]
    assert ps.task_argv("worker") == ("-m", "worker") and ps.task_argv("ps") == ("-m", "ps")
    assert spec_for_script("train.py", 1, cwd=tmp_path).tasks() == [("chief", 0)]
    with pytest.raises(ClusterFileError, match="exceed limits.max_tasks") as info:
        spec_for_script("train.py", 5000, cwd=tmp_path)
    assert all(p.line == 0 and p.file.startswith("clusterctl launch -n 5000")
               for p in info.value.problems)
