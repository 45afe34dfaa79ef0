"""gRPC-specific behaviour: authentication, malformed input, ports, unreachable peers."""

from __future__ import annotations

import grpc
import pytest

from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline
from cluster.errors import PeerUnavailableError, UnauthenticatedError
from cluster.settings import TaskSettings
from cluster.transport import _framing
from cluster.transport._pb import collective_pb2, control_pb2
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.auth import InsecureClusterError, Token, resolve_token
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.network import NetworkTransport
from cluster.transport.server import TaskServer

from .conftest import TOKEN, NetworkGroup

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server():
    srv = TaskServer("127.0.0.1:0", TOKEN)
    endpoint = CollectiveEndpoint.install(srv, "worker:0")
    srv.start()
    yield srv, endpoint
    srv.stop(0)


def _check(channel: grpc.Channel, metadata=()) -> control_pb2.HealthCheckResponse:
    method = channel.unary_unary(
        "/cluster_runtime.v1.Control/Check",
        request_serializer=control_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=control_pb2.HealthCheckResponse.FromString,
    )
    return method(control_pb2.HealthCheckRequest(), timeout=5, metadata=metadata)


def _exchange(channel: grpc.Channel, frames, metadata=()):
    method = channel.stream_unary("/cluster_runtime.v1.Collective/Exchange")
    return method(iter(frames), timeout=5, metadata=metadata)


def _stream_from_rank_0(group: NetworkGroup, *frames: collective_pb2.Frame) -> None:
    """One Exchange stream to rank 2 of ``group``, as rank 0, carrying ``frames`` (a header and
    its data each) and ending cleanly: what rank 0's data plane would send."""
    with grpc.insecure_channel(group.servers[2].address) as channel:
        raw = [_framing.encode(f, b"x" if f.total_bytes else b"") for f in frames]
        _exchange(channel, raw, (*TOKEN.metadata, ("x-src-rank", "0")))


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),),
                                      (("authorization", "test-secret-token"),)])
def test_call_without_the_right_token_is_unauthenticated(server, metadata) -> None:
    srv, _ = server
    with grpc.insecure_channel(srv.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _check(channel, metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "test-secret-token" not in (info.value.details() or "")


def test_unauthenticated_stream_is_refused_before_any_frame_is_handled(server) -> None:
    srv, _ = server
    with grpc.insecure_channel(srv.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _exchange(channel, [b"\x08\x01garbage-that-is-never-parsed"],
                      (("x-src-rank", "1"),))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # ...and the server keeps serving authenticated callers.
        assert _check(channel, TOKEN.metadata).task == "worker:0"


def test_malformed_frame_gets_invalid_argument_and_server_keeps_serving() -> None:
    group = NetworkGroup(2)
    try:
        with grpc.insecure_channel(group.servers[1].address) as channel:
            md = (*TOKEN.metadata, ("x-src-rank", "0"))
            with pytest.raises(grpc.RpcError) as info:
                _exchange(channel, [b"\x7a\xff\xff\xff\x0f"], md)  # data length past the end
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert _check(channel, TOKEN.metadata).task == "worker:1"
    finally:
        group.close()


def test_frame_claiming_another_rank_is_rejected() -> None:
    group = NetworkGroup(3)
    try:
        with grpc.insecure_channel(group.servers[2].address) as channel:
            header = collective_pb2.Frame(src_rank=1, group="g", total_bytes=1)
            md = (*TOKEN.metadata, ("x-src-rank", "0"))
            with pytest.raises(grpc.RpcError) as info:
                _exchange(channel, [_framing.encode(header, b"x")], md)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        group.close()


def test_a_frame_after_the_goodbye_is_rejected() -> None:
    group = NetworkGroup(3)
    try:
        with pytest.raises(grpc.RpcError) as info:
            _stream_from_rank_0(group, collective_pb2.Frame(src_rank=0, goodbye=True),
                                collective_pb2.Frame(src_rank=0, group="g", total_bytes=1))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "after the goodbye" in info.value.details()
    finally:
        group.close()


@pytest.mark.parametrize("lost", ["", "worker:1"])
def test_a_goodbye_frame_ends_waits_on_its_sender_at_once(lost) -> None:
    # Even on a stream that carried no data: a wait on the sender ends now, not at its deadline,
    # naming the task the goodbye names, or the sender as one that left.
    group = NetworkGroup(3)
    try:
        _stream_from_rank_0(group, collective_pb2.Frame(src_rank=0, goodbye=True, lost_task=lost))
        with pytest.raises(PeerUnavailableError) as info:
            group.transports[2].recv(0, MessageKey("g", 0, 0), deadline=Deadline.after(10))
        if lost:
            assert info.value.task == "worker:1"
            assert "as worker:0 found: its goodbye says it lost worker:1" in str(info.value)
        else:
            assert info.value.task == "worker:0"
            assert "left the group" in str(info.value)
    finally:
        group.close()


def test_a_stream_that_ends_without_its_goodbye_is_a_lost_peer() -> None:
    # grpc-python ends the request stream of a caller that was killed as if it had finished:
    # without the goodbye frame that is a death, not a departure ("left the group", "finished
    # its script"), as a TCP connection that ends without its goodbye is.
    group = NetworkGroup(3)
    try:
        data = collective_pb2.Frame(src_rank=0, group="g", seq=7, total_bytes=1)
        _stream_from_rank_0(group, data)
        b = group.transports[2]
        with pytest.raises(PeerUnavailableError) as info:  # the group fails, as for any loss
            b.recv(0, MessageKey("g", 8, 0), deadline=Deadline.after(10))
        assert info.value.task == "worker:0"
        assert "is unavailable" in str(info.value) and "left the group" not in str(info.value)
        assert not b.departed("worker:0")
    finally:
        group.close()


def test_wrong_token_on_a_peer_fails_connect_with_unauthenticated_error() -> None:
    srv = TaskServer("127.0.0.1:0", TOKEN)
    endpoint = CollectiveEndpoint.install(srv, "worker:0")
    srv.start()
    other = TaskServer("127.0.0.1:0", Token("another-secret"))
    other_endpoint = CollectiveEndpoint.install(other, "worker:1")
    other.start()
    peers = [PeerInfo(0, "worker:0", srv.address), PeerInfo(1, "worker:1", other.address)]
    NetworkTransport(endpoint, 0, peers, TOKEN)
    t1 = NetworkTransport(other_endpoint, 1, peers, Token("another-secret"))
    try:
        with pytest.raises(UnauthenticatedError) as info:
            t1.connect(Deadline.after(5))
        assert "worker:0" in str(info.value)
        assert "another-secret" not in str(info.value) and "test-secret" not in str(info.value)
    finally:
        srv.stop(0)
        other.stop(0)


def test_binding_a_port_in_use_fails_instead_of_sharing_it(server) -> None:
    srv, _ = server
    with pytest.raises(OSError, match=srv.address):
        TaskServer(srv.address, TOKEN)


def test_connect_to_a_closed_port_names_the_missing_peer_and_address() -> None:
    dead_port = pick_free_ports("127.0.0.1", 1)[0]  # a port nobody listens on
    srv = TaskServer("127.0.0.1:0", TOKEN)
    endpoint = CollectiveEndpoint.install(srv, "worker:0")
    srv.start()
    peers = [PeerInfo(0, "worker:0", srv.address),
             PeerInfo(1, "worker:1", f"127.0.0.1:{dead_port}")]
    t = NetworkTransport(endpoint, 0, peers, TOKEN)
    try:
        with pytest.raises(PeerUnavailableError, match=rf"worker:1 \(127.0.0.1:{dead_port}\)"):
            t.connect(Deadline.after(1.0))
    finally:
        srv.stop(0)


@pytest.mark.parametrize("data_plane", ["grpc", "tcp"])
def test_peer_that_closes_cleanly_fails_only_waits_on_it(data_plane: str) -> None:
    group = NetworkGroup(3, data_plane=data_plane)
    try:
        a, b, c = group.transports
        b.send(0, MessageKey("g", 0, 0), b"last words", deadline=Deadline.after(5))
        b.close()
        assert bytes(a.recv(1, MessageKey("g", 0, 0), deadline=Deadline.after(5)).payload) == \
            b"last words"
        with pytest.raises(PeerUnavailableError, match="worker:1 .*left the group"):
            a.recv(1, MessageKey("g", 1, 0), deadline=Deadline.after(5))
        c.send(0, MessageKey("g", 2, 0), b"still here", deadline=Deadline.after(5))
        assert bytes(a.recv(2, MessageKey("g", 2, 0), deadline=Deadline.after(5)).payload) == \
            b"still here"
    finally:
        group.close()


def test_token_policy_allows_loopback_without_token_and_refuses_remote() -> None:
    env = TaskSettings.from_env
    assert resolve_token(["127.0.0.1:1", "localhost:2"], env({})).value is None
    with pytest.raises(InsecureClusterError, match="CLUSTER_TOKEN.*10.0.0.2:2222"):
        resolve_token(["127.0.0.1:1", "10.0.0.2:2222"], env({}))
    assert resolve_token(["10.0.0.2:2222"], env({"CLUSTER_ALLOW_INSECURE": "1"})).value is None
    assert resolve_token(["10.0.0.2:2222"], env({"CLUSTER_TOKEN": "s3cret"})).value == "s3cret"


def test_token_never_appears_in_repr() -> None:
    assert "s3cret" not in repr(Token("s3cret"))
