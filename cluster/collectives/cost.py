"""The message-count model of the network all-reduce algorithms: pure arithmetic, no I/O.

Two figures per algorithm and group size ``n``, both counting the mismatch handshake every
algorithm sends (one empty message to the right neighbour, see ``_exchange``), except where
the ring's and two-rank doubling's first data message carries it:

- :func:`latency_steps`: the messages on the critical path, i.e. the all-reduce's time for a
  small message when every rank has a CPU of its own, a message costs one latency ``alpha``
  and a rank sends and receives one message per step (the "one-port" model; the handshake
  travels in parallel with the first data message, so it adds nothing);
- :func:`messages`: the messages sent by all ranks together, i.e. the time when the ranks
  share a few CPUs and each message costs a fixed CPU time (many ranks on one host: the
  single-machine benchmarks and CI).

Recursive doubling minimises the first, the binomial tree the second; the ring is the
bandwidth optimum for large messages but the worst on both counts for small ones.
``tests/collectives/test_cost.py`` counts the messages the algorithms really send.

>>> [latency_steps(a, 64) for a in ALGORITHMS], [messages(a, 64) for a in ALGORITHMS]
([126, 6, 12], [8064, 448, 190])
"""

from __future__ import annotations

__all__ = ["ALGORITHMS", "latency_steps", "messages"]

ALGORITHMS = ("ring", "doubling", "tree")


def latency_steps(algorithm: str, n: int) -> int:
    """Message latencies on the critical path of a small all-reduce among ``n`` ranks.

    ring ``2 (n - 1)``; doubling ``log2 c`` with ``c`` the largest power of two <= ``n``, plus
    2 (fold-in, fold-out) when ``n > c``; tree ``2 ceil(log2 n)``.
    """
    _check(algorithm, n)
    if n == 1:
        return 0
    core = 1 << (n.bit_length() - 1)
    if algorithm == "ring":
        return 2 * (n - 1)
    if algorithm == "doubling":
        return core.bit_length() - 1 + (2 if n > core else 0)
    return 2 * (n - 1).bit_length()


def messages(algorithm: str, n: int) -> int:
    """Messages all ``n`` ranks send together in one small all-reduce (one chunk per segment),
    handshakes included.

    ring ``2 n (n - 1)`` (its first message is the handshake); doubling ``c log2 c`` plus
    ``2 (n - c)`` fold messages plus ``n`` handshakes (none at ``n = 2``, where the exchange
    carries it); tree ``2 (n - 1)`` plus ``n`` handshakes.
    """
    _check(algorithm, n)
    if n == 1:
        return 0
    core = 1 << (n.bit_length() - 1)
    if algorithm == "ring":
        return 2 * n * (n - 1)
    if algorithm == "doubling":
        handshakes = 0 if n == 2 else n
        return core * (core.bit_length() - 1) + 2 * (n - core) + handshakes
    return 2 * (n - 1) + n


def _check(algorithm: str, n: int) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; one of {ALGORITHMS}")
    if n < 1:
        raise ValueError(f"a group has at least one rank, got {n}")
