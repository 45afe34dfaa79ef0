"""examples/ps: the quickstart's MLP trained with parameter servers (1 chief, 2 workers, 2 ps)
through ``clusterctl launch``, asynchronously and with ``--sync``, to >= 95% test accuracy: the
documented runs, shared with tests/docs (``tests/_examples.py``).

Measured on 2 cores (20 epochs, about 4.2 s per launch): asynchronous 0.9611-0.9806 over 49
launches (median 0.972; the order in which gradients arrive varies), synchronous 0.9667-0.9694
(before contributors were pinned to their workers, a worker could run both functions of a round
and take the next batch of its own shard; runs now repeat bit for bit).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests._examples import timeout_for
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]

EXAMPLE = REPO / "examples" / "ps"


def clusterctl(*args: str, marker: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLUSTER_TEST_MARKER": marker}  # inherited by every task
    return subprocess.run([sys.executable, "-m", "cluster.ctl.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_shipped_cluster_file_validates():
    proc = clusterctl("validate", str(EXAMPLE / "cluster.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(max(timeout_for("ps-async-launch"), timeout_for("ps-sync-launch")))
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_ps_example_trains_to_the_quickstart_accuracy(example_runs, sync: bool):
    # The documented runs (shared with tests/docs): the shipped file, and with --sync.
    assert 'args: ["--epochs", "20"]' in (EXAMPLE / "cluster.yaml").read_text()
    run = example_runs("ps-sync-launch" if sync else "ps-async-launch")
    out = run.text
    assert run.ok, out

    mode = "synchronous" if sync else "asynchronous"
    assert f"ParameterServerStrategy ({mode}): 2 workers, 2 parameter servers" in out, out
    assert ("variables: dense1/kernel on ps:0+ps:1, dense1/bias on ps:0, "
            "dense2/kernel on ps:1, dense2/bias on ps:0") in out, out
    assert "[chief:0]    epoch 20/20" in out, out
    found = re.search(r"\[chief:0\] +test accuracy (\d\.\d+) on 360 held-out digits", out)
    assert found, out
    assert float(found.group(1)) >= 0.95, out

    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["attempts"] == 1
    tasks = {t["task"]: t for t in summary["tasks"]}
    assert sorted(tasks) == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    assert all(t["restarts"] == 0 for t in tasks.values()), summary


def test_the_chief_program_alone_says_how_to_run_it():
    proc = subprocess.run([sys.executable, str(EXAMPLE / "train.py")], cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "clusterctl launch examples/ps/cluster.yaml" in proc.stderr
