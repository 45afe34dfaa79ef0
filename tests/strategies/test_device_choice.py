"""Which device a task takes when the user names none: ``choose_task_device`` (pure, table
tested), the local rank from the tasks' addresses, and the strategies' defaults on a machine
whose CuPy sees GPUs (the fake CuPy)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import cluster
from cluster import settings as task_settings
from cluster.errors import TaskConfigError
from cluster.settings import TaskSettings
from cluster.strategies import _devices
from cluster.strategies._devices import choose_task_device, local_rank_of
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.transport.inproc import InProcessHub
from tests.collectives._fake_cupy import FakeCuda

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("mode", "local_rank", "local_size", "gpus", "visible", "device", "says"), [
        ("cpu", 0, 1, 0, None, "/cpu:0", "no GPU visible"),
        ("cpu", 1, 2, 1, None, "/cpu:0", "CLUSTER_DEVICES=cpu (the default) though CuPy sees 1"),
        ("cpu", 3, 8, 8, None, "/cpu:0", "NumPy values stay NumPy"),
        ("gpu", 0, 2, 1, None, "/gpu:0", "2 tasks on this host share 1 GPU(s)"),
        ("gpu", 1, 2, 1, None, "/gpu:0", "local rank 1 takes GPU 0 (rank % GPUs)"),
        ("gpu", 0, 8, 8, None, "/gpu:0", "local rank 0 of 8 takes GPU 0, one task per GPU"),
        ("gpu", 7, 8, 8, None, "/gpu:7", "local rank 7 of 8 takes GPU 7, one task per GPU"),
        ("gpu", 1, 2, 2, "2,3", "/gpu:1",
         "takes GPU 1 (CUDA_VISIBLE_DEVICES=2,3 leaves it GPU 3)"),
        ("gpu", 5, 6, 4, None, "/gpu:1", "6 tasks on this host share 4 GPU(s)"),
    ])
def test_choose_task_device(mode, local_rank, local_size, gpus, visible, device, says) -> None:
    choice = choose_task_device(mode, local_rank, local_size, gpus, visible)
    assert choice.device == device
    assert says in choice.reason


def test_the_cpu_default_with_gpus_says_how_to_take_them() -> None:
    choice = choose_task_device("cpu", 0, 1, 2)
    assert "CLUSTER_DEVICES=gpu" in choice.hint
    line = choice.describe("worker:0")
    assert line.startswith("worker:0 takes /cpu:0: ") and "CLUSTER_DEVICES=gpu" in line


def test_gpu_asked_without_a_gpu_is_a_config_error_naming_the_switch() -> None:
    with pytest.raises(TaskConfigError, match="CLUSTER_DEVICES=gpu but CuPy sees no GPU"):
        choose_task_device("gpu", 0, 1, 0)


@pytest.mark.parametrize(("addresses", "rank", "want"), [
    (["", ""], 1, (1, 2)),  # in-process peers: one host
    (["127.0.0.1:1", "localhost:2", "127.0.0.1:3"], 2, (2, 3)),
    (["a:1", "b:1", "a:2", "b:2"], 2, (1, 2)),
    (["a:1", "b:1", "a:2", "b:2"], 1, (0, 2)),
    (["[::1]:5", "10.0.0.1:5"], 1, (0, 1)),
])
def test_local_rank_is_the_index_among_the_tasks_of_the_same_host(addresses, rank, want) -> None:
    assert local_rank_of(addresses, rank) == want


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two GPUs that CuPy sees, the log-once memory cleared, the settings restored after."""
    FakeCuda(gpus=2).install(monkeypatch)
    monkeypatch.setattr(_devices, "_logged", set())
    previous = task_settings.install(None)
    yield
    task_settings.install(previous)


def _strategy(rank: int, size: int) -> MultiWorkerMirroredStrategy:
    hub = InProcessHub(size)
    return MultiWorkerMirroredStrategy._from_transport(hub.transports[rank])


def test_multi_worker_default_is_one_cpu_replica_even_with_gpus(fake_gpus, caplog) -> None:
    task_settings.install(TaskSettings())
    with caplog.at_level(logging.INFO, logger="cluster.strategies._devices"):
        strategy = _strategy(0, 1)
        _strategy(0, 1)
    assert [d.kind for d in strategy.extended.devices] == ["CPU"]
    lines = [r.getMessage() for r in caplog.records if "takes /cpu:0" in r.getMessage()]
    assert len(lines) == 1, lines  # logged once per process
    assert "CLUSTER_DEVICES=gpu" in lines[0]
    result = strategy.run(lambda: cluster.get_replica_context().all_reduce(
        "SUM", np.ones(3, np.float32)))
    assert type(result) is np.ndarray and result.tolist() == [1.0, 1.0, 1.0]


def test_multi_worker_with_the_gpu_switch_takes_the_local_ranks_gpu(fake_gpus) -> None:
    task_settings.install(TaskSettings(devices="gpu"))
    hub = InProcessHub(2)
    # Building the strategy waits for no peer here (in-process transports): rank 1 alone shows
    # its device choice.
    strategy = MultiWorkerMirroredStrategy._from_transport(hub.transports[1])
    (device,) = strategy.extended.devices
    assert (device.kind, device.index) == ("GPU", 1)


def test_explicit_devices_are_obeyed_whatever_the_switch(fake_gpus) -> None:
    task_settings.install(TaskSettings(devices="gpu"))
    strategy = MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0"])
    assert [d.kind for d in strategy.extended.devices] == ["CPU"]


def test_mirrored_default_takes_every_gpu_and_logs_it(fake_gpus, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="cluster.strategies._devices"):
        strategy = cluster.MirroredStrategy()
    assert [(d.kind, d.index) for d in strategy.extended.devices] == [("GPU", 0), ("GPU", 1)]
    assert any("MirroredStrategy() takes /gpu:0, /gpu:1" in r.getMessage()
               for r in caplog.records)
