"""Mismatches, dead peers, timeouts and local errors: every rank fails, none is left waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from cluster.collectives import CollectiveGroup, CommunicationOptions, ReduceOp
from cluster.collectives.options import PATH_ENV, CollectiveSettings
from cluster.deadline import Deadline
from cluster.errors import (
    ClusterError,
    CollectiveAbortedError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerUnavailableError,
)
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport
from cluster.transport.inproc import InProcessHub

from . import _threads
from ._threads import make_groups, run_ranks

Call = Callable[[CollectiveGroup, int], object]


def _all_reduce(shape: tuple[int, ...], dtype: str = "float32", op: str = "SUM") -> Call:
    return lambda g, r: g.all_reduce(np.ones(shape, dtype), op)


def _per_rank(*calls: Call) -> Call:
    """Rank r runs ``calls[r]`` (ranks beyond the list run the last one)."""
    return lambda g, r: calls[min(r, len(calls) - 1)](g, r)


def _in_order(*calls: Call) -> Call:
    def run(g: CollectiveGroup, r: int) -> list[object]:
        return [c(g, r) for c in calls]

    return run


_gather: Call = lambda g, r: g.all_gather(np.ones((2, 2), np.float32))  # noqa: E731
_reduce: Call = _all_reduce((2, 2))

MISMATCHES: dict[str, tuple[int, Call, dict]] = {
    "shape": (2, _per_rank(_all_reduce((3,)), _all_reduce((4,))), {}),
    "shape-same-size": (2, _per_rank(_all_reduce((3, 4)), _all_reduce((4, 3))), {}),
    "dtype-same-itemsize": (3, _per_rank(_all_reduce((5,)), _all_reduce((5,), "int32")), {}),
    "op": (2, _per_rank(_all_reduce((5,), op="SUM"), _all_reduce((5,), op="MAX")), {}),
    "order": (2, _per_rank(_in_order(_reduce, _gather), _in_order(_gather, _reduce)), {}),
    "kind": (3, _per_rank(_reduce, lambda g, r: g.broadcast(np.ones((2, 2), np.float32))), {}),
    "odd-rank-out-of-five": (
        5,
        _per_rank(*[_all_reduce((6,))] * 3, _all_reduce((7,)), _all_reduce((6,))),
        {},
    ),
    # Ranks 0-1 run recursive doubling and ranks 2-3 the ring (their tensors differ in size):
    # without the ring handshake each side would wait for keys the other never sends.
    "doubling-vs-ring": (
        4,
        _per_rank(_all_reduce((4,)), _all_reduce((4,)), _all_reduce((4000,))),
        {},
    ),
    # Every rank believes its left neighbour is the root: nobody sends any data.
    "broadcast-root-cycle": (3, lambda g, r: g.broadcast(np.ones(4), root=(r - 1) % 3), {}),
    "broadcast-root": (2, lambda g, r: g.broadcast(np.ones(4), root=r), {}),
    "gather-rank": (3, _per_rank(_gather, lambda g, r: g.all_gather(np.ones((2, 2, 1)))), {}),
    "many": (
        3,
        _per_rank(
            lambda g, r: g.all_reduce_many([np.ones(3), np.ones(2)]),
            lambda g, r: g.all_reduce_many([np.ones(2), np.ones(3)]),
        ),
        {},
    ),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_raises_on_every_rank(case: str) -> None:
    world, call, kwargs = MISMATCHES[case]
    hub, groups = make_groups(world, small_message_bytes=1024, chunk_bytes=64, **kwargs)
    outcomes = run_ranks(
        lambda r: call(groups[r], r), world, return_exceptions=True, transports=hub.transports
    )
    assert all(isinstance(o, CollectiveMismatchError | CollectiveAbortedError) for o in outcomes), (
        outcomes
    )
    mismatches = [o for o in outcomes if isinstance(o, CollectiveMismatchError)]
    assert mismatches, outcomes
    message = str(mismatches[0])
    assert "collective #0 of group 'default'" in message
    assert message.count("worker:") == 2 and message.count(" runs ") == 2, message
    for o in outcomes:
        if isinstance(o, CollectiveAbortedError):  # carries the root cause and who found it
            assert "CollectiveMismatchError" in str(o) and o.task.startswith("worker:")


@pytest.mark.network_path
def test_mismatch_message_names_both_tasks_and_signatures() -> None:
    hub, groups = make_groups(2, small_message_bytes=1 << 20)
    outcomes = run_ranks(
        lambda r: groups[r].all_reduce(np.ones((3, 4 + r), np.float32)), 2, return_exceptions=True
    )
    found = next(o for o in outcomes if isinstance(o, CollectiveMismatchError))
    text = str(found)
    assert "'all_reduce SUM float32[3,4] doubling'" in text
    assert "'all_reduce SUM float32[3,5] doubling'" in text
    assert "worker:0 (rank 0)" in text and "worker:1 (rank 1)" in text


@pytest.mark.network_path
def test_options_that_change_the_algorithm_are_a_mismatch() -> None:
    hub = InProcessHub(2)
    groups = [
        _threads.new_group(hub.transports[0], chunk_bytes=64, small_message_bytes=0),
        _threads.new_group(hub.transports[1], chunk_bytes=128, small_message_bytes=0),
    ]
    outcomes = run_ranks(lambda r: groups[r].all_reduce(np.ones(100)), 2, return_exceptions=True)
    assert any(isinstance(o, CollectiveMismatchError) for o in outcomes)
    assert all(isinstance(o, ClusterError) for o in outcomes)


@pytest.mark.shm_path
def test_shared_memory_mismatch_names_both_tasks_and_signatures() -> None:
    hub, groups = make_groups(2)
    outcomes = run_ranks(
        lambda r: groups[r].all_reduce(np.ones((3, 4 + r), np.float32)), 2, return_exceptions=True
    )
    found = next(o for o in outcomes if isinstance(o, CollectiveMismatchError))
    text = str(found)
    assert "collective #0 of group 'default'" in text
    assert "'all_reduce SUM float32[3,4] shm/" in text
    assert "'all_reduce SUM float32[3,5] shm/" in text
    assert "worker:0 (local rank 0)" in text and "worker:1 (local rank 1)" in text


@pytest.mark.network_path
def test_shared_memory_settings_that_differ_are_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PATH_ENV)
    hub = InProcessHub(2)
    shm = CollectiveSettings()  # the shared-memory path, whatever the test's default
    groups = [
        _threads.new_group(hub.transports[0], shm_round_bytes=1024, settings=shm),
        _threads.new_group(hub.transports[1], shm_round_bytes=2048, settings=shm),
    ]
    outcomes = run_ranks(lambda r: groups[r].all_reduce(np.ones(100)), 2, return_exceptions=True)
    assert any(isinstance(o, CollectiveMismatchError) for o in outcomes), outcomes
    assert all(isinstance(o, ClusterError) for o in outcomes)


def test_ranks_on_different_paths_are_a_mismatch() -> None:
    """One rank forces the network ring for a call the others run in shared memory (or, on the
    network path, with recursive doubling): a mismatch, never a hang."""
    hub, groups = make_groups(3)
    ring = CommunicationOptions(implementation="RING", timeout_seconds=20)
    outcomes = run_ranks(
        lambda r: groups[r].all_reduce(np.ones(100), options=ring if r == 1 else None),
        3, return_exceptions=True, transports=hub.transports,
    )
    assert any(isinstance(o, CollectiveMismatchError) for o in outcomes), outcomes
    assert all(isinstance(o, ClusterError) for o in outcomes), outcomes


def test_an_input_rejected_on_one_rank_fails_every_rank_at_once() -> None:
    """Only worker:1's input is bad: it raises its TypeError, the others fail at once (no
    deadline) with an error naming worker:1 and the error type (tests/collectives/
    test_rejected_input.py: when every rank rejects, the group survives)."""
    hub, groups = make_groups(3)
    inputs = [np.ones(4, np.float32), np.ones(4, np.int8), np.ones(4, np.float32)]
    outcomes = run_ranks(lambda r: groups[r].all_reduce(inputs[r]), 3, return_exceptions=True)
    assert isinstance(outcomes[1], TypeError)
    assert "int8" in str(outcomes[1]) and "float32" in str(outcomes[1])
    for o in (outcomes[0], outcomes[2]):
        assert isinstance(o, CollectiveAbortedError | CollectiveMismatchError), o
        assert "worker:1" in str(o) and "rejected all_reduce: TypeError" in str(o)


class _Watched(Transport):
    """Delegates to an in-process transport and signals when the collective first waits."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.rank, self.world_size = inner.rank, inner.world_size
        self.waiting = threading.Event()

    @property
    def peers(self) -> list[PeerInfo]:
        return self.inner.peers

    def send(
        self,
        dst: int,
        key: MessageKey,
        payload: bytes | bytearray | memoryview,
        *,
        deadline: Deadline,
        signature: str = "",
    ) -> None:
        self.inner.send(dst, key, payload, deadline=deadline, signature=signature)

    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        self.waiting.set()
        return self.inner.recv(src, key, deadline=deadline)

    def abort(self, reason: str) -> None:
        self.inner.abort(reason)

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("small_message_bytes", [0, 1 << 30], ids=["ring", "doubling"])
def test_a_killed_rank_raises_peer_unavailable_on_every_survivor(small_message_bytes: int) -> None:
    hub = InProcessHub(4)
    watched = [_Watched(t) for t in hub.transports]
    groups = [
        _threads.new_group(t, small_message_bytes=small_message_bytes, chunk_bytes=64)
        for t in watched
    ]
    survivors = [0, 1, 3]

    def killer() -> None:
        for r in survivors:
            watched[r].waiting.wait(5)
        hub.kill(2)  # every survivor is now inside the collective, waiting for rank 2's data

    thread = threading.Thread(target=killer)
    thread.start()
    outcomes = run_ranks(
        lambda r: groups[r].all_reduce(np.ones(1000)),
        survivors,
        return_exceptions=True,
        transports=hub.transports,
    )
    thread.join()
    for o in outcomes:
        assert isinstance(o, PeerUnavailableError), o
        assert o.task == "worker:2"
        assert "worker:2" in str(o) and "during all_reduce #0 of group 'default'" in str(o)
    # The group stays failed: the next call raises at once, without waiting.
    with pytest.raises(PeerUnavailableError):
        groups[0].barrier()


def test_a_missing_peer_times_out_and_the_others_are_aborted() -> None:
    hub, groups = make_groups(2)
    options = CommunicationOptions(timeout_seconds=0.2)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"all_reduce #0 .* timed out after 0.2 s"):
        groups[0].all_reduce(np.ones(3), options=options)  # rank 1 never calls
    assert time.monotonic() - start < 2.0
    with pytest.raises(CollectiveAbortedError, match="worker:0"):
        groups[1].all_reduce(np.ones(3))  # fails at once: rank 0 aborted the group


def test_group_timeout_option_applies_to_every_call() -> None:
    hub = InProcessHub(3)
    group = _threads.new_group(hub.transports[2], options=CommunicationOptions(timeout_seconds=0.1))
    with pytest.raises(CollectiveTimeoutError, match="worker:1"):
        group.broadcast(np.ones(3), root=1)


def test_reduce_op_strings_and_errors() -> None:
    hub, groups = make_groups(1)
    assert groups[0].all_reduce(np.ones(2), "mean").tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="unknown reduce op 'PROD'"):
        groups[0].all_reduce(np.ones(2), "PROD")
    with pytest.raises(TypeError, match="all_reduce got a value of type builtins.str"):
        groups[0].all_reduce("12", ReduceOp.SUM)  # text is no array family
    # lists convert as tf.convert_to_tensor does (int32), the one rule of cluster._family
    assert groups[0].all_reduce([1, 2], ReduceOp.SUM).dtype == np.int32
