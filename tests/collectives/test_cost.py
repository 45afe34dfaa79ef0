"""The message-count model (``cost.py``) against its formulas and against the messages the
algorithms really send over the in-process transport."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from cluster.collectives import ReduceOp
from cluster.collectives.cost import ALGORITHMS, latency_steps, messages
from cluster.collectives.group import SETUP_SEQ
from cluster.collectives.options import Algorithm, CollectivePath, CollectiveSettings

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
