"""NCCL through CuPy (``cluster.collectives.nccl``).

Without a GPU, a fake ``cupy`` (NumPy arrays with a ``.device`` and real ``.data.ptr`` addresses)
and a fake ``cupy.cuda.nccl`` that follows CuPy's signatures (argument order, stream argument,
tuple ids converted to C chars, ``initAll`` taking a list) check what we hand NCCL: pointers,
counts, dtype and op constants, the device current at creation, each GPU's own stream, and that
calls driving several GPUs from one thread are grouped. The fake reduces through the pointers, so
results are checked end to end. Tests marked ``gpu`` run the real thing where CuPy sees a GPU.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import threading
import types
from typing import Any

import numpy as np
import pytest

from cluster.collectives.nccl import (
    NcclComm,
    all_gather_devices,
    all_reduce_devices,
    available,
    broadcast_devices,
    id_from_bytes,
    id_to_bytes,
    nccl_dtype,
    nccl_op,
    supported_dtypes,
    unique_id,
)
from cluster.collectives.ops import ReduceOp, finalize
from cluster.errors import CollectiveAbortedError, CollectiveTimeoutError
from tests._requires import cupy_missing

from ._fake_cupy import (
    NCCL_CONSTANTS,
    VERSIONS,
    FakeArray,
    FakeCuda,
    assert_same_bits,
    host,
)
from ._threads import run_ranks

pytestmark = [pytest.mark.timeout(60), pytest.mark.path_independent]

# available() is False when CuPy cannot run here, or when it sees a device but not NCCL.
NO_GPU = cupy_missing() or "CuPy sees a CUDA device but cannot load NCCL (cupy.cuda.nccl)"

@pytest.fixture(params=VERSIONS, ids=lambda v: f"cupy{v.split('.')[0]}")
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    """The fake CuPy, once per CuPy version the project supports."""
    return FakeCuda(version=request.param).install(monkeypatch)


def test_available_is_false_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["cupy", "cupy.cuda", "cupy.cuda.nccl"]:
        monkeypatch.setitem(sys.modules, name, None)  # ``import cupy`` raises ImportError
    assert available() is False
    with pytest.raises(ImportError,
                       match=r"need CuPy: install the 'gpu' extra"):
        unique_id()
    with pytest.raises(ImportError, match="nvidia-nccl"):
        NcclComm(1, bytes(128), 0, 0)
    with pytest.raises(ImportError, match="need CuPy"):
        NcclComm.for_devices([0])


def test_available_is_false_when_cupy_cannot_load_nccl(fake: FakeCuda) -> None:
    assert available() is True
    fake.nccl.available = False  # what cupy/cuda/nccl.py sets when libnccl is missing
    assert available() is False
    with pytest.raises(ImportError, match="cannot load the NCCL library"):
        NcclComm.for_devices([0])


@pytest.mark.parametrize("count", [0, RuntimeError("cudaErrorNoDevice")])
def test_available_is_false_without_a_device_and_never_raises(fake: FakeCuda, count) -> None:
    def get_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    fake.cuda.runtime.getDeviceCount = get_count
    assert available() is False


def test_importing_the_module_does_not_import_cupy() -> None:
    code = ("import sys; import cluster.collectives.nccl; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- unique ids ------------------------------------------------------------------------------


def test_unique_id_round_trips_through_128_bytes() -> None:
    signed = tuple(((i * 37) % 256) - 128 for i in range(128))
    data = id_to_bytes(signed)
    assert isinstance(data, bytes) and len(data) == 128
    assert id_from_bytes(data) == signed
    unsigned = tuple(v & 0xFF for v in signed)  # the same id where C char is unsigned
    assert id_to_bytes(unsigned) == data
    assert id_from_bytes(data, signed=False) == unsigned
    assert id_from_bytes(bytearray(data)) == signed


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ((0,) * 127, ValueError, "has 128 values, got 127"),
        ((300,) + (0,) * 127, ValueError, "C char values"),
    ],
)
def test_id_to_bytes_rejects_what_is_not_an_id(value, error, match) -> None:
    with pytest.raises(error, match=match):
        id_to_bytes(value)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (bytes(127), ValueError, "is 128 bytes, got 127; pass the bytes from unique_id"),
        ("x" * 128, TypeError, "is 128 bytes, got str"),
    ],
)
def test_id_from_bytes_rejects_what_is_not_an_id(value, error, match) -> None:
    with pytest.raises(error, match=match):
        id_from_bytes(value)


def test_unique_id_serialises_what_cupy_gives(fake: FakeCuda) -> None:
    uid = unique_id()
    assert type(uid) is bytes and len(uid) == 128
    if fake.major == 13:  # a tuple of C chars
        fake.nccl.get_unique_id = lambda: tuple(range(-64, 64))
        assert unique_id() == bytes(v & 0xFF for v in range(-64, 64))
    else:  # the bytes themselves
        fake.nccl.get_unique_id = lambda: bytes(range(128))
        assert unique_id() == bytes(range(128))


def test_one_rank_communicator_from_a_unique_id(fake: FakeCuda) -> None:
    with NcclComm(1, unique_id(), 0, 0, timeout_seconds=5) as comm:
        x = fake.array(np.array([-5, 0, 7], np.int64), 0)
        assert host(comm.all_reduce(x, "MEAN")).tolist() == [-5, 0, 7]
        assert host(comm.broadcast(x, 0)).tolist() == [-5, 0, 7]
        assert host(comm.all_gather(x.reshape(3, 1))).ravel().tolist() == [-5, 0, 7]
    assert comm.closed


def test_two_ranks_from_rank_0s_unique_id(fake: FakeCuda) -> None:
    ids: list[bytes] = []
    made = threading.Event()

    def rank(r: int) -> np.ndarray:
        if r == 0:
            ids.append(unique_id())
            made.set()
        assert made.wait(10)
        with NcclComm(2, ids[0], r, device=r, timeout_seconds=5) as comm:
            return host(comm.all_reduce(fake.array([r + 1.0, -r], r), "SUM"))

    assert_same_bits(run_ranks(rank, 2), np.array([3.0, -1.0]))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_fake_refuses_the_other_versions_id(monkeypatch: pytest.MonkeyPatch,
                                                version: str) -> None:
    """What NcclComm once got wrong: each CuPy takes one form of the id, and only that."""
    fake = FakeCuda(version=version).install(monkeypatch)
    other = tuple(range(128)) if fake.major == 14 else bytes(128)
    want = "bytes, got tuple" if fake.major == 14 else "tuple, got bytes"
    with pytest.raises(TypeError, match=f"Argument 'commId' has incorrect type .expected {want}"):
        fake.nccl.NcclCommunicator(1, other, 0)


# -- dtype and op tables ---------------------------------------------------------------------


def _nccl_namespace(bfloat16: bool) -> types.SimpleNamespace:
    constants = dict(NCCL_CONSTANTS)
    if not bfloat16:
        del constants["NCCL_BFLOAT16"]
    return types.SimpleNamespace(**constants)


@pytest.mark.parametrize(
    ("dtype", "constant"),
    [("float16", 6), ("float32", 7), ("float64", 8), ("int32", 2), ("int64", 4)],
)
def test_dtypes_map_to_nccl_constants(dtype: str, constant: int) -> None:
    assert nccl_dtype(_nccl_namespace(True), np.dtype(dtype)) == constant


def test_bfloat16_is_supported_only_where_cupy_knows_it() -> None:
    assert supported_dtypes(_nccl_namespace(True)) == (
        "float16", "float32", "float64", "int32", "int64", "bfloat16")
    assert "bfloat16" not in supported_dtypes(_nccl_namespace(False))


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint32", "complex64"])
def test_unsupported_dtype_names_itself_and_the_supported_list(dtype: str) -> None:
    with pytest.raises(TypeError) as info:
        nccl_dtype(_nccl_namespace(False), dtype, "all_reduce")
    message = str(info.value)
    assert f"NCCL all_reduce does not support dtype {dtype}" in message
    assert "supported dtypes: float16, float32, float64, int32, int64." in message
    assert "astype" in message


@pytest.mark.parametrize(
    ("op", "constant"),
    [("SUM", 0), ("MEAN", 0), ("MAX", 2), ("MIN", 3), ("max", 2), (ReduceOp.MIN, 3)],
)
def test_ops_map_to_nccl_constants(op, constant: int) -> None:
    assert nccl_op(_nccl_namespace(True), op) == constant


def test_unknown_ops_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown reduce op 'PROD'"):
        nccl_op(_nccl_namespace(True), "PROD")
    with pytest.raises(TypeError, match="must be a ReduceOp or its name"):
        nccl_op(_nccl_namespace(True), 3)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "float32", "float64"])
@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_mean_division_on_the_gpu_matches_the_host(fake: FakeCuda, dtype: str,
                                                  count: int) -> None:
    """``finalize``'s CuPy branch (exact integer ufuncs only) gives the NumPy branch's bytes."""
    rng = np.random.default_rng(count)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        values = np.concatenate([rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True),
                                 np.array([info.min, info.max, -5, 5, -1, 0, -7, 7], dtype)])
    else:
        values = (rng.standard_normal(200) * 1000).astype(dtype)
    ours, theirs = fake.array(values, device=0), values.copy()
    finalize(ReduceOp.MEAN, ours, count)  # a CuPy array: the GPU branch
    finalize(ReduceOp.MEAN, theirs, count)
    assert ours.dtype == np.dtype(dtype) and host(ours).tobytes() == theirs.tobytes()


# -- several GPUs of one process (fake) ------------------------------------------------------


def _inputs(fake: FakeCuda, n: int, dtype: str, shape=(4, 5)) -> list[FakeArray]:
    rng = np.random.default_rng(0)
    size = int(np.prod(shape))
    if np.issubdtype(dtype, np.integer):
        host = [rng.integers(-100, 100, size).reshape(shape) for _ in range(n)]
    else:
        host = [rng.standard_normal(size).reshape(shape) for _ in range(n)]
    return [fake.array(h, device=d, dtype=dtype) for d, h in enumerate(host)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64"])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
def test_all_reduce_devices(fake: FakeCuda, dtype: str, op: str) -> None:
    comms = NcclComm.for_devices([0, 1, 2])
    arrays = _inputs(fake, 3, dtype)
    before = [host(a).copy() for a in arrays]
    results = all_reduce_devices(comms, arrays, op)
    want = before[0].copy()
    ufunc = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}[op]
    for other in before[1:]:
        ufunc(want, other, out=want)
    finalize(ReduceOp.parse(op), want, 3)
    assert_same_bits(results, want)
    assert [r.device.id for r in results] == [0, 1, 2]
    assert all(host(a).tobytes() == b.tobytes() for a, b in zip(arrays, before, strict=True))
    assert sorted(fake.calls) == [("allReduce", r, r) for r in range(3)]
    assert all(s.syncs == 1 for s in fake.streams.values()) and len(fake.streams) == 3


def test_broadcast_devices_moves_any_dtype(fake: FakeCuda) -> None:
    comms = NcclComm.for_devices([2, 0])
    arrays = [fake.array([[True, False, True]], device=2),
              fake.array([[False, False, False]], device=0)]
    results = broadcast_devices(comms, arrays, root=0)
    assert_same_bits(results, np.array([[True, False, True]]))
    assert [r.device.id for r in results] == [2, 0]
    results = broadcast_devices(comms, arrays, root=1)
    assert_same_bits(results, np.zeros((1, 3), bool))


def test_all_gather_devices_concatenates_along_axis_0(fake: FakeCuda) -> None:
    comms = NcclComm.for_devices([0, 1, 2])
    arrays = _inputs(fake, 3, "float32", shape=(2, 3))
    want = np.concatenate([host(a) for a in arrays])
    results = all_gather_devices(comms, arrays)
    assert_same_bits(results, want)
    assert want.shape == (6, 3)


def test_fortran_order_arrays_reduce_and_keep_their_layout(fake: FakeCuda) -> None:
    comms = NcclComm.for_devices([0, 1])
    arrays = [fake.array(np.arange(6.0).reshape(2, 3) * (d + 1), d, order="F") for d in range(2)]
    results = all_reduce_devices(comms, arrays, "SUM")
    for r in results:
        assert r.flags.f_contiguous
        np.testing.assert_array_equal(host(r), np.arange(6.0).reshape(2, 3) * 3)


def test_empty_arrays_never_reach_nccl(fake: FakeCuda) -> None:
    comms = NcclComm.for_devices([0, 1])
    arrays = [fake.array(np.zeros((0, 3), np.float32), d) for d in range(2)]
    assert [r.shape for r in all_reduce_devices(comms, arrays)] == [(0, 3), (0, 3)]
    assert [r.shape for r in all_gather_devices(comms, arrays)] == [(0, 3), (0, 3)]
    assert fake.calls == []


def test_one_gpu_is_a_one_rank_communicator(fake: FakeCuda) -> None:
    (comm,) = NcclComm.for_devices([1])
    x = fake.array([-5, 0, 3], device=1, dtype="int32")
    assert host(comm.all_reduce(x, "MEAN")).tolist() == [-5, 0, 3]
    assert host(comm.broadcast(x, 0)).tolist() == [-5, 0, 3]
    assert host(comm.all_gather(x)).tolist() == [-5, 0, 3]


# -- one process per GPU (fake; threads stand in for processes) ------------------------------


@pytest.mark.parametrize(("version", "char_signed"),
                         [("13.6.0", True), ("13.6.0", False), ("14.2.0", True)])
def test_ranks_joined_by_unique_id(monkeypatch: pytest.MonkeyPatch, version: str,
                                   char_signed: bool) -> None:
    fake = FakeCuda(version=version, char_signed=char_signed).install(monkeypatch)
    uid = bytes(range(0, 256, 2))  # bytes above 127: a signed/unsigned char matters

    def rank(r: int) -> tuple:
        with NcclComm(2, uid, r, device=r, timeout_seconds=5) as comm:
            assert comm._comm.device == r  # created with its GPU current
            x = fake.array(np.array([-5, 1, 7]) * (r + 1), device=r, dtype="int32")
            mean = comm.all_reduce(x, "MEAN")
            root = comm.broadcast(fake.array([r, r], device=r, dtype="int64"), root=1)
            gathered = comm.all_gather(fake.array([[r, r]], device=r, dtype="float32"))
            raw = comm._comm
        assert raw.state == "destroyed" and comm.closed
        return host(mean), host(root), host(gathered)

    results = run_ranks(rank, 2)
    assert_same_bits([m for m, _, _ in results], np.array([-7, 1, 10], np.int32))
    assert_same_bits([b for _, b, _ in results], np.array([1, 1], np.int64))
    assert_same_bits([g for _, _, g in results], np.array([[0, 0], [1, 1]], np.float32))


def test_timeout_aborts_the_communicator(fake: FakeCuda) -> None:
    comm = NcclComm(1, bytes(128), 0, 0, timeout_seconds=0.05)
    raw = comm._comm
    fake.hung = True
    with pytest.raises(CollectiveTimeoutError, match=r"did not complete within 0.05 s"):
        comm.all_reduce(fake.array([1.0], 0))
    assert raw.state == "aborted" and comm.closed
    with pytest.raises(ValueError, match="all_reduce on a closed NcclComm"):
        comm.all_reduce(fake.array([1.0], 0))


def test_an_async_nccl_error_aborts_the_communicator(fake: FakeCuda) -> None:
    comms = NcclComm.for_devices([0, 1], timeout_seconds=30)
    fake.hung, fake.async_error = True, "NCCL_ERROR_REMOTE_ERROR: peer died"
    arrays = [fake.array([1.0], d) for d in range(2)]
    with pytest.raises(CollectiveAbortedError, match="peer died; the communicator was aborted"):
        all_reduce_devices(comms, arrays)
    assert all(c.closed for c in comms)


# -- errors ----------------------------------------------------------------------------------


def test_arrays_must_be_cupy_arrays_on_the_comms_gpu(fake: FakeCuda) -> None:
    (comm,) = NcclComm.for_devices([1])
    with pytest.raises(TypeError, match=r"takes CuPy arrays on GPU 1, got numpy.ndarray"):
        comm.all_reduce(np.ones(3))
    with pytest.raises(ValueError, match=r"is on GPU 0 but .* uses GPU 1; copy it with "
                                         r"`with cupy.cuda.Device\(1\): x = x.copy\(\)`"):
        comm.broadcast(fake.array([1.0], 0))


def test_strided_arrays_are_refused_with_the_fix(fake: FakeCuda) -> None:
    (comm,) = NcclComm.for_devices([0])
    x = fake.array(np.arange(12.0).reshape(3, 4), 0)
    with pytest.raises(ValueError, match=r"needs a contiguous array.*cupy.ascontiguousarray"):
        comm.all_reduce(x[:, ::2])
    with pytest.raises(ValueError, match=r"needs a C-contiguous array.*ascontiguousarray"):
        comm.all_gather(x.T)


def test_all_reduce_refuses_other_dtypes(fake: FakeCuda) -> None:
    (comm,) = NcclComm.for_devices([0])
    with pytest.raises(TypeError, match=r"does not support dtype bool; supported dtypes: "
                                        r"float16, float32, float64, int32, int64, bfloat16"):
        comm.all_reduce(fake.array([True], 0))


def test_bad_roots_scalars_and_closed_comms(fake: FakeCuda) -> None:
    comm = NcclComm(1, bytes(128), 0, 0)
    x = fake.array([1.0], 0)
    with pytest.raises(ValueError, match=r"broadcast root 1 is not a rank .* \(0..0\)"):
        comm.broadcast(x, root=1)
    with pytest.raises(TypeError, match="broadcast root must be an int"):
        comm.broadcast(x, root=True)
    with pytest.raises(ValueError, match=r"rank >= 1 .* x.reshape\(1\)"):
        comm.all_gather(fake.array(1.0, 0))
    raw = comm._comm
    comm.close()
    comm.close()
    assert raw.state == "destroyed"
    with pytest.raises(ValueError, match=r"broadcast on a closed NcclComm\(rank 0 of 1, GPU 0"):
        comm.broadcast(x)


def test_device_helpers_need_the_whole_communicator(fake: FakeCuda) -> None:
    comms = NcclComm.for_devices([0, 1])
    arrays = [fake.array([1.0], d) for d in range(2)]
    with pytest.raises(ValueError, match="2 communicators but 1 arrays"):
        all_reduce_devices(comms, arrays[:1])
    with pytest.raises(ValueError, match=r"every rank of one communicator in rank order"):
        all_reduce_devices(comms[::-1], arrays[::-1])
    with pytest.raises(ValueError, match=r"one shape and dtype; got \(1,\) float64 and \(2,\)"):
        all_reduce_devices(comms, [arrays[0], fake.array([1.0, 2.0], 1)])
    with pytest.raises(TypeError, match="the list from NcclComm.for_devices"):
        all_gather_devices([object()], arrays[:1])
    assert fake.calls == []


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((2, bytes(128), 2, 0), {}, ValueError, r"rank 2 is not a rank .* size 2 \(0..1\)"),
        ((0, bytes(128), 0, 0), {}, ValueError, "size must be >= 1"),
        ((1, bytes(128), 0, -1), {}, ValueError, "device must be >= 0"),
        ((1, bytes(128), 0, "0"), {}, TypeError, "device must be an int"),
        ((1, bytes(12), 0, 0), {}, ValueError, "is 128 bytes, got 12"),
        ((1, bytes(128), 0, 0), {"timeout_seconds": 0}, ValueError, "must be > 0"),
    ],
)
def test_bad_constructor_arguments(fake: FakeCuda, args, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        NcclComm(*args, **kwargs)


@pytest.mark.parametrize("devices", [[], [0, 0]])
def test_for_devices_needs_distinct_devices(fake: FakeCuda, devices: list) -> None:
    with pytest.raises(ValueError, match="distinct GPU ids, at least one"):
        NcclComm.for_devices(devices)


# -- real GPUs -------------------------------------------------------------------------------

GPU = available()


def _gpu_count() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.timeout(120)
def test_real_collectives_among_the_gpus_of_this_process() -> None:
    import cupy

    n = _gpu_count()
    comms = NcclComm.for_devices(list(range(n)))
    arrays = []
    for d in range(n):
        with cupy.cuda.Device(d):
            arrays.append(cupy.arange(1 << 16, dtype=cupy.float32) * (d + 1) - 7.25)
    host = [cupy.asnumpy(a) for a in arrays]
    for op in ["SUM", "MEAN", "MAX", "MIN"]:
        want = host[0].copy()
        ufunc = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}[op]
        for other in host[1:]:
            ufunc(want, other, out=want)
        finalize(ReduceOp[op], want, n)
        results = all_reduce_devices(comms, arrays, op)
        assert [r.device.id for r in results] == list(range(n))
        assert_same_bits([cupy.asnumpy(r) for r in results], want)
    assert_same_bits([cupy.asnumpy(r) for r in broadcast_devices(comms, arrays, n - 1)],
                      host[n - 1])
    assert_same_bits([cupy.asnumpy(r) for r in all_gather_devices(comms, arrays)],
                      np.concatenate(host))
    for c in comms:
        c.close()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.timeout(120)
def test_real_one_rank_communicator_from_a_unique_id() -> None:
    import cupy

    with NcclComm(1, unique_id(), 0, 0, timeout_seconds=60) as comm, cupy.cuda.Device(0):
        x = cupy.asarray(np.array([-5, 0, 7], np.int64))
        assert cupy.asnumpy(comm.all_reduce(x, "MEAN")).tolist() == [-5, 0, 7]
        assert cupy.asnumpy(comm.broadcast(x, 0)).tolist() == [-5, 0, 7]
        assert cupy.asnumpy(comm.all_gather(x.reshape(3, 1))).ravel().tolist() == [-5, 0, 7]


def _two_process_rank(rank: int, ids: Any, results: Any) -> None:
    """One rank in a fresh interpreter: rank 0 makes the id, rank 1 receives it."""
    import cupy

    if rank == 0:
        uid = unique_id()
        ids.put(uid)
    else:
        uid = ids.get(timeout=60)
    with NcclComm(2, uid, rank, device=rank, timeout_seconds=60) as comm, cupy.cuda.Device(rank):
        rng = np.random.default_rng(rank)
        x = cupy.asarray(rng.standard_normal(1 << 18).astype(np.float32))
        out = comm.all_reduce(x, "SUM")
        mean = comm.all_reduce(x, "MEAN")
        results.put((rank, cupy.asnumpy(x).tobytes(), cupy.asnumpy(out).tobytes(),
                     cupy.asnumpy(mean).tobytes()))


@pytest.mark.gpu
@pytest.mark.multiprocess
@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.timeout(180)
def test_real_two_processes_get_bitwise_identical_results() -> None:
    if _gpu_count() < 2:
        pytest.skip(f"two NCCL ranks need two GPUs (NCCL refuses two ranks on one GPU); "
                    f"{_gpu_count()} here")
    ctx = mp.get_context("spawn")
    ids, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_two_process_rank, args=(r, ids, results), daemon=True)
             for r in range(2)]
    try:
        for p in procs:
            p.start()
        got = {}
        for _ in range(2):
            rank, x, total, mean = results.get(timeout=150)
            got[rank] = (np.frombuffer(x, np.float32), total, mean)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
    assert got[0][1] == got[1][1] and got[0][2] == got[1][2]  # bitwise identical
    want = got[0][0] + got[1][0]
    np.testing.assert_array_equal(np.frombuffer(got[0][1], np.float32), want)
    np.testing.assert_array_equal(np.frombuffer(got[0][2], np.float32), want / np.float32(2))
