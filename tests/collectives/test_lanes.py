"""The two-lane ring (``cluster.collectives.lanes``): exact results on every rank, its step
numbers and handshake, mismatches, failures mid-lane, and the lane threads' contract (first error
at once, the deadline, no write after the call ended, reuse, idle exit)."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from cluster.collectives import CommunicationOptions, _stall
from cluster.collectives import lanes as lanes_module
from cluster.collectives._engine import SETUP_SEQ
from cluster.collectives.lanes import Guard, LaneCancelledError, LaneThreads
from cluster.collectives.options import CollectivePath, CollectiveSettings
from cluster.deadline import Deadline
from cluster.errors import (
    ClusterError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerUnavailableError,
)
from cluster.transport.inproc import InProcessHub

from . import _threads
from ._threads import run_ranks

pytestmark = [pytest.mark.timeout(60), pytest.mark.network_path]

TWO = CollectiveSettings(path=CollectivePath.NETWORK, lanes=2)
ONE = CollectiveSettings(path=CollectivePath.NETWORK, lanes=1)


def _groups(world: int, settings: list[CollectiveSettings] | CollectiveSettings = TWO, **kw):
    hub = InProcessHub(world)
    per = settings if isinstance(settings, list) else [settings] * world
    return hub, [_threads.new_group(t, settings=s, **kw) for t, s in zip(hub.transports, per,
                                                                         strict=True)]


def _input(rank: int, n: int, dtype: str) -> np.ndarray:
    # Integers (as floats too): any order of reduction gives the exact same values.
    return (np.random.default_rng([rank, n]).integers(-50, 50, n)).astype(dtype)


@pytest.mark.parametrize("world", [2, 3, 4, 5])
@pytest.mark.parametrize(("n", "dtype"), [(0, "float32"), (1, "float64"), (7, "int32"),
                                          (100_003, "float32"), (250_000, "int64")])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
def test_two_lanes_reduce_exactly_and_alike_on_every_rank(world, n, dtype, op) -> None:
    hub, groups = _groups(world, small_message_bytes=0, chunk_bytes=4096)
    inputs = [_input(r, n, dtype) for r in range(world)]
    got = run_ranks(lambda r: groups[r].all_reduce(inputs[r], op), world, timeout=50,
                    transports=hub.transports)
    stack = np.stack(inputs).astype(np.float64)
    want = {"SUM": stack.sum(0), "MAX": stack.max(0), "MIN": stack.min(0),
            "MEAN": stack.sum(0) / world}[op]
    if op == "MEAN" and np.dtype(dtype).kind == "i":
        want = np.trunc(want)
    for result in got:
        assert result.dtype == np.dtype(dtype) and result.shape == (n,)
        np.testing.assert_allclose(result.astype(np.float64), want, rtol=1e-6)
        assert result.tobytes() == got[0].tobytes()
    # The caller's arrays are read, never written.
    assert all(np.array_equal(inputs[r], _input(r, n, dtype)) for r in range(world))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_two_lanes_match_one_lane_for_many_arrays_and_a_fused_update(world) -> None:
    """``all_reduce_many`` and ``all_reduce_apply`` (the ring's fused update) split across lanes
    give what one lane gives, bit for bit (integer-valued data)."""
    sizes = [300_001, 5, 131_072, 77_777]
    values = [[_input(r, n, "float32") for n in sizes] for r in range(world)]

    def run(settings: CollectiveSettings) -> tuple[list, list]:
        hub, groups = _groups(world, settings, small_message_bytes=0, chunk_bytes=8192)
        many = run_ranks(lambda r: groups[r].all_reduce_many(values[r]), world, timeout=50,
                         transports=hub.transports)
        targets = [[np.full(n, 3.0, np.float32) for n in sizes] for _ in range(world)]

        def step(target: np.ndarray, reduced: np.ndarray) -> None:
            np.subtract(target, reduced, out=target)

        run_ranks(lambda r: groups[r].all_reduce_apply(values[r], targets[r], step, "SUM"),
                  world, timeout=50, transports=hub.transports)
        return many, targets

    many_one, targets_one = run(ONE)
    many_two, targets_two = run(TWO)
    for r in range(world):
        for a, b in zip(many_one[r], many_two[r], strict=True):
            assert a.tobytes() == b.tobytes()
        for a, b in zip(targets_one[r], targets_two[r], strict=True):
            assert a.tobytes() == b.tobytes()
    assert not np.array_equal(targets_two[0][0], np.full(sizes[0], 3.0, np.float32))


def test_lanes_run_in_opposite_directions_on_lane_threads() -> None:
    """At N = 3 lane 1 sends to the left neighbour: every rank sends to both neighbours, from
    threads named for the group's lanes, with step numbers after lane 0's. (The group's set-up
    collective, which runs first on the caller's thread, is left out.)"""
    hub, groups = _groups(3, small_message_bytes=0, chunk_bytes=1 << 20)
    sent: list[tuple[int, int, int, str]] = []
    lock = threading.Lock()
    for t in hub.transports:
        original = t.send

        def spy(dst, key, payload, *, deadline, signature="", t=t, original=original):
            with lock:
                if key.seq != SETUP_SEQ:
                    sent.append((t.rank, dst, key.step, threading.current_thread().name))
            original(dst, key, payload, deadline=deadline, signature=signature)

        t.send = spy
    run_ranks(lambda r: groups[r].all_reduce(np.ones(30_000, np.float32)), 3,
              transports=hub.transports)
    for rank in range(3):
        right, left = (rank + 1) % 3, (rank - 1) % 3
        to_right = {s for r, d, s, _ in sent if r == rank and d == right}
        to_left = {s for r, d, s, _ in sent if r == rank and d == left}
        assert to_right == {0, 1, 2, 3, 4}  # the handshake, then lane 0's four steps
        assert to_left == {5, 6, 7, 8}  # lane 1's four steps, the other way round
    assert {name for r, d, s, name in sent if s > 0} == {"default-ring-lane"}


@pytest.mark.parametrize("many", [False, True], ids=["all_reduce", "all_reduce_many"])
def test_ranks_with_different_lanes_fail_with_a_mismatch_not_a_hang(many: bool) -> None:
    hub, groups = _groups(3, [TWO, ONE, TWO], small_message_bytes=0,
                          options=CommunicationOptions(timeout_seconds=20))
    x = np.ones(50_000, np.float32)
    call = (lambda r: groups[r].all_reduce_many([x, x])) if many else (
        lambda r: groups[r].all_reduce(x))
    start = time.monotonic()
    outcomes = run_ranks(call, 3, return_exceptions=True, transports=hub.transports)
    assert time.monotonic() - start < 10
    assert all(isinstance(o, ClusterError) for o in outcomes), outcomes
    mismatch = next(o for o in outcomes if isinstance(o, CollectiveMismatchError))
    assert "x2" in str(mismatch) or "lanes=2" in str(mismatch)


def test_a_rank_killed_mid_lane_fails_every_survivor_at_once() -> None:
    hub, groups = _groups(4, small_message_bytes=0, chunk_bytes=4096,
                          options=CommunicationOptions(timeout_seconds=30))
    started = threading.Event()
    original = hub.transports[0].recv

    def recv(src, key, *, deadline):
        started.set()
        return original(src, key, deadline=deadline)

    hub.transports[0].recv = recv

    def killer() -> None:
        started.wait(5)
        time.sleep(0.05)
        hub.kill(2)

    thread = threading.Thread(target=killer)
    thread.start()
    start = time.monotonic()
    outcomes = run_ranks(lambda r: groups[r].all_reduce(np.ones(2_000_000, np.float32)),
                         [0, 1, 3], return_exceptions=True, transports=hub.transports)
    thread.join()
    assert time.monotonic() - start < 10
    for o in outcomes:
        assert isinstance(o, PeerUnavailableError) and o.task == "worker:2", o


# -- the lane threads ----------------------------------------------------------------------------


def test_the_first_error_is_raised_at_once_and_no_lane_writes_afterwards() -> None:
    threads = LaneThreads("t")
    release = threading.Event()
    wrote: list[str] = []
    cancelled = threading.Event()

    def fails(guard: Guard) -> int:
        raise ValueError("lane 0 broke")

    def slow(guard: Guard) -> int:
        release.wait(5)
        try:
            with guard.writing():
                wrote.append("late")
        except LaneCancelledError:
            cancelled.set()
        return 1

    start = time.monotonic()
    with pytest.raises(ValueError, match="lane 0 broke"):
        threads.run([fails, slow], Deadline.after(10))
    assert time.monotonic() - start < 1  # not after the slow lane
    release.set()
    assert cancelled.wait(5)
    assert wrote == []


def test_a_write_in_progress_finishes_before_the_call_ends() -> None:
    threads = LaneThreads("t")
    inside = threading.Event()
    finished: list[float] = []

    def writer(guard: Guard) -> int:
        with guard.writing():
            inside.set()
            time.sleep(0.3)
            finished.append(time.monotonic())
        return 1

    def fails(guard: Guard) -> int:
        inside.wait(5)
        raise ValueError("other lane")

    with pytest.raises(ValueError):
        threads.run([writer, fails], Deadline.after(10))
    assert finished and finished[0] <= time.monotonic()


def test_lanes_write_at_the_same_time_and_the_end_waits_for_all_of_them() -> None:
    # Copy threads write disjoint parts at once: a guard that let one write at a time would
    # serialise them (each writer here waits inside its write for the other to be inside too).
    guard = Guard()
    inside = [threading.Event(), threading.Event()]
    met: list[bool] = []
    done: list[float] = []

    def writer(me: int) -> None:
        with guard.writing():
            inside[me].set()
            met.append(inside[1 - me].wait(5))
            time.sleep(0.1)
            done.append(time.monotonic())

    started = time.monotonic()
    workers = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    assert all(e.wait(5) for e in inside)
    guard.close()  # returns only once both writes have finished
    closed = time.monotonic()
    for w in workers:
        w.join(5)
    assert met == [True, True]
    assert len(done) == 2 and max(done) <= closed
    assert closed - started < 2  # the writes overlapped: no wait ran into its 5 s timeout
    with pytest.raises(LaneCancelledError):
        with guard.writing():
            pass


def test_lanes_past_the_deadline_time_out() -> None:
    threads = LaneThreads("t")
    release = threading.Event()
    with pytest.raises(CollectiveTimeoutError, match="1 still running"):
        threads.run([lambda g: 1, lambda g: int(release.wait(5))], Deadline.after(0.2))
    release.set()


def test_lane_threads_are_reused_then_end_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes_module, "IDLE_SECONDS", 0.3)
    threads = LaneThreads("reuse")
    seen: list[int] = []

    def who(guard: Guard) -> int:
        seen.append(threading.get_ident())
        return len(seen)

    assert threads.run([who, who], Deadline.after(5)) in ([1, 2], [2, 1])
    threads.run([who, who], Deadline.after(5))
    assert len(set(seen)) == 2  # the same two threads served both calls
    deadline = time.monotonic() + 5
    while any(t.name == "reuse-lane" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "idle lane threads did not end"
        time.sleep(0.05)
    assert threads.run([who], Deadline.after(5)) == [5]  # and start again when needed


def test_a_stalled_two_lane_all_reduce_names_the_missing_rank(caplog) -> None:
    """The caller waits for its lanes, not in a mailbox: the stall warning and the timeout look
    at the lanes' waits and name the rank that never called."""
    caplog.set_level(logging.WARNING, "cluster.collectives")
    previous = _stall.set_threshold(0.2)
    try:
        hub, groups = _groups(2, small_message_bytes=0)
        run_ranks(lambda r: groups[r].all_reduce(np.ones(4, np.float32)), 2)  # both call #0
        with pytest.raises(CollectiveTimeoutError) as failure:
            groups[0].all_reduce(np.ones(100_000, np.float32),
                                 options=CommunicationOptions(timeout_seconds=1.5))
    finally:
        _stall.set_threshold(previous)
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "cluster.collectives" and r.levelno == logging.WARNING]
    assert any("all_reduce #1" in w and "for worker:1" in w for w in warnings), warnings
    assert "worker:1" in str(failure.value)
