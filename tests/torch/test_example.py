"""examples/torch under ``clusterctl launch`` (1 chief + 2 workers) computes what one plain torch
process computes on the same global batches (float32, to 1e-6), and its three replicas end
bitwise identical."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import processes_with
from tests._requires import require
from tests.conftest import REPO

torch = require("torch")

EXAMPLE = REPO / "examples" / "torch"
STEPS = 12
sys.path.insert(0, str(EXAMPLE))
from model import global_batches, load_digits, make_model  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]


def single_process(steps: int, lr: float = 0.05, momentum: float = 0.9) -> dict[str, np.ndarray]:
    """The same training in plain torch: one process, the global batch's mean loss."""
    import torch.nn.functional as F

    torch.set_num_threads(1)
    x_train, y_train, _, _ = load_digits()
    model = make_model("small", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for rows in global_batches(len(x_train), 64, 0, 1)[:steps]:
        F.cross_entropy(model(x_train[rows]), y_train[rows]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def test_three_tasks_match_one_process(tmp_path: Path, marker: str) -> None:
    out_dir = tmp_path / "params"
    spec = tmp_path / "torch.yaml"
    # 64 rows over 3 tasks: 22/21/21, an uneven split the loss scaling must get right.
    spec.write_text(
        "name: torch-test\n"
        f"entrypoint: {EXAMPLE / 'train.py'}\n"
        f"args: ['--steps', '{STEPS}', '--save-dir', '{out_dir}', '--bucket-cap-mb', '0.01']\n"
        "cluster: {chief: 1, worker: 2}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        "restart: {max_restarts: 0}\n"
        "timeouts: {startup: 180, grace: 30, run: 300, heartbeat: 15}\n")
    text = io.StringIO()
    result = launcher.launch(parse_cluster_file(spec.read_text(), spec), out=text,
                             color="never")
    assert not processes_with(marker), "processes left behind"
    assert result.exit_code == 0, text.getvalue()

    replicas = []
    for rank in range(3):
        with np.load(out_dir / f"params-{rank}.npz") as saved:
            replicas.append({k: saved[k] for k in saved.files if k != "test_accuracy"})
    want = single_process(STEPS)
    assert sorted(replicas[0]) == sorted(want)
    for name, value in want.items():
        for other in replicas[1:]:
            assert np.array_equal(replicas[0][name], other[name]), name  # bitwise identical
        np.testing.assert_allclose(replicas[0][name], value, rtol=0, atol=1e-6, err_msg=name)
        assert not np.array_equal(value, make_model("small", 0).state_dict()[name].numpy())
