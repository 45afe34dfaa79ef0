"""all_reduce over the in-process transport: N ranks as threads, checked against NumPy.

Floats are compared with a dtype tolerance against a float64 reference; integers exactly; and
every rank's result must be bitwise identical to every other's, with the input's dtype and shape,
and the inputs left untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.collectives import CollectiveGroup, CommunicationOptions, ReduceOp
from cluster.collectives.options import ALGORITHM_ENV, Algorithm, CollectiveSettings
from cluster.deadline import Deadline
from cluster.errors import TaskConfigError
from cluster.settings import TaskSettings
from cluster.transport.api import MessageKey, PeerInfo, Received, Transport
from cluster.transport.inproc import InProcessHub

from ._threads import make_groups, run_ranks

DTYPES = ["float16", "float32", "float64", "int32", "int64"]
TOLERANCE = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}

# small_message_bytes=0 forces the ring at every size; a huge one forces recursive doubling;
# the binomial tree is forced by name. The ring runs with 8-byte chunks so that multi-chunk
# pipelining is exercised at tiny sizes.
ALGORITHMS = {
    "ring": dict(small_message_bytes=0, chunk_bytes=8),
    "doubling": dict(small_message_bytes=1 << 30),
    "tree": dict(settings=CollectiveSettings(algorithm=Algorithm.TREE)),
}


def rank_input(seed: int, rank: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    n = int(np.prod(shape))
    values = rng.normal(0, 10, n) if np.dtype(dtype).kind == "f" else rng.integers(-999, 999, n)
    return values.astype(dtype).reshape(shape)


def reference(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    stack = np.stack([x.astype(np.float64 if x.dtype.kind == "f" else np.int64) for x in inputs])
    if op is ReduceOp.MAX:
        return stack.max(axis=0)
    if op is ReduceOp.MIN:
        return stack.min(axis=0)
    total = stack.sum(axis=0)
    if op is ReduceOp.SUM:
        return total
    if total.dtype.kind == "f":
        return total / len(inputs)
    return np.sign(total) * (np.abs(total) // len(inputs))  # truncation toward zero, as TF


def check(results: list[np.ndarray], inputs: list[np.ndarray], op: ReduceOp) -> None:
    """Identical bytes on every rank, input dtype/shape, and NumPy's answer."""
    first = results[0]
    for r in results:
        assert isinstance(r, np.ndarray)
        assert r.dtype == inputs[0].dtype and r.shape == inputs[0].shape
        assert r.tobytes() == first.tobytes()
    want = reference(inputs, op)
    if first.dtype.kind == "f" and op in (ReduceOp.SUM, ReduceOp.MEAN):
        tol = TOLERANCE[str(first.dtype)]
        np.testing.assert_allclose(first.astype(np.float64), want, rtol=tol, atol=tol * 10)
    else:
        assert np.array_equal(first.astype(want.dtype), want)


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.value)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_all_reduce_matches_numpy(world: int, algorithm: str, op: ReduceOp) -> None:
    # Awkward sizes: empty, one, N-1, N+1, primes, several chunks per segment.
    sizes = sorted({0, 1, max(world - 1, 0), world + 1, 13, 37})
    hub, groups = make_groups(world, **ALGORITHMS[algorithm])
    cases = [(dtype, (n,)) for dtype in DTYPES for n in sizes]
    inputs = {
        r: [rank_input(i, r, dtype, shape) for i, (dtype, shape) in enumerate(cases)]
        for r in range(world)
    }
    originals = {r: [x.copy() for x in xs] for r, xs in inputs.items()}

    def body(rank: int) -> list[np.ndarray]:
        return [groups[rank].all_reduce(x, op) for x in inputs[rank]]

    results = run_ranks(body, world, transports=hub.transports)
    for i in range(len(cases)):
        check([results[r][i] for r in range(world)], [inputs[r][i] for r in range(world)], op)
    for r in range(world):  # the caller's arrays are never modified
        for x, orig in zip(inputs[r], originals[r], strict=True):
            assert x.tobytes() == orig.tobytes()


def test_all_reduce_eight_ranks_both_algorithms() -> None:
    hub, groups = make_groups(8, small_message_bytes=200, chunk_bytes=24)
    inputs = [[rank_input(n, r, "float32", (n,)) for n in (0, 7, 9, 49, 101)] for r in range(8)]
    results = run_ranks(
        lambda r: [groups[r].all_reduce(x, ReduceOp.SUM) for x in inputs[r]],
        8,
        transports=hub.transports,
    )
    for i in range(5):
        check([res[i] for res in results], [xs[i] for xs in inputs], ReduceOp.SUM)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("shape", [(), (3, 4), (2, 3, 5), (0, 3), (4, 0, 2), (1, 1, 1, 7)], ids=str)
def test_all_reduce_keeps_any_shape(shape: tuple[int, ...], algorithm: str) -> None:
    hub, groups = make_groups(3, **ALGORITHMS[algorithm])
    inputs = [rank_input(1, r, "float64", shape) for r in range(3)]
    results = run_ranks(lambda r: groups[r].all_reduce(inputs[r], "sum"), 3)
    check(results, inputs, ReduceOp.SUM)


def test_all_reduce_accepts_non_contiguous_and_fortran_ordered_inputs() -> None:
    hub, groups = make_groups(3, small_message_bytes=0, chunk_bytes=16)
    base = [rank_input(2, r, "int64", (6, 8)) for r in range(3)]
    strided = [b[::2, 1::3] for b in base]
    fortran = [np.asfortranarray(b) for b in base]

    def body(rank: int) -> tuple[np.ndarray, np.ndarray]:
        g = groups[rank]
        return g.all_reduce(strided[rank]), g.all_reduce(fortran[rank], ReduceOp.MAX)

    results = run_ranks(body, 3)
    check([r[0] for r in results], strided, ReduceOp.SUM)
    check([r[1] for r in results], fortran, ReduceOp.MAX)


def test_all_reduce_of_a_large_tensor_uses_many_pipelined_chunks() -> None:
    # 300k float32 with 4 KiB chunks: ~25 chunks per ring segment, each forwarded as reduced.
    hub, groups = make_groups(4, chunk_bytes=4096)
    inputs = [rank_input(3, r, "float32", (300_001,)) for r in range(4)]
    results = run_ranks(lambda r: groups[r].all_reduce(inputs[r], ReduceOp.MEAN), 4)
    check(results, inputs, ReduceOp.MEAN)


def test_python_and_numpy_scalars_come_back_as_numpy_scalars() -> None:
    hub, groups = make_groups(2)

    def body(rank: int) -> list[object]:
        g = groups[rank]
        return [g.all_reduce(1.5), g.all_reduce(rank + 1), g.all_reduce(np.float32(2.0), "max")]

    results = run_ranks(body, 2)
    for out in results:
        # Python values take TensorFlow's dtypes (float32, int32), as in tf.distribute
        assert out[0] == 3.0 and type(out[0]) is np.float32
        assert out[1] == 3 and type(out[1]) is np.int32
        assert out[2] == 2.0 and type(out[2]) is np.float32


def test_integer_mean_truncates_toward_zero_like_tensorflow() -> None:
    hub, groups = make_groups(2)
    inputs = [np.array([-5, 5, 7, -7, 1], np.int32), np.array([0, 0, 0, 0, 0], np.int32)]
    results = run_ranks(lambda r: groups[r].all_reduce(inputs[r], ReduceOp.MEAN), 2)
    assert results[0].dtype == np.int32
    assert results[0].tolist() == [-2, 2, 3, -3, 0]


def test_signed_zeros_reduce_to_identical_bytes_on_every_rank() -> None:
    # maximum(-0.0, 0.0) and maximum(0.0, -0.0) differ in sign: partners must agree on order.
    for world in (2, 3, 4, 5):
        hub, groups = make_groups(world, small_message_bytes=1 << 30)
        inputs = [np.array([(-1.0) ** r * 0.0] * 3) for r in range(world)]
        results = run_ranks(
            lambda r, g=groups, x=inputs: g[r].all_reduce(x[r], ReduceOp.MAX), world
        )
        assert len({r.tobytes() for r in results}) == 1, world


class _NoMessages(Transport):
    """A one-rank transport on which any message is a test failure."""

    rank, world_size = 0, 1

    @property
    def peers(self) -> list[PeerInfo]:
        return [PeerInfo(0, "worker:0", "")]

    def send(
        self, dst: int, key: MessageKey, payload: object, *, deadline: Deadline, signature: str = ""
    ) -> None:
        raise AssertionError("a one-rank group sent a message")

    def recv(self, src: int, key: MessageKey, *, deadline: Deadline) -> Received:
        raise AssertionError("a one-rank group waited for a message")

    def abort(self, reason: str) -> None:
        raise AssertionError(f"a one-rank group aborted: {reason}")

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_one_rank_sends_no_messages_at_all() -> None:
    g = CollectiveGroup(_NoMessages())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = g.all_reduce(x, ReduceOp.MEAN)
    assert out is not x and np.array_equal(out, x)
    assert np.array_equal(g.all_gather(x, axis=1), x)
    assert np.array_equal(g.broadcast(x), x)
    assert np.array_equal(g.reduce_scatter(x), x)
    assert [a.tolist() for a in g.all_reduce_many([x, np.int64(4)])] == [x.tolist(), 4]
    g.barrier()


def test_collectives_leave_no_message_behind() -> None:
    # Every message sent is received, handshakes included (a leftover would leak per call).
    hub, groups = make_groups(5, small_message_bytes=64, chunk_bytes=16)

    def body(rank: int) -> None:
        g = groups[rank]
        g.all_reduce(np.ones(3, np.float32))
        g.all_reduce(np.ones(100, np.float32))
        g.all_gather(np.ones((rank + 1, 2)), axis=0)
        g.broadcast(np.ones(50), root=3)
        g.reduce_scatter(np.ones((9, 2)))
        g.all_reduce_many([np.ones(3), np.ones(40, np.float32), np.ones(2)])
        g.all_reduce_many([])
        g.barrier()

    run_ranks(body, 5)
    assert [len(t._mailbox._messages) for t in hub.transports] == [0] * 5


@pytest.mark.parametrize(
    ("env", "options", "expected"),
    [
        ("", CommunicationOptions(), "doubling"),
        ("", CommunicationOptions(implementation="RING"), "ring"),
        ("", CommunicationOptions(implementation="NCCL"), "ring"),  # falls back, as in TF
        ("ring", CommunicationOptions(), "ring"),
        ("doubling", CommunicationOptions(implementation="RING"), "doubling"),
        ("tree", CommunicationOptions(implementation="RING"), "tree"),
    ],
)
def test_algorithm_choice_follows_size_options_and_environment(
    monkeypatch: pytest.MonkeyPatch, env: str, options: CommunicationOptions, expected: str
) -> None:
    settings = CollectiveSettings.from_env({ALGORITHM_ENV: env})
    g = CollectiveGroup(InProcessHub(2).transports[0], options=options, settings=settings)
    assert g._engine.network.algorithm(1024, options).split("/")[0] == expected
    if not env and options.implementation.value == "AUTO":
        assert g._engine.network.algorithm(64 * 1024, options).startswith("ring")


def test_bad_algorithm_environment_is_a_clear_error() -> None:
    with pytest.raises(TaskConfigError, match=ALGORITHM_ENV):
        TaskSettings.from_env({ALGORITHM_ENV: "butterfly"})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 6),
    shape=st.lists(st.integers(0, 6), max_size=3).map(tuple),
    algorithm=st.sampled_from(list(ALGORITHMS)),
    chunk_bytes=st.sampled_from([1, 8, 24, 1 << 20]),
    op=st.sampled_from(list(ReduceOp)),
    seed=st.integers(0, 2**32 - 1),
)
def test_all_reduce_property(
    world: int, shape: tuple[int, ...], algorithm: str, chunk_bytes: int, op: ReduceOp, seed: int
) -> None:
    hub, groups = make_groups(world, **{**ALGORITHMS[algorithm], "chunk_bytes": chunk_bytes})
    inputs = [rank_input(seed, r, "int64", shape) for r in range(world)]
    results = run_ranks(
        lambda r: groups[r].all_reduce(inputs[r], op), world, transports=hub.transports
    )
    check(results, inputs, op)


# The network algorithms themselves (the tests' 1 KiB shm rounds hold at most 16 ranks).
@pytest.mark.network_path
@pytest.mark.parametrize("algorithm", ["doubling", "tree"])
@pytest.mark.parametrize("world", [17, 33, 64])
def test_latency_bound_algorithms_at_large_n_are_exact_and_identical(
    world: int, algorithm: str
) -> None:
    # Non-powers of two exercise doubling's fold-in/fold-out and the tree's clipped subtrees.
    hub, groups = make_groups(world, **ALGORITHMS[algorithm])
    floats = [rank_input(world, r, "float32", (1024,)) for r in range(world)]
    ints = [rank_input(world, r, "int64", (257,)) for r in range(world)]

    def body(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = groups[rank]
        return (g.all_reduce(floats[rank], ReduceOp.SUM), g.all_reduce(ints[rank], ReduceOp.SUM),
                g.all_reduce(floats[rank], ReduceOp.MEAN))

    results = run_ranks(body, world, timeout=60, transports=hub.transports)
    check([r[0] for r in results], floats, ReduceOp.SUM)  # bitwise identical on every rank
    check([r[1] for r in results], ints, ReduceOp.SUM)  # integer sums exact
    check([r[2] for r in results], floats, ReduceOp.MEAN)
