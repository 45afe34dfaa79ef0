"""SGD's update fused on the GPU (one CuPy elementwise kernel: sum, scale, add), bitwise equal to
Keras' ``w -= lr * g``, as part of ``CrossDeviceOps.reduce_and_update``; on the fake CuPy, whose
kernels :mod:`tests.strategies._elementwise` runs."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster.collectives import kernels
from cluster.collectives.epilogue import AddScaled
from cluster.cross_device_ops import CrossDeviceOps, ReductionToOneDevice
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.transport.inproc import InProcessHub
from tests._fakegpu.fakecuda import FakeCuda, host
from tests.collectives._threads import run_ranks
from tests.strategies import _elementwise

pytestmark = pytest.mark.timeout(60)

LR = 0.1


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    cuda = FakeCuda(gpus=2).install(monkeypatch)
    _elementwise.install(cuda.cupy)
    _elementwise.calls.clear()
    return cuda


def _keras_sgd(w: np.ndarray, g: np.ndarray) -> np.ndarray:
    return w - w.dtype.type(LR) * g


def test_the_kernel_sums_in_order_then_scales_then_adds_with_uncontracted_roundings() -> None:
    ins, outs, body = kernels.gpu_kernel_source(3)
    assert (ins, outs) == ("T g0, T g1, T g2, T scale", "T w")
    assert body == ("T s = g0; s = add_rn(s, g1); s = add_rn(s, g2); "
                    "w = add_rn(w, mul_rn(s, scale));")
    for intrinsic in ("__fadd_rn", "__dadd_rn", "__fmul_rn", "__dmul_rn"):
        assert intrinsic in kernels.GPU_PREAMBLE  # never contracted into an FMA


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("operands", [1, 3])
def test_one_kernel_is_bitwise_numpy(fake: FakeCuda, dtype, operands: int) -> None:
    rng = np.random.default_rng(operands)
    grads = [rng.standard_normal(1001).astype(dtype) for _ in range(operands)]
    w = rng.standard_normal(1001).astype(dtype)
    target = fake.array(w, 1)
    assert kernels.sum_add_scaled_on_gpu(AddScaled(-LR), [fake.array(g, 1) for g in grads],
                                         target)
    total = grads[0].copy()
    for g in grads[1:]:
        total = total + g
    assert host(target).tobytes() == _keras_sgd(w, total).tobytes()
    assert _elementwise.calls == [f"cluster_sum{operands}_add_scaled"]


def test_the_kernel_declines_what_it_cannot_do(fake: FakeCuda) -> None:
    w = fake.array(np.ones(3, np.float32), 0)
    assert not kernels.sum_add_scaled_on_gpu(AddScaled(-LR), [fake.array(np.ones(3), 0)], w)
    assert not kernels.sum_add_scaled_on_gpu(AddScaled(-LR),
                                             [fake.array(np.ones(3, np.float32), 1)], w)
    assert not kernels.sum_add_scaled_on_gpu(lambda t, r: None,
                                             [fake.array(np.ones(3, np.float32), 0)], w)
    assert host(w).tolist() == [1.0, 1.0, 1.0] and _elementwise.calls == []


def test_one_gpu_replica_fuses_sgd_and_matches_keras(fake: FakeCuda) -> None:
    strategy = cluster.MirroredStrategy(["/gpu:0"])
    w0 = np.linspace(-1, 1, 7, dtype=np.float32)
    with strategy.scope():
        v = cluster.Variable(fake.array(w0, 0))
    g = np.linspace(0.5, 3, 7, dtype=np.float32)
    opt = cluster.optimizers.SGD(LR)
    strategy.run(lambda: opt.apply_gradients([(fake.array(g, 0), v)]))
    assert _elementwise.calls == ["cluster_sum1_add_scaled"]
    assert isinstance(v.value(), fake.cupy.ndarray)
    assert host(v.value()).tobytes() == _keras_sgd(w0, g).tobytes()


def test_numpy_gradients_for_a_gpu_variable_take_the_unfused_route_exactly(fake) -> None:
    strategy = cluster.MirroredStrategy(["/gpu:0"])
    w0 = np.linspace(-1, 1, 5, dtype=np.float32)
    with strategy.scope():
        v = cluster.Variable(w0)
    g = np.linspace(0.5, 3, 5, dtype=np.float32)
    opt = cluster.optimizers.SGD(LR)
    strategy.run(lambda: opt.apply_gradients([(g, v)]))
    assert host(v.value()).tobytes() == _keras_sgd(w0, g).tobytes()


def test_two_tasks_one_gpu_each_fuse_sgd_on_the_gpu(fake: FakeCuda) -> None:
    """Two ranks (threads), GPU r each: NCCL sums the gradients, one kernel updates, every rank
    ends with Keras' bytes."""
    hub = InProcessHub(2)
    w0 = np.linspace(-1, 1, 4096, dtype=np.float32)
    grads = [np.full(4096, r + 0.25, np.float32) for r in range(2)]
    fused: list[bool] = []

    def rank(r: int) -> bytes:
        strategy = MultiWorkerMirroredStrategy._from_transport(hub.transports[r],
                                                               devices=[f"/gpu:{r}"])
        ops = strategy.extended.cross_device_ops
        real = ops.reduce_and_update
        ops.reduce_and_update = lambda *a, **k: fused.append(real(*a, **k)) or fused[-1]
        with strategy.scope():
            v = cluster.Variable(w0)
        opt = cluster.optimizers.SGD(LR)
        strategy.run(lambda: opt.apply_gradients([(fake.array(grads[r], r), v)]))
        assert v.value().device.id == r
        return host(v.value()).tobytes()

    results = run_ranks(rank, 2, timeout=40, transports=hub.transports)
    assert results == [_keras_sgd(w0, grads[0] + grads[1]).tobytes()] * 2
    assert fused == [True, True]
    assert _elementwise.calls == ["cluster_sum1_add_scaled"] * 2


def test_the_default_reduce_and_update_of_any_ops_is_the_unfused_route() -> None:
    class Summing(CrossDeviceOps):
        def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
            return ReductionToOneDevice().batch_reduce_components(op, values,
                                                                  num_replicas_in_sync)

    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=Summing())
    w0 = np.linspace(-1, 1, 6, dtype=np.float32)
    with strategy.scope():
        v = cluster.Variable(w0)
    g = [np.full(6, 0.5, np.float32), np.full(6, 1.25, np.float32)]
    opt = cluster.optimizers.SGD(LR)
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: g[ctx.replica_id_in_sync_group])
    strategy.run(lambda grad: opt.apply_gradients([(grad, v)]), args=(per_replica,))
    want = _keras_sgd(w0, g[0] + g[1]).tobytes()
    assert [c.numpy().tobytes() for c in strategy.experimental_local_results(v)] == [want] * 2
    assert not Summing().reduce_and_update([[g[0]], ], [[w0.copy()]], AddScaled(-LR), 1)


# -- values keep their family whatever the replica's device -----------------------------------

def _all_reduce_and_gather(strategy, value):
    def step():
        ctx = cluster.get_replica_context()
        return ctx.all_reduce("SUM", value), ctx.all_gather(value, axis=0)

    return strategy.run(step)


@pytest.mark.parametrize("devices", [["/cpu:0"], ["/gpu:1"]], ids=["cpu replica", "gpu replica"])
def test_numpy_in_numpy_out_and_cupy_in_cupy_out_on_any_replica(fake: FakeCuda, devices) -> None:
    strategy = cluster.MirroredStrategy(devices)
    summed, gathered = _all_reduce_and_gather(strategy, np.arange(3, dtype=np.float32))
    assert type(summed) is np.ndarray and type(gathered) is np.ndarray
    assert summed.tolist() == [0.0, 1.0, 2.0] and gathered.tolist() == [0.0, 1.0, 2.0]
    x = fake.array(np.arange(3, dtype=np.float32), 0)
    summed, gathered = _all_reduce_and_gather(strategy, x)
    assert isinstance(summed, fake.cupy.ndarray) and isinstance(gathered, fake.cupy.ndarray)
    # On a GPU replica the result is on the replica's GPU; a CPU replica leaves it on the value's.
    want_device = 1 if devices == ["/gpu:1"] else 0
    assert summed.device.id == want_device and gathered.device.id == want_device
    assert host(summed).tolist() == [0.0, 1.0, 2.0] and host(gathered).tolist() == [0.0, 1.0, 2.0]


def test_cupy_gradients_update_cpu_variables_exactly(fake: FakeCuda) -> None:
    hub = InProcessHub(1)
    strategy = MultiWorkerMirroredStrategy._from_transport(hub.transports[0], devices=["/cpu:0"])
    w0 = np.linspace(-1, 1, 5, dtype=np.float32)
    g = np.linspace(0.5, 3, 5, dtype=np.float32)
    with strategy.scope():
        v = cluster.Variable(w0)
    opt = cluster.optimizers.SGD(LR)
    strategy.run(lambda: opt.apply_gradients([(fake.array(g, 1), v)]))
    assert type(v.value()) is np.ndarray
    assert v.numpy().tobytes() == _keras_sgd(w0, g).tobytes()


def test_a_scalar_per_gpu_reduces_to_a_scalar_over_nccl(fake: FakeCuda) -> None:
    strategy = cluster.MirroredStrategy(["/gpu:0", "/gpu:1"])

    def value():
        r = cluster.get_replica_context().replica_id_in_sync_group
        return fake.array(np.float32(3.0 + 3.0 * r), r)  # 3.0 on GPU 0, 6.0 on GPU 1

    mean = strategy.reduce("MEAN", strategy.run(value), axis=None)
    assert isinstance(mean, fake.cupy.ndarray) and mean.shape == ()
    assert float(mean) == 4.5
