"""A serving worker runs pickled code only for callers holding the cluster token."""

from __future__ import annotations

import json
import pickle

import grpc
import pytest

from cluster.coordinator._calls import Call
from cluster.coordinator._reply_mac import verify_reply
from cluster.transport._pb import coordinator_pb2
from cluster.transport.auth import Token
from cluster.transport.worker_client import SERVICE

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]


class _CreatesFile:
    """Unpickling this creates ``path``: proof that a payload was (or was not) unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _run(address: str, token: Token, payload: bytes) -> coordinator_pb2.RunReply:
    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=20)
        call = channel.unary_unary(
            f"/{SERVICE}/Run", request_serializer=coordinator_pb2.RunRequest.SerializeToString,
            response_deserializer=coordinator_pb2.RunReply.FromString)
        request = coordinator_pb2.RunRequest(run_id=1, payload=payload, nonce=b"n" * 16)
        return call(request, timeout=10, metadata=token.metadata)
    finally:
        channel.close()


def test_a_wrong_token_is_refused_before_anything_is_unpickled(ps_cluster, tmp_path):
    cluster = ps_cluster(workers=1, ps=1)
    address = cluster.spec["worker"][0]
    proof = tmp_path / "unpickled"
    payload = pickle.dumps(_CreatesFile(str(proof)))
    for token in (Token("not-the-token"), Token(None)):
        with pytest.raises(grpc.RpcError) as refused:
            _run(address, token, payload)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not proof.exists()
    # Positive control: with the cluster's token the same bytes are unpickled (and the reply
    # carries a MAC that only the token holder can make).
    token = Token(cluster.env["CLUSTER_TOKEN"])
    reply = _run(address, token, payload)
    assert proof.exists()
    assert verify_reply(token, b"n" * 16, 1, reply.outcome, reply.payload, reply.mac)
    assert not verify_reply(Token("other"), b"n" * 16, 1, reply.outcome, reply.payload,
                            reply.mac)


def test_a_worker_answers_a_good_call_with_an_authenticated_result(ps_cluster):
    import cloudpickle

    cluster = ps_cluster(workers=1, ps=1)
    token = Token(cluster.env["CLUSTER_TOKEN"])
    payload = cloudpickle.dumps(Call(cloudpickle.dumps((json.dumps, ({"a": 1},), {}))))
    reply = _run(cluster.spec["worker"][0], token, payload)
    assert reply.outcome == coordinator_pb2.RunReply.OK
    assert cloudpickle.loads(reply.payload) == '{"a": 1}'
