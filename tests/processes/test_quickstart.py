"""The README's first command: the quickstart trains a chief and two workers through
``clusterctl launch`` to >= 95% test accuracy, with the same parameters as one process. The
launch is the session's shared run of the README's command (``tests/_examples.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from tests._examples import timeout_for
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

QUICKSTART = REPO / "examples" / "quickstart"


def test_shipped_cluster_file_validates():
    proc = subprocess.run([sys.executable, "-m", "cluster.ctl.cli", "validate",
                           str(QUICKSTART / "cluster.yaml")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(timeout_for("quickstart-launch", extra=60))
def test_quickstart_matches_a_single_process_run(tmp_path, example_runs):
    # The README's run (shared with tests/docs), which also saves its final parameters.
    shipped = (QUICKSTART / "cluster.yaml").read_text()
    assert 'args: ["--epochs", "10"]' in shipped
    run = example_runs("quickstart-launch")
    text = run.text
    assert run.ok, text
    assert "3 replica(s) in sync" in text and "epoch 10/10" in text
    with np.load(run.run_dir / "params.npz") as distributed:
        accuracy = float(distributed["test_accuracy"])
        params = [distributed[f"arr_{i}"] for i in range(4)]
    assert accuracy >= 0.95, text

    spec = importlib.util.spec_from_file_location("quickstart_train", QUICKSTART / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    single = tmp_path / "single.npz"
    assert module.main(["--strategy", "default", "--epochs", "10", "--save", str(single)]) == 0
    with np.load(single) as reference:
        for i, got in enumerate(params):
            np.testing.assert_allclose(got, reference[f"arr_{i}"], rtol=0, atol=2e-6)
