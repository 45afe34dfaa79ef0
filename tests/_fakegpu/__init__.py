"""The fake GPU machine: processes that see CuPy and N GPUs on a machine without any.

It exists to check that the code paths a GPU machine takes work (device choice, staging,
NCCL set-up, the host paths carrying GPU values) in real processes, here, where there is no GPU.
It is test code and never ships: ``tests/_fakegpu`` is not part of any package.

``PYTHONPATH=tests/_fakegpu python -m worker ...`` imports the ``cupy`` and ``cupyx`` packages
of this folder, which load the strict fake of :mod:`tests._fakegpu.fakecuda` over host memory
(no implicit NumPy conversion, each version's NCCL id type, pinned host memory, streams and
events). The environment shapes the machine:

- ``CLUSTER_FAKE_GPUS``: GPUs installed (default 1); ``CUDA_VISIBLE_DEVICES`` selects among
  them as the CUDA driver does (``cupy.cuda.runtime.getDeviceCount()`` counts what it leaves);
- ``CLUSTER_FAKE_CUPY``: ``cupy.__version__``, "13" or "14" (default) for the modelled release.

NCCL works among the ranks of one process (``initAll``) and across processes: a unique id
names a root in the process that made it, which the other ranks join, as real NCCL's ids name
the root's bootstrap socket. So tasks that each take their own GPU (``CUDA_VISIBLE_DEVICES``
per task, or local rank r on GPU r) run NCCL among themselves, and tasks sharing a GPU take the
host paths, as on a real GPU host.

A whole test run can take the machine too: ``PYTHONPATH=tests/_fakegpu CLUSTER_FAKE_GPUS=2
uv run pytest -m gpu tests/...`` runs the tests marked ``gpu`` on it, and without ``-m gpu``
it shows which of the others a GPU host would fail (tests that install their own fake CuPy
replace the machine's for their duration).

In tests, :func:`fake_gpu_env` gives the environment, and the ``fake_gpu`` fixture (import it
into a ``conftest.py``) starts processes on the machine, reaped when the test ends::

    def test_a_task_on_a_gpu_host(fake_gpu):
        task = fake_gpu.python("-c", "import cupy; print(cupy.cuda.runtime.getDeviceCount())",
                               gpus=2)
        assert task.wait(30) == 0 and task.output.strip() == "2"
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cluster.testing import TaskProcess, TaskProcesses

__all__ = ["PATH", "FakeGpuMachine", "fake_gpu", "fake_gpu_env", "run_on_fake_gpu"]

PATH = Path(__file__).resolve().parent
"""The folder to put first on ``PYTHONPATH``: its ``cupy`` and ``cupyx`` are the fake's."""


def fake_gpu_env(gpus: int = 1, cupy: str = "14", *, visible: str | None = None,
                 base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on the fake GPU machine, from ``base`` (default: this
    process's): ``gpus`` installed GPUs, CuPy ``cupy`` ("13", "14" or a full version),
    ``CUDA_VISIBLE_DEVICES=visible`` when given (else unset, so every GPU is visible)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PATH), env.get("PYTHONPATH")) if p)
    env["CLUSTER_FAKE_GPUS"] = str(int(gpus))
    env["CLUSTER_FAKE_CUPY"] = str(cupy)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def run_on_fake_gpu(*args: str | os.PathLike, timeout: float, gpus: int = 1, cupy: str = "14",
                    visible: str | None = None, env: Mapping[str, str] | None = None,
                    cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS...`` on the fake GPU machine, to completion (killed and reaped after
    ``timeout`` s: ``subprocess.TimeoutExpired``). Output is captured as text."""
    full = {**fake_gpu_env(gpus, cupy, visible=visible), **(env or {})}
    return subprocess.run([sys.executable, *map(os.fspath, args)], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


class FakeGpuMachine:
    """Starts task processes on the fake GPU machine; the ``fake_gpu`` fixture's value."""

    def __init__(self, tasks: TaskProcesses) -> None:
        self._tasks = tasks

    def python(self, *args: str | os.PathLike, gpus: int = 1, cupy: str = "14",
               visible: str | None = None, env: Mapping[str, str] | None = None,
               **kwargs: Any) -> TaskProcess:
        """``python ARGS...`` as a :class:`~cluster.testing.TaskProcess` on the machine
        (``kwargs`` as ``TaskProcess`` takes them: ``tf_config``, ``name``, ``log``, ...)."""
        full = {**fake_gpu_env(gpus, cupy, visible=visible), **(env or {})}
        return self._tasks.python(*args, env=full, **kwargs)


@pytest.fixture
def fake_gpu(task_processes: TaskProcesses) -> Iterator[FakeGpuMachine]:
    """Processes on the fake GPU machine, reaped when the test ends (see the module docstring)."""
    yield FakeGpuMachine(task_processes)
