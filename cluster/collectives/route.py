"""Which path and which network algorithm a collective takes: pure decisions, table-tested.

A :class:`~cluster.collectives.group.CollectiveGroup` decides each call in two steps, both
functions of values every rank holds alike (so every rank decides alike):

1. :func:`choose_route`: ``LOCAL`` (shared memory only: the group is on one host), ``HIER``
   (an all-reduce across hosts: reduce inside each host, the network across one leader per
   host, broadcast inside) or ``NETWORK`` (everything over the transport);
2. :func:`network_algorithm`, for what crosses the network: recursive doubling (latency-bound
   messages) or the pipelined ring; the binomial tree only when forced.

The ``*_config`` functions give the text each route adds to a collective's signature, so ranks
configured differently fail with a mismatch instead of waiting for each other's messages.

>>> from cluster.collectives.options import CollectiveSettings, CommunicationOptions
>>> choose_route(Topology(((0, 1),), 0), CollectiveSettings(), CommunicationOptions(),
...              "all_reduce")
<Route.LOCAL: 'local'>
>>> network_algorithm(CollectiveSettings(), CommunicationOptions(), 1024,
...                   small_message_bytes=64 * 1024, chunk_bytes=4 << 20)
'doubling'
"""

from __future__ import annotations

import enum

from cluster.collectives.cost import HostShape, ring_pipelines
from cluster.collectives.cost import ring_lanes as lanes_by_cost
from cluster.collectives.options import (
    Algorithm,
    CollectivePath,
    CollectiveSettings,
    CommunicationImplementation,
    CommunicationOptions,
)
from cluster.collectives.topology import Topology

__all__ = [
    "KINDS",
    "Route",
    "algorithm_config",
    "choose_route",
    "hier_config",
    "network_algorithm",
    "ring_chunk_bytes",
    "ring_lanes",
    "shm_config",
]

WHOLE_SEGMENT_MAX_BYTES = 32 << 20
"""The largest whole-segment message: glibc's largest ``mmap`` threshold, so a receive buffer
still comes from malloc's warm heap, never fresh pages."""

KINDS = frozenset({"all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier"})
"""The kinds :func:`choose_route` decides for (``all_reduce_many`` routes as ``all_reduce``)."""


class Route(enum.Enum):
    """The path of one collective call."""

    LOCAL = "local"
    HIER = "hier"
    NETWORK = "network"


def choose_route(
    topology: Topology | None,
    settings: CollectiveSettings,
    options: CommunicationOptions,
    kind: str,
) -> Route:
    """The route of a collective of ``kind`` in a group of several ranks.

    - ``topology`` is ``None`` when the group never set up its hosts (a network-only group,
      such as the leaders of a hierarchical one): ``NETWORK``.
    - ``settings.path=NETWORK``, a forced ``settings.algorithm`` or
      ``options.implementation=RING`` (the call's options) put everything on the network.
    - One host: every collective is ``LOCAL``. Several hosts of which one at least shares
      memory: all-reduces are ``HIER``, the other kinds ``NETWORK``.

    Raises ``ValueError`` for a ``kind`` outside :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; one of {sorted(KINDS)}")
    if (
        topology is None
        or settings.path is CollectivePath.NETWORK
        or settings.algorithm is not Algorithm.AUTO
        or options.implementation is CommunicationImplementation.RING
    ):
        return Route.NETWORK
    if topology.single_host:
        return Route.LOCAL
    if kind == "all_reduce" and topology.shares_memory:
        return Route.HIER
    return Route.NETWORK


def network_algorithm(
    settings: CollectiveSettings,
    options: CommunicationOptions,
    nbytes: int,
    *,
    small_message_bytes: int,
    chunk_bytes: int,
    lanes: int = 1,
) -> str:
    """``"doubling"``, ``"tree"`` or ``"ring/<chunk_bytes>"`` (``"ring/<chunk_bytes>x2"`` with
    two ``lanes``) for a network reduction of ``nbytes``.

    A forced ``settings.algorithm`` wins; else ``implementation=RING`` (or ``NCCL``, which has
    no network algorithm of its own) takes the ring at every size; else messages below
    ``small_message_bytes`` use recursive doubling and larger ones the ring. The text is part
    of the collective's signature.

    ``AUTO`` never picks the binomial tree, at any group size: it sends fewer messages in all
    (``2 (N - 1)`` against about ``N log2 N``) but waits twice as many latencies. Where every
    rank has a core (the leaders of a hierarchical group: one rank per host) doubling wins by
    the model; with N processes on one 2-core machine the two measured within 30 % of each
    other either way at N = 8-32 (run to run, with the machine's load), and only N threads
    sharing one interpreter favour the tree consistently (``bench/allreduce.py --algorithms
    doubling,tree``). Force it with ``Algorithm.TREE``.
    """
    if settings.algorithm is Algorithm.DOUBLING:
        return "doubling"
    if settings.algorithm is Algorithm.TREE:
        return "tree"
    ring_forced = settings.algorithm is Algorithm.RING or options.implementation in (
        CommunicationImplementation.RING,
        CommunicationImplementation.NCCL,
    )
    if ring_forced or nbytes >= small_message_bytes:
        return f"ring/{chunk_bytes}" + (f"x{lanes}" if lanes > 1 else "")
    return "doubling"


def ring_chunk_bytes(chunk_bytes: int, nbytes: int, itemsize: int, world_size: int, *,
                     shape: HostShape | None) -> int:
    """The ring's message size for a reduction of ``nbytes`` (items of ``itemsize``) among
    ``world_size`` ranks, given the group's ``chunk_bytes``; ``shape`` is the host's when every
    rank of the group runs on one host (the network path forced among co-located processes),
    else ``None``.

    Across hosts, or where every rank has a core (:func:`~cluster.collectives.cost.ring_pipelines`):
    ``chunk_bytes``, sub-chunks pipelined through each step (across hosts the overlap of a
    chunk's reduction with the next chunk's transfer is what a slow link needs). Where ranks
    outnumber cores, each segment travels whole (up to :data:`WHOLE_SEGMENT_MAX_BYTES`), never
    less than ``chunk_bytes``. A function of values every rank of a host holds alike, so every
    rank picks the same size.

    >>> two_cores = HostShape(cores=2, ranks=4)
    >>> ring_chunk_bytes(4 << 20, 64 << 20, 4, 4, shape=two_cores) == 16 << 20
    True
    >>> ring_chunk_bytes(4 << 20, 64 << 20, 4, 4, shape=HostShape(16, 4)) == 4 << 20
    True
    >>> ring_chunk_bytes(4 << 20, 64 << 20, 4, 4, shape=None) == 4 << 20
    True
    """
    if shape is None or ring_pipelines(shape):
        return chunk_bytes
    items = -(-nbytes // itemsize) if itemsize > 0 else nbytes
    segment = -(-items // world_size) * max(itemsize, 1)  # the largest segment, whole items
    return max(chunk_bytes, min(segment, WHOLE_SEGMENT_MAX_BYTES))


def ring_lanes(settings: CollectiveSettings, nbytes: int, shape: HostShape | None) -> int:
    """The lanes of a ring all-reduce of ``nbytes``: ``settings.lanes`` when forced; else, on
    one host (``shape``), the cost model's choice
    (:func:`~cluster.collectives.cost.ring_lanes`); across hosts one, as no rank knows the
    other hosts' cores. A function of values every rank holds alike."""
    if settings.lanes is not None:
        return settings.lanes
    if shape is None:
        return 1
    return lanes_by_cost(shape, nbytes)


def algorithm_config(
    settings: CollectiveSettings,
    options: CommunicationOptions,
    *,
    small_message_bytes: int,
    chunk_bytes: int,
    shape: HostShape | None = None,
) -> str:
    """Everything :func:`network_algorithm`, :func:`ring_chunk_bytes` and :func:`ring_lanes`
    depend on but the size, as signature text (for calls that pick an algorithm per pack):
    ranks that would decide differently fail with a mismatch instead of waiting."""
    lanes = "auto" if settings.lanes is None else settings.lanes
    cores = "" if shape is None else f"/cores={shape.cores}"
    return (f"{settings.algorithm.value}/{options.implementation.value}/"
            f"{small_message_bytes}/{chunk_bytes}/lanes={lanes}{cores}")


def shm_config(round_bytes: int, whole_bytes: int | None) -> str:
    """The ``LOCAL`` route's signature text: the shared-memory layout and algorithm switch."""
    whole = "auto" if whole_bytes is None else whole_bytes
    return f"shm/{round_bytes}/{whole}"


def hier_config(topology: Topology, round_bytes: int, whole_bytes: int | None,
                algorithm: str) -> str:
    """The ``HIER`` route's signature text: the shared-memory layout, the hosts, who carries
    the bytes across them (every rank its stripe, or the leaders) and their
    :func:`algorithm_config`."""
    whole = "auto" if whole_bytes is None else whole_bytes
    hosts = "|".join(",".join(map(str, h)) for h in topology.hosts)
    across = "striped" if topology.striped else "leaders"
    return f"hier/{round_bytes}/{whole}/{hosts}/{across}/{algorithm}"
