"""``model.fit`` under ``MultiWorkerMirroredStrategy`` on 3 tasks (``clusterctl launch -n 3``)
against plain Keras in one process on the same global batches: the contract's program.

One launch runs every variant (SGD with momentum and Adam; NumPy arrays, a ``PyDataset``, a torch
``DataLoader``; shuffled or not; 250 rows in batches of 32, so the last batch is uneven) while the
reference runs beside it; the tests then compare what each task wrote.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests._requires import require

require("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")  # keras picks its backend at import
require("keras")

from tests.keras._launch import launch_with_reference  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

TASKS = ("chief-0", "worker-0", "worker-1")
# Compared with one process. A PyDataset's shuffle draws from Python's global `random`, which
# the runtime's own threads also draw from: shuffled, it is identical on every task but not
# one process's order, so it is only in ALL.
EXACT = ("sgd-arrays", "adam-arrays-shuffle", "sgd-pydataset", "adam-dataloader-shuffle")
ALL = (*EXACT, "sgd-pydataset-shuffle")


def load(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """A task's weights and logs (``history``, ``evaluate``) as ``_fit_task.py`` wrote them."""
    with np.load(path) as data:
        weights = {k: data[k] for k in data.files if k != "logs"}
        logs = json.loads(data["logs"].tobytes())
    return weights, logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("keras-fit")
    launch_with_reference(out, list(ALL), ["--files", str(out / "files")])
    return out


@pytest.mark.parametrize("variant", EXACT)
def test_weights_equal_one_process(runs: Path, variant: str) -> None:
    reference, _ = load(runs / "plain" / variant / "alone-0.npz")
    weights, _ = load(runs / "tasks" / variant / "chief-0.npz")
    assert reference.keys() == weights.keys()
    for name in reference:
        np.testing.assert_allclose(weights[name], reference[name], rtol=0, atol=1e-5,
                                   err_msg=f"{variant}: {name}")


@pytest.mark.parametrize("variant", ALL)
def test_weights_bitwise_identical_on_every_task(runs: Path, variant: str) -> None:
    chief, _ = load(runs / "tasks" / variant / "chief-0.npz")
    for task in TASKS[1:]:
        weights, _ = load(runs / "tasks" / variant / f"{task}.npz")
        for name in chief:
            assert weights[name].tobytes() == chief[name].tobytes(), f"{variant} {task} {name}"


@pytest.mark.parametrize("variant", ALL)
def test_history_and_evaluate_identical_on_every_task(runs: Path, variant: str) -> None:
    _, chief = load(runs / "tasks" / variant / "chief-0.npz")
    assert set(chief["history"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for task in TASKS[1:]:
        _, logs = load(runs / "tasks" / variant / f"{task}.npz")
        assert logs == chief, f"{variant}: {task} reports other numbers than the chief"


@pytest.mark.parametrize("variant", EXACT)
def test_history_and_evaluate_equal_one_process(runs: Path, variant: str) -> None:
    _, reference = load(runs / "plain" / variant / "alone-0.npz")
    _, chief = load(runs / "tasks" / variant / "chief-0.npz")
    for key, values in reference["history"].items():
        np.testing.assert_allclose(chief["history"][key], values, rtol=0, atol=1e-4,
                                   err_msg=f"{variant}: history[{key!r}]")
    for key, value in reference["evaluate"].items():
        assert chief["evaluate"][key] == pytest.approx(value, abs=1e-4), f"{variant}: {key}"


def test_only_the_chief_writes_files(runs: Path) -> None:
    variant = ALL[0]
    shared = runs / "files" / variant
    assert sorted(os.listdir(shared)) == ["ckpt-1.weights.h5", "ckpt-2.weights.h5",
                                          "ckpt-3.weights.h5", "log.csv", "model.keras"]
    private_folders = set()
    for task in TASKS:
        record = json.loads((runs / "tasks" / variant / f"{task}-files.json").read_text())
        assert record["after"] == str(shared / "ckpt-{epoch}.weights.h5")  # put back after fit
        for epoch, seen in enumerate(record["seen"]):
            folder = seen["folder"]
            expected = [f"ckpt-{e + 1}.weights.h5" for e in range(epoch + 1)]
            if task == "chief-0":
                assert folder == str(shared)
            else:  # its own temporary folder, never the shared one nor another task's
                assert Path(folder).parent == Path(tempfile.gettempdir())
                assert Path(folder).name.startswith(f"cluster-keras-{task}-")
                private_folders.add(folder)
                expected.append("log.csv")
                assert sorted(seen["files"]) == sorted(expected), (task, seen)
    assert len(private_folders) == 2
    assert not any(os.path.exists(folder) for folder in private_folders)  # removed after fit
    lines = (shared / "log.csv").read_text().splitlines()
    assert lines[0].split(",")[0] == "epoch" and len(lines) == 4  # one writer: no interleaving
