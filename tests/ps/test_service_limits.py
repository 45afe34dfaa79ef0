"""Requests that would exhaust a parameter server are refused, and it keeps serving.

Checked: a Pull naming one 16 MiB variable 96 times must not kill the ps; a synchronous push
without a deadline must not fail UNKNOWN yet count; pushes waiting for 2^31 contributors must
not hold every RPC thread. The memory attack runs against a ps in a child process whose data
segment is capped (RLIMIT_DATA), so the machine is never at risk.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

import ps.servicer
from cluster.errors import PeerUnavailableError
from cluster.ps import OptimizerSpec, VariableStore
from cluster.transport._pb import ps_pb2
from cluster.transport._ps_codec import encode_push_request
from cluster.transport.auth import Token
from cluster.transport.ps_client import SERVICE, PsClient
from cluster.transport.server import CHANNEL_OPTIONS, TaskServer
from ps.servicer import PsService
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

TOKEN = Token("s3cret-limits-token")
F32 = np.float32


@pytest.fixture
def served():
    """An in-process ps (its service, its store) and a raw channel to it; stopped after."""
    server = TaskServer("127.0.0.1:0", TOKEN)
    store = VariableStore("ps:0")
    service = PsService(store, "ps:0")
    service.install(server)
    server.start()
    store.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0))
    channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
    try:
        yield service, server.address, channel
    finally:
        channel.close()
        server.stop(grace=0)


def _raw(channel, method: str, serializer=None):
    return channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=serializer)


def _sync_push(step: int, contributors: int, contributor: int, *, no_wait: bool = False) -> bytes:
    return encode_push_request({"w": np.ones(3, F32)}, ps_pb2.PushRequest(
        step=step, num_contributors=contributors, contributor=contributor, no_wait=no_wait))


def _serves(address: str) -> None:
    with PsClient(address, TOKEN, task="ps:0", timeout=10) as client:
        assert client.pull(["w"])[0].value.shape == (3,)


# ---- item 5: a Pull's reply is bounded ----------------------------------------------------------

_LIMITED_PS = """
import resource, sys
import numpy as np
resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))  # 1 GiB: a 1.5 GiB reply cannot fit
from cluster.ps import VariableStore
from cluster.transport.auth import Token
from cluster.transport.server import TaskServer
from ps.servicer import PsService
server = TaskServer("127.0.0.1:0", Token(sys.argv[1]))
store = VariableStore("ps:0")
PsService(store, "ps:0").install(server)
store.create("big", np.zeros(4 << 20, np.float32))  # 16 MiB
store.create("w", np.zeros(3, np.float32))
server.start()
print(server.address, flush=True)
sys.stdin.read()  # serve until the test closes stdin
server.stop(grace=0)
"""


def test_a_pull_naming_one_big_variable_96_times_is_refused_and_the_ps_keeps_serving() -> None:
    child = subprocess.Popen([sys.executable, "-c", _LIMITED_PS, TOKEN.value], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = child.stdout.readline().strip()
        assert address, "the ps child never served"
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            pull = _raw(channel, "Pull", ps_pb2.PullRequest.SerializeToString)
            request = ps_pb2.PullRequest(names=["big"] * 96)
            assert request.ByteSize() < 2048
            with pytest.raises(grpc.RpcError) as e:
                pull(request, timeout=30, metadata=TOKEN.metadata)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert "more than once: big" in e.value.details()
        _serves(address)
        assert child.poll() is None, "the ps died"
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_pull_of_several_variables_over_the_reply_limit_is_refused_and_the_client_splits(
        served, monkeypatch) -> None:
    service, address, channel = served
    store = service.store
    monkeypatch.setattr(ps.servicer, "MAX_PULL_REPLY_BYTES", 4096)
    names = [f"v{i}" for i in range(10)]
    for i, name in enumerate(names):
        store.create(name, np.full(512, i, F32))  # 2 KiB each: 20 KiB in all
    store.create("huge", np.ones(4096, F32))  # alone over the limit: still served alone
    pull = _raw(channel, "Pull", ps_pb2.PullRequest.SerializeToString)
    with pytest.raises(grpc.RpcError) as e:
        pull(ps_pb2.PullRequest(names=names), timeout=10, metadata=TOKEN.metadata)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the limit of 4096 bytes" in e.value.details()
    with PsClient(address, TOKEN, task="ps:0", timeout=10) as client:
        got = client.pull(names + ["huge"], step=0)
        assert [p.name for p in got] == names + ["huge"]
        assert [int(p.value[0]) for p in got[:-1]] == list(range(10))
        assert client.pull(["huge"])[0].value.nbytes == 16384


# ---- item 6: a waiting synchronous push needs a deadline ----------------------------------------

def test_a_synchronous_push_without_a_deadline_is_refused_before_it_counts(served) -> None:
    service, address, channel = served
    push = _raw(channel, "Push")
    with pytest.raises(grpc.RpcError) as e:
        push(_sync_push(0, 2, 0), metadata=TOKEN.metadata)  # no timeout
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "needs a gRPC deadline" in e.value.details()
    assert not service.store._vars["w"].pending, "the refused push counted"
    # One that does not wait needs none; the step then still needs both contributors.
    push(_sync_push(0, 2, 0, no_wait=True), metadata=TOKEN.metadata)
    assert service.store.version("w") == 1
    push(_sync_push(0, 2, 1), timeout=10, metadata=TOKEN.metadata)
    assert service.store.version("w") == 2


# ---- item 7: contributors are validated, waits leave threads ------------------------------------

def test_a_push_for_more_contributors_than_the_cluster_has_is_refused(served) -> None:
    service, address, channel = served
    service.max_contributors = 3
    push = _raw(channel, "Push")
    with pytest.raises(grpc.RpcError) as e:
        push(_sync_push(0, 2 ** 31, 0), timeout=10, metadata=TOKEN.metadata)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "names 2147483648 contributors" in e.value.details()
    assert "has 3 tasks that can push" in e.value.details()
    assert not service.store._vars["w"].pending


def test_forty_waiting_pushes_leave_threads_for_check_and_pull(served) -> None:
    service, address, channel = served
    push = _raw(channel, "Push")
    outcomes: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def wait_for_a_step_that_never_completes(step: int) -> None:
        try:
            push(_sync_push(step, 2, 0), timeout=20, metadata=TOKEN.metadata)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        with lock:
            outcomes.append(code)

    threads = [threading.Thread(target=wait_for_a_step_that_never_completes, args=(step,))
               for step in range(40)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while True:  # the pushes over the limit are refused at once; the others wait
        with lock:
            if len(outcomes) >= 40 - ps.servicer.MAX_WAITING_PUSHES:
                break
        assert time.monotonic() < deadline, "pushes over the limit were not refused"
        time.sleep(0.02)
    with lock:
        assert set(outcomes) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    start = time.monotonic()
    _serves(address)  # a pull still finds a thread, at once
    assert time.monotonic() - start < 10
    # Complete the waiting steps (each needs contributor 1), so every waiter returns.
    for step in range(40):
        push(_sync_push(step, 2, 1, no_wait=True), timeout=10, metadata=TOKEN.metadata)
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 40


# ---- the unreachable message names the time that passed ------------------------------------------

def test_unreachable_ps_error_names_the_real_elapsed_time_and_the_budget() -> None:
    server = TaskServer("127.0.0.1:0", TOKEN)
    address = server.address
    server.stop(grace=0)  # nothing listens there now: refused at once
    with PsClient(address, TOKEN, task="ps:0", timeout=30.0) as client:
        with pytest.raises(PeerUnavailableError) as e:
            client.pull(["w"])
    message = str(e.value)
    assert "(deadline 30.0 s)" in message
    assert "after 30.0 s" not in message
    elapsed = float(message.split(" after ")[1].split(" s")[0])
    assert elapsed < 29.0
