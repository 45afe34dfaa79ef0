"""GPU replicas (CuPy) and NCCL among local GPUs. These run only where CuPy sees a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster.strategies._devices import gpu_count
from tests._requires import skip_without_cupy

GPUS = gpu_count()
pytestmark = [pytest.mark.gpu, skip_without_cupy()]


def test_one_gpu_replica_keeps_values_on_the_gpu():
    import cupy

    strategy = cluster.MirroredStrategy(["/gpu:0"])
    with strategy.scope():
        v = cluster.Variable(cupy.ones(3, cupy.float32))
    assert isinstance(v.value(), cupy.ndarray)
    result = strategy.run(lambda: cluster.get_replica_context().all_reduce("SUM", v.value() * 2))
    assert isinstance(result, cupy.ndarray)
    cupy.testing.assert_array_equal(result, cupy.full(3, 2.0, cupy.float32))
    opt = cluster.optimizers.SGD(0.5)
    strategy.run(lambda: opt.apply_gradients([(cupy.ones(3, cupy.float32), v)]))
    np.testing.assert_array_equal(v.numpy(), [0.5, 0.5, 0.5])


@pytest.mark.skipif(0 < GPUS < 2, reason="NCCL among GPUs needs at least 2 GPUs; 1 here")
def test_nccl_all_reduce_among_local_gpus_is_bitwise_identical():
    import cupy

    devices = [f"/gpu:{i}" for i in range(GPUS)]
    strategy = cluster.MirroredStrategy(devices)

    def step():
        r = cluster.get_replica_context().replica_id_in_sync_group
        x = cupy.arange(1 << 20, dtype=cupy.float32) * (r + 1)
        return cluster.get_replica_context().all_reduce("SUM", x)

    results = strategy.experimental_local_results(strategy.run(step))
    expected = np.arange(1 << 20, dtype=np.float32) * sum(range(1, GPUS + 1))
    for i, r in enumerate(results):
        assert r.device.id == i
        np.testing.assert_array_equal(cupy.asnumpy(r), expected)
