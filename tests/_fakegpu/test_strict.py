"""The fake CuPy is as strict as CuPy 13/14 where our code could go wrong on a GPU machine
(each expectation is CuPy's documented or coded behaviour: ``cupy/_core/core.pyx``,
``cupy/__init__.py``, ``cupyx/_pinned_array.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests._fakegpu.fakecuda import VERSIONS, FakeCuda, PerformanceWarning, is_pinned

pytestmark = pytest.mark.timeout(30)

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly.")


@pytest.fixture(params=VERSIONS, ids=lambda v: f"cupy{v.split('.')[0]}")
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(gpus=2, version=request.param).install(monkeypatch)


@pytest.mark.parametrize("convert", [np.asarray, np.array, np.float32, lambda x: np.array([x]),
                                     lambda x: np.add(x, np.ones(3))])
def test_no_implicit_conversion_to_numpy(fake: FakeCuda, convert) -> None:
    x = fake.cupy.arange(3.0)
    with pytest.raises(TypeError) as raised:
        convert(x)
    assert str(raised.value) in (IMPLICIT, "Unsupported type <class 'numpy.ndarray'>")


def test_python_scalars_convert_through_get(fake: FakeCuda) -> None:
    loss = fake.cupy.arange(4.0, dtype=np.float32).sum()
    assert isinstance(loss, fake.cupy.ndarray) and loss.ndim == 0  # a 0-d array, not a scalar
    assert (float(loss), int(loss), bool(loss)) == (6.0, 6, True)
    assert loss.item() == 6.0 and isinstance(loss.item(), float)
    with pytest.raises(TypeError):
        np.float32(loss)  # what examples/quickstart's NumPy code must never meet
    with pytest.raises(TypeError):
        float(fake.cupy.arange(3.0))  # NumPy's refusal, through get()
    with pytest.raises(ValueError, match="ambiguous"):
        bool(fake.cupy.arange(3.0))


def test_arithmetic_stays_on_the_device_and_refuses_host_arrays(fake: FakeCuda) -> None:
    with fake.cuda.Device(1):
        x = fake.cupy.ones(3, dtype=np.float32)
        y = x * 2 + 1.5
        y += x
        assert isinstance(y, fake.cupy.ndarray) and y.device.id == 1 and y.dtype == np.float32
        assert isinstance(y[0], fake.cupy.ndarray) and y[0].ndim == 0
        assert np.maximum(y, x).device.id == 1  # NumPy's ufuncs dispatch to CuPy
        assert isinstance(np.concatenate([x, y]), fake.cupy.ndarray)
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
            x + np.ones(3, np.float32)
        with pytest.raises(TypeError, match="Unsupported type"):
            fake.cupy.concatenate([x, np.ones(3)])
    assert y.get().tolist() == [4.5, 4.5, 4.5]


def test_arrays_of_another_gpu_warn_as_with_peer_access(fake: FakeCuda) -> None:
    with fake.cuda.Device(1):
        x = fake.cupy.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PerformanceWarning, match=r"resides \(1\).*current device \(0\)"):
            x + 1


def test_host_copies_are_explicit(fake: FakeCuda) -> None:
    x = fake.cupy.arange(6, dtype=np.int64).reshape(2, 3)
    got = fake.cupy.asnumpy(x)
    assert type(got) is np.ndarray and got.tolist() == [[0, 1, 2], [3, 4, 5]]
    out = np.empty((2, 3), np.int64)
    assert x.get(out=out) is out and fake.cupy.asnumpy(x, stream=None, out=out) is out
    with pytest.raises(TypeError, match="float64 array cannot be obtained from int64 array"):
        x.get(out=np.empty((2, 3)))
    with pytest.raises(ValueError, match="Shape mismatch"):
        x.get(out=np.empty(6, np.int64))
    x.set(np.full((2, 3), 7, np.int64))
    assert x.get().tolist() == [[7] * 3] * 2
    with pytest.raises(TypeError, match="Only numpy.ndarray can be set"):
        x.set([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(TypeError, match="int32 array cannot be set to int64 array"):
        x.set(np.zeros((2, 3), np.int32))
    assert fake.cupy.asarray(x) is x and fake.cupy.array(x) is not x


def test_pinned_memory_is_numpy_memory_marked_pinned(fake: FakeCuda) -> None:
    a = fake.cupyx.empty_pinned((2, 4), dtype=np.float32)
    z = fake.cupyx.zeros_pinned(5)
    assert type(a) is np.ndarray and a.shape == (2, 4) and a.dtype == np.float32
    assert is_pinned(a) and is_pinned(a[1]) and is_pinned(z) and z.tolist() == [0.0] * 5
    assert not is_pinned(np.empty(3)) and fake.pinned_bytes == 32 + 40
    pool = fake.cuda.PinnedMemoryPool()
    fake.cuda.set_pinned_memory_allocator(pool.malloc)
    assert is_pinned(fake.cupyx.empty_pinned(3)) and pool.allocated == 1
    mem = fake.cuda.alloc_pinned_memory(64)
    assert mem.size == 64 and mem.ptr != 0 and pool.allocated == 2


def test_streams_and_events(fake: FakeCuda) -> None:
    default = fake.cuda.get_current_stream()
    stream = fake.cuda.Stream(non_blocking=True)
    assert stream.non_blocking and stream.ptr != default.ptr
    with stream:
        assert fake.cuda.get_current_stream() is stream
        event = fake.cuda.Event(disable_timing=True)
        event.record(stream)
    assert fake.cuda.get_current_stream() is default
    assert event.done and event.synchronize() is None
    stream.synchronize()
    assert stream.syncs == 1
    fake.hung = True
    assert not stream.record().done


def test_devices_are_the_visible_ones(fake: FakeCuda) -> None:
    assert fake.cuda.runtime.getDeviceCount() == 2
    with pytest.raises(RuntimeError, match="cudaErrorInvalidDevice"), fake.cuda.Device(2):
        pass
    with fake.cuda.Device(1):
        assert fake.cuda.Device().id == 1 and fake.cupy.zeros(1).device.id == 1
    assert fake.cupy.get_array_module(fake.cupy.zeros(1)) is fake.cupy
    assert fake.cupy.get_array_module(np.zeros(1)) is np


def test_dlpack_and_copies(fake: FakeCuda) -> None:
    import copy
    import pickle

    x = fake.cupy.arange(3.0)
    assert fake.cupy.from_dlpack(x) is x and x.__dlpack_device__() == (2, 0)
    with pytest.raises(TypeError, match="CPU arrays cannot be directly imported to CuPy"):
        fake.cupy.from_dlpack(np.arange(3.0))
    with pytest.raises(BufferError):
        np.from_dlpack(x)
    assert x.astype(np.float64, copy=False) is x
    for clone in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert isinstance(clone, fake.cupy.ndarray) and clone.get().tolist() == [0.0, 1.0, 2.0]
        assert clone.data.ptr != x.data.ptr
