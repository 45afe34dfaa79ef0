"""A program that imported Keras needs no ``import cluster.keras``: entering a strategy's scope
wires it in (the package root's scope hook), and a program without Keras never loads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests._requires import require
from tests.conftest import REPO

require("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")  # keras picks its backend at import
require("keras")

pytestmark = pytest.mark.timeout(120)


def _run(program: str) -> str:
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, env=env, timeout=100,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_model_compiled_in_the_scope_is_distributed_without_importing_cluster_keras() -> None:
    out = _run(
        "import sys, keras, cluster\n"
        "assert 'cluster.keras' not in sys.modules\n"
        "strategy = cluster.MirroredStrategy(['/cpu:0'])\n"
        "with strategy.scope():\n"
        "    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
        "    model.compile(optimizer=keras.optimizers.SGD(0.1), loss='mse')\n"
        "outside = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
        "outside.compile(optimizer=keras.optimizers.SGD(0.1), loss='mse')\n"
        "import cluster.keras\n"
        "print(cluster.keras.replication_of(model) is not None,\n"
        "      cluster.keras.replication_of(outside) is None)\n"
    )
    assert out.split() == ["True", "True"]


def test_a_program_without_keras_never_loads_it() -> None:
    out = _run(
        "import sys, cluster\n"
        "with cluster.MirroredStrategy(['/cpu:0']).scope():\n"
        "    cluster.Variable(1.0)\n"
        "print('keras' in sys.modules, 'cluster.keras' in sys.modules)\n"
    )
    assert out.split() == ["False", "False"]
