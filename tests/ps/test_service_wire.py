"""The ParameterServer's hand-parsed messages over real gRPC: malformed, unauthenticated and
well-formed bytes from a raw channel, and a client facing a server that answers garbage."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from cluster.ps import OptimizerSpec, VariableStore
from cluster.transport._pb import ps_pb2
from cluster.transport._ps_codec import encode_push_request
from cluster.transport.auth import Token
from cluster.transport.ps_client import SERVICE, PsClient
from cluster.transport.server import CHANNEL_OPTIONS, TaskServer
from ps.servicer import PsService

pytestmark = pytest.mark.timeout(60)

TOKEN = Token("s3cret-wire-token")
F32 = np.float32


@pytest.fixture
def served():
    """One in-process ps server with variable ``w`` (3 float32, SGD 1.0); yields
    ``(store, address, raw Push callable)``."""
    server = TaskServer("127.0.0.1:0", TOKEN)
    store = VariableStore("ps:0")
    PsService(store, "ps:0").install(server)
    server.start()
    store.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0))
    channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
    push = channel.unary_unary(f"/{SERVICE}/Push")  # bytes in, bytes out
    try:
        yield store, server.address, push
    finally:
        channel.close()
        server.stop(grace=0)


def _push_bytes(grad: np.ndarray) -> bytes:
    return encode_push_request({"w": grad}, ps_pb2.PushRequest(num_contributors=1))


@pytest.mark.parametrize("message", [
    b"\xff" * 7,  # garbage
    b"\x0a\x7f" + b"\x00" * 10,  # an entry longer than the message
    b"\x0b\x0c",  # a group
], ids=["garbage", "overlong-entry", "group"])
def test_malformed_push_is_invalid_argument_and_the_server_keeps_serving(served,
                                                                         message) -> None:
    store, address, push = served
    with pytest.raises(grpc.RpcError) as e:
        push(message, timeout=10, metadata=TOKEN.metadata)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert store.version("w") == 1
    with PsClient(address, TOKEN, task="ps:0", timeout=10) as ps:
        assert ps.push({"w": np.ones(3, F32)}) == [2]
        assert ps.pull(["w"])[0].value.tolist() == [-1, -1, -1]


def test_truncated_and_oversized_pushes_are_refused_unapplied(served) -> None:
    store, _, push = served
    good = _push_bytes(np.ones(3, F32))
    for message in (good[:-1], good[:len(good) // 2], good + b"\x7a\x01"):
        with pytest.raises(grpc.RpcError) as e:
            push(message, timeout=10, metadata=TOKEN.metadata)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, message
    # A data field longer than the shape says (total_bytes agrees with the shape).
    request = ps_pb2.PushRequest.FromString(good)
    request.gradients[0].value.data += b"\x00" * 4
    with pytest.raises(grpc.RpcError) as e:
        push(request.SerializeToString(), timeout=10, metadata=TOKEN.metadata)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert store.version("w") == 1
    # The well-formed message itself (a stock protobuf parser reads it too) is applied.
    assert ps_pb2.PushReply.FromString(push(good, timeout=10, metadata=TOKEN.metadata)
                                       ).versions == [2]


def test_push_without_the_token_is_refused_before_parsing(served) -> None:
    store, _, push = served
    with pytest.raises(grpc.RpcError) as e:
        push(_push_bytes(np.ones(3, F32)), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert store.version("w") == 1


def test_pull_of_several_variables_arrives_whole_and_read_only(served) -> None:
    store, address, _ = served
    store.create("step", np.array(5, np.int64), trainable=False)
    store.create("e", np.zeros((0, 4), F32), trainable=False)
    with PsClient(address, TOKEN, task="ps:0", timeout=10) as ps:
        got = ps.pull(["step", "w", "e"], [0, 0, 0])
        assert [(p.name, p.version) for p in got] == [("step", 1), ("w", 1), ("e", 1)]
        assert got[0].value.dtype == np.int64 and got[0].value.tolist() == 5
        assert got[2].value.shape == (0, 4)
        assert not got[1].value.flags.writeable
        assert [p.name for p in ps.pull(["step", "w"], [1, 0])] == ["w"]  # newer_than per name


def test_client_refuses_a_malformed_pull_reply_naming_the_task() -> None:
    server = TaskServer("127.0.0.1:0", TOKEN)
    server.add_handlers(SERVICE, {"Pull": grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"\x0a\x10\x0a\x01w")})  # entry runs past the end
    server.start()
    try:
        with PsClient(server.address, TOKEN, task="ps:3", timeout=10) as ps:
            with pytest.raises(ValueError, match=r"ps:3 .*malformed reply to the pull"):
                ps.pull(["w"])
    finally:
        server.stop(grace=0)
