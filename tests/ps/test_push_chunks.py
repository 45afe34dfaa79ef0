"""Large pushes as a ``PushChunks`` stream: the layout of its messages, the receiver's checks,
and the same bytes as a push in one message, over real gRPC."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from cluster.ctl.certs import write_host_cert
from cluster.errors import VariableMismatchError
from cluster.ps import OptimizerSpec, VariableStore
from cluster.ps._pieces import GradientPieces, PieceAssembler
from cluster.transport import ps_client
from cluster.transport._pb import ps_pb2
from cluster.transport._ps_codec import (
    ALIGN,
    MIN_PIECE_BYTES,
    decode_push_pieces,
    push_chunk_messages,
)
from cluster.transport.auth import Token
from cluster.transport.ps_client import SERVICE, PsClient
from cluster.transport.server import CHANNEL_OPTIONS, TaskServer
from cluster.transport.tls import TlsConfig
from ps.servicer import PsService

pytestmark = pytest.mark.timeout(60)

TOKEN = Token("s3cret-chunks-token")
F32 = np.float32
OPTIMIZERS = [OptimizerSpec.sgd(0.1), OptimizerSpec.sgd(0.1, 0.9, nesterov=True),
              OptimizerSpec.adam(0.01)]


def _grads(seed: int, sizes: list[int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float64, np.float16, np.int8]
    return {f"g{i}": rng.standard_normal(n).astype(dtypes[i % len(dtypes)]).reshape(-1, 1)
            for i, n in enumerate(sizes)}


def _assemble(messages: list[bytes]) -> tuple[ps_pb2.PushRequest, dict]:
    assembler = PieceAssembler(MIN_PIECE_BYTES)
    header = None
    for message in messages:
        request, pieces = decode_push_pieces(message)
        header = header or request
        for name, (dtype, shape, start, flat) in pieces:
            assembler.add(name, shape, dtype, start, flat)
    return header, assembler.finish()


@pytest.mark.parametrize("sizes", [[0], [5], [1 << 20], [3, (1 << 20) + 7, 17, 600_000, 0],
                                   [300_000] * 9, [(3 << 20) + 5]])
@pytest.mark.parametrize("chunk_bytes", [MIN_PIECE_BYTES, 1 << 20])
def test_messages_carry_every_element_once_in_aligned_chunks(sizes, chunk_bytes) -> None:
    grads = _grads(len(sizes), sizes)
    header = ps_pb2.PushRequest(step=7, num_contributors=2, contributor=1)
    messages = [write() for write in push_chunk_messages(grads, header, chunk_bytes)]
    for i, message in enumerate(messages):
        request, pieces = decode_push_pieces(message)
        assert (request.step, request.num_contributors) == ((7, 2) if i == 0 else (0, 0))
        base = np.frombuffer(message, np.uint8).ctypes.data
        data = sum(flat.nbytes for _, (_, _, _, flat) in pieces)
        assert data <= chunk_bytes or len(pieces) == 1
        for _, (_, _, _, flat) in pieces:
            assert flat.size == 0 or (flat.ctypes.data - base) % ALIGN == 0
    _, got = _assemble(messages)
    assert list(got) == list(grads)
    for name, want in grads.items():
        value = got[name]
        joined = value.join() if isinstance(value, GradientPieces) else value
        assert joined.dtype == want.dtype and joined.shape == want.shape
        assert joined.tobytes() == want.tobytes()
        if isinstance(value, GradientPieces):  # split only when larger than a chunk's room
            assert want.nbytes > MIN_PIECE_BYTES
            small = [flat.nbytes for _, flat in value.pieces if flat.nbytes < MIN_PIECE_BYTES]
            assert len(small) <= 1


def _flat(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=F32)


@pytest.mark.parametrize("chunks, error", [
    ([(0, 10), (5, 10)], "overlap"),
    ([(10, 10), (0, 15)], "overlap"),
    ([(0, 10), (10, 5)], "hold 15 of its 20"),
    ([(15, 10)], "of a 20-element tensor"),
    ([(0, 0)], "empty chunk"),
], ids=["overlap-after", "overlap-before", "gap", "past-the-end", "empty"])
def test_the_assembler_refuses_chunks_that_do_not_tile_the_tensor(chunks, error) -> None:
    assembler = PieceAssembler(8)
    with pytest.raises(ValueError, match=error):
        for start, n in chunks:
            assembler.add("w", (20,), np.dtype(F32), start, _flat(n, start))
        assembler.finish()


def test_the_assembler_refuses_a_changed_tensor_and_too_many_chunks() -> None:
    assembler = PieceAssembler(8)
    assembler.add("w", (20,), np.dtype(F32), 0, _flat(2))
    with pytest.raises(ValueError, match="disagree"):
        assembler.add("w", (4, 5), np.dtype(F32), 2, _flat(2, 2))
    with pytest.raises(ValueError, match="disagree"):
        assembler.add("w", (20,), np.dtype(np.float64), 2, np.zeros(2))
    # 80 bytes in chunks of at least 8 bytes: at most 1 + 80 // 8 = 11 chunks.
    for start in range(2, 12):  # one element (4 bytes) each: too small, but within the count
        assembler.add("w", (20,), np.dtype(F32), start, _flat(1, start))
    with pytest.raises(ValueError, match="more than 11 chunks"):
        assembler.add("w", (20,), np.dtype(F32), 12, _flat(8, 12))


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sgd", "nesterov", "adam"])
def test_a_gradient_in_pieces_updates_the_bytes_one_array_updates(optimizer) -> None:
    rng = np.random.default_rng(3)
    init = rng.standard_normal((300, 7)).astype(F32)
    grads = [rng.standard_normal(init.shape).astype(F32) for _ in range(3)]
    whole, pieced = VariableStore("ps:0"), VariableStore("ps:0")
    for store in (whole, pieced):
        store.create("w", init, optimizer=optimizer)
    cuts = [0, 64, 1000, 1001, 2100]
    for grad in grads:
        whole.push({"w": grad})
        flat = grad.reshape(-1)
        pieces = [(a, flat[a:b]) for a, b in zip(cuts, cuts[1:] + [flat.size], strict=True)]
        pieced.push({"w": GradientPieces(init.shape, init.dtype, tuple(reversed(pieces)))})
    assert pieced.pull(["w"])[0].value.tobytes() == whole.pull(["w"])[0].value.tobytes()
    assert pieced.version("w") == whole.version("w") == 4
    _, _, slots_whole = whole.read_slots("w")
    _, _, slots_pieced = pieced.read_slots("w")
    assert {k: v.tobytes() for k, v in slots_pieced.items()} == \
        {k: v.tobytes() for k, v in slots_whole.items()}


def test_pieces_of_another_shape_are_refused_and_change_nothing() -> None:
    store = VariableStore("ps:0")
    store.create("w", np.zeros(6, F32), optimizer=OptimizerSpec.sgd(1.0))
    with pytest.raises(VariableMismatchError, match="shape"):
        store.push({"w": GradientPieces((2, 3), np.dtype(F32), ((0, np.ones(6, F32)),))})
    assert store.version("w") == 1


# -- over gRPC ------------------------------------------------------------------------------


@pytest.fixture
def served():
    """An in-process ps with ``big`` (5 MiB of float32, one per optimizer variant) and a raw
    PushChunks callable; yields ``(service, address, raw stream callable)``."""
    server = TaskServer("127.0.0.1:0", TOKEN)
    store = VariableStore("ps:0")
    service = PsService(store, "ps:0")
    service.install(server)
    server.start()
    channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
    try:
        yield service, server.address, channel.stream_unary(f"/{SERVICE}/PushChunks")
    finally:
        channel.close()
        server.stop(grace=0)


BIG = (5 << 20) // 4  # elements: above STREAM_MIN_BYTES


def _messages(grads, header=None, chunk_bytes=1 << 20) -> list[bytes]:
    return [w() for w in push_chunk_messages(grads, header or ps_pb2.PushRequest(), chunk_bytes)]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sgd", "nesterov", "adam"])
def test_a_large_push_streams_and_updates_what_the_store_itself_would(served, monkeypatch,
                                                                     optimizer) -> None:
    service, address, _ = served
    rng = np.random.default_rng(5)
    init = rng.standard_normal(BIG).astype(F32)
    grads = [rng.standard_normal(BIG).astype(F32) for _ in range(2)]
    service.store.create("w", init, optimizer=optimizer)
    streamed = []
    real = PsClient._push_streamed
    monkeypatch.setattr(PsClient, "_push_streamed",
                        lambda self, *a: streamed.append(1) or real(self, *a))
    with PsClient(address, TOKEN, task="ps:0", timeout=20) as ps:
        assert [ps.push({"w": grad}) for grad in grads] == [[2], [3]]
    assert len(streamed) == 2
    reference = VariableStore("ps:0")
    reference.create("w", init, optimizer=optimizer)
    for grad in grads:
        reference.push({"w": grad})
    assert service.store.pull(["w"])[0].value.tobytes() == \
        reference.pull(["w"])[0].value.tobytes()


def test_synchronous_contributions_may_stream(served) -> None:
    service, address, _ = served
    service.store.create("w", np.zeros(BIG, F32), optimizer=OptimizerSpec.sgd(1.0))
    results = {}

    def push(k: int) -> None:
        with PsClient(address, TOKEN, task="ps:0", timeout=20) as ps:
            results[k] = ps.push({"w": np.full(BIG, k + 1, F32)}, step=0, num_contributors=2,
                                 contributor=k)

    threads = [threading.Thread(target=push, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: [2], 1: [2]}
    assert np.all(service.store.pull(["w"])[0].value == -1.5)  # mean of 1 and 2


def _refused(call, messages, code, match=None, **kw) -> None:
    with pytest.raises(grpc.RpcError) as e:
        call(iter(messages), metadata=TOKEN.metadata, **kw)
    assert e.value.code() == code, e.value.details()
    if match:
        assert match in e.value.details()


def test_malformed_streams_are_refused_and_change_nothing(served) -> None:
    service, address, call = served
    store = service.store
    store.create("w", np.zeros(BIG, F32), optimizer=OptimizerSpec.sgd(1.0))
    grad = np.ones(BIG, F32)
    messages = _messages({"w": grad})
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    _refused(call, messages[:-1], invalid, "hold", timeout=10)
    _refused(call, messages + messages[-1:], invalid, "overlap", timeout=10)
    _refused(call, [], invalid, "empty stream", timeout=10)
    late_header = _messages({"w": grad}, ps_pb2.PushRequest(step=3))
    _refused(call, messages[:1] + late_header[:1], invalid, "header", timeout=10)
    _refused(call, messages, invalid, "deadline")  # no timeout: would hold a thread forever
    _refused(call, _messages({"nope": grad}), grpc.StatusCode.NOT_FOUND, timeout=10)
    _refused(call, _messages({"w": np.ones(BIG + 1, F32)}), grpc.StatusCode.INVALID_ARGUMENT,
             "bytes", timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        call(iter(messages), timeout=10)  # no token
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert store.version("w") == 1
    reply = call(iter(messages), timeout=10, metadata=TOKEN.metadata)
    assert list(ps_pb2.PushReply.FromString(reply).versions) == [2]
    assert store.version("w") == 2 and np.all(store.pull(["w"])[0].value == -1)


def test_a_stream_cancelled_midway_changes_nothing_and_frees_its_place(served) -> None:
    service, address, call = served
    service.max_waiting = 1  # one place: a leaked place would refuse the next stream
    service._waiting = threading.BoundedSemaphore(1)
    store = service.store
    store.create("w", np.zeros(BIG, F32), optimizer=OptimizerSpec.sgd(1.0))
    messages = _messages({"w": np.ones(BIG, F32)})
    hold = threading.Event()

    def stalled():
        yield messages[0]
        hold.wait(10)  # the rest never comes: the call is cancelled meanwhile

    future = call.future(stalled(), timeout=10, metadata=TOKEN.metadata)
    time.sleep(0.3)
    future.cancel()
    hold.set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the server notices the cancellation and lets go
        try:
            call(iter(messages), timeout=10, metadata=TOKEN.metadata)
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            time.sleep(0.05)
    assert store.version("w") == 2 and np.all(store.pull(["w"])[0].value == -1)


def test_with_no_place_for_a_stream_the_client_pushes_in_one_message(served, monkeypatch) -> None:
    service, address, _ = served
    service._waiting = threading.BoundedSemaphore(1)
    assert service._waiting.acquire(blocking=False)  # every place taken
    service.store.create("w", np.zeros(BIG, F32), optimizer=OptimizerSpec.sgd(1.0))
    sent = []
    real = ps_client.encode_push_request
    monkeypatch.setattr(ps_client, "encode_push_request", lambda *a: sent.append(1) or real(*a))
    with PsClient(address, TOKEN, task="ps:0", timeout=20) as ps:
        assert ps.push({"w": np.ones(BIG, F32)}) == [2]
    assert sent == [1]
    assert np.all(service.store.pull(["w"])[0].value == -1)


def test_a_ps_without_push_chunks_gets_one_message_pushes(monkeypatch) -> None:
    # An older ps (a rolling upgrade) answers PushChunks UNIMPLEMENTED, having applied nothing:
    # the client pushes in one message, and does not try a stream again.
    handlers = PsService.handlers
    monkeypatch.setattr(PsService, "handlers",
                        lambda self: {k: v for k, v in handlers(self).items()
                                      if k != "PushChunks"})
    server = TaskServer("127.0.0.1:0", TOKEN)
    service = PsService(VariableStore("ps:0"), "ps:0")
    service.install(server)
    server.start()
    try:
        service.store.create("w", np.zeros(BIG, F32), optimizer=OptimizerSpec.sgd(1.0))
        tried = []
        real = PsClient._push_streamed
        monkeypatch.setattr(PsClient, "_push_streamed",
                            lambda self, *a: tried.append(1) or real(self, *a))
        with PsClient(server.address, TOKEN, task="ps:0", timeout=20) as ps:
            assert ps.push({"w": np.ones(BIG, F32)}) == [2]
            assert ps.push({"w": np.ones(BIG, F32)}) == [3]
        assert tried == [1]  # one try, then one message every time
        assert np.all(service.store.pull(["w"])[0].value == -2)  # each push applied once
    finally:
        server.stop(grace=0)


def test_a_streamed_push_travels_over_mutual_tls(tmp_path) -> None:
    write_host_cert(tmp_path, [], name="cluster")
    token = Token("s3cret-tls-chunks", TlsConfig.load(cert=tmp_path / "cluster.pem",
                                                      key=tmp_path / "cluster.key",
                                                      ca=tmp_path / "ca.pem"))
    server = TaskServer("127.0.0.1:0", token)
    store = VariableStore("ps:0")
    PsService(store, "ps:0").install(server)
    server.start()
    try:
        store.create("w", np.zeros(BIG, F32), optimizer=OptimizerSpec.sgd(0.5))
        grad = np.random.default_rng(9).standard_normal(BIG).astype(F32)
        with PsClient(server.address, token, task="ps:0", timeout=20) as ps:
            assert ps.push({"w": grad}) == [2]
        assert store.pull(["w"])[0].value.tobytes() == (-(F32(0.5) * grad)).tobytes()
    finally:
        server.stop(grace=0)
