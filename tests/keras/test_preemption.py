"""A preempted worker (SIGTERM mid-epoch) under ``cluster.keras.BackupAndRestore``: every task
saves at the same step and exits 204, ``clusterctl`` restarts the cluster, ``fit`` resumes at
that step, and the final weights equal an uninterrupted run's."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests._requires import require

require("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")  # keras picks its backend at import
require("keras")

from tests.keras._launch import launch_with_reference  # noqa: E402
from tests.keras.test_fit import load  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

VARIANT = "adam-arrays-shuffle"  # Adam's moments and the shuffle's random state must resume


def test_sigterm_to_a_worker_mid_epoch_resumes_at_the_same_step(tmp_path: Path) -> None:
    console, attempts = launch_with_reference(
        tmp_path, [VARIANT], ["--backup", str(tmp_path / "backup"), "--preempt-at", "1:3"],
        restart="{max_restarts: 1, policy: exit-code}")
    assert attempts == 2, console[-4000:]
    assert "[worker:1]   preempting myself at epoch 1, step 3" in console
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}]    BackupAndRestore: resuming at epoch 2, step 3" in console \
            or f"[{task}]   BackupAndRestore: resuming at epoch 2, step 3" in console, task
    reference, plain_logs = load(tmp_path / "plain" / VARIANT / "alone-0.npz")
    chief, logs = load(tmp_path / "tasks" / VARIANT / "chief-0.npz")
    for name in reference:
        np.testing.assert_allclose(chief[name], reference[name], rtol=0, atol=1e-5)
    for task in ("worker-0", "worker-1"):
        weights, _ = load(tmp_path / "tasks" / VARIANT / f"{task}.npz")
        assert all(weights[n].tobytes() == chief[n].tobytes() for n in chief), task
    # The resumed epoch's history counts the steps before the preemption too.
    np.testing.assert_allclose(logs["history"]["loss"], plain_logs["history"]["loss"][1:],
                               rtol=0, atol=1e-4)
    assert not (tmp_path / "backup" / VARIANT).exists()  # removed by the chief when fit ended
