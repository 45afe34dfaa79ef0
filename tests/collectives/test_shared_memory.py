"""The shared-memory path itself: hosts, the hierarchy, set-up fallbacks, cleanup, liveness.

The collective suites run on this path already (see ``conftest.py``); these tests cover what only
it has. Ranks are threads of this process; ``host_id`` splits them into logical hosts.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest

from cluster.collectives import CollectiveGroup, CommunicationOptions, ReduceOp, cost, shm_segment
from cluster.collectives.cost import HostShape
from cluster.collectives.options import CollectivePath, CollectiveSettings
from cluster.errors import PeerUnavailableError
from cluster.transport.inproc import InProcessHub

from . import _threads
from ._threads import make_groups, run_ranks
from .test_all_reduce import rank_input

pytestmark = [pytest.mark.shm_path, pytest.mark.timeout(60)]

LAYOUTS = {  # host of each rank
    "one host": [0, 0, 0, 0],
    "two by two": [0, 0, 1, 1],
    "interleaved": [0, 1, 0, 1],
    "uneven": [0, 0, 0, 1],
    "singles and a pair": [0, 1, 2, 2],
}


def _groups(hosts: list[int], **kwargs) -> tuple[InProcessHub, list[CollectiveGroup]]:
    hub = InProcessHub(len(hosts))
    kwargs = {"shm_round_bytes": 512, "shm_whole_bytes": 128, "chunk_bytes": 64, **kwargs}
    groups = [_threads.new_group(t, host_id=f"host{hosts[r]}", **kwargs)
              for r, t in enumerate(hub.transports)]
    return hub, groups


def _our_segments() -> set[str]:
    prefix = f"{shm_segment.PREFIX}.{os.getuid()}."
    return {n for n in os.listdir(shm_segment.SHM_DIR) if n.startswith(prefix)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ranks_sharing_a_host_id_form_one_host(layout: str) -> None:
    hosts = LAYOUTS[layout]
    hub, groups = _groups(hosts)
    run_ranks(lambda r: groups[r].barrier(), len(hosts))
    want = tuple(sorted(tuple(r for r, h in enumerate(hosts) if h == host) for host in set(hosts)))
    for g in groups:
        assert g.topology is not None and g.topology.hosts == want


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
@pytest.mark.parametrize("size", [0, 5, 100, 3001])
@pytest.mark.parametrize("small", [None, 0], ids=["default", "stripes"])
def test_hierarchical_all_reduce_equals_the_network_path(layout: str, op: str, size: int,
                                                         small: int | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Integers: exactly the network path's result. Floats: within rounding of NumPy, and
    bitwise identical on every rank. ``stripes``: every size crosses hosts in stripes where
    the hosts match (empty ones included), else through the leaders."""
    hosts = LAYOUTS[layout]
    world = len(hosts)
    ints = [rank_input(7, r, "int64", (size,)) for r in range(world)]
    floats = [rank_input(8, r, "float32", (size,)) for r in range(world)]
    _, groups = _groups(hosts, **({} if small is None else {"small_message_bytes": small}))
    ours = run_ranks(lambda r: (groups[r].all_reduce(ints[r], op),
                                groups[r].all_reduce(floats[r], op)), world)
    _, network = _groups(hosts, settings=CollectiveSettings(path=CollectivePath.NETWORK))
    theirs = run_ranks(lambda r: network[r].all_reduce(ints[r], op), world)
    reference = {"SUM": np.sum, "MEAN": np.mean, "MAX": np.max, "MIN": np.min}[op]
    want = reference(np.stack(floats).astype(np.float64), axis=0)
    for (got_int, got_float), net_int in zip(ours, theirs, strict=True):
        assert got_int.dtype == np.int64 and np.array_equal(got_int, net_int)
        assert got_float.dtype == np.float32
        assert got_float.tobytes() == ours[0][1].tobytes()
        np.testing.assert_allclose(got_float, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(("layout", "carriers"), [
    ("two by two", [0, 1, 2, 3]),     # hosts of the same size: every rank carries its stripe
    ("interleaved", [0, 1, 2, 3]),
    ("uneven", [0, 3]),               # else the hosts' leaders carry the host totals
    ("singles and a pair", [0, 1, 2]),
])
def test_every_rank_carries_a_stripe_across_hosts_where_the_hosts_match(layout: str,
                                                                       carriers: list[int]) -> None:
    hosts = LAYOUTS[layout]
    # Stripes from 2 KiB per rank on (the ring's threshold); a smaller call goes through the
    # leaders whatever the layout.
    _, groups = _groups(hosts, small_message_bytes=2048)
    large = [np.arange(1001, dtype=np.float64) * (r + 1) for r in range(len(hosts))]  # 8 KiB
    small = [np.full(100, r + 1.0) for r in range(len(hosts))]
    out = run_ranks(lambda r: (groups[r].all_reduce(large[r], "MEAN"),
                               groups[r].all_reduce(small[r], "SUM")), len(hosts))
    for got_large, got_small in out:
        assert got_large.tobytes() == out[0][0].tobytes()
        np.testing.assert_allclose(got_large, np.arange(1001) * 2.5)
        np.testing.assert_array_equal(got_small, np.full(100, 10.0))
    leaders = {hosts.index(h) for h in set(hosts)}  # each host's lowest rank
    for r, g in enumerate(groups):
        assert g.route_counts["all_reduce/hier"] == 2
        carried = (r in carriers) + (r in leaders)  # the large call, then the small one
        assert g.route_counts.get("hosts/all_reduce/network", 0) == carried, r


@pytest.mark.parametrize("layout", ["two by two", "interleaved"])
def test_other_collectives_across_hosts_use_the_network(layout: str) -> None:
    hosts = LAYOUTS[layout]
    _, groups = _groups(hosts)

    def body(r: int):
        g = groups[r]
        return (g.all_gather(np.full((r + 1, 2), r), axis=0), g.broadcast(np.arange(9) * r, 3),
                g.reduce_scatter(np.arange(8) + r), g.all_reduce_many([np.ones(3) * r, 2.0]))

    results = run_ranks(body, len(hosts))
    for r, (gathered, broadcast, scattered, many) in enumerate(results):
        assert np.array_equal(gathered, np.concatenate([np.full((k + 1, 2), k) for k in range(4)]))
        assert np.array_equal(broadcast, np.arange(9) * 3)
        assert np.array_equal(scattered, (4 * np.arange(8) + 6)[2 * r : 2 * r + 2])
        assert np.array_equal(many[0], np.full(3, 6.0)) and many[1] == 8.0


def test_a_long_mixed_sequence_reuses_buffers_safely() -> None:
    """Hundreds of collectives of every kind, sizes spanning many rounds, one rank slowed at
    random: a rank that ran ahead must never overwrite a buffer a slow one still reads."""
    world = 3
    hub, groups = _groups([0] * world, shm_round_bytes=192, shm_whole_bytes=96)
    rng = np.random.default_rng(0)
    plan = [(rng.choice(["ar", "ag", "bc", "rs", "bar"]), int(rng.integers(0, 200)))
            for _ in range(300)]

    def body(r: int) -> list:
        g, slow = groups[r], np.random.default_rng(r)
        out = []
        for kind, n in plan:
            if slow.random() < 0.05:
                time.sleep(0.002)
            x = np.arange(n, dtype=np.int64) * (r + 1) + n
            if kind == "ar":
                out.append(g.all_reduce(x))
            elif kind == "ag":
                out.append(g.all_gather(x[: n - r] if n > r else x[:0], axis=0))
            elif kind == "bc":
                out.append(g.broadcast(x, n % world))
            elif kind == "rs" and n:
                out.append(g.reduce_scatter(x))
            else:
                g.barrier()
        return out

    results = run_ranks(body, world, timeout=50, transports=hub.transports)
    i = 0
    for kind, n in plan:
        x = [np.arange(n, dtype=np.int64) * (r + 1) + n for r in range(world)]
        if kind == "ar":
            want = [sum(x)] * world
        elif kind == "ag":
            parts = [x[r][: n - r] if n > r else x[r][:0] for r in range(world)]
            want = [np.concatenate(parts)] * world
        elif kind == "bc":
            want = [x[n % world]] * world
        elif kind == "rs" and n:
            want = np.array_split(sum(x), world)
        else:
            continue
        for r in range(world):
            assert np.array_equal(results[r][i], want[r]), (kind, n, r)
        i += 1


def test_no_segment_is_left_in_dev_shm_once_the_group_is_set_up() -> None:
    before = _our_segments()
    _, groups = _groups([0, 0, 1, 1])
    run_ranks(lambda r: groups[r].all_reduce(np.ones(1000)), 4)
    assert all(g._engine.shm is not None for g in groups)  # shared memory is mapped and in use
    assert _our_segments() <= before


def test_no_space_in_dev_shm_falls_back_to_the_network(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    def full(size: int) -> shm_segment.Segment:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_segment.Segment, "create", staticmethod(full))
    _, groups = _groups([0, 0, 1, 1])
    with caplog.at_level(logging.WARNING):
        results = run_ranks(lambda r: groups[r].all_reduce(np.arange(10) * r), 4)
    assert all(np.array_equal(x, np.arange(10) * 6) for x in results)
    assert groups[0].topology is not None and groups[0].topology.hosts == ((0,), (1,), (2,), (3,))
    assert "No space left on device" in caplog.text and "use the network" in caplog.text


def test_a_rank_that_cannot_attach_puts_its_whole_host_on_the_network(
        monkeypatch: pytest.MonkeyPatch) -> None:
    attach = shm_segment.Segment.attach

    def picky(name: str, size: int) -> shm_segment.Segment:
        import threading

        if threading.current_thread().name == "rank-3":
            raise PermissionError(errno.EACCES, "Permission denied")
        return attach(name, size)

    monkeypatch.setattr(shm_segment.Segment, "attach", staticmethod(picky))
    before = _our_segments()
    _, groups = _groups([0, 0, 1, 1])
    results = run_ranks(lambda r: groups[r].all_reduce(np.full(700, r)), 4)
    assert all(np.array_equal(x, np.full(700, 6)) for x in results)
    assert groups[0].topology is not None and groups[0].topology.hosts == ((0, 1), (2,), (3,))
    assert groups[2]._engine.shm is None and groups[3]._engine.shm is None
    assert _our_segments() <= before  # host 1's leader unlinked its segment all the same


def test_sweep_removes_segments_whose_creator_died_and_keeps_the_rest() -> None:
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=time.sleep, args=(0,))
    child.start()
    child.join(30)
    dead_pid = child.pid
    pidns = shm_segment._pid_namespace()
    base = f"{shm_segment.PREFIX}.{os.getuid()}.{pidns}"
    dead = f"{base}.{dead_pid}.{'ab' * 8}"
    alive = f"{base}.{os.getpid()}.{'cd' * 8}"
    foreign_ns = f"{shm_segment.PREFIX}.{os.getuid()}.{pidns + 1}.{dead_pid}.{'ef' * 8}"
    paths = [os.path.join(shm_segment.SHM_DIR, n) for n in (dead, alive, foreign_ns)]
    for p in paths:
        with open(p, "wb"):
            pass
    try:
        removed = shm_segment.sweep_stale()
        assert dead in removed and not os.path.exists(paths[0])
        assert os.path.exists(paths[1]) and os.path.exists(paths[2])
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


def test_a_co_located_peer_whose_process_is_gone_is_reported_within_a_moment() -> None:
    """The pid check: a peer that vanished without its connections noticing (they are
    in-process here) is still found, naming the task."""
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=time.sleep, args=(0,))
    child.start()
    child.join(30)
    hub, groups = _groups([0, 0, 0])
    run_ranks(lambda r: groups[r].barrier(), 3)
    arena = groups[0]._engine.shm.arena  # type: ignore[union-attr]
    arena._pids[2] = child.pid  # rank 2 "died": its pid no longer exists
    start = time.monotonic()
    outcomes = run_ranks(lambda r: groups[r].all_reduce(np.ones(3)), [0], return_exceptions=True,
                         transports=hub.transports)
    assert isinstance(outcomes[0], PeerUnavailableError), outcomes
    assert outcomes[0].task == "worker:2" and f"pid {child.pid}" in str(outcomes[0])
    assert time.monotonic() - start < 2.0


def test_implementation_ring_keeps_a_group_off_shared_memory() -> None:
    hub = InProcessHub(2)
    ring = CommunicationOptions(implementation="RING")
    groups = [_threads.new_group(t, options=ring) for t in hub.transports]
    results = run_ranks(lambda r: groups[r].all_reduce(np.ones(4), ReduceOp.SUM), 2)
    assert all(np.array_equal(x, np.full(4, 2.0)) for x in results)
    assert all(g._engine.shm is None for g in groups)


@pytest.mark.parametrize("world", [2, 3])
def test_lone_arrays_share_rounds_and_keep_the_bytes_of_one_call_each(world: int) -> None:
    # Rounds of 512 B (128 float32 per round, split among the ranks): arrays span several
    # rounds and rounds span several arrays; two dtypes run one after the other.
    from cluster._update_rules import sgd_update

    def sgd(target: np.ndarray, reduced: np.ndarray) -> None:
        sgd_update(target, reduced, None, learning_rate=0.25, momentum=0.0, nesterov=False)

    specs = [(200, "float32"), (37, "float64"), (0, "float32"), (130, "float32"),
             (1000, "float64"), (129, "float32"), (64, "float32")]
    rng = np.random.default_rng(11)
    grads = [[rng.standard_normal(n).astype(dt) for n, dt in specs] for _ in range(world)]
    params = [rng.standard_normal(n).astype(dt) for n, dt in specs]
    kept = [[g.copy() for g in gs] for gs in grads]
    alone = CommunicationOptions(bytes_per_pack=1)  # every array its own pack: each one lone
    _, groups = _groups([0] * world, shm_single_copy=False)  # the staged rounds
    _, plain = _groups([0] * world)

    def together(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        groups[rank].all_reduce_apply(grads[rank], mine, sgd, "SUM", options=alone)
        return mine

    def one_by_one(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        for g, target in zip(grads[rank], mine, strict=True):
            sgd(target, plain[rank].all_reduce(g, "SUM"))
        return mine

    got = run_ranks(together, world)
    want = run_ranks(one_by_one, world)
    for rank in range(world):
        for a, b in zip(got[rank], want[rank], strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        for g, k in zip(grads[rank], kept[rank], strict=True):
            assert g.tobytes() == k.tobytes()  # values are never written
    assert all(not np.array_equal(a, p) for a, p in zip(got[0], params, strict=True) if a.size)


@pytest.mark.parametrize("in_place", [False, True])
def test_lone_arrays_of_all_reduce_many_share_rounds(in_place: bool) -> None:
    world = 3
    specs = [(200, "float32"), (37, "float64"), (130, "float32"), (1000, "float64"),
             (129, "float32")]
    rng = np.random.default_rng(12)
    values = [[rng.standard_normal(n).astype(dt) for n, dt in specs] for _ in range(world)]
    kept = [[v.copy() for v in vs] for vs in values]
    alone = CommunicationOptions(bytes_per_pack=1)
    _, groups = _groups([0] * world, shm_single_copy=False)  # the staged rounds
    _, plain = _groups([0] * world)

    def together(rank: int) -> list[np.ndarray]:
        mine = [v.copy() for v in values[rank]] if in_place else values[rank]
        return groups[rank].all_reduce_many(mine, "SUM", options=alone, in_place=in_place)

    got = run_ranks(together, world)
    want = run_ranks(lambda r: [plain[r].all_reduce(v, "SUM") for v in values[r]], world)
    for rank in range(world):
        for a, b in zip(got[rank], want[rank], strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        for v, k in zip(values[rank], kept[rank], strict=True):
            assert v.tobytes() == k.tobytes()  # the caller's values are untouched


# -- single copy: ranks read each other's arrays in place (cluster.collectives.cma) -------------


def _single_copy_case(world: int, single_copy: list[bool], in_place: bool) -> list:
    """All-reduces of three kinds on one host of ``world`` thread ranks, each rank's group made
    with ``single_copy[rank]``: what every rank got, and whether its group read in place."""
    from cluster.collectives.epilogue import AddScaled

    sgd = AddScaled(-0.25)

    rng = np.random.default_rng(5)
    specs = [(2000, "float32"), (37, "float64"), (0, "float32"), (1301, "float32"),
             (900, "float64"), (64, "float32")]
    values = [[rng.standard_normal(n).astype(dt) for n, dt in specs] for _ in range(world)]
    params = [rng.standard_normal(n).astype(dt) for n, dt in specs]
    lone = [rng.integers(-1000, 1000, 5001).astype("int64") for _ in range(world)]
    kept = [[v.copy() for v in vs] for vs in values]
    hub = InProcessHub(world)
    groups = [_threads.new_group(t, shm_round_bytes=512, shm_whole_bytes=128, chunk_bytes=64,
                                 shm_single_copy=single_copy[r])
              for r, t in enumerate(hub.transports)]
    alone = CommunicationOptions(bytes_per_pack=1)  # every array its own pack: each one lone

    def rank(r: int) -> tuple:
        g = groups[r]
        mine = [v.copy() for v in values[r]] if in_place else values[r]
        many = g.all_reduce_many(mine, "MEAN", options=alone, in_place=in_place)
        updated = [p.copy() for p in params]
        g.all_reduce_apply(values[r], updated, sgd, "SUM", options=alone)
        biggest = g.all_reduce(lone[r], "MAX")
        return many, updated, biggest, g._engine.shm.single_copy, g._engine.shm._copy_threads

    got = run_ranks(rank, world)
    for r in range(world):
        for v, k in zip(values[r], kept[r], strict=True):
            assert v.tobytes() == k.tobytes()  # the caller's values are never written
        assert np.array_equal(got[r][2], np.max(lone, axis=0))
    return got


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("cores", [2, 16], ids=["2-cores", "16-cores"])
def test_single_copy_gives_the_bytes_of_the_staged_algorithm(
        world: int, in_place: bool, cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 256 B: arrays span several blocks and blocks span several arrays. On a host of
    16 cores each rank splits its copying over 4 threads, each on a part of the range."""
    from cluster.collectives import shared_memory

    monkeypatch.setattr(shared_memory, "_READ_BLOCK_BYTES", 256)
    monkeypatch.setattr(shared_memory, "host_cores", lambda: cores)
    single = _single_copy_case(world, [True] * world, in_place)
    staged = _single_copy_case(world, [False] * world, in_place)
    for r in range(world):
        assert single[r][3] is True and staged[r][3] is False
        assert single[r][4] == (4 if cores == 16 else 1)
        for a, b in zip(_flat(single[r][:3]), _flat(staged[r][:3]), strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        for a, b in zip(_flat(single[0][:3]), _flat(single[r][:3]), strict=True):
            assert a.tobytes() == b.tobytes()  # identical on every rank


def _flat(results: tuple) -> list[np.ndarray]:
    many, updated, biggest = results[:3]
    return [*many, *updated, biggest]


def test_ranks_read_in_place_by_default_where_they_outnumber_or_spare_cores() -> None:
    """Not with exactly a core per rank: its staged rounds run in parallel, one per core."""
    from cluster.collectives.shared_memory import auto_copy_threads, auto_single_copy

    assert [auto_single_copy(n, cpus=2) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert [auto_single_copy(n, cpus=16) for n in (2, 8, 16, 32)] == [True, True, False, True]
    assert [auto_copy_threads(n, cpus=16) for n in (2, 8, 16, 32)] == [4, 2, 1, 1]


def test_one_rank_that_will_not_read_in_place_keeps_the_whole_host_staged() -> None:
    got = _single_copy_case(3, [True, False, True], in_place=False)
    assert [g[3] for g in got] == [False, False, False]
    want = _single_copy_case(3, [True] * 3, in_place=False)
    for a, b in zip(_flat(got[1][:3]), _flat(want[1][:3]), strict=True):
        assert a.tobytes() == b.tobytes()


def test_the_proof_needs_the_peers_token_at_its_address() -> None:
    from cluster.collectives import cma

    token = cma.Token()
    assert cma.prove(os.getpid(), token.address, token.value())
    assert not cma.prove(os.getpid(), token.address, bytes(16))  # another token
    ctx = mp.get_context("spawn")
    other = ctx.Process(target=time.sleep, args=(20,))
    other.start()
    try:  # a live process that is not the one that published the token
        assert not cma.prove(other.pid, token.address, token.value())
    finally:
        other.kill()
        other.join(10)
    with pytest.raises(cma.CmaError) as gone:
        cma.read(other.pid, [(token.address, token.address, 16)])
    assert gone.value.errno == errno.ESRCH
    with pytest.raises(cma.CmaError) as unmapped:
        cma.read(os.getpid(), [(token.address, 8, 16)])
    assert unmapped.value.errno == errno.EFAULT


def test_a_failed_read_names_the_peer() -> None:
    hub, groups = _groups([0, 0])
    run_ranks(lambda r: groups[r].barrier(), 2)
    shm = groups[0]._engine.shm
    assert shm is not None
    shm.arena._pids[1] = 2**22 + 12345  # no such process
    target = np.zeros(4, np.uint8)
    with pytest.raises(PeerUnavailableError) as failed:
        shm._read(1, [(target.ctypes.data, target.ctypes.data, 4)])
    assert failed.value.task == "worker:1" and "worker:1" in str(failed.value)


@pytest.mark.parametrize("single_copy", [False, True])
def test_small_arrays_on_one_host_are_updated_once_in_the_group_without_a_pack(
        single_copy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays that would share a pack on the network join the host's run of rounds instead:
    each element is updated by one rank (the update's element counts add up to the total), no
    pack is made, and every rank ends with the unfused bytes. A dtype whose arrays are small
    all together keeps its pack (one round) and is updated by every rank."""
    from cluster.collectives import _packing
    from cluster.collectives.epilogue import AddScaled

    world = 3
    specs = [(300, "float32"), (41, "float32"), (7, "float64"), (0, "float32"), (520, "float32"),
             (5, "float64")]
    rng = np.random.default_rng(8)
    grads = [[rng.standard_normal(n).astype(dt) for n, dt in specs] for _ in range(world)]
    params = [rng.standard_normal(n).astype(dt) for n, dt in specs]
    touched: dict[str, int] = {"float32": 0, "float64": 0}
    lock = threading.Lock()

    def counting(target: np.ndarray, reduced: np.ndarray) -> None:
        with lock:
            touched[target.dtype.name] += target.size
        AddScaled(-0.5)(target, reduced)

    packs = []
    real_pack = _packing.pack

    def recording(arrays, *args, **kwargs):
        packs.append([a.dtype.name for a in arrays])
        return real_pack(arrays, *args, **kwargs)

    monkeypatch.setattr(_packing, "pack", recording)
    # 861 float32 (3444 B) take the direct algorithm; 12 float64 (96 B) stay whole.
    _, groups = _groups([0] * world, shm_whole_bytes=256, shm_single_copy=single_copy)
    _, plain = _groups([0] * world, shm_whole_bytes=256, shm_single_copy=single_copy)

    def fused(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        groups[rank].all_reduce_apply(grads[rank], mine, counting)
        return mine

    def unfused(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        for target, total in zip(mine, plain[rank].all_reduce_many(grads[rank], "SUM"),
                                 strict=True):
            AddScaled(-0.5)(target, total.copy())
        return mine

    got = run_ranks(fused, world)
    assert touched == {"float32": 861, "float64": world * 12}, touched
    assert packs == [["float64", "float64"]] * world  # only the small dtype was packed
    assert all(g._engine.shm.single_copy is single_copy for g in groups)
    want = run_ranks(unfused, world)
    for rank in range(world):
        for a, b in zip(got[rank], want[rank], strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("cores", "polls"), [(2, False), (16, True)])
def test_a_group_polls_its_waits_as_its_host_shape_says(monkeypatch: pytest.MonkeyPatch,
                                                        cores: int, polls: bool) -> None:
    monkeypatch.setattr(cost, "host_cores", lambda: cores)
    hub, groups = make_groups(2)
    got = run_ranks(lambda r: groups[r].all_reduce(np.full(1000, r + 1.0)), 2)
    assert all((g == 3.0).all() for g in got)
    spins = [g._engine.shm.arena._spin for g in groups]
    assert spins == [cost.spin_seconds(HostShape(cores, 2))] * 2 and (spins[0] > 0) is polls
