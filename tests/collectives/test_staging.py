"""Host staging of GPU values (``cluster._staging``): pinned buffers reused per GPU and size
class, copies on a stream of their own that are waited for before anyone reads, and the
collectives' CuPy values through it, bitwise exact on both paths.

The strict fake CuPy completes every copy at once. Here (the ``fake`` fixture) an asynchronous
copy between pinned memory and a GPU on a ``cupy.cuda.Stream`` (``set`` from pinned memory,
``get(blocking=False)`` into it) runs only when that stream's work is waited for
(``synchronize``, an event recorded after it, a stream made to wait for such an event): the
latest moment CUDA allows, so code that reads a buffer before waiting, or reuses one too early,
sees stale bytes. Copies from or to pageable memory complete before the call returns (CUDA
stages them), as do copies on any other stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cluster._family import on_device_of, stage, to_host
from cluster._staging import MIN_CLASS_BYTES, Staging, size_class
from cluster.transport.inproc import InProcessHub
from tests.conftest import REPO

from . import _threads
from ._fake_cupy import FakeArray, FakeCuda, assert_same_bits, host, is_pinned
from ._threads import run_ranks

pytestmark = pytest.mark.timeout(60)


class AsyncCopies:
    """What the ``fake`` fixture adds to the fake CuPy: deferred copies on copy streams.

    ``streams``: every ``cupy.cuda.Stream`` made, each with ``copies`` (``(direction, pinned)``
    per copy) and ``waits`` (``wait_event`` calls); ``allocations``: the sizes asked of the
    pinned allocator, in order.
    """

    def __init__(self, fake: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
        self.streams: list[Any] = []
        self.allocations: list[int] = []
        cuda = fake.cuda
        base_stream, base_event = cuda.Stream, cuda.Event
        copies = self

        class CopyStream(base_stream):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.queued: list[Callable[[], None]] = []
                self.issued = 0
                self.copies: list[tuple[str, bool]] = []
                self.waits = 0
                copies.streams.append(self)

            def enqueue(self, op: Callable[[], None]) -> None:
                self.queued.append(op)
                self.issued += 1

            def run_until(self, issued: int) -> None:
                while self.queued and self.issued - len(self.queued) < issued:
                    self.queued.pop(0)()

            def synchronize(self) -> None:
                super().synchronize()
                self.run_until(self.issued)

            def wait_event(self, event: Any) -> None:
                self.waits += 1
                event.run_recorded()  # the work it waits for comes first (a legal order)

        class Event(base_event):  # type: ignore[misc, valid-type]
            def record(self, stream: Any = None) -> None:
                super().record(stream)
                self.issued = stream.issued if isinstance(stream, CopyStream) else 0

            def run_recorded(self) -> None:
                if isinstance(self.stream, CopyStream) and not fake.hung:
                    self.stream.run_until(self.issued)

            def synchronize(self) -> None:
                super().synchronize()  # raises on a hung GPU
                self.run_recorded()

            @property
            def done(self) -> bool:
                self.run_recorded()
                return not fake.hung

        get, set_ = FakeArray.get, FakeArray.set

        def deferred_get(array: FakeArray, stream: Any = None, order: str = "C",
                         out: np.ndarray | None = None, blocking: bool = True) -> np.ndarray:
            if not isinstance(stream, CopyStream):
                return get(array, stream, order, out, blocking)
            pinned = out is not None and is_pinned(out)
            stream.copies.append(("d2h", pinned))
            if blocking or not pinned:
                stream.synchronize()
                return get(array, None, order, out)
            stream.enqueue(lambda: get(array, None, order, out))
            return out

        def deferred_set(array: FakeArray, arr: np.ndarray, stream: Any = None) -> None:
            if not isinstance(stream, CopyStream):
                return set_(array, arr, stream)
            pinned = is_pinned(arr)
            stream.copies.append(("h2d", pinned))
            if not pinned:
                stream.synchronize()
                return set_(array, arr)
            stream.enqueue(lambda: set_(array, arr))  # reads ``arr`` when it runs, as DMA does
            return None

        def allocate(size: int) -> Any:
            copies.allocations.append(size)
            return cuda.PinnedMemoryPointer(-(-max(size, 1) // 1024) * 1024)  # rounded up

        monkeypatch.setattr(cuda, "Stream", CopyStream)
        monkeypatch.setattr(cuda, "Event", Event)
        monkeypatch.setattr(FakeArray, "get", deferred_get)
        monkeypatch.setattr(FakeArray, "set", deferred_set)
        cuda.set_pinned_memory_allocator(allocate)

    def all_copies(self) -> list[tuple[str, bool]]:
        return [c for stream in self.streams for c in stream.copies]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda(gpus=2).install(monkeypatch)
    fake.async_copies = AsyncCopies(fake, monkeypatch)
    return fake


def _copies(fake: FakeCuda) -> list[tuple[str, bool]]:
    return fake.async_copies.all_copies()


# -- the asynchronous copies: what makes the tests below able to fail ----------------------------


@pytest.mark.path_independent
def test_an_async_pinned_copy_runs_only_once_its_stream_is_waited_for(fake: FakeCuda) -> None:
    x = fake.array(np.arange(4, dtype=np.float32), 0)
    stream = fake.cuda.Stream(non_blocking=True)
    out = np.frombuffer(fake.cuda.alloc_pinned_memory(16), np.float32, 4)
    out[:] = -1
    x.get(stream=stream, out=out, blocking=False)
    assert out.tolist() == [-1] * 4  # not yet: nothing waited for the stream
    event = fake.cuda.Event(disable_timing=True)
    event.record(stream)
    event.synchronize()
    assert out.tolist() == [0, 1, 2, 3]
    y = fake.array(np.zeros(4, np.float32), 0)
    y.set(out, stream=stream)
    out[:] = 9  # reused before the copy ran: the device sees 9s, as a real DMA could
    stream.synchronize()
    assert host(y).tolist() == [9] * 4


# -- Staging ---------------------------------------------------------------------------------------


@pytest.mark.path_independent
@pytest.mark.parametrize(("nbytes", "cls"), [
    (0, MIN_CLASS_BYTES), (1, MIN_CLASS_BYTES), (MIN_CLASS_BYTES, MIN_CLASS_BYTES),
    (MIN_CLASS_BYTES + 1, 2 * MIN_CLASS_BYTES), (64 << 20, 64 << 20), ((64 << 20) + 1, 128 << 20),
])
def test_size_classes_are_powers_of_two_from_the_smallest(nbytes: int, cls: int) -> None:
    assert size_class(nbytes) == cls


@pytest.mark.path_independent
@pytest.mark.parametrize("layout", ["C", "F", "strided", "0-d", "empty"])
def test_to_host_is_an_exact_pinned_copy_ready_on_return(fake: FakeCuda, layout: str) -> None:
    values = np.arange(24, dtype=np.float64).reshape(4, 6) * 1.5 - 7
    source = {"C": values, "F": np.asfortranarray(values), "strided": values[:, ::2],
              "0-d": np.float64(3.25), "empty": np.zeros((0, 3))}[layout]
    x = fake.array(source, 1, order="F" if layout == "F" else "C")
    if layout == "strided":
        x = fake.array(values, 1)[:, ::2]
    staging = Staging()
    out = staging.to_host(x)
    assert type(out) is np.ndarray and out.flags.c_contiguous and out.flags.writeable
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.tobytes() == np.ascontiguousarray(source).tobytes()
    assert is_pinned(out) == (x.size > 0) and staging.is_pooled(out) == (x.size > 0)
    streams = [s for s in fake.async_copies.streams if s.non_blocking]  # staging's own
    stream = streams[0] if streams else None
    if x.size:
        assert stream is not None and stream.device_id == 1 and stream.non_blocking
        assert stream.copies == [("d2h", True)] and stream.waits == 1  # after the caller's work


@pytest.mark.path_independent
def test_a_dropped_buffer_is_handed_out_again_and_a_held_one_never(fake: FakeCuda) -> None:
    staging = Staging()
    x = fake.array(np.arange(1000, dtype=np.float32), 0)
    first = staging.to_host(x)
    address = first.ctypes.data
    held = staging.to_host(x)  # ``first`` is still held: another buffer
    assert held.ctypes.data != address and not np.shares_memory(first, held)
    view = first[10:].reshape(-1, 10)  # any view keeps the buffer
    del first
    third = staging.to_host(x * 2)
    assert not np.shares_memory(third, view) and not np.shares_memory(third, held)
    dropped = {address, third.ctypes.data}
    del view, third
    for _ in range(5):
        again = staging.to_host(x)
        assert again.ctypes.data in dropped and not np.shares_memory(again, held)
        assert again.tobytes() == host(x).tobytes()
        del again
    assert fake.async_copies.allocations == [size_class(4000)] * 3  # three held at once, at most
    assert staging.pinned_bytes == 3 * size_class(4000)


@pytest.mark.path_independent
def test_buffers_are_per_gpu_and_size_class(fake: FakeCuda) -> None:
    staging = Staging()
    small = [fake.array(np.ones(10, np.float32), d) for d in (0, 1)]
    for x in small:
        staging.to_host(x)
    staging.to_host(fake.array(np.ones(MIN_CLASS_BYTES, np.float32), 0))  # 4x the class
    assert fake.async_copies.allocations == [MIN_CLASS_BYTES, MIN_CLASS_BYTES, 4 * MIN_CLASS_BYTES]
    staging.to_host(small[1])
    assert len(fake.async_copies.allocations) == 3


@pytest.mark.path_independent
def test_the_pool_is_bounded_idle_buffers_make_room_and_the_rest_is_pageable(
        fake: FakeCuda) -> None:
    staging = Staging(max_bytes=4 * MIN_CLASS_BYTES)
    small = fake.array(np.ones(10, np.float32), 0)
    staging.to_host(small)  # idle once dropped
    big = fake.array(np.arange(MIN_CLASS_BYTES // 2, dtype=np.float64), 0)  # 4 classes
    held = staging.to_host(big)  # the idle small buffer is dropped to make room
    assert is_pinned(held) and staging.pinned_bytes == 4 * MIN_CLASS_BYTES
    over = staging.to_host(big)  # no room left while ``held`` is held: pageable, still exact
    assert not is_pinned(over) and not staging.is_pooled(over)
    assert over.tobytes() == held.tobytes() == host(big).tobytes()
    assert _copies(fake)[-1] == ("d2h", False)
    assert staging.pinned_bytes <= 4 * MIN_CLASS_BYTES
    with pytest.raises(ValueError, match="max_bytes must be an int >= 0"):
        Staging(max_bytes=-1)


@pytest.mark.path_independent
def test_to_device_is_a_fresh_exact_array_and_the_host_buffer_is_free_on_return(
        fake: FakeCuda) -> None:
    staging = Staging()
    x = fake.array(np.arange(12, dtype=np.int64).reshape(3, 4) - 5, 1)
    buffer = staging.to_host(x)
    buffer *= 3
    want = buffer.copy()
    out = staging.to_device(buffer, 1)
    buffer[...] = 0  # reused at once: the copy must have run already
    assert isinstance(out, FakeArray) and out.device.id == 1 and out.shape == (3, 4)
    assert host(out).tobytes() == want.tobytes()
    assert not np.shares_memory(host(out), buffer)
    assert ("h2d", True) in _copies(fake)
    empty = staging.to_device(np.zeros((0, 2), np.float32), 0)
    assert empty.shape == (0, 2) and empty.device.id == 0


@pytest.mark.path_independent
def test_many_values_are_copied_with_one_wait_per_gpu(fake: FakeCuda) -> None:
    staging = Staging()
    xs = [fake.array(np.full(5, i, np.float32), i % 2) for i in range(6)]
    hosts = staging.to_host_many(xs)
    assert [h.tolist() for h in hosts] == [[float(i)] * 5 for i in range(6)]
    backs = staging.to_device_many([h + 1 for h in hosts], [i % 2 for i in range(6)])
    assert [(b.device.id, host(b).tolist()) for b in backs] == \
        [(i % 2, [i + 1.0] * 5) for i in range(6)]


@pytest.mark.path_independent
def test_close_drops_the_pool_and_staging_goes_on(fake: FakeCuda) -> None:
    staging = Staging()
    x = fake.array(np.ones(100, np.float32), 0)
    staging.to_host(x)
    assert staging.pinned_bytes == MIN_CLASS_BYTES
    staging.close()
    assert staging.pinned_bytes == 0
    assert staging.to_host(x).tolist() == [1.0] * 100
    assert len(fake.async_copies.allocations) == 2


@pytest.mark.path_independent
def test_threads_staging_at_once_each_get_their_own_bytes(fake: FakeCuda) -> None:
    staging = Staging(max_bytes=3 * MIN_CLASS_BYTES)  # fewer buffers than threads: some pageable
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for step in range(30):
                x = fake.array(np.full(1000, i * 100 + step, np.float32), i % 2)
                out = staging.to_host(x)
                back = staging.to_device(out * 2, i % 2)
                assert out.tolist() == [i * 100 + step] * 1000
                assert host(back).tolist() == [2.0 * (i * 100 + step)] * 1000
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert staging.pinned_bytes <= 3 * MIN_CLASS_BYTES


@pytest.mark.path_independent
def test_the_family_helpers_use_staging_when_given(fake: FakeCuda) -> None:
    staging = Staging()
    x = fake.array(np.arange(6, dtype=np.float32).reshape(2, 3), 1)
    staged = stage(x, "all_reduce", staging)
    assert staged.owned and is_pinned(staged.array)
    assert staged.array.tolist() == host(x).tolist()
    staged.array[...] += 1
    back = staged.restore(staged.array)
    assert isinstance(back, FakeArray) and back.device.id == 1
    assert host(back).tolist() == (host(x) + 1).tolist()
    assert is_pinned(to_host(x, staging)) and not is_pinned(to_host(x))
    again = on_device_of(x, np.ones((2, 3), np.float32), staging)
    assert again.device.id == 1 and host(again).tolist() == [[1.0] * 3] * 2
    assert to_host(np.ones(2)).tolist() == [1.0, 1.0]  # NumPy: as is, staging or not


# -- through the collectives: two tasks sharing one GPU, both paths -------------------------------


def _two_ranks_on_gpu_0(fake: FakeCuda) -> list[Any]:
    hub = InProcessHub(2)
    return [_threads.new_group(t) for t in hub.transports]


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_two_ranks_on_one_gpu_all_reduce_exactly_through_pinned_staging(
        fake: FakeCuda, op: str, dtype: str, collective_path: str) -> None:
    """The layout of two tasks sharing a GPU: no NCCL between them, so CuPy values take the
    host path, staged through each group's pinned buffers; identical bytes on both ranks,
    the reduction NumPy computes; the buffers serve every later call; close drops them."""
    groups = _two_ranks_on_gpu_0(fake)
    rng = np.random.default_rng(3)
    inputs = [[(rng.standard_normal(3000) * 100).astype(dtype) for _ in range(2)]
              for _ in range(4)]

    def rank(r: int) -> list[Any]:
        out = []
        for step in range(4):
            x = fake.array(inputs[step][r], 0)
            out.append(groups[r].all_reduce(x, op))
            assert host(x).tobytes() == inputs[step][r].tobytes()  # input untouched
        return out

    results = run_ranks(rank, 2, timeout=30)
    for step in range(4):
        total = inputs[step][0] + inputs[step][1]
        want = total
        if op == "MEAN":  # integers truncate toward zero, as TensorFlow's collectives do
            want = np.trunc(total / 2) if dtype == "int32" else total / 2
        got = [results[r][step] for r in range(2)]
        assert all(isinstance(g, FakeArray) and g.device.id == 0 for g in got)
        assert_same_bits(got, want.astype(dtype))
    assert all(pinned for _, pinned in _copies(fake))  # every copy from or to pinned memory
    assert len(fake.async_copies.allocations) == 2  # one buffer per rank, reused by every step
    assert all(g._engine.staging.pinned_bytes == size_class(inputs[0][0].nbytes) for g in groups)
    for g in groups:
        g.close()
        assert g._engine.staging.pinned_bytes == 0


def test_all_reduce_many_stages_cupy_values_together_and_returns_them_on_their_gpu(
        fake: FakeCuda, collective_path: str) -> None:
    groups = _two_ranks_on_gpu_0(fake)
    values = [[np.full(7, r + i, np.float32) for i in range(3)] for r in range(2)]
    cpu = [np.full(2, r + 1.0) for r in range(2)]

    def rank(r: int) -> list[Any]:
        return groups[r].all_reduce_many([*(fake.array(v, 0) for v in values[r]), cpu[r]])

    results = run_ranks(rank, 2, timeout=30)
    for i in range(3):
        assert_same_bits([results[r][i] for r in range(2)], values[0][i] + values[1][i])
        assert all(isinstance(results[r][i], FakeArray) for r in range(2))
    assert_same_bits([results[r][3] for r in range(2)], cpu[0] + cpu[1])
    assert all(type(results[r][3]) is np.ndarray for r in range(2))
    # In through pinned buffers; back from where each result lies (small values share a pack).
    assert [c for c in _copies(fake) if c[0] == "d2h"] == [("d2h", True)] * 6


def test_gather_broadcast_and_reduce_scatter_of_gpu_values_stage_through_pinned_memory(
        fake: FakeCuda, collective_path: str) -> None:
    groups = _two_ranks_on_gpu_0(fake)
    base = np.arange(8, dtype=np.float32).reshape(4, 2)

    def rank(r: int) -> tuple[Any, ...]:
        x = fake.array(base + 10 * r, 0)
        return (groups[r].all_gather(x), groups[r].broadcast(x, 1),
                groups[r].reduce_scatter(x))

    results = run_ranks(rank, 2, timeout=30)
    assert_same_bits([g for g, _, _ in results], np.concatenate([base, base + 10]))
    assert_same_bits([b for _, b, _ in results], base + 10)
    total = base + base + 10
    for r, (_, _, part) in enumerate(results):
        assert isinstance(part, FakeArray)
        assert host(part).tobytes() == total[2 * r:2 * r + 2].tobytes()
    # In through pinned buffers; the results (new arrays of the algorithms) back from where
    # they lie.
    assert [c for c in _copies(fake) if c[0] == "d2h"] == [("d2h", True)] * 6


# -- in real processes on the fake GPU machine -----------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.path_independent
@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ["shm", "network"])
def test_two_task_processes_sharing_a_gpu_reduce_exactly_on_both_paths(path: str) -> None:
    """``tools/gpu_check.sh``'s two-tasks check, on the fake GPU machine: two spawned tasks
    on GPU 0, every dtype, SUM and MEAN, 64 MiB; CuPy results hold NumPy's bytes on both."""
    from tests._fakegpu import run_on_fake_gpu

    done = run_on_fake_gpu(REPO / "tools" / "_gpu_checks.py", "two-tasks", path, timeout=170,
                           cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "11 cases exact and identical on both tasks" in done.stdout
    route = "local" if path == "shm" else "network"
    assert f"routes ['all_reduce/{route}']" in done.stdout
