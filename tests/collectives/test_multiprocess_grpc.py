"""Collectives across real processes on loopback (gRPC control, TCP or gRPC data), against NumPy.

One launch per group size runs a whole battery of cases (dtypes, ops, awkward sizes, shapes,
both algorithms), so the suite stays bounded; each case's inputs are a pure function of
(case, rank), so the parent recomputes the exact expected result.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from cluster.collectives.shared_memory import auto_single_copy
from cluster.deadline import Deadline
from cluster.settings import TaskSettings
from cluster.testing import run_group
from cluster.transport.api import MessageKey

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

DTYPES = ["float16", "float32", "float64", "int32", "int64"]
OPS = ["SUM", "MEAN", "MAX", "MIN"]
SIZES = [0, 1, 7, 1000, 40_000, 300_001]  # empty, below N, odd, doubling range, ring range


def _cases() -> list[tuple[str, str, tuple[int, ...]]]:
    cases = []
    for i, dtype in enumerate(DTYPES):
        for j, op in enumerate(OPS):
            size = SIZES[(i + j) % len(SIZES)]
            cases.append((dtype, op, (size,)))
    cases += [("float32", "SUM", ()), ("float64", "MAX", (3, 5, 7)), ("int64", "SUM", (2, 0, 3)),
              ("float32", "SUM", (600_007,))]
    return cases


def _input(case: int, rank: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([case, rank])
    n = int(np.prod(shape)) if shape else 1
    if np.dtype(dtype).kind == "f":
        values = rng.uniform(-8, 8, n).round(2)
    else:
        values = rng.integers(-1000, 1000, n)
    return values.astype(dtype).reshape(shape)


def _expected(case: int, world: int, dtype: str, op: str, shape: tuple[int, ...]) -> np.ndarray:
    stack = np.stack([_input(case, r, dtype, shape).astype(np.float64) for r in range(world)])
    if op == "MAX":
        return stack.max(axis=0)
    if op == "MIN":
        return stack.min(axis=0)
    total = stack.sum(axis=0)
    return total / world if op == "MEAN" else total


def _battery(transport):
    from cluster.collectives import CollectiveGroup, ReduceOp

    group = CollectiveGroup(transport, name="battery", small_message_bytes=64 << 10,
                            settings=TaskSettings.from_env().collectives)
    results = []
    for case, (dtype, op, shape) in enumerate(_cases()):
        out = group.all_reduce(_input(case, transport.rank, dtype, shape), ReduceOp[op])
        results.append((str(out.dtype), out.shape, out.tobytes()))
    gathered = group.all_gather(np.full((2, 3), transport.rank, np.int32), axis=0)
    root_value = np.arange(100_000, dtype=np.float32) * (transport.rank + 1)
    broadcast = group.broadcast(root_value, root=1)
    scattered = group.reduce_scatter(np.arange(10, dtype=np.int64) + transport.rank)
    group.barrier()
    single_copy = group.single_copy
    return results, gathered, broadcast, scattered, single_copy


@pytest.mark.parametrize(("world", "plane"), [(2, "tcp"), (3, "tcp"), (4, "tcp"), (3, "grpc")])
def test_collectives_match_numpy_and_are_bitwise_identical_across_processes(
        world: int, plane: str, collective_path: str) -> None:
    outcomes = run_group(_battery, world, timeout=100,
                         env={"CLUSTER_TOKEN": "t0k3n", "CLUSTER_DATA_PLANE": plane})
    _check_battery(outcomes, world, collective_path)


@pytest.mark.network_path
@pytest.mark.parametrize("world", [2, 3])
def test_two_lane_ring_matches_numpy_across_processes(world: int, collective_path: str) -> None:
    """The battery with the ring's two lanes forced (``CLUSTER_RING_LANES=2``) over TCP: lane 1
    runs the other way round the ring, over the connections to each rank's left neighbour."""
    outcomes = run_group(_battery, world, timeout=100,
                         env={"CLUSTER_TOKEN": "t0k3n", "CLUSTER_DATA_PLANE": "tcp",
                              "CLUSTER_RING_LANES": "2"})
    _check_battery(outcomes, world, collective_path)


def _check_battery(outcomes, world: int, collective_path: str) -> None:
    assert all(o.ok for o in outcomes), [o.traceback for o in outcomes if not o.ok]
    # On one host, the large all-reduces read each other's processes in place (cluster.
    # collectives.cma) where ranks outnumber cores, unless Yama lets a process read only its
    # descendants.
    single_copy = auto_single_copy(world) and _yama_scope() < 1
    assert [o.result[4] for o in outcomes] == [single_copy if collective_path == "shm" else None
                                               ] * world
    first = outcomes[0].result
    for o in outcomes[1:]:  # every rank received bitwise-identical all-reduce results
        assert o.result[0] == first[0]
    for case, (dtype, op, shape) in enumerate(_cases()):
        got_dtype, got_shape, raw = first[0][case]
        assert (got_dtype, got_shape) == (dtype, shape)
        got = np.frombuffer(raw, dtype).reshape(shape)
        want = _expected(case, world, dtype, op, shape)
        if np.dtype(dtype).kind == "i":
            if op == "MEAN":
                want = np.trunc(want)  # documented: integer MEAN truncates, as TF's Div
            assert np.array_equal(got.astype(np.float64), want), (case, dtype, op, shape)
        else:
            tol = 2e-2 if dtype == "float16" else 1e-5
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 8,
                                       err_msg=f"case {case}: {dtype} {op} {shape}")
    expected_gather = np.repeat(np.arange(world, dtype=np.int32), 2)[:, None] * np.ones((1, 3),
                                                                                        np.int32)
    for o in outcomes:
        _, gathered, broadcast, _, _ = o.result
        assert np.array_equal(gathered, expected_gather)
        assert np.array_equal(broadcast, np.arange(100_000, dtype=np.float32) * 2)
    full = sum(np.arange(10, dtype=np.int64) + r for r in range(world))
    assert np.array_equal(np.concatenate([o.result[3] for o in outcomes]), full)


def _yama_scope() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except OSError:
        return 0  # no Yama: the ordinary same-user check


def _all_reduce_until_victim_dies(transport, victim: int):
    from cluster.collectives import CollectiveGroup, CommunicationOptions

    group = CollectiveGroup(transport, options=CommunicationOptions(timeout_seconds=60),
                            settings=TaskSettings.from_env().collectives)
    group.barrier()
    # Die only after every survivor has left the barrier: a death poisons the whole group, so an
    # earlier one would fail the barrier itself rather than the all-reduces under test.
    ack = MessageKey("acked", 0, 0)
    if transport.rank == victim:
        for r in range(transport.world_size):
            if r != victim:
                transport.recv(r, ack, deadline=Deadline.after(10))
        os.kill(os.getpid(), signal.SIGKILL)
    transport.send(victim, ack, b"", deadline=Deadline.after(10))
    on_shm = group.topology is not None and group.topology.single_host
    start = time.monotonic()
    try:
        for _ in range(1000):
            group.all_reduce(np.ones(1 << 20, np.float32))
    except Exception as e:
        return type(e).__name__, str(e), time.monotonic() - start, on_shm
    return "no error", "", time.monotonic() - start, on_shm


def _segments() -> set[str]:
    from cluster.collectives import shm_segment

    prefix = f"{shm_segment.PREFIX}.{os.getuid()}."
    return {n for n in os.listdir(shm_segment.SHM_DIR) if n.startswith(prefix)}


def _orphans(names: set[str]) -> set[str]:
    """The segments of ``names`` whose creator (named in the segment, in this pid namespace) is
    dead: leaks. A live creator's segment belongs to another run (a second test suite, a
    training job) and is not this test's business."""
    from cluster.collectives import shm_segment

    pidns = shm_segment._pid_namespace()
    return {n for n in names
            if (m := shm_segment._NAME.match(n)) and int(m.group(2)) == pidns
            and not shm_segment.pid_alive(int(m.group(3)))}


@pytest.mark.parametrize("plane", ["tcp", "grpc"])
def test_kill_9_during_all_reduce_fails_every_survivor_naming_the_dead_task(
        plane: str, collective_path: str) -> None:
    """On the shared-memory path too (co-located processes), and kill -9 leaves nothing in
    /dev/shm."""
    _kill_9_fails_every_survivor({"CLUSTER_DATA_PLANE": plane}, collective_path)


@pytest.mark.network_path
def test_kill_9_mid_lane_fails_every_survivor_naming_the_dead_task(collective_path: str) -> None:
    """With the ring's two lanes, survivors wait on both neighbours at once: both lanes end."""
    _kill_9_fails_every_survivor({"CLUSTER_DATA_PLANE": "tcp", "CLUSTER_RING_LANES": "2"},
                                 collective_path)


def _kill_9_fails_every_survivor(env: dict[str, str], collective_path: str) -> None:
    before = _segments()
    outcomes = run_group(_all_reduce_until_victim_dies, 4, args=(2,), timeout=60, env=env)
    assert outcomes[2].exitcode == -signal.SIGKILL
    for o in (outcomes[0], outcomes[1], outcomes[3]):
        assert o.ok, o.traceback
        kind, message, elapsed, on_shm = o.result
        assert on_shm == (collective_path == "shm")
        # Across the network every survivor learns of the death itself, whoever told it first
        # (an abort of a group that failed by a loss names the loss); shared memory's abort
        # flag carries the first failure's words.
        kinds = ["PeerUnavailableError"] + (["CollectiveAbortedError"] if on_shm else [])
        assert kind in kinds, f"worker:{o.rank}: {kind}: {message}"
        assert "worker:2" in message, f"worker:{o.rank}: {message}"  # whole, not abridged
        assert elapsed < 10.0
    assert not _orphans(_segments() - before)


def _mismatched_shapes(transport):
    from cluster.collectives import CollectiveGroup

    group = CollectiveGroup(transport, settings=TaskSettings.from_env().collectives)
    try:
        # A fast rank may detect the mismatch and abort while a slow one is still leaving the
        # barrier; that one then reports the abort from there, which is the same outcome.
        group.barrier()
        group.all_reduce(np.ones(10 + (transport.rank == 1), np.float32))
    except Exception as e:
        return type(e).__name__, str(e)
    return "no error", ""


def test_shape_mismatch_between_processes_is_an_error_on_every_rank() -> None:
    outcomes = run_group(_mismatched_shapes, 3, timeout=60)
    kinds = [o.result[0] for o in outcomes]
    assert all(o.ok for o in outcomes), [o.traceback for o in outcomes]
    assert set(kinds) <= {"CollectiveMismatchError", "CollectiveAbortedError"}, outcomes
    assert "CollectiveMismatchError" in kinds
    assert all("float32[11]" in o.result[1] or "aborted" in o.result[1] for o in outcomes)
