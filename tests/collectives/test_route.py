"""The route and network-algorithm decisions: table tests, no transport involved."""

from __future__ import annotations

import pytest

from cluster.collectives.cost import HostShape
from cluster.collectives.options import (
    Algorithm,
    CollectivePath,
    CollectiveSettings,
    CommunicationImplementation,
    CommunicationOptions,
)
from cluster.collectives.route import (
    KINDS,
    Route,
    algorithm_config,
    choose_route,
    hier_config,
    network_algorithm,
    ring_chunk_bytes,
    ring_lanes,
    shm_config,
)
from cluster.collectives.topology import Topology

pytestmark = pytest.mark.path_independent

AUTO = CollectiveSettings()
NETWORK_PATH = CollectiveSettings(path=CollectivePath.NETWORK)
FORCED_RING = CollectiveSettings(algorithm=Algorithm.RING)
FORCED_DOUBLING = CollectiveSettings(algorithm=Algorithm.DOUBLING)
DEFAULT = CommunicationOptions()
RING = CommunicationOptions(implementation=CommunicationImplementation.RING)
NCCL = CommunicationOptions(implementation=CommunicationImplementation.NCCL)

ONE_HOST = Topology(((0, 1, 2),), 0)
TWO_HOSTS = Topology(((0, 1), (2, 3)), 0)
MIXED = Topology(((0,), (1, 2)), 0)  # a rank alone on its host beside a shared host
ALONE = Topology(((0,), (1,), (2,)), 0)  # nobody shares memory (the path was off, or failed)

# -- choose_route --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topology", "settings", "options", "kind", "expected"),
    [
        # One host: every collective stays in shared memory.
        (ONE_HOST, AUTO, DEFAULT, "all_reduce", Route.LOCAL),
        (ONE_HOST, AUTO, DEFAULT, "all_gather", Route.LOCAL),
        (ONE_HOST, AUTO, DEFAULT, "broadcast", Route.LOCAL),
        (ONE_HOST, AUTO, DEFAULT, "reduce_scatter", Route.LOCAL),
        (ONE_HOST, AUTO, DEFAULT, "barrier", Route.LOCAL),
        (ONE_HOST, AUTO, NCCL, "all_reduce", Route.LOCAL),  # NCCL is AUTO for host memory
        # Several hosts: all-reduces are hierarchical, the rest use the network.
        (TWO_HOSTS, AUTO, DEFAULT, "all_reduce", Route.HIER),
        (TWO_HOSTS, AUTO, DEFAULT, "all_gather", Route.NETWORK),
        (TWO_HOSTS, AUTO, DEFAULT, "broadcast", Route.NETWORK),
        (TWO_HOSTS, AUTO, DEFAULT, "reduce_scatter", Route.NETWORK),
        (TWO_HOSTS, AUTO, DEFAULT, "barrier", Route.NETWORK),
        (MIXED, AUTO, DEFAULT, "all_reduce", Route.HIER),
        (MIXED, AUTO, DEFAULT, "barrier", Route.NETWORK),
        # Nobody shares memory: nothing to gain from a hierarchy.
        (ALONE, AUTO, DEFAULT, "all_reduce", Route.NETWORK),
        (ALONE, AUTO, DEFAULT, "broadcast", Route.NETWORK),
        # Hosts never set up (a network-only group, e.g. the leaders).
        (None, AUTO, DEFAULT, "all_reduce", Route.NETWORK),
        (None, AUTO, DEFAULT, "barrier", Route.NETWORK),
        # The switches that keep everything on the network, whatever the hosts.
        (ONE_HOST, AUTO, RING, "all_reduce", Route.NETWORK),
        (ONE_HOST, AUTO, RING, "barrier", Route.NETWORK),
        (TWO_HOSTS, AUTO, RING, "all_reduce", Route.NETWORK),
        (ONE_HOST, NETWORK_PATH, DEFAULT, "all_reduce", Route.NETWORK),
        (TWO_HOSTS, NETWORK_PATH, DEFAULT, "all_reduce", Route.NETWORK),
        (ONE_HOST, FORCED_RING, DEFAULT, "all_reduce", Route.NETWORK),
        (ONE_HOST, FORCED_DOUBLING, DEFAULT, "broadcast", Route.NETWORK),
        (TWO_HOSTS, FORCED_DOUBLING, DEFAULT, "all_reduce", Route.NETWORK),
    ],
)
def test_choose_route_table(
    topology: Topology | None,
    settings: CollectiveSettings,
    options: CommunicationOptions,
    kind: str,
    expected: Route,
) -> None:
    assert choose_route(topology, settings, options, kind) is expected


def test_choose_route_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="all_reduce_many"):
        choose_route(ONE_HOST, AUTO, DEFAULT, "all_reduce_many")  # routes as all_reduce
    assert "all_reduce" in KINDS and "all_reduce_many" not in KINDS


def test_every_rank_of_a_host_decides_alike() -> None:
    # The decision must not depend on which rank asks: ranks of one group call it alike.
    for kind in sorted(KINDS):
        routes = {choose_route(Topology(TWO_HOSTS.hosts, r), AUTO, DEFAULT, kind)
                  for r in range(4)}
        assert len(routes) == 1, kind


# -- network_algorithm ---------------------------------------------------------------------------

SMALL = 64 * 1024
CHUNK = 4 << 20


@pytest.mark.parametrize(
    ("settings", "options", "nbytes", "expected"),
    [
        (AUTO, DEFAULT, 0, "doubling"),
        (AUTO, DEFAULT, 1024, "doubling"),
        (AUTO, DEFAULT, SMALL - 1, "doubling"),
        (AUTO, DEFAULT, SMALL, f"ring/{CHUNK}"),  # the threshold itself is large
        (AUTO, DEFAULT, 1 << 30, f"ring/{CHUNK}"),
        (AUTO, RING, 0, f"ring/{CHUNK}"),  # RING: the ring at every size
        (AUTO, NCCL, 1024, f"ring/{CHUNK}"),  # no network NCCL: falls back as TF does
        (NETWORK_PATH, DEFAULT, 1024, "doubling"),  # the path alone does not pick an algorithm
        (FORCED_RING, DEFAULT, 1024, f"ring/{CHUNK}"),
        (FORCED_DOUBLING, DEFAULT, 1 << 30, "doubling"),
        (FORCED_DOUBLING, RING, 1 << 30, "doubling"),  # the forced algorithm wins over RING
    ],
)
def test_network_algorithm_table(
    settings: CollectiveSettings, options: CommunicationOptions, nbytes: int, expected: str
) -> None:
    got = network_algorithm(settings, options, nbytes, small_message_bytes=SMALL,
                            chunk_bytes=CHUNK)
    assert got == expected


def test_network_algorithm_with_no_small_messages_always_rings() -> None:
    assert network_algorithm(AUTO, DEFAULT, 0, small_message_bytes=0, chunk_bytes=8) == "ring/8"


# -- ring_chunk_bytes ----------------------------------------------------------------------------

MIB = 1 << 20


TWO_CORES, SIXTEEN_CORES = 2, 16


@pytest.mark.parametrize(
    ("nbytes", "itemsize", "world_size", "expected"),
    [
        (64 * MIB, 4, 2, CHUNK),  # two ranks: pipelined sub-chunks
        (64 * MIB, 4, 4, 16 * MIB),  # more ranks than cores: each segment whole
        (64 * MIB, 4, 3, 22369624),  # the largest segment, whole float32 items
        (1 * MIB, 4, 4, CHUNK),  # never below the group's chunk size
        (1 << 30, 4, 4, 32 * MIB),  # capped where malloc's heap ends
        (10, 4, 3, CHUNK),
        (0, 4, 4, CHUNK),
    ],
)
def test_ring_chunk_bytes_table_on_two_cores(nbytes: int, itemsize: int, world_size: int,
                                             expected: int) -> None:
    got = ring_chunk_bytes(CHUNK, nbytes, itemsize, world_size,
                           shape=HostShape(TWO_CORES, world_size))
    assert got == expected
    # Across hosts the ring always pipelines sub-chunks (a slow link needs the overlap).
    assert ring_chunk_bytes(CHUNK, nbytes, itemsize, world_size, shape=None) == CHUNK
    if world_size > 2 and nbytes <= 32 * MIB * world_size:
        # One message per segment: every segment of segments() fits in one chunk.
        assert got >= -(-nbytes // itemsize // world_size) * itemsize


@pytest.mark.parametrize(("world_size", "expected"),
                         [(2, CHUNK), (4, CHUNK), (8, CHUNK), (16, CHUNK), (32, 2 * MIB * 4)])
def test_ring_chunk_bytes_on_sixteen_cores_pipelines_while_every_rank_has_a_core(
        world_size: int, expected: int) -> None:
    # 256 MiB of float32: at 32 ranks (two per core) each 8 MiB segment travels whole.
    got = ring_chunk_bytes(CHUNK, 256 * MIB, 4, world_size,
                           shape=HostShape(SIXTEEN_CORES, world_size))
    assert got == expected


@pytest.mark.parametrize(
    ("cores", "world_size", "nbytes", "expected"),
    [
        # Two cores: every thread waits for a core, a second lane only adds work.
        (TWO_CORES, 2, 64 * MIB, 1),
        (TWO_CORES, 4, 64 * MIB, 1),
        # Sixteen cores: a rank's cores to spare take a second lane for large messages.
        (SIXTEEN_CORES, 2, 64 * MIB, 2),
        (SIXTEEN_CORES, 4, 64 * MIB, 2),
        (SIXTEEN_CORES, 8, 64 * MIB, 2),
        (SIXTEEN_CORES, 4, 64 << 10, 1),  # small: the hand-off costs more than it saves
        (SIXTEEN_CORES, 16, 64 * MIB, 1),  # a core per rank: its threads fill it already
        (SIXTEEN_CORES, 32, 64 * MIB, 1),
    ],
)
def test_ring_lanes_by_host_shape(cores: int, world_size: int, nbytes: int,
                                  expected: int) -> None:
    shape = HostShape(cores, world_size)
    assert ring_lanes(CollectiveSettings(), nbytes, shape) == expected
    assert ring_lanes(CollectiveSettings(lanes=1), nbytes, shape) == 1  # forced
    assert ring_lanes(CollectiveSettings(lanes=2), nbytes, shape) == 2
    assert ring_lanes(CollectiveSettings(), nbytes, None) == 1  # across hosts: one lane


def test_network_algorithm_names_its_lanes() -> None:
    assert network_algorithm(AUTO, DEFAULT, 1 << 30, small_message_bytes=SMALL,
                             chunk_bytes=CHUNK, lanes=2) == f"ring/{CHUNK}x2"
    assert network_algorithm(AUTO, DEFAULT, 10, small_message_bytes=SMALL,
                             chunk_bytes=CHUNK, lanes=2) == "doubling"


# -- signature text ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "options", "expected"),
    [
        (AUTO, DEFAULT, f"auto/AUTO/{SMALL}/{CHUNK}/lanes=auto"),
        (FORCED_RING, RING, f"ring/RING/{SMALL}/{CHUNK}/lanes=auto"),
        (FORCED_DOUBLING, NCCL, f"doubling/NCCL/{SMALL}/{CHUNK}/lanes=auto"),
        (CollectiveSettings(lanes=2), DEFAULT, f"auto/AUTO/{SMALL}/{CHUNK}/lanes=2"),
    ],
)
def test_algorithm_config_names_every_input_but_the_size(
    settings: CollectiveSettings, options: CommunicationOptions, expected: str
) -> None:
    got = algorithm_config(settings, options, small_message_bytes=SMALL, chunk_bytes=CHUNK)
    assert got == expected


def test_route_configs_name_the_layout_and_hosts() -> None:
    assert shm_config(1024, 256) == "shm/1024/256"
    assert shm_config(4 << 20, None) == f"shm/{4 << 20}/auto"
    got = hier_config(TWO_HOSTS, 1024, None, "auto/AUTO/1/2")
    assert got == "hier/1024/auto/0,1|2,3/striped/auto/AUTO/1/2"  # hosts of 2: each a stripe
    assert hier_config(MIXED, 64, 0, "x") == "hier/64/0/0|1,2/leaders/x"  # 1 and 2: leaders


@pytest.mark.parametrize(("hosts", "rank", "striped", "column"), [
    (((0, 1), (2, 3)), 3, True, (1, 3)),                 # two hosts of two: stripe 1
    (((0, 2), (1, 3)), 2, True, (2, 3)),                 # interleaved ranks
    (((0, 1, 2), (3, 4, 5), (6, 7, 8)), 4, True, (1, 4, 7)),
    (((0, 1, 2), (3,)), 0, False, (0, 3)),               # uneven: the leaders carry it
    (((0,), (1, 2)), 2, False, (2,)),                    # a rank alone on its host
    (((0, 1, 2, 3),), 1, False, (1,)),                   # one host: nothing crosses
    (((0,), (1,)), 1, False, (0, 1)),                    # no host shares memory
])
def test_a_topology_is_striped_when_every_host_has_the_same_ranks(hosts, rank, striped,
                                                                   column) -> None:
    topology = Topology(hosts, rank)
    assert topology.striped is striped
    assert topology.column == column
