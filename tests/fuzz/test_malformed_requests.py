"""Bytes that are not the request message end the call INVALID_ARGUMENT, whatever the method's
cardinality: the caller's error, not INTERNAL (a server bug), as gRPC itself answers a failing
deserializer. Found by the fuzz suite (``Collective/Hello`` answered INTERNAL to ``b"\\x00"``)."""

from __future__ import annotations

import grpc
import pytest

from cluster.transport._pb import control_pb2
from cluster.transport.auth import Token
from cluster.transport.server import TaskServer

pytestmark = pytest.mark.timeout(60)

TOKEN = Token("malformed-test")
GARBAGE = b"\x00"  # field number 0: never a valid protobuf
REQUEST = control_pb2.HealthCheckRequest
REPLY = control_pb2.HealthCheckResponse


def _reply(request, context):
    return REPLY(task=request.expected_task)


def _replies(request, context):
    yield REPLY(task=request.expected_task)


def _from_stream(requests, context):
    return REPLY(task="".join(r.expected_task for r in requests))


@pytest.fixture(scope="module")
def address():
    with TaskServer("127.0.0.1:0", TOKEN) as server:
        kw = {"request_deserializer": REQUEST.FromString,
              "response_serializer": REPLY.SerializeToString}
        server.add_handlers("t.T", {
            "Unary": grpc.unary_unary_rpc_method_handler(_reply, **kw),
            "ServerStream": grpc.unary_stream_rpc_method_handler(_replies, **kw),
            "ClientStream": grpc.stream_unary_rpc_method_handler(_from_stream, **kw),
        })
        server.start()
        yield server.address


def _code(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_garbage_requests_answer_invalid_argument_at_every_cardinality(address) -> None:
    meta = TOKEN.metadata
    with grpc.insecure_channel(address) as channel:
        unary = channel.unary_unary("/t.T/Unary")
        server_stream = channel.unary_stream("/t.T/ServerStream")
        client_stream = channel.stream_unary("/t.T/ClientStream")
        assert _code(lambda: unary(GARBAGE, timeout=30, metadata=meta)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert _code(lambda: list(server_stream(GARBAGE, timeout=30, metadata=meta))) == \
            grpc.StatusCode.INVALID_ARGUMENT
        good = REQUEST(expected_task="a").SerializeToString()
        assert _code(lambda: client_stream(iter([good, GARBAGE]), timeout=30,
                                           metadata=meta)) == grpc.StatusCode.INVALID_ARGUMENT


def test_well_formed_requests_still_reach_their_handlers(address) -> None:
    meta = TOKEN.metadata
    good = REQUEST(expected_task="a").SerializeToString()
    with grpc.insecure_channel(address) as channel:
        assert REPLY.FromString(channel.unary_unary("/t.T/Unary")(
            good, timeout=30, metadata=meta)).task == "a"
        [one] = channel.unary_stream("/t.T/ServerStream")(good, timeout=30, metadata=meta)
        assert REPLY.FromString(one).task == "a"
        assert REPLY.FromString(channel.stream_unary("/t.T/ClientStream")(
            iter([good, good]), timeout=30, metadata=meta)).task == "aa"
