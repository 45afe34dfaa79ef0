"""The owner's one-pass sum and update (``cluster.collectives.kernels``): the bytes of NumPy's
passes, refused where it does not apply, and taken by every fused all-reduce that can."""

from __future__ import annotations

import logging
import sys
import threading

import numpy as np
import pytest

from cluster.collectives import CollectiveGroup, CommunicationOptions, kernels
from cluster.collectives.epilogue import AddScaled
from cluster.collectives.options import CollectivePath, CollectiveSettings
from cluster.transport.inproc import InProcessHub

from ._threads import run_ranks

# Groups are built here with their path spelled out; the shared-memory marker only keeps the
# conftest from running every test twice.
pytestmark = [pytest.mark.shm_path, pytest.mark.timeout(120)]  # the first call compiles

pytest.importorskip("numba", reason="numba is a dependency; without it NumPy does the work")


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loops loaded, as after a first large fused call (this process's state as it was
    after the test, so that other tests' paths do not depend on the order they run in)."""
    monkeypatch.setattr(kernels, "_loaded", kernels._loaded)
    assert kernels.load_for(AddScaled(1.0), kernels.LOAD_ITEMS)


def _values(n: int, dtype: str, seed: int) -> np.ndarray:
    """Normal values with the awkward ones sprinkled in: zeros of both signs, infinities, the
    default NaN, subnormals and values near overflow."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    a = rng.standard_normal(n).astype(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.smallest_subnormal,
                        -info.smallest_subnormal, info.max, -info.max, info.tiny], dtype)
    at = rng.choice(n, size=n // 50, replace=False)
    a[at] = rng.choice(special, size=at.size)
    return a


def _numpy(operands: list[np.ndarray], scale: float, target: np.ndarray) -> np.ndarray:
    """What the collectives do without the kernel: sum in rank order, then the update."""
    total = operands[0] + operands[1]
    for other in operands[2:]:
        total += other
    want = target.copy()
    AddScaled(scale)(want, total)
    return want


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("copy", [False, True])
def test_one_pass_gives_the_bytes_of_numpys_passes(dtype: str, ranks: int, copy: bool,
                                                   loaded: None) -> None:
    n = 70_001  # not a multiple of any vector width
    operands = [_values(n, dtype, seed) for seed in range(ranks)]
    # A received chunk is a read-only view of the transport's bytes.
    operands[-1] = np.frombuffer(operands[-1].tobytes(), dtype)
    kept = [o.copy() for o in operands]
    target = _values(n, dtype, 99)
    copy_to = np.full(n, 7, dtype) if copy else None
    with np.errstate(all="ignore"):  # overflow to inf and inf - inf are part of the test
        want = _numpy(operands, -0.1, target)
        assert kernels.sum_add_scaled(AddScaled(-0.1), operands, target, copy_to)
    assert target.tobytes() == want.tobytes()  # bitwise, NaN and signed zeros included
    if copy_to is not None:
        assert copy_to.tobytes() == want.tobytes()
    for o, k in zip(operands, kept, strict=True):
        assert o.tobytes() == k.tobytes()  # operands are only read


def _refused_cases() -> dict[str, tuple]:
    n = 1000
    f32 = [np.ones(n, np.float32), np.ones(n, np.float32)]
    odd = np.frombuffer(bytes(4 * n + 4), np.float32, count=n, offset=1)  # misaligned
    return {
        "an update it does not know": (lambda t, r: None, f32, np.zeros(n, np.float32)),
        "float16": (AddScaled(1.0), [np.ones(n, np.float16)] * 2, np.zeros(n, np.float16)),
        "integers": (AddScaled(1.0), [np.ones(n, np.int32)] * 2, np.zeros(n, np.int32)),
        "one operand": (AddScaled(1.0), f32[:1], np.zeros(n, np.float32)),
        "mixed dtypes": (AddScaled(1.0), [f32[0], np.ones(n, np.float64)],
                         np.zeros(n, np.float32)),
        "lengths differ": (AddScaled(1.0), [f32[0], np.ones(n + 1, np.float32)],
                           np.zeros(n, np.float32)),
        "strided": (AddScaled(1.0), [np.ones(2 * n, np.float32)[::2], f32[1]],
                    np.zeros(n, np.float32)),
        "misaligned": (AddScaled(1.0), [odd, f32[1]], np.zeros(n, np.float32)),
        "read-only target": (AddScaled(1.0), f32, np.frombuffer(bytes(4 * n), np.float32)),
    }


def test_only_a_large_fused_call_of_add_scaled_loads_numba(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ops = [np.ones(100, np.float32), np.ones(100, np.float32)]
    target = np.zeros(100, np.float32)
    monkeypatch.setattr(kernels, "_loaded", None)
    assert not kernels.sum_add_scaled(AddScaled(1.0), ops, target)  # nothing loaded yet
    assert not target.any()
    assert not kernels.load_for(AddScaled(1.0), kernels.LOAD_ITEMS - 1)  # too small to pay
    assert not kernels.load_for(lambda t, r: None, kernels.LOAD_ITEMS)  # not an update it runs
    assert kernels._loaded is None
    assert kernels.load_for(AddScaled(1.0), kernels.LOAD_ITEMS)
    assert kernels.sum_add_scaled(AddScaled(1.0), ops, target)  # then parts of any size
    assert (target == 2).all()


def test_a_group_loads_the_loops_before_its_first_large_fused_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "LOAD_ITEMS", 1000)
    network = CollectiveSettings(path=CollectivePath.NETWORK)
    groups = [CollectiveGroup(t, settings=network) for t in InProcessHub(2).transports]

    def body(rank: int, n: int) -> None:
        groups[rank].all_reduce_apply([np.ones(n, np.float32)], [np.zeros(n, np.float32)],
                                      AddScaled(1.0))

    run_ranks(lambda r: body(r, 999), 2)
    assert kernels._loaded is None
    run_ranks(lambda r: body(r, 1000), 2)
    assert kernels._loaded


def test_without_numba_numpy_does_the_work_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import cluster.collectives

    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.delattr(cluster.collectives, "_loops", raising=False)
    monkeypatch.setitem(sys.modules, "cluster.collectives._loops", None)  # import fails
    target = np.zeros(100, np.float32)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        assert not kernels.load_for(AddScaled(1.0), kernels.LOAD_ITEMS)
        assert not kernels.sum_add_scaled(AddScaled(1.0), [np.ones(100, np.float32)] * 2,
                                          target)
    assert kernels._loaded is False and not target.any()
    assert "run on NumPy: numba did not load" in caplog.text


@pytest.mark.parametrize("case", list(_refused_cases()))
def test_what_it_cannot_do_it_leaves_to_numpy_untouched(case: str, loaded: None) -> None:
    update, operands, target = _refused_cases()[case]
    before = target.copy()
    assert not kernels.sum_add_scaled(update, operands, target)
    assert target.tobytes() == before.tobytes()


def _fused_apply(groups: list, world: int, grads: list, params: list) -> list:
    alone = CommunicationOptions(bytes_per_pack=1)

    def body(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        groups[rank].all_reduce_apply(grads[rank], mine, AddScaled(-0.25), options=alone)
        return mine

    return run_ranks(body, world, timeout=100)


@pytest.mark.parametrize("path", ["ring", "shared memory, staged", "shared memory, single copy"])
@pytest.mark.parametrize("world", [2, 3])
def test_fused_all_reduces_take_the_one_pass_and_keep_the_bytes(
        path: str, world: int, monkeypatch: pytest.MonkeyPatch, loaded: None) -> None:
    rng = np.random.default_rng(4)
    # Each array alone: the ring fuses lone arrays only (the ring takes the large one); the
    # small shared-memory rounds below make arrays span rounds and rounds span arrays.
    sizes = [300_001, 17, 5001, 640]
    grads = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(world)]
    params = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    kept = [[g.copy() for g in gs] for gs in grads]
    compiled = kernels._loaded
    calls = [0]
    lock = threading.Lock()

    def counted(fn):
        def call(*args):
            with lock:
                calls[0] += 1
            fn(*args)
        return call


    def groups() -> list:
        hub = InProcessHub(world)
        if path == "ring":
            network = CollectiveSettings(path=CollectivePath.NETWORK)
            return [CollectiveGroup(t, settings=network, chunk_bytes=4096)
                    for t in hub.transports]
        return [CollectiveGroup(t, host_id="host0", shm_round_bytes=65536, shm_whole_bytes=64,
                                shm_single_copy=path.endswith("copy"))
                for t in hub.transports]

    monkeypatch.setattr(kernels, "_loaded", tuple(counted(f) for f in compiled))
    built = groups()
    got = _fused_apply(built, world, grads, params)
    if path != "ring":
        single = path.endswith("copy")
        assert all(g._engine.shm is not None and g._engine.shm.single_copy is single for g in built)
    assert calls[0] > 0  # the one pass ran
    monkeypatch.setattr(kernels, "_loaded", False)  # as where numba cannot load
    taken = calls[0]
    want = _fused_apply(groups(), world, grads, params)
    assert calls[0] == taken  # NumPy's passes this time
    for rank in range(world):
        for a, b in zip(got[rank], want[rank], strict=True):
            assert a.tobytes() == b.tobytes()
        for g, k in zip(grads[rank], kept[rank], strict=True):
            assert g.tobytes() == k.tobytes()
    assert not np.array_equal(got[0][0], params[0])
