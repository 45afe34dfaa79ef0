"""``examples/keras``: the digits classifier trained with ``model.fit`` as the docs say: with
its cluster file (a chief and two workers) and alone; the two runs end with the same model."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cluster.testing import processes_with
from tests._requires import require
from tests.conftest import REPO
from tests.ctl._cli_run import env_with, run_cli

require("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")  # keras picks its backend at import
keras = require("keras")

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

EXAMPLE = REPO / "examples" / "keras"
ARGS = ("--epochs", "3")


def test_launched_and_alone_train_the_same_model(tmp_path: Path) -> None:
    marker = f"cluster-test-{uuid.uuid4().hex}"
    env = env_with(marker, KERAS_BACKEND="torch")
    env.pop("TF_CONFIG", None)
    alone = subprocess.Popen([sys.executable, str(EXAMPLE / "train.py"), *ARGS,
                              "--save", str(tmp_path / "alone.keras")], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        launch = run_cli(["launch", "--run-dir", str(tmp_path / "run"),
                          str(EXAMPLE / "cluster.yaml"), "--", *ARGS,
                          "--save", str(tmp_path / "launched.keras"),
                          "--log-csv", str(tmp_path / "log.csv")],
                         cwd=REPO, env=env, timeout=800)
        alone_output, _ = alone.communicate(timeout=300)
    finally:
        alone.kill()
        alone.wait()
        leaked = processes_with(marker)
    assert not leaked, f"processes left behind: {leaked}"
    assert launch.returncode == 0, launch.stdout[-4000:] + launch.stderr[-4000:]
    assert alone.returncode == 0, alone_output[-4000:]
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}]" in launch.stdout and "test accuracy" in launch.stdout
    accuracy = [line.split("test accuracy ")[1].split(",")[0]
                for line in launch.stdout.splitlines() if "test accuracy" in line]
    assert len(accuracy) == 3 and len(set(accuracy)) == 1, accuracy  # global, on every task
    assert float(accuracy[0]) > 0.8, accuracy
    launched = keras.saving.load_model(tmp_path / "launched.keras")
    reference = keras.saving.load_model(tmp_path / "alone.keras")
    for a, b in zip(launched.get_weights(), reference.get_weights(), strict=True):
        assert abs(a - b).max() <= 1e-5
    assert len((tmp_path / "log.csv").read_text().splitlines()) == 1 + 3  # the chief's only
    assert sorted(os.listdir(tmp_path)) == ["alone.keras", "launched.keras", "log.csv", "run"]
