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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fused_sgd_kernel_is_bitwise_numpy_on_a_real_gpu(dtype):
    """One kernel sums three gradients in order, scales and adds: NumPy's bytes (no FMA)."""
    import cupy

    from cluster.collectives import kernels
    from cluster.collectives.epilogue import AddScaled

    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(1 << 16).astype(dtype) for _ in range(3)]
    w = rng.standard_normal(1 << 16).astype(dtype)
    target = cupy.asarray(w)
    assert kernels.sum_add_scaled_on_gpu(AddScaled(-0.1), [cupy.asarray(g) for g in grads],
                                         target)
    want = w - dtype(0.1) * ((grads[0] + grads[1]) + grads[2])
    assert cupy.asnumpy(target).tobytes() == want.tobytes()


def test_sgd_on_a_gpu_replica_is_fused_and_bitwise_keras():
    import cupy

    strategy = cluster.MirroredStrategy(["/gpu:0"])
    w0 = np.linspace(-1, 1, 1001, dtype=np.float32)
    g = np.linspace(0.5, 3, 1001, dtype=np.float32)
    with strategy.scope():
        v = cluster.Variable(cupy.asarray(w0))
    ops = strategy.extended.cross_device_ops
    fused = []
    real = ops.reduce_and_update
    ops.reduce_and_update = lambda *a, **k: fused.append(real(*a, **k)) or fused[-1]
    opt = cluster.optimizers.SGD(0.1)
    strategy.run(lambda: opt.apply_gradients([(cupy.asarray(g), v)]))
    assert fused == [True]
    assert cupy.asnumpy(v.value()).tobytes() == (w0 - np.float32(0.1) * g).tobytes()
