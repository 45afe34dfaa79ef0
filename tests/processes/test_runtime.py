"""cluster.runtime in one process: strict placement, peers, the collective transport, failures."""

from __future__ import annotations

import json
import socket
import threading

import numpy as np
import pytest

import cluster.runtime as runtime
from cluster._placement import resolve_placement
from cluster.collectives import CollectiveGroup, ReduceOp
from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline
from cluster.errors import (
    AddressInUseError,
    CollectiveAbortedError,
    PeerFailedError,
    PeersNotReadyError,
    TaskConfigError,
)
from cluster.settings import TaskSettings
from cluster.testing import loopback_cluster
from resolver import ClusterSpec, SimpleClusterResolver, TFConfigClusterResolver

pytestmark = pytest.mark.timeout(60)

FAST = TaskSettings(connect_timeout=10, heartbeat_interval=0.2, heartbeat_timeout=3,
                               report_timeout=2)


def resolver(cluster: dict, task_type: str, task_id: int) -> SimpleClusterResolver:
    return SimpleClusterResolver(ClusterSpec(cluster), task_type=task_type, task_id=task_id)


# -- strict placement ---------------------------------------------------------------------------

GOOD = {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}


@pytest.mark.parametrize(("cluster", "task_type", "task_id", "expected"), [
    ({}, "worker", 0, "no cluster"),
    (GOOD, None, None, "task.type is missing"),
    (GOOD, "worker", None, "task.index is missing"),
    (GOOD, "worker", 2, "not in the cluster: job 'worker' has tasks [0, 1]"),
    (GOOD, "wroker", 0, 'no job \'wroker\' (did you mean "worker"?)'),
    ({"worker": ["127.0.0.1"]}, "worker", 0, 'expected "host:port"'),
    ({"worker": ["127.0.0.1:99999"]}, "worker", 0, "port must be an integer 1-65535"),
    ({"worker": ["127.0.0.1:x"]}, "worker", 0, "port must be an integer"),
    ({"worker": {1: "127.0.0.1:2222"}}, "worker", 1, "indices must be 0..0 with no gaps"),
    ({"chief": ["a:1", "b:2"]}, "chief", 0, "at most one chief"),
    ({"master": ["a:1"]}, "master", 0, "unknown job 'master'"),
])
def test_strict_placement_refuses_with_a_clear_message(cluster, task_type, task_id,
                                                       expected) -> None:
    with pytest.raises(TaskConfigError) as info:
        resolve_placement(resolver(cluster, task_type, task_id))
    assert expected in str(info.value)


def test_placement_of_a_valid_task() -> None:
    p = resolve_placement(resolver(GOOD, "worker", 1))
    assert (p.task, p.address) == ("worker:1", "127.0.0.1:2224")
    assert [t for t, _ in p.tasks()] == ["chief:0", "worker:0", "worker:1"]


def test_kubeflow_sparse_cluster_gets_its_own_message(monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "sparseCluster": {"worker": {"1": "w1:2222"}}, "task": {"type": "worker", "index": 1}}))
    with pytest.raises(TaskConfigError, match="sparseCluster.*enableDynamicWorker"):
        resolve_placement(TFConfigClusterResolver())


def test_malformed_tf_config_becomes_a_task_config_error(monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": [42]}}')
    with pytest.raises(TaskConfigError, match=r"cluster.worker\[0\]"):
        resolve_placement(TFConfigClusterResolver())


def test_settings_from_env_name_the_bad_variable() -> None:
    assert TaskSettings.from_env({"CLUSTER_CONNECT_TIMEOUT": "2.5"}).connect_timeout \
        == 2.5
    with pytest.raises(TaskConfigError, match="CLUSTER_HEARTBEAT_TIMEOUT"):
        TaskSettings.from_env({"CLUSTER_HEARTBEAT_TIMEOUT": "-1"})


# -- runtimes in one process ----------------------------------------------------------------


@pytest.fixture
def pair():
    """chief:0 and worker:0 as two TaskRuntimes in this process."""
    cluster = loopback_cluster(chief=1, worker=1)
    rts = [runtime.TaskRuntime.create(resolver(cluster, "chief", 0), FAST),
           runtime.TaskRuntime.create(resolver(cluster, "worker", 0), FAST)]
    yield rts
    for rt in rts:
        rt.shutdown(grace=0)


def _in_threads(fns):
    results, errors = [None] * len(fns), [None] * len(fns)

    def run(i):
        try:
            results[i] = fns[i]()
        except BaseException as e:  # surfaced to the test
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results, errors


def test_peers_and_collective_transport_in_rank_order(pair) -> None:
    chief, worker = pair
    _, errors = _in_threads([chief.wait_for_peers, worker.wait_for_peers])
    assert errors == [None, None]

    def reduce(rt):
        transport = rt.collective_transport()
        assert rt.collective_transport() is transport  # cached
        return transport.rank, CollectiveGroup(transport).all_reduce(
            np.full(3, transport.rank + 1.0), ReduceOp.SUM).tolist()

    results, errors = _in_threads([lambda: reduce(chief), lambda: reduce(worker)])
    assert errors == [None, None]
    assert results == [(0, [3.0, 3.0, 3.0]), (1, [3.0, 3.0, 3.0])]


def test_report_failure_fails_the_peers_collectives_naming_the_root_cause(pair) -> None:
    chief, worker = pair
    _in_threads([chief.collective_transport, worker.collective_transport])
    seen = threading.Event()
    worker.add_failure_listener(lambda e: seen.set())
    chief.report_failure(ValueError("boom"))
    assert seen.wait(5)
    assert isinstance(worker.peer_failure, PeerFailedError)
    assert str(worker.peer_failure) == "chief:0 failed: ValueError: boom"
    with pytest.raises(CollectiveAbortedError, match="chief:0.*ValueError: boom"):
        CollectiveGroup(worker.collective_transport()).all_reduce(np.ones(2), ReduceOp.SUM)
    with pytest.raises(PeerFailedError, match="chief:0 failed: ValueError: boom"):
        worker.wait_for_peers()


def test_wait_for_peers_lists_exactly_the_tasks_that_never_came_up() -> None:
    ports = pick_free_ports("127.0.0.1", 3)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    rt = runtime.TaskRuntime.create(resolver(cluster, "worker", 0), FAST)
    try:
        with pytest.raises(PeersNotReadyError) as info:
            rt.wait_for_peers(Deadline.after(1.0))
    finally:
        rt.shutdown(grace=0)
    message = str(info.value)
    assert f"worker:1 (127.0.0.1:{ports[1]})" in message
    assert f"worker:2 (127.0.0.1:{ports[2]})" in message
    assert "2 of 2 peers never came up" in message
    assert [m[0] for m in info.value.missing] == ["worker:1", "worker:2"]


def test_a_taken_address_is_an_address_in_use_error_naming_the_task() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        address = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(AddressInUseError, match=f"worker:0: cannot serve on {address}"):
            runtime.TaskRuntime.create(resolver({"worker": [address]}, "worker", 0), FAST)


def test_start_is_idempotent_for_the_same_task_and_refuses_another() -> None:
    port = pick_free_ports("127.0.0.1", 1)[0]
    cluster = {"worker": [f"127.0.0.1:{port}"]}
    rt = runtime.start(resolver(cluster, "worker", 0))
    try:
        assert runtime.current() is rt
        assert runtime.start(resolver(cluster, "worker", 0)) is rt
        other = {"chief": [f"127.0.0.1:{port + 1}"], **cluster}
        with pytest.raises(TaskConfigError, match="already runs worker:0"):
            runtime.start(resolver(other, "chief", 0))
    finally:
        rt.shutdown(grace=0)
    assert runtime.current() is None


def test_tasks_outside_the_collective_group_get_no_transport() -> None:
    cluster = loopback_cluster(worker=1, ps=1)
    rt = runtime.TaskRuntime.create(resolver(cluster, "ps", 0), FAST)
    try:
        with pytest.raises(TaskConfigError, match="ps:0 is not in the collective group"):
            rt.collective_transport()
    finally:
        rt.shutdown(grace=0)
