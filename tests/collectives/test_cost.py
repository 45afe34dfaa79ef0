"""The message-count model (``cost.py``) against its formulas and against the messages the
algorithms really send over the in-process transport."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from cluster.collectives import ReduceOp, cost
from cluster.collectives.cost import ALGORITHMS, HostShape, latency_steps, messages
from cluster.collectives.group import SETUP_SEQ
from cluster.collectives.options import Algorithm, CollectivePath, CollectiveSettings
from cluster.collectives.shared_memory import (
    DEFAULT_ROUND_BYTES,
    auto_single_copy,
    auto_whole_bytes,
)

from ._threads import make_groups, run_ranks

pytestmark = pytest.mark.path_independent


@pytest.mark.parametrize(
    ("n", "ring", "doubling", "tree"),
    [
        (1, 0, 0, 0),
        (2, 2, 1, 2),
        (3, 4, 3, 4),  # doubling: fold-in, one round, fold-out
        (4, 6, 2, 4),
        (5, 8, 4, 6),
        (8, 14, 3, 6),
        (64, 126, 6, 12),
        (65, 128, 8, 14),
        (128, 254, 7, 14),
        (96, 190, 8, 14),
    ],
)
def test_latency_steps_table(n: int, ring: int, doubling: int, tree: int) -> None:
    got = [latency_steps(a, n) for a in ("ring", "doubling", "tree")]
    assert got == [ring, doubling, tree]


@pytest.mark.parametrize(
    ("n", "ring", "doubling", "tree"),
    [
        (1, 0, 0, 0),
        (2, 4, 2, 4),  # doubling at two ranks: the exchange carries the handshake
        (3, 12, 7, 7),
        (4, 24, 12, 10),
        (8, 112, 32, 22),
        (64, 8064, 448, 190),
        (128, 32512, 1024, 382),
    ],
)
def test_messages_table(n: int, ring: int, doubling: int, tree: int) -> None:
    assert [messages(a, n) for a in ("ring", "doubling", "tree")] == [ring, doubling, tree]


@pytest.mark.parametrize("bad", [("butterfly", 4), ("ring", 0)])
def test_model_rejects_unknown_algorithms_and_empty_groups(bad: tuple[str, int]) -> None:
    with pytest.raises(ValueError):
        messages(*bad)
    with pytest.raises(ValueError):
        latency_steps(*bad)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [2, 3, 5, 8, 13])
def test_the_algorithms_send_what_the_model_counts(algorithm: str, n: int) -> None:
    settings = CollectiveSettings(path=CollectivePath.NETWORK, algorithm=Algorithm(algorithm))
    hub, groups = make_groups(n, settings=settings)
    sent: Counter[int] = Counter()  # messages per collective sequence number
    lock = threading.Lock()
    deliver = hub._deliver

    def counting(src, dst, key, data, signature):  # noqa: ANN001, ANN202
        with lock:
            sent[key.seq] += 1
        deliver(src, dst, key, data, signature)

    hub._deliver = counting  # type: ignore[method-assign]
    # 64 float32: one chunk per ring segment at every n here, as the model assumes.
    results = run_ranks(
        lambda r: groups[r].all_reduce(np.full(64, r, np.int64), ReduceOp.SUM),
        n, transports=hub.transports,
    )
    assert all(int(x[0]) == n * (n - 1) // 2 for x in results)
    sent.pop(SETUP_SEQ, None)  # the group's one-off setup, inside its first collective
    assert len(sent) == 1, sent  # nothing but this all-reduce went over the wire
    assert sum(sent.values()) == messages(algorithm, n)


# -- shared memory: decisions per host shape -------------------------------------------------

KIB = 1 << 10


@pytest.mark.parametrize(
    ("cores", "ranks", "whole", "single_copy"),
    [
        # 2 cores: what measures best there (bench/allreduce.py, bench/strategy.py).
        (2, 2, 16 * KIB, False),
        (2, 3, 512 * KIB, True),
        (2, 4, 512 * KIB, True),
        # 16 cores: waits are cheap; with cores to spare a rank reads in place on several
        # threads, with exactly a core per rank the staged rounds run in parallel instead.
        (16, 2, 16 * KIB, True),
        (16, 4, 8 * KIB, True),
        (16, 8, 4 * KIB, True),
        (16, 16, 2 * KIB, False),
        (16, 32, 32 * KIB, True),  # ranks take turns on cores again
    ],
)
def test_shared_memory_decisions_per_host_shape(cores: int, ranks: int, whole: int,
                                                single_copy: bool) -> None:
    shape = HostShape(cores, ranks)
    assert cost.whole_bytes(shape) == whole
    assert cost.single_copy_pays(shape, DEFAULT_ROUND_BYTES) is single_copy
    # The defaults of the shared-memory collectives are these decisions.
    assert auto_whole_bytes(ranks, cpus=cores) == whole
    assert auto_single_copy(ranks, cpus=cores) is single_copy


@pytest.mark.parametrize(("cores", "ranks"), [(2, 2), (2, 4), (16, 2), (16, 4), (16, 8)])
def test_the_small_threshold_is_where_the_modelled_costs_cross(cores: int, ranks: int) -> None:
    shape = HostShape(cores, ranks)
    whole = cost.whole_bytes(shape)
    one_round = 1 << 30  # every size below in one round
    assert cost.whole_seconds(shape, whole) <= cost.direct_seconds(shape, whole, one_round)
    assert cost.whole_seconds(shape, 2 * whole) > cost.direct_seconds(shape, 2 * whole,
                                                                      one_round)


def test_a_wait_costs_a_scheduler_turn_only_where_ranks_outnumber_cores() -> None:
    free = [cost.wait_seconds(HostShape(16, n)) for n in (2, 4, 8, 16)]
    assert free == [cost.MEASURED.wait_s] * 4
    shared = [cost.wait_seconds(HostShape(2, n)) for n in (3, 4, 8)]
    assert shared == sorted(shared) and shared[0] > 10 * free[0]
    assert cost.wait_seconds(HostShape(2, 4)) == cost.MEASURED.shared_wait_s
    # Faster copies (a server core) lower the small threshold; dearer waits raise it.
    fast = cost.HostCosts(move_bytes_per_s=4 * cost.MEASURED.move_bytes_per_s)
    slow_waits = cost.HostCosts(wait_s=8 * cost.MEASURED.wait_s)
    shape = HostShape(16, 4)
    assert cost.whole_bytes(shape, fast) > cost.whole_bytes(shape)
    assert cost.whole_bytes(shape, slow_waits) > cost.whole_bytes(shape)


def test_one_rank_never_reads_in_place_and_shapes_are_validated() -> None:
    assert not cost.single_copy_pays(HostShape(2, 1), DEFAULT_ROUND_BYTES)
    assert HostShape(16, 4).cores_per_rank == 4.0 and HostShape(2, 4).share == 2.0
    with pytest.raises(ValueError, match="HostShape.ranks"):
        HostShape(2, 0)
    with pytest.raises(ValueError, match="HostShape.cores"):
        HostShape(0, 2)


# -- the network ring on one host ----------------------------------------------------------------

MIB = 1 << 20


@pytest.mark.parametrize(("cores", "ranks", "pipelines", "lanes_64m"), [
    (2, 2, True, 1), (2, 3, False, 1), (2, 4, False, 1),
    (16, 2, True, 2), (16, 4, True, 2), (16, 8, True, 2), (16, 16, True, 1), (16, 32, False, 1),
])
def test_ring_decisions_per_host_shape(cores: int, ranks: int, pipelines: bool,
                                       lanes_64m: int) -> None:
    shape = HostShape(cores, ranks)
    assert cost.ring_pipelines(shape) is pipelines
    assert cost.ring_lanes(shape, 64 * MIB) == lanes_64m
    assert cost.ring_lanes(shape, 16 << 10) == 1  # a hand-off costs more than a small ring


def test_the_ring_model_gives_the_two_core_figures_it_was_fitted_to() -> None:
    """64 MiB float32 over loopback TCP on the 2-core VM measured 55 ms at N = 2 and 147 ms at
    N = 4 (every thread waits for a core: the rank's whole CPU over its share of cores)."""
    assert cost.ring_seconds(HostShape(2, 2), 64 * MIB, 1) == pytest.approx(0.055, rel=0.15)
    assert cost.ring_seconds(HostShape(2, 4), 64 * MIB, 1) == pytest.approx(0.147, rel=0.15)


def test_a_second_lane_halves_the_busiest_thread_only_where_cores_are_free() -> None:
    free = HostShape(16, 4)
    one, two = (cost.ring_seconds(free, 64 * MIB, lanes) for lanes in (1, 2))
    assert two == pytest.approx(one / 2, rel=0.05)  # two senders, two receivers: half each
    # Two ranks: the peer's second connection carries the second lane.
    pair = HostShape(16, 2)
    assert cost.ring_seconds(pair, 64 * MIB, 2) == pytest.approx(
        cost.ring_seconds(pair, 64 * MIB, 1) / 2, rel=0.05)
    # Eight ranks on sixteen cores: two cores per rank carry the four busy threads' work.
    eight = HostShape(16, 8)
    assert cost.ring_seconds(eight, 64 * MIB, 1) / 2 < cost.ring_seconds(eight, 64 * MIB, 2) < \
        cost.ring_seconds(eight, 64 * MIB, 1)
    busy = HostShape(2, 2)
    assert cost.ring_seconds(busy, 64 * MIB, 2) >= cost.ring_seconds(busy, 64 * MIB, 1)
    assert cost.ring_seconds(HostShape(16, 1), 64 * MIB, 1) == 0.0


@pytest.mark.parametrize(("cores", "ranks", "polls"), [
    (2, 2, False), (2, 4, False), (16, 2, True), (16, 8, True), (16, 16, False), (16, 32, False),
])
def test_shared_memory_waits_poll_only_where_cores_are_to_spare(cores: int, ranks: int,
                                                                polls: bool) -> None:
    spin = cost.spin_seconds(HostShape(cores, ranks))
    assert (spin > 0) is polls
    assert spin <= 1e-3  # never long enough to matter where the peer is late



@pytest.mark.parametrize(("cores", "ranks", "threads"), [
    (2, 2, 1), (2, 4, 1), (16, 2, 4), (16, 4, 4), (16, 8, 2), (16, 16, 1), (16, 32, 1),
])
def test_single_copy_threads_per_host_shape(cores: int, ranks: int, threads: int) -> None:
    shape = HostShape(cores, ranks)
    assert cost.copy_threads(shape) == threads
    one = cost.single_copy_seconds(shape, 64 << 20, threads=1)
    assert cost.single_copy_seconds(shape, 64 << 20) <= one
