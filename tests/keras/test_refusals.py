"""What ``cluster.keras`` refuses, each with a ``ValueError`` that names what works instead."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests._requires import require
from tests.conftest import REPO

require("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")  # keras picks its backend at import
keras = require("keras")

import cluster  # noqa: E402
import cluster.keras  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _compile(optimizer=None, **kwargs) -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1), loss="mse", **kwargs)
    return model


def test_several_replicas_in_one_process_are_refused() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope(), pytest.raises(ValueError, match="one replica per process.*"
                                                           "MultiWorkerMirroredStrategy"):
        _compile()


def test_jit_compile_is_refused() -> None:
    with cluster.OneDeviceStrategy("/cpu:0").scope(), \
            pytest.raises(ValueError, match="jit_compile=False"):
        _compile(jit_compile=True)


def test_keras_backup_and_restore_is_refused() -> None:
    with cluster.OneDeviceStrategy("/cpu:0").scope():
        model = _compile()
    with pytest.raises(ValueError, match="cluster.keras.BackupAndRestore"):
        model.fit(np.zeros((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore("unused")])


def test_outside_a_scope_compile_is_keras_own() -> None:
    model = _compile()
    assert cluster.keras.replication_of(model) is None
    assert "train_step" not in vars(model)


def test_a_single_replica_strategy_trains_as_keras_does() -> None:
    x = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)
    y = x[:, :2] * 2.0
    keras.utils.set_random_seed(0)
    plain = _compile(keras.optimizers.Adam(0.01))
    plain.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    keras.utils.set_random_seed(0)
    with cluster.OneDeviceStrategy("/cpu:0").scope():
        ours = _compile(keras.optimizers.Adam(0.01))
    assert cluster.keras.replication_of(ours) is not None
    ours.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    for a, b in zip(plain.get_weights(), ours.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(300)
def test_the_jax_backend_is_refused() -> None:
    program = ("import cluster, cluster.keras, keras\n"
               "with cluster.OneDeviceStrategy('/cpu:0').scope():\n"
               "    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
               "    try:\n"
               "        m.compile(optimizer='sgd', loss='mse')\n"
               "    except ValueError as e:\n"
               "        print('refused:', e)\n")
    require("jax")
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: cluster.keras trains Keras models on the torch backend" in done.stdout
    assert "KERAS_BACKEND=torch" in done.stdout


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_parameter_server_strategy_is_refused(marker: str) -> None:
    from tests.ctl._cli_run import env_with, run_cli

    env = env_with(marker, KERAS_BACKEND="torch", CLUSTER_HEARTBEAT_TIMEOUT="15")
    env.pop("TF_CONFIG", None)
    done = run_cli(["launch", "-n", "2", "--ps", "1", str(REPO / "tests" / "keras" /
                                                          "_ps_task.py")],
                   cwd=REPO, env=env, timeout=360)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "refused: model.fit under ParameterServerStrategy is not supported" in done.stdout
    assert "use MultiWorkerMirroredStrategy" in done.stdout
