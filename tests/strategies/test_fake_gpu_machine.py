"""On a machine whose CuPy sees GPUs (the fake GPU machine, ``tests/_fakegpu``: strict like real
CuPy, no implicit NumPy conversion), the README's quickstart passes and gets NumPy, and
``CLUSTER_DEVICES=gpu`` puts each task's replica on its local rank's GPU."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests._fakegpu import run_on_fake_gpu

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
FAKE_GPU = REPO / "tests" / "_fakegpu"
DEVICE_LOG = Path(__file__).resolve().parent / "_device_log"  # shows each task's device choice
CLUSTERCTL = ("-c", "import sys; from cluster.ctl.cli import main; sys.exit(main())")


def test_the_readme_quickstart_passes_on_a_gpu_machine_and_computes_in_numpy(tmp_path) -> None:
    """``clusterctl launch examples/quickstart/cluster.yaml`` as the README runs it (one epoch
    here, and the final parameters saved): exit 0, every task on the CPU though CuPy sees a
    GPU, NumPy parameters."""
    params = tmp_path / "params.npz"
    done = run_on_fake_gpu(*CLUSTERCTL, "launch", "examples/quickstart/cluster.yaml",
                           "--run-dir", str(tmp_path / "run"), "--color", "never", "--",
                           "--epochs", "1", "--save", str(params), gpus=1, cwd=REPO,
                           env={"PYTHONPATH": f"{FAKE_GPU}:{DEVICE_LOG}"}, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test accuracy" in done.stdout
    assert done.stdout.count("takes /cpu:0: CLUSTER_DEVICES=cpu (the default) though CuPy "
                             "sees 1 GPU(s)") == 3, done.stdout[-3000:]
    with np.load(params) as saved:
        assert float(saved["test_accuracy"]) > 0.5
        assert all(saved[k].dtype == np.float32 for k in saved.files if k.startswith("arr_"))


SCRIPT = textwrap.dedent("""
    import logging
    import numpy as np
    import cupy
    import cluster
    from tests.strategies import _elementwise

    _elementwise.install(cupy)  # the fake CuPy has no kernels: the stand-in runs SGD's
    # The task logs warnings; the device choice is an INFO line of its own logger.
    logging.getLogger("cluster.strategies._devices").setLevel(logging.INFO)
    strategy = cluster.MultiWorkerMirroredStrategy()
    rank = strategy.extended.worker_index
    with strategy.scope():
        v = cluster.Variable(np.ones(4, np.float32))
    x = cupy.asarray(np.full(4, rank + 1.0, np.float32))
    total = strategy.run(lambda: cluster.get_replica_context().all_reduce("SUM", x))
    opt = cluster.optimizers.SGD(0.5)
    strategy.run(lambda: opt.apply_gradients([(x, v)]))
    print("RESULT", rank, isinstance(v.value(), cupy.ndarray), v.value().device.id,
          isinstance(total, cupy.ndarray), cupy.asnumpy(total).tolist(),
          cupy.asnumpy(v.value()).tolist(), _elementwise.calls, flush=True)
""")


@pytest.mark.parametrize("collective_path", ["auto", "network"])
def test_the_gpu_switch_puts_each_task_on_a_gpu_and_cupy_comes_back(tmp_path,
                                                                    collective_path) -> None:
    """Two tasks sharing one GPU (the host path carries the CuPy values; the fake's NCCL cannot
    span processes), ``CLUSTER_DEVICES=gpu``: variables live on GPU 0, CuPy values come back,
    exact, SGD's update runs as the one GPU kernel, and each task logs why it shares the GPU."""
    script = tmp_path / "gpu_task.py"
    script.write_text(SCRIPT)
    env = {"CLUSTER_DEVICES": "gpu", "CLUSTER_COLLECTIVE_PATH": collective_path,
           "PYTHONPATH": f"{FAKE_GPU}:{REPO}"}
    done = run_on_fake_gpu(*CLUSTERCTL, "launch", "-n", "2", str(script), "--run-dir",
                           str(tmp_path / "run"), "--color", "never", gpus=1, env=env,
                           cwd=REPO, timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = sorted(line.split("RESULT ", 1)[1] for line in done.stdout.splitlines()
                     if "RESULT " in line)
    assert results == [
        f"{rank} True 0 True [3.0, 3.0, 3.0, 3.0] [-0.5, -0.5, -0.5, -0.5] "
        "['cluster_sum1_add_scaled']" for rank in (0, 1)]
    assert done.stdout.count("2 tasks on this host share 1 GPU(s)") == 2


def test_the_gpu_switch_without_a_gpu_stops_the_task_naming_the_switch(tmp_path) -> None:
    script = tmp_path / "task.py"
    script.write_text("import cluster\ncluster.MultiWorkerMirroredStrategy()\n")
    done = run_on_fake_gpu(str(script), gpus=1, visible="", env={"CLUSTER_DEVICES": "gpu"},
                           timeout=60)
    assert done.returncode != 0
    assert "CLUSTER_DEVICES=gpu but CuPy sees no GPU" in done.stderr
    assert sys.executable  # the same interpreter ran it
