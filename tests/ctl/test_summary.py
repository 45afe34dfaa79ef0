"""``summary.json``, written by ``clusterctl launch`` for every run, with real task processes:
a task that succeeded has no cause (its last line is kept as ``last_line``); a task that failed
has its cause."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

SCRIPT = """\
import json, os, sys
task = json.loads(os.environ["TF_CONFIG"])["task"]
print(f"{task['type']}:{task['index']} final loss 0.25", flush=True)
print("", flush=True)  # a blank line is no last line
sys.exit(int(sys.argv[1]))
"""


def _launch(tmp_path: Path, marker: str, code: int) -> dict:
    (tmp_path / "train.py").write_text(SCRIPT)
    path = tmp_path / "cluster.yaml"
    path.write_text(f"name: summary\nentrypoint: train.py\nargs: ['{code}']\n"
                    f"cluster: {{worker: 2}}\nenv: {{CLUSTER_TEST_MARKER: {marker}}}\n"
                    f"log_dir: {tmp_path / 'runs'}\ntimeouts: {{startup: 60, grace: 5}}\n")
    out = io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    assert result.exit_code == (0 if code == 0 else 1), out.getvalue()
    return json.loads((result.run_dir / "summary.json").read_text())


def test_a_task_that_succeeded_has_no_cause_and_keeps_its_last_line(tmp_path, marker) -> None:
    summary = _launch(tmp_path, marker, 0)
    tasks = {t["task"]: t for t in summary["tasks"]}
    assert sorted(tasks) == ["worker:0", "worker:1"]
    for name, task in tasks.items():
        assert task["exit_code"] == 0
        assert task["cause"] == ""
        assert task["last_line"] == f"{name} final loss 0.25"
    assert summary["root_cause"] == ""


def test_a_task_that_failed_names_its_cause(tmp_path, marker) -> None:
    summary = _launch(tmp_path, marker, 3)
    tasks = {t["task"]: t for t in summary["tasks"]}
    assert all(t["exit_code"] != 0 and t["cause"] for t in tasks.values()), summary
    culprit = summary["root_cause"].split(" ", 1)[0]
    assert tasks[culprit]["cause"].endswith("train.py exited with code 3"), summary
    # Its own last line (never the blank one after it): its script's, or, since both workers
    # fail at once, possibly its runtime's line about the other's failure, which may come after.
    last = tasks[culprit]["last_line"]
    assert last == f"{culprit} final loss 0.25" or last.startswith(
        f"ERROR cluster.task_runtime: {culprit}: worker:"), summary
