"""Cost models of the all-reduce algorithms, pure arithmetic: the message counts of the
network algorithms, and the time of the shared-memory ones per host shape.

Network. Two figures per algorithm and group size ``n``, both counting the mismatch handshake every
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

Shared memory. A :class:`HostShape` (cores, co-located ranks) and :class:`HostCosts` (what a
wait and a moved byte cost, measured) give each algorithm's time for a message size
(:func:`whole_seconds`, :func:`direct_seconds`, :func:`single_copy_seconds`), and from them the
decisions :mod:`~cluster.collectives.shared_memory` takes by default: :func:`whole_bytes` and
:func:`single_copy_pays`. With a core per rank a wait is cheap and every rank's phases run in
parallel; where ranks take turns on cores a wait is a scheduler turn, and the algorithms with
fewer waits win.

The network ring on one host. The same :class:`HostShape` decides how the ring runs when the
network path carries co-located ranks: pipelined chunks or whole segments
(:func:`ring_pipelines`), and one lane or two (:func:`ring_lanes`, from :func:`ring_seconds`:
each rank's threads and what each of them moves).

>>> [latency_steps(a, 64) for a in ALGORITHMS], [messages(a, 64) for a in ALGORITHMS]
([126, 6, 12], [8064, 448, 190])
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.collectives.cores import host_cores

__all__ = [
    "ALGORITHMS",
    "MAX_COPY_THREADS",
    "MEASURED",
    "HostCosts",
    "HostShape",
    "copy_threads",
    "direct_seconds",
    "latency_steps",
    "messages",
    "ring_lanes",
    "ring_pipelines",
    "ring_seconds",
    "single_copy_pays",
    "single_copy_seconds",
    "spin_seconds",
    "wait_seconds",
    "whole_bytes",
    "whole_seconds",
]

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


# -- shared memory on one host: cost per machine shape ---------------------------------------


@dataclass(frozen=True)
class HostShape:
    """``ranks`` co-located ranks sharing a host's ``cores`` (:func:`~cluster.collectives.cores.
    host_cores`: the machine's, capped by a CPU quota; the same on every rank of a host, so
    every rank takes the same decisions; an affinity mask, which may differ per rank, must not
    decide an algorithm)."""

    cores: int
    ranks: int

    def __post_init__(self) -> None:
        for name in ("cores", "ranks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"HostShape.{name} must be an int >= 1, got {value!r}")

    @classmethod
    def here(cls, ranks: int) -> HostShape:
        """``ranks`` co-located ranks on this machine's cores."""
        return cls(host_cores(), ranks)

    @property
    def cores_per_rank(self) -> float:
        return self.cores / self.ranks

    @property
    def share(self) -> float:
        """How many ranks take turns on one core (1.0 with a core per rank or more)."""
        return max(1.0, self.ranks / self.cores)


@dataclass(frozen=True)
class HostCosts:
    """What one rank's steps cost on a host; the defaults were measured on a 2-core AMD EPYC VM
    with ``bench/allreduce.py`` and ``bench/strategy.py`` (see each field), and are taken as they
    are for servers: a server core copies at about the same rate (10-20 GB/s from cache), and with
    a core per rank its waits are as cheap.

    - ``move_bytes_per_s``: bytes a core moves (read plus written) per second in the NumPy
      passes of the all-reduces: 7.5e9, the slope of the 4-rank whole and direct all-reduces
      between 256 KiB and 1 MiB (0.69 ms per MiB apart, for 2.5 more moved bytes per byte and
      rank, 2 ranks per core); ``np.copyto`` copies 12.7 GB/s of 1 MiB (25 GB/s moved) here.
    - ``wait_s``: one more synchronisation when every rank has its own core, i.e. its peers run
      in lockstep and a wait mostly finds their progress already posted: 4e-6, from the 2-rank
      crossover (the direct algorithm wins from 32 KiB: 64 KiB in 0.04 ms against 0.07 ms).
    - ``shared_wait_s``: one more synchronisation when two ranks take turns on each core: the
      waiter sleeps until the scheduler runs the peer it waits for: 0.37e-3, from the 4-rank
      crossover (256 KiB 0.51 against 0.71 ms, 1 MiB 1.13 against 0.81 ms); it grows with
      :attr:`HostShape.share`.
    - ``kernel_read_s_per_byte``: what reading a peer's array in place through
      ``process_vm_readv`` costs per byte beyond a staged copy (the kernel pins the peer's pages
      and copies into a scratch that then leaves cache): 5e-11, ResNet-50's ``apply_gradients``
      at 2 ranks (~100 MB of gradients) staged in 37-42 ms, read in place in 42-50 ms.

    - ``spin_s``: how long a shared-memory wait polls before it sleeps where a host has cores to
      spare beyond its ranks (:func:`spin_seconds`): about the latency of waking a sleeping
      rank on an idle core (a 4 KiB all-reduce at N = 2 on a 16-core server, one wait, took
      0.16 ms in one run and 0.38-0.40 ms in others of the same build).

    The network ring's threads (one rank of a ring over loopback TCP, 64 MiB float32 at N = 2
    and 4, each thread's CPU from ``/proc/self/task/*/schedstat``; a rank's main thread sends
    and combines, a receiver thread per inbound connection drains it):

    - ``send_s_per_byte``: the sending thread per byte sent (``sendmsg``'s copy, and the
      loopback's TCP work the kernel charges to the sender): 0.30e-9, the main thread's 0.41 ns
      per byte of the message at N = 2 (1 byte sent, 0.5 combined) and 0.66 at N = 4 (1.5 and
      0.75), less the combines.
    - ``combine_s_per_byte``: ``np.add`` of a received chunk and the local values into scratch,
      from memory, per byte of the chunk: 0.24e-9 (4 and 16 MiB, caches flushed).
    - ``recv_s_per_byte``: a receiver thread per byte received: 0.33e-9 (0.39 ns at N = 2, 0.29 at
      N = 4).
    - ``lane_s``: handing a lane to its thread and taking its end back, per call: 1e-4.
    """

    move_bytes_per_s: float = 7.5e9
    wait_s: float = 4e-6
    shared_wait_s: float = 0.37e-3
    kernel_read_s_per_byte: float = 5e-11
    spin_s: float = 100e-6
    send_s_per_byte: float = 0.30e-9
    combine_s_per_byte: float = 0.24e-9
    recv_s_per_byte: float = 0.33e-9
    lane_s: float = 1e-4


MEASURED = HostCosts()
"""The measured costs every default decision uses."""

REFERENCE_BYTES = 64 << 20
"""The message a per-group decision (:func:`single_copy_pays`) is taken for: a large model's
gradients in one step (ResNet-50's are 100 MB, BERT-base's 440 MB)."""


def wait_seconds(shape: HostShape, costs: HostCosts = MEASURED) -> float:
    """One synchronisation of the co-located ranks: cheap with a core per rank (polled first
    where cores are to spare, :func:`spin_seconds`); with ranks outnumbering cores, the
    scheduler's turn of the peer waited for."""
    if shape.ranks <= shape.cores:
        return costs.wait_s
    return costs.shared_wait_s * shape.share / 2.0  # measured at 2 ranks per core


def spin_seconds(shape: HostShape, costs: HostCosts = MEASURED) -> float:
    """How long a shared-memory wait polls its peer's progress before sleeping on a futex.

    Where the host has cores to spare beyond its ranks (2, 4 or 8 ranks on 16 cores) a polling
    rank holds a core nobody else needs and sees its peer's progress at once, instead of
    paying an idle core's wake-up. Where ranks fill or outnumber the cores (2 or 4 on 2) the
    waits sleep at once: polling 50 us measured slower on the shared 2-core VM (4 KiB at N=2,
    four alternating pairs: 0.99-7.8 ms against 0.60-6.2 ms), as a polling rank holds the core
    that a peer the scheduler placed beside it needs.
    """
    return costs.spin_s if shape.ranks < shape.cores else 0.0


def whole_seconds(shape: HostShape, nbytes: int, costs: HostCosts = MEASURED) -> float:
    """The small all-reduce: one wait; every rank copies its value in (2 moved bytes per byte)
    and reduces all ``L`` values (``L + 1``): ``(L + 3) n`` bytes moved per rank."""
    moved = (shape.ranks + 3) * nbytes
    return wait_seconds(shape, costs) + moved * shape.share / costs.move_bytes_per_s


def direct_seconds(shape: HostShape, nbytes: int, round_bytes: int,
                   costs: HostCosts = MEASURED) -> float:
    """The staged direct all-reduce: two waits per round; per rank, copy in ``(L-1)/L n``
    (twice that moved), reduce its ``n/L`` from ``L`` parts (``n + 2n/L``), copy out
    ``(L-1)/L n`` (twice): ``(5 - 2/L) n`` bytes moved."""
    rounds = max(1, -(-nbytes // round_bytes))
    moved = (5 - 2 / shape.ranks) * nbytes
    return (2 * rounds * wait_seconds(shape, costs)
            + moved * shape.share / costs.move_bytes_per_s)


MAX_COPY_THREADS = 4
"""The most threads a rank splits a single-copy all-reduce's reads and reductions over."""


def copy_threads(shape: HostShape) -> int:
    """Threads a rank runs a single-copy all-reduce's two copying steps on: its whole cores
    (at most :data:`MAX_COPY_THREADS`). Those steps read peers' arrays in place and write only
    the rank's own output, with no synchronisation inside, so they split over threads (each on
    a part of the range) with nothing to agree on: 4 per rank for 2 or 4 ranks on 16 cores, 2
    for 8, 1 where ranks fill or outnumber the cores."""
    return max(1, min(MAX_COPY_THREADS, shape.cores // shape.ranks))


def single_copy_seconds(shape: HostShape, nbytes: int, costs: HostCosts = MEASURED,
                        threads: int | None = None) -> float:
    """The direct all-reduce reading peers in place: three waits per call, the same moved bytes
    as :func:`direct_seconds`, and the kernel's reads of ``2 (L-1)/L n`` bytes from peers,
    split over the rank's ``threads`` (:func:`copy_threads` by default)."""
    threads = copy_threads(shape) if threads is None else threads
    moved = (5 - 2 / shape.ranks) * nbytes
    read = 2 * (shape.ranks - 1) / shape.ranks * nbytes
    return (3 * wait_seconds(shape, costs)
            + (moved / costs.move_bytes_per_s + read * costs.kernel_read_s_per_byte)
            * shape.share / threads)


def whole_bytes(shape: HostShape, costs: HostCosts = MEASURED) -> int:
    """The largest power of two (1 KiB to 1 MiB) of bytes at which :func:`whole_seconds` is at
    most :func:`direct_seconds` (one round): the small all-reduce's threshold.

    The whole algorithm moves ``L - 2 + 2/L`` more bytes per byte than the direct one and saves
    one wait, so the threshold is ``wait * bandwidth / ((L - 2 + 2/L) * share)``: with a core per
    rank waits cost little and the threshold falls with ``L`` (16 KiB at 2 ranks, 8 KiB at 4,
    4 KiB at 8, on 2 cores or 16 alike); where ranks take turns on cores a wait costs a
    scheduler turn and reducing whole pays up to 512 KiB (4 ranks on 2 cores).
    """
    extra = shape.ranks - 2 + 2 / shape.ranks  # moved bytes per byte, whole over direct (>= 1)
    crossover = wait_seconds(shape, costs) * costs.move_bytes_per_s / (extra * shape.share)
    size = 1 << 10
    while size * 2 <= min(crossover, 1 << 20):
        size *= 2
    return size


def single_copy_pays(shape: HostShape, round_bytes: int, nbytes: int = REFERENCE_BYTES,
                     costs: HostCosts = MEASURED) -> bool:
    """Whether reading peers' arrays in place beats the staged rounds for ``nbytes``.

    It saves ``2 rounds - 3`` waits, pays the kernel's reads, and splits its copying over the
    rank's :func:`copy_threads`. Where ranks take turns on cores (4 ranks on 2) each wait is a
    scheduler turn and reading in place wins; with exactly a core per rank (2 ranks on 2, 16 on
    16) a wait costs microseconds and the staged rounds win, each rank copying its part into
    the arena on its own core while the others do the same; with cores to spare (2, 4 or 8
    ranks on 16) the copying runs on several threads per rank and reading in place wins again.
    One rank has nothing to read.
    """
    if shape.ranks == 1:
        return False
    return single_copy_seconds(shape, nbytes, costs) < direct_seconds(shape, nbytes,
                                                                      round_bytes, costs)


# -- the network ring among the ranks of one host ----------------------------------------------


def ring_pipelines(shape: HostShape) -> bool:
    """Whether the ring sends each segment in pipelined chunks (else whole segments).

    Pipelining overlaps a chunk's combine with the next chunk's transfer: it pays when every
    rank's threads have cores to overlap on. Where ranks outnumber cores (4 on 2) there is
    nothing to overlap with, and each extra ``sendmsg`` costs CPU the machine does not have:
    at N = 4, 64 MiB on 2 cores, 57-65 ms CPU per rank with 4 MiB chunks against 43-57 ms with
    one 16 MiB message per step; at N = 2 the pipeline wins (38 ms against 65 ms).
    """
    return shape.ranks <= shape.cores


def ring_seconds(shape: HostShape, nbytes: int, lanes: int, costs: HostCosts = MEASURED) -> float:
    """A ring all-reduce of ``nbytes`` among ``shape.ranks`` ranks of one host, with ``lanes``.

    Per rank, ``2 (N-1)/N nbytes`` are sent and received and ``(N-1)/N nbytes`` combined. A
    lane's thread sends and combines its share; each inbound connection's receiver thread
    drains its share. Two lanes arrive over two connections: at ``N >= 3`` from the left and
    from the right neighbour; at ``N = 2``, where both neighbours are the one peer, over the
    second connection the TCP data plane opens when two threads send to one peer at once. The
    time is the busiest thread's work, or all of the rank's work over its cores where threads
    outnumber them, plus the lanes' hand-offs.
    """
    n = shape.ranks
    if n == 1 or nbytes == 0:
        return 0.0
    moved = 2 * (n - 1) / n * nbytes
    main = moved * costs.send_s_per_byte + moved / 2 * costs.combine_s_per_byte
    receiving = moved * costs.recv_s_per_byte
    busiest = max(main, receiving) / lanes
    cores = shape.cores / n
    return max(busiest, (main + receiving) / cores) + (lanes - 1) * costs.lane_s


def ring_lanes(shape: HostShape, nbytes: int, costs: HostCosts = MEASURED) -> int:
    """The lanes (1 or 2) that give the lower :func:`ring_seconds` (1 on a tie).

    A second lane pays where each rank has cores to spare for its threads: 2 ranks, 4 or 8
    on 16 cores, from a few hundred KiB; never where ranks share cores (2 or 4 on 2)."""
    return 2 if ring_seconds(shape, nbytes, 2, costs) < ring_seconds(shape, nbytes, 1, costs) else 1
