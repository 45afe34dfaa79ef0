"""Array families (NumPy, scalars, CuPy) and the packing plan of all_reduce_many."""

from __future__ import annotations

import numpy as np
import pytest

from cluster._family import stage
from cluster.collectives import ReduceOp
from cluster.collectives._packing import describe, pack, plan_packs, unpack
from tests._requires import require_cupy

from ._fake_cupy import FakeArray, FakeCuda, host
from ._threads import make_groups, run_ranks

# -- families ------------------------------------------------------------------------------------


def test_numpy_arrays_are_staged_without_a_copy() -> None:
    x = np.arange(4)
    staged = stage(x)
    assert staged.array is x and not staged.owned and staged.restore(x) is x


@pytest.mark.parametrize(
    ("value", "dtype", "back"),
    [
        (1.5, "float32", np.float32),  # TensorFlow's rule (tf.convert_to_tensor), everywhere
        (3, "int32", np.int32),
        (np.float32(2), "float32", np.float32),
        (np.int32(7), "int32", np.int32),
    ],
)
def test_scalars_become_owned_0d_arrays_and_come_back_as_numpy_scalars(value, dtype, back) -> None:
    staged = stage(value)
    assert staged.owned and staged.array.shape == () and staged.array.dtype == np.dtype(dtype)
    assert type(staged.restore(staged.array)) is back


@pytest.mark.parametrize("value", ["x", None, b"ab", object()])
def test_other_values_are_a_type_error_naming_the_families(value: object) -> None:
    with pytest.raises(TypeError, match=r"all_reduce got .*supported: NumPy arrays.*np.asarray"):
        stage(value, "all_reduce")


def test_lists_and_bools_are_staged_with_tensorflows_dtypes() -> None:
    staged = stage([1.0, 2.0])
    assert staged.owned and staged.array.dtype == np.float32 and staged.array.tolist() == [1, 2]
    assert stage(True).array.dtype == np.bool_


def test_cupy_arrays_are_staged_through_the_host_and_return_on_their_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CuPy without NCCL: values are staged on the host, results come back on each GPU."""
    fake = FakeCuda(gpus=2).install(monkeypatch)
    fake.nccl.available = False  # CuPy keeps the module when libnccl is missing
    hub, groups = make_groups(2)
    inputs = [fake.array(np.full(3, r + 1.0, np.float32), device=r) for r in range(2)]
    results = run_ranks(lambda r: groups[r].all_reduce(inputs[r], ReduceOp.SUM), 2)
    for r, out in enumerate(results):
        assert isinstance(out, FakeArray) and out.device.id == r
        assert out.dtype == np.float32 and host(out).tolist() == [3.0, 3.0, 3.0]
    assert host(inputs[0]).tolist() == [1.0, 1.0, 1.0]  # the caller's device array is untouched


@pytest.mark.gpu
def test_real_cupy_all_reduce() -> None:
    cupy = require_cupy()
    hub, groups = make_groups(2)
    inputs = [cupy.arange(5, dtype=cupy.float32) * (r + 1) for r in range(2)]
    results = run_ranks(lambda r: groups[r].all_reduce(inputs[r]), 2)
    for out in results:
        assert isinstance(out, cupy.ndarray) and out.device.id == inputs[0].device.id
        assert cupy.asnumpy(out).tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]


# -- packing -------------------------------------------------------------------------------------

F4, F8, I8 = np.dtype("float32"), np.dtype("float64"), np.dtype("int64")


@pytest.mark.parametrize(
    ("tensors", "bytes_per_pack", "fuse_below", "packs"),
    [
        ([], 0, 100, []),
        ([(F4, 8), (F4, 8), (F4, 8)], 16, 100, [[0, 1], [2]]),
        ([(F4, 8), (F4, 40), (F4, 8)], 16, 100, [[0], [1], [2]]),  # a big one travels alone
        ([(F4, 8), (F8, 8), (F4, 8), (F8, 8)], 64, 100, [[0, 2], [1, 3]]),  # one dtype per pack
        ([(F4, 8), (F4, 200), (F4, 8), (I8, 8)], 0, 100, [[0, 2], [1], [3]]),  # 0: fuse small
        ([(F4, 0), (F4, 0)], 1, 100, [[0, 1]]),  # empty tensors fit anywhere
    ],
)
def test_plan_packs_table(tensors, bytes_per_pack, fuse_below, packs) -> None:
    assert plan_packs(tensors, bytes_per_pack, fuse_below) == packs


def test_pack_and_unpack_round_trip_mixed_shapes_and_layouts() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    arrays = [base[::2, ::3], np.float32(5) * np.ones(()), np.zeros((0, 3), np.float32), base.T]
    buffer, ranges = pack(arrays)
    assert buffer.size == sum(a.size for a in arrays) and buffer.flags.c_contiguous
    for original, view in zip(
        arrays, unpack(buffer, ranges, [a.shape for a in arrays]), strict=True
    ):
        assert view.shape == original.shape and np.array_equal(view, original)


def test_describe_differs_whenever_a_shape_or_dtype_differs() -> None:
    a = describe([np.ones((2, 3)), np.ones(4, np.float32)])
    assert a == describe([np.zeros((2, 3)), np.zeros(4, np.float32)])
    assert a != describe([np.ones((3, 2)), np.ones(4, np.float32)])
    assert a != describe([np.ones(4, np.float32), np.ones((2, 3))])
    assert "1xfloat64 (6 elements), 1xfloat32 (4 elements)" in a


# -- layering ------------------------------------------------------------------------------------


def test_collectives_never_import_grpc() -> None:
    # The same code runs over every transport, so only cluster/transport/ (and the servicers)
    # may import grpc.
    import ast
    from pathlib import Path

    _NETWORK_MODULES = ("cluster.transport.network", "cluster.transport.endpoint")
    package = Path(__file__).resolve().parents[2] / "cluster" / "collectives"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "grpc"]
            offenders += [f"{path.name}: {n}" for n in names if n in _NETWORK_MODULES]
    assert not offenders, offenders
