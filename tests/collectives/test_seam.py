"""The seam strategies use: ``all_reduce_many`` of lone tensors without copies, results the
caller keeps (never overwritten by a later call, pooled buffers included), and CuPy values on the
device route. Runs on both paths (see ``conftest.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cluster.collectives._buffers import MIN_POOLED_BYTES
from cluster.transport.inproc import InProcessHub

from . import _threads
from ._fake_cupy import FakeCuda, assert_same_bits
from ._threads import make_groups, run_ranks

pytestmark = pytest.mark.timeout(60)

POOLED = MIN_POOLED_BYTES // 4  # float32 elements of the smallest pooled buffer


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_held_results_of_a_lone_pooled_tensor_are_never_overwritten(op: str) -> None:
    """r1 = all_reduce_many([x]); r2 = all_reduce_many([y]) (same size, so r2 could reuse a
    pooled buffer): r1 keeps its values, and once dropped, its buffer serves a later call."""
    hub, groups = make_groups(2, shm_round_bytes=1 << 20)  # 32 MiB in a few rounds

    def body(rank: int) -> tuple[Any, ...]:
        g = groups[rank]
        x = np.full(POOLED, rank + 1.0, np.float32)
        y = np.full(POOLED, 10.0 * (rank + 1), np.float32)
        (r1,) = g.all_reduce_many([x], op)
        (r2,) = g.all_reduce_many([y], op)
        (r3,) = g.all_reduce_many([x], op)
        held = (float(r1[0]), float(r1[-1]), float(r2[0]), r1 is x, np.shares_memory(r1, x),
                np.shares_memory(r1, r2), np.shares_memory(r2, r3), float(x[0]))
        addresses = {r1.ctypes.data, r2.ctypes.data, r3.ctypes.data}
        del r1, r2, r3
        (r4,) = g.all_reduce_many([y], op)
        return (*held, r4.ctypes.data in addresses, float(r4[0]))

    scale = 0.5 if op == "MEAN" else 1.0
    for rank, out in enumerate(run_ranks(body, 2, timeout=50)):
        r1a, r1b, r2a, same, shares_x, shares_12, shares_23, x0, reused, r4 = out
        assert (r1a, r1b, r2a) == (3.0 * scale, 3.0 * scale, 30.0 * scale)
        assert not same and not shares_x and not shares_12 and not shares_23
        assert x0 == rank + 1.0  # the input is never written
        assert r4 == 30.0 * scale and reused  # a dropped result's buffer serves again


def test_lone_tensors_are_not_packed_and_small_ones_share_a_pack() -> None:
    """A tensor that travels alone comes back in a buffer of its own size (no pack around
    it); small ones are views of one shared pack."""
    hub, groups = make_groups(2)
    big = [np.full(1 << 18, float(r), np.float32) for r in range(2)]  # 1 MiB: alone
    small = [[np.full(3, float(r)), np.full(2, float(r))] for r in range(2)]

    results = run_ranks(lambda r: groups[r].all_reduce_many([big[r], *small[r]]), 2)
    for r, (b, s1, s2) in enumerate(results):
        assert b.base is None or b.base.nbytes == b.nbytes  # not a view of a larger pack
        assert b.tolist() == [1.0] * (1 << 18) and s1.tolist() == [1.0] * 3
        assert s1.base is not None and s1.base is s2.base  # fused into one pack
        assert big[r][0] == float(r)


def test_owned_values_are_reduced_in_place_and_scalars_come_back() -> None:
    hub, groups = make_groups(2)
    results = run_ranks(lambda r: groups[r].all_reduce_many([1.5, [1, 2]], "SUM"), 2)
    for scalar, listed in results:
        assert scalar == 3.0 and type(scalar) is np.float32
        assert listed.tolist() == [2, 4] and listed.dtype == np.int32


@pytest.mark.shm_path
@pytest.mark.parametrize("hosts", [[0, 0], [0, 0, 1, 1]], ids=["one host", "two hosts"])
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_all_reduce_many_routes_cupy_values_through_nccl_and_numpy_through_the_host(
        monkeypatch: pytest.MonkeyPatch, hosts: list[int], op: str) -> None:
    fake = FakeCuda(gpus=4).install(monkeypatch)
    world = len(hosts)
    hub = InProcessHub(world)
    groups = [_threads.new_group(t, host_id=f"h{hosts[r]}") for r, t in enumerate(hub.transports)]
    devices = [r % 2 for r in range(world)]  # distinct GPUs within each host
    gpu_in = [np.arange(6, dtype=np.float32) * (r + 1) for r in range(world)]
    cpu_in = [np.full(4, r + 1.0) for r in range(world)]

    def rank(r: int) -> Any:
        x = fake.array(gpu_in[r], devices[r])
        gpu, cpu = groups[r].all_reduce_many([x, cpu_in[r]], op)
        return gpu, cpu, x.get()

    results = run_ranks(rank, world, transports=hub.transports)
    divisor = world if op == "MEAN" else 1
    assert_same_bits([g for g, _, _ in results], (sum(gpu_in) / divisor).astype(np.float32))
    assert_same_bits([c for _, c, _ in results], sum(cpu_in) / divisor)
    assert [g.device.id for g, _, _ in results] == devices  # CuPy in, CuPy out, on its GPU
    assert all(type(c) is np.ndarray for _, c, _ in results)
    for r, (_, _, x) in enumerate(results):
        np.testing.assert_array_equal(x, gpu_in[r])  # the caller's device array is untouched
    reductions = [call for call in fake.calls if call[0] == "allReduce"]
    assert len(reductions) == world  # every rank's GPU took part in one NCCL all-reduce
