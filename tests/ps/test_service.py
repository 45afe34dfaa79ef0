"""The ParameterServer service over real gRPC on loopback: in-process servers and `python -m ps`."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from cluster.errors import (
    ClusterError,
    PeerUnavailableError,
    StaleStepError,
    SyncTimeoutError,
    UnauthenticatedError,
    VariableExistsError,
    VariableMismatchError,
    VariableNotFoundError,
)
from cluster.ps import (
    AssignMode,
    FixedShardsPartitioner,
    OptimizerSpec,
    VariableStore,
    concat,
    place,
    split,
)
from cluster.testing import loopback_cluster, tf_config
from cluster.transport.auth import Token
from cluster.transport.ps_client import PsClient
from cluster.transport.server import TaskServer
from ps.servicer import PsService

pytestmark = pytest.mark.timeout(60)

TOKEN = Token("s3cret-test-token")
F32 = np.float32


@pytest.fixture
def servers():
    """Start in-process ps servers: ``servers(n) -> [(store, address)]``; stopped afterwards."""
    started: list[TaskServer] = []

    def start(n: int = 1) -> list[tuple[VariableStore, str]]:
        out = []
        for i in range(n):
            server = TaskServer("127.0.0.1:0", TOKEN)
            store = VariableStore(f"ps:{i}")
            PsService(store, f"ps:{i}").install(server)
            server.start()
            started.append(server)
            out.append((store, server.address))
        return out

    yield start
    for server in started:
        server.stop(grace=0)


def test_round_trip(servers) -> None:
    (store, address), = servers(1)
    with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
        init = np.arange(6, dtype=F32).reshape(2, 3)
        assert ps.create("w", init, optimizer=OptimizerSpec.sgd(0.5)) == 1
        assert ps.create("w", init, optimizer=OptimizerSpec.sgd(0.5), exist_ok=True) == 1
        assert ps.push({"w": np.ones((2, 3), F32)}) == [2]
        (pulled,) = ps.pull(["w"])
        assert (pulled.name, pulled.version) == ("w", 2)
        assert pulled.value.tobytes() == (init - F32(0.5)).tobytes()
        assert ps.pull(["w"], newer_than=2) == []
        assert ps.assign("w", np.ones((2, 3), F32), AssignMode.ASSIGN_ADD) == 3
        assert store.pull(["w"])[0].value.tolist() == [[0.5, 1.5, 2.5], [3.5, 4.5, 5.5]]
        ps.create("step", np.array(7, np.int64), trainable=False)
        assert ps.pull(["step"])[0].value.dtype == np.int64


def test_store_errors_arrive_typed(servers) -> None:
    (_, address), = servers(1)
    with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
        ps.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd())
        with pytest.raises(VariableNotFoundError, match="ps:0 .*'nope'"):
            ps.pull(["nope"])
        with pytest.raises(VariableExistsError, match="w"):
            ps.create("w", np.zeros(4, F32), exist_ok=True)
        with pytest.raises(VariableMismatchError, match="dtype float64.*variable w"):
            ps.push({"w": np.zeros(3)})
        with pytest.raises(TypeError, match="cannot be sent"):
            ps.assign("w", np.zeros(3, np.complex64))
        # The server kept serving after every refusal.
        assert ps.pull(["w"])[0].version == 1


def test_sync_push_over_the_wire(servers) -> None:
    (store, address), = servers(1)
    clients = [PsClient(address, TOKEN, task="ps:0", timeout=10) for _ in range(2)]
    clients[0].create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0))
    results: list = []
    threads = [threading.Thread(target=lambda c=c, k=k: results.append(
        c.push({"w": np.full(3, k + 1, F32)}, step=0, num_contributors=2)))
        for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results == [[2], [2]]
    assert store.pull(["w"])[0].value.tolist() == [-1.5, -1.5, -1.5]  # the mean of 1 and 2
    with pytest.raises(StaleStepError, match="step 0"):
        clients[1].push({"w": np.ones(3, F32)}, step=0, num_contributors=2)
    for c in clients:
        c.close()


def test_lonely_sync_push_times_out_typed_before_the_rpc_deadline(servers) -> None:
    (_, address), = servers(1)
    with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
        ps.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0))
        with pytest.raises(SyncTimeoutError, match="step 0"):
            ps.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, timeout=1.0)


def test_first_push_sets_the_optimizer_over_the_wire(servers) -> None:
    (store, address), = servers(1)
    with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
        ps.create("w", np.zeros(3, F32))
        with pytest.raises(VariableMismatchError, match="w on ps:0, which has no optimizer"):
            ps.push({"w": np.ones(3, F32)})
        spec = OptimizerSpec.sgd(0.5, momentum=0.9)
        assert ps.push({"w": np.ones(3, F32)}, optimizer=spec) == [2]
        assert store._vars["w"].optimizer == spec
        assert store.slot("w", "momentum").tolist() == [-0.5, -0.5, -0.5]  # -lr * g
        with pytest.raises(VariableMismatchError, match="rule='adam'.*rule='sgd'"):
            ps.push({"w": np.ones(3, F32)}, optimizer=OptimizerSpec.adam())
        assert ps.push({"w": np.ones(3, F32)}) == [3]


def test_coordinated_sync_push_over_the_wire(servers) -> None:
    (store, address), = servers(1)
    with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
        ps.create("w", np.zeros(3, F32))
        sgd = OptimizerSpec.sgd(1.0)
        # no_wait: answered as soon as recorded; contributor 0 is sent (not read as "absent").
        assert ps.push({"w": np.full(3, 9.0, F32)}, step=0, num_contributors=2, contributor=0,
                       optimizer=sgd, wait=False) == [1]
        assert ps.push({"w": np.full(3, 1.0, F32)}, step=0, num_contributors=2, contributor=0,
                       wait=False) == [1]  # replaces the 9s
        with pytest.raises(ClusterError, match="without a contributor index"):
            ps.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, wait=False)
        assert ps.push({"w": np.full(3, 2.0, F32)}, step=0, num_contributors=2,
                       contributor=1) == [2]
        assert store.pull(["w"])[0].value.tolist() == [-1.5, -1.5, -1.5]  # mean of 1 and 2
        # A re-run of contributor 1's function after the step applied changes nothing.
        assert ps.push({"w": np.full(3, 7.0, F32)}, step=0, num_contributors=2,
                       contributor=1) == [2]
        assert store.pull(["w"])[0].value.tolist() == [-1.5, -1.5, -1.5]
        with pytest.raises(StaleStepError, match="step 0"):
            ps.push({"w": np.ones(3, F32)}, step=0, num_contributors=2)
        with pytest.raises(ValueError, match="contributor must be .*got 2"):
            ps.push({"w": np.ones(3, F32)}, step=1, num_contributors=2, contributor=2)


def test_indexed_mean_over_the_wire_is_independent_of_arrival_order(servers) -> None:
    grads = [np.array([1e8, 1.0, 0.1], F32), np.array([1.0, -1e8, 0.2], F32),
             np.array([-1e8, 1e8, 0.3], F32)]
    results = set()
    for (store, address), order in zip(servers(2), ([0, 1, 2], [2, 1, 0]), strict=True):
        with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
            ps.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0))
            for k in order:
                ps.push({"w": grads[k]}, step=0, num_contributors=3, contributor=k, wait=False)
        results.add(store.pull(["w"])[0].value.tobytes())
    mean = ((grads[0] + grads[1]) + grads[2]) / F32(3)  # in contributor order
    assert results == {(np.zeros(3, F32) - mean).tobytes()}


def test_wrong_token_is_unauthenticated(servers) -> None:
    (store, address), = servers(1)
    with PsClient(address, Token("wrong"), task="ps:0", timeout=5) as ps:
        with pytest.raises(UnauthenticatedError, match="ps:0"):
            ps.create("w", np.zeros(3, F32))
    with PsClient(address, None, task="ps:0", timeout=5) as ps:
        with pytest.raises(UnauthenticatedError):
            ps.pull(["w"])
    assert "w" not in store


def test_partitioned_variable_round_trips_over_two_servers(servers) -> None:
    (_, a0), (_, a1) = servers(2)
    clients = [PsClient(a, TOKEN, task=f"ps:{i}", timeout=5) for i, a in enumerate((a0, a1))]
    value = np.random.default_rng(1).standard_normal((11, 4)).astype(F32)
    plan = place([("emb", value.shape)], 2, FixedShardsPartitioner(3))
    shards = plan.shards_of("emb")
    assert [s.ps for s in shards] == [0, 1, 0]
    for shard, part in zip(shards, split(value, len(shards)), strict=True):
        clients[shard.ps].create(shard.name, part, optimizer=OptimizerSpec.sgd(0.1))
    pulled = [clients[s.ps].pull([s.name])[0].value for s in shards]
    assert concat(pulled).tobytes() == value.tobytes()
    for c in clients:
        c.close()


@pytest.mark.multiprocess
def test_real_ps_process_serves_then_dies_into_peer_unavailable(marker, task_processes) -> None:
    cluster = loopback_cluster(ps=1)
    address = cluster["ps"][0]
    proc = task_processes.python("-m", "ps", tf_config=tf_config(cluster, "ps", 0), name="ps:0",
                                 env={"CLUSTER_TOKEN": TOKEN.value, "CLUSTER_TEST_MARKER": marker})
    proc.read_until("ps:0: serving the variable store on", timeout=30)
    with PsClient(address, TOKEN, task="ps:0", timeout=5) as ps:
        ps.create("w", np.ones(4, F32), optimizer=OptimizerSpec.adam(0.1))
        ps.push({"w": np.ones(4, F32)})
        assert ps.pull(["w"])[0].version == 2
        proc.kill(signal.SIGKILL, group=True)
        proc.wait(timeout=10)
        started = time.monotonic()
        with pytest.raises(PeerUnavailableError, match=f"ps:0 \\({address}\\)") as e:
            ps.pull(["w"])
        assert time.monotonic() - started < 10
        assert (e.value.task, e.value.address) == ("ps:0", address)
