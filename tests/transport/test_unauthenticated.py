"""What a caller without the token can make a task do: nothing that costs memory or tells it
which services run.

The victim is a real serving ``python -m worker`` (its server hosts Collective, Control,
Coordination and the worker's Run service, whose authenticated cap is 2 GiB) started under
``prlimit --data`` so an attack that worked could never endanger the machine; its RSS is read
from ``/proc``.
"""

from __future__ import annotations

import shutil
import sys
import threading

import grpc
import pytest

from cluster.deadline import Deadline
from cluster.testing import loopback_cluster, tf_config
from cluster.transport.auth import Token
from cluster.transport.server import (
    LARGE_MESSAGE_BYTES,
    MAX_MESSAGE_BYTES,
    TaskServer,
    message_limit,
)
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]

TOKEN = "unauth-test-secret"
BODY = 16 << 20  # each hostile request; 16 at once held whole would be +256 MiB
# Measured +3-7 MiB for 200 refused 64 MiB requests at once; room for thread stacks and a busy CI.
MAX_GROWTH_MIB = 16
VICTIM_DATA_LIMIT = 1 << 30  # RLIMIT_DATA of the victim: an attack that worked dies there

# Real methods of every cardinality, and one that does not exist.
METHODS = [
    "/cluster_runtime.v1.Worker/Run",
    "/cluster_runtime.v1.Control/Check",
    "/cluster_runtime.v1.Coordination/Register",
    "/cluster_runtime.v1.Collective/Exchange",
    "/cluster_runtime.v1.Control/Heartbeat",
    "/no.such.Service/Method",
]


def _status_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"{key} missing from /proc/{pid}/status")


def _check(channel: grpc.Channel, metadata, timeout: float) -> grpc.StatusCode:
    """An authenticated-or-not Control/Check with an empty request; returns its status."""
    try:
        channel.unary_unary("/cluster_runtime.v1.Control/Check")(
            b"", timeout=timeout, metadata=metadata, wait_for_ready=True)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _hostile(address: str, method: str, metadata, codes: list) -> None:
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
    try:
        channel.unary_unary(method)(b"\xff" * BODY, timeout=30, metadata=metadata)
        codes.append((method, grpc.StatusCode.OK))
    except grpc.RpcError as e:
        codes.append((method, e.code()))
    finally:
        channel.close()


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux) to "
                    "confine the victim's memory")
def test_unauthenticated_floods_cost_a_few_mib_and_every_method_answers_unauthenticated(
        task_processes, marker) -> None:
    cluster = loopback_cluster(worker=1)
    address = cluster["worker"][0]
    victim = task_processes.start(
        ["prlimit", f"--data={VICTIM_DATA_LIMIT}", sys.executable, "-m", "worker"],
        name="worker:0", tf_config=tf_config(cluster, "worker", 0), cwd=REPO,
        env={"CLUSTER_TOKEN": TOKEN, "CLUSTER_TEST_MARKER": marker})
    good = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(address) as channel:
        assert _check(channel, good, timeout=30) == grpc.StatusCode.OK, victim.output
        before = _status_mib(victim.pid, "VmRSS")

        codes: list = []
        senders = [
            threading.Thread(target=_hostile, args=(address, METHODS[i % len(METHODS)],
                                                    None if i % 2 else
                                                    (("authorization", "Bearer wrong"),),
                                                    codes))
            for i in range(16)]
        for t in senders:
            t.start()
        deadline = Deadline.after(60)
        for t in senders:
            t.join(deadline.timeout())
        assert not any(t.is_alive() for t in senders), "hostile calls still running after 60 s"

        assert victim.returncode is None, victim.output
        growth = _status_mib(victim.pid, "VmHWM") - before
        assert growth < MAX_GROWTH_MIB, f"victim grew {growth:.0f} MiB (RSS {before:.0f} MiB)"
        # Item 3: known or not, every method answers the same, so nothing is learnt.
        assert {code for _, code in codes} == {grpc.StatusCode.UNAUTHENTICATED}, codes
        assert _check(channel, good, timeout=10) == grpc.StatusCode.OK, victim.output


def test_an_authenticated_request_over_the_cap_is_refused_before_it_is_read() -> None:
    token = Token("cap-test")
    with TaskServer("127.0.0.1:0", token) as server:
        server.add_handlers("t.T", {"Echo": grpc.unary_unary_rpc_method_handler(
            lambda request, context: b"ok")})
        server.start()
        with grpc.insecure_channel(server.address, options=[
                ("grpc.max_send_message_length", -1)]) as channel:
            echo = channel.unary_unary("/t.T/Echo")
            assert echo(b"x" * (MAX_MESSAGE_BYTES - 1024), timeout=30,
                        metadata=token.metadata) == b"ok"
            with pytest.raises(grpc.RpcError) as raised:
                echo(b"x" * (MAX_MESSAGE_BYTES + 1), timeout=30, metadata=token.metadata)
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_message_limit_is_the_largest_cap_of_the_services_hosted() -> None:
    assert message_limit([]) == MAX_MESSAGE_BYTES
    assert message_limit(["cluster_runtime.v1.Collective"]) == MAX_MESSAGE_BYTES
    assert message_limit(["cluster_runtime.v1.Control",
                          "cluster_runtime.v1.ParameterServer"]) == LARGE_MESSAGE_BYTES
    assert message_limit({"cluster_runtime.v1.Worker": {}}) == LARGE_MESSAGE_BYTES
