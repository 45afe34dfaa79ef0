"""``PsClient``: one parameter-server task's variable store, over gRPC.

Every call has a deadline (``timeout`` per call, else the client's default) and raises only
typed errors: the store's own (``VariableNotFoundError``, ``VariableExistsError``,
``VariableMismatchError``, ``StaleStepError``, ``SyncTimeoutError``) as the server raised them,
``UnauthenticatedError`` for a wrong token, and ``PeerUnavailableError`` naming the task and its
address when the task is dead, unreachable or too slow (translated by
``cluster.transport._grpc_errors``), and ``ValueError`` for a reply it cannot parse. The gRPC
edge of the ``ps`` package: the store and partitioners never import gRPC. Pulls and pushes
travel as ``cluster.transport._ps_codec`` writes them (protobuf's bytes, fewer copies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from cluster._ps_values import AssignMode, OptimizerSpec, Pulled
from cluster.deadline import Deadline
from cluster.errors import PeerUnavailableError
from cluster.transport._closing import close_channels
from cluster.transport._grpc_errors import is_exhausted, is_unimplemented, translate
from cluster.transport._pb import ps_pb2
from cluster.transport._ps_codec import decode_pull_reply, encode_push_request, push_chunk_messages
from cluster.transport._ps_wire import fill_chunk, from_chunk
from cluster.transport.api import PeerInfo
from cluster.transport.auth import Token
from cluster.transport.control import HeartbeatMonitor
from cluster.transport.server import CHANNEL_OPTIONS
from cluster.transport.tls import open_channel

__all__ = ["SERVICE", "PsClient", "PsWatch", "optimizer_from_proto", "optimizer_to_proto"]

SERVICE = "cluster_runtime.v1.ParameterServer"
DEFAULT_TIMEOUT = 30.0
#: A push of at least this many gradient bytes goes as a ``PushChunks`` stream of messages of
#: :data:`CHUNK_BYTES`: the next message is written while the last travels. 16 MiB to one ps
#: measured 0.74-0.84x of a bare gRPC echo so against 0.70-0.71x in one message, alternating
#: (docs/benchmarks/ps.md); 1 MiB messages cost more per message, 4 MiB overlap
#: less.
STREAM_MIN_BYTES = 4 << 20
CHUNK_BYTES = 2 << 20


class _ReplyTooLarge(Exception):
    """The server refused a Pull whose reply would exceed its limit (RESOURCE_EXHAUSTED)."""


class _StreamRefused(Exception):
    """The server did not take a PushChunks stream and applied nothing: it had no place for one
    (RESOURCE_EXHAUSTED, nothing read), or it predates the method (UNIMPLEMENTED: ``never``)."""

    def __init__(self, details: str, *, never: bool = False) -> None:
        super().__init__(details)
        self.never = never


def optimizer_to_proto(spec: OptimizerSpec | None) -> ps_pb2.OptimizerConfig:
    if spec is None:
        return ps_pb2.OptimizerConfig()
    if spec.rule == "sgd":
        return ps_pb2.OptimizerConfig(sgd=ps_pb2.SGDConfig(
            learning_rate=spec.learning_rate, momentum=spec.momentum, nesterov=spec.nesterov))
    return ps_pb2.OptimizerConfig(adam=ps_pb2.AdamConfig(
        learning_rate=spec.learning_rate, beta_1=spec.beta_1, beta_2=spec.beta_2,
        epsilon=spec.epsilon))


def optimizer_from_proto(config: ps_pb2.OptimizerConfig) -> OptimizerSpec | None:
    rule = config.WhichOneof("rule")
    if rule == "sgd":
        return OptimizerSpec.sgd(config.sgd.learning_rate, config.sgd.momentum,
                                 config.sgd.nesterov)
    if rule == "adam":
        a = config.adam
        return OptimizerSpec.adam(a.learning_rate, a.beta_1, a.beta_2, a.epsilon)
    return None


class PsClient:
    """Calls the ``ParameterServer`` service of task ``task`` (``"ps:0"``) at ``address``.

    ``token``: the cluster's :class:`Token` (or its string). ``timeout``: default seconds per
    call. Thread-safe; :meth:`close` (or ``with``) releases the channel.
    """

    def __init__(self, address: str, token: Token | str | None, *, task: str = "ps",
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.address = address
        self.task = task
        self.timeout = timeout
        self._peer = PeerInfo(-1, task, address)
        self._token = token if isinstance(token, Token) else Token(token)
        self._channel = open_channel(address, CHANNEL_OPTIONS, self._token.tls)
        # A type of None: bytes written or parsed here by _ps_codec (tensors skip protobuf).
        self._calls = {
            name: self._channel.unary_unary(
                f"/{SERVICE}/{name}", request_serializer=req and req.SerializeToString,
                response_deserializer=rep and rep.FromString)
            for name, req, rep in [
                ("CreateVariable", ps_pb2.CreateVariableRequest, ps_pb2.CreateVariableReply),
                ("Pull", ps_pb2.PullRequest, None),
                ("Push", None, ps_pb2.PushReply),
                ("Assign", ps_pb2.AssignRequest, ps_pb2.AssignReply),
                ("ReadSlots", ps_pb2.ReadSlotsRequest, ps_pb2.ReadSlotsReply),
                ("WriteSlots", ps_pb2.WriteSlotsRequest, ps_pb2.WriteSlotsReply),
            ]
        }
        self._streams = True  # False once the ps answered PushChunks UNIMPLEMENTED
        # Messages written by _ps_codec.push_chunk_messages; called like the others.
        self._calls["PushChunks"] = self._channel.stream_unary(
            f"/{SERVICE}/PushChunks", response_deserializer=ps_pb2.PushReply.FromString)

    def __repr__(self) -> str:
        return f"PsClient({self.task} at {self.address})"

    def close(self) -> None:
        """Close the channel, waiting at most
        :data:`~cluster.transport._closing.CLOSE_TIMEOUT`."""
        close_channels([self._channel], what=f"channel to {self.task}")

    def __enter__(self) -> PsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: float | None, activity: str) -> Any:
        seconds = self.timeout if timeout is None else timeout
        start = time.monotonic()
        try:
            return self._calls[method](request, timeout=seconds, metadata=self._token.metadata)
        except grpc.RpcError as e:
            if method == "Pull" and is_exhausted(e):
                raise _ReplyTooLarge(e.details()) from e
            if method == "PushChunks" and is_exhausted(e):  # the places refusal: nothing read
                raise _StreamRefused(e.details()) from e
            if method == "PushChunks" and is_unimplemented(e):
                raise _StreamRefused(e.details(), never=True) from e  # an older ps
            # The time that really passed (a refused connection fails at once), and the budget.
            raise translate(e, self._peer, f"{activity} (deadline {seconds:.1f} s)",
                            seconds=time.monotonic() - start) from e

    def create(self, name: str, initial_value: Any, *, trainable: bool = True,
               optimizer: OptimizerSpec | None = None, exist_ok: bool = False,
               timeout: float | None = None) -> int:
        """:meth:`VariableStore.create` on the task; returns the variable's version."""
        request = ps_pb2.CreateVariableRequest(
            name=name, trainable=trainable, optimizer=optimizer_to_proto(optimizer),
            exist_ok=exist_ok)
        fill_chunk(request.initial_value, np.asarray(initial_value), f"variable {name}")
        return self._call("CreateVariable", request, timeout, f"create {name}").version

    def pull(self, names: Iterable[str], newer_than: int | Sequence[int] | None = None, *,
             step: int | None = None, timeout: float | None = None) -> list[Pulled]:
        """:meth:`VariableStore.pull` on the task (``step``: values as of that synchronous
        step); values are read-only arrays."""
        names = list(names)
        if newer_than is None or isinstance(newer_than, int):
            newer_than = [newer_than or 0] * len(names)
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        return self._pull(names, list(newer_than), step, deadline)

    def _pull(self, names: list[str], newer_than: list[int], step: int | None,
              deadline: Deadline) -> list[Pulled]:
        """One Pull; one per half when the server finds the reply too large (its limit on one
        Pull of several variables), all within ``deadline``."""
        activity = f"pull of {len(names)} variables" + (
            f" as of step {step}" if step is not None else "")
        try:
            reply = self._call("Pull", ps_pb2.PullRequest(names=names, newer_than=newer_than,
                                                          step=step),
                               deadline.remaining(), activity)
        except _ReplyTooLarge as e:
            if len(names) < 2:
                raise ValueError(f"{self.task} ({self.address}) refused the {activity}: {e}") \
                    from e
            half = len(names) // 2
            return (self._pull(names[:half], newer_than[:half], step, deadline)
                    + self._pull(names[half:], newer_than[half:], step, deadline))
        try:
            values = decode_pull_reply(reply)  # views of the reply's bytes: no copy
        except ValueError as e:
            raise ValueError(f"{self.task} ({self.address}) sent a malformed reply to the "
                             f"{activity}: {e}") from e
        return [Pulled(*value) for value in values]

    def push(self, grads: Mapping[str, Any], *, step: int | None = None,
             num_contributors: int = 1, contributor: int | None = None, wait: bool = True,
             optimizer: OptimizerSpec | None = None,
             timeout: float | None = None) -> list[int]:
        """:meth:`VariableStore.push` on the task; returns the versions, in ``grads`` order.

        A synchronous push waits for its step up to ``timeout`` (the server answers
        :class:`SyncTimeoutError` shortly before it), or with ``wait=False`` returns once its
        contribution is recorded. ``contributor`` and ``optimizer``: as in
        :meth:`VariableStore.push`. Raises ``ValueError`` locally for a ``contributor`` outside
        ``[0, num_contributors)``.
        """
        if contributor is not None and not 0 <= contributor < num_contributors:
            raise ValueError(f"contributor must be an int in [0, {num_contributors}) "
                             f"(num_contributors={num_contributors}), got {contributor!r}")
        header = ps_pb2.PushRequest(step=step or 0, num_contributors=num_contributors,
                                    contributor=contributor, no_wait=not wait)
        if optimizer is not None:
            header.optimizer.CopyFrom(optimizer_to_proto(optimizer))
        arrays = {n: np.asarray(g) for n, g in grads.items()}
        activity = (f"push of {len(grads)} gradients"
                    + (f" for step {step}" if step is not None else "")
                    + (f" by contributor {contributor}" if contributor is not None else ""))
        if self._streams and sum(a.nbytes for a in arrays.values()) >= STREAM_MIN_BYTES:
            try:
                return self._push_streamed(arrays, header, timeout, activity)
            except _StreamRefused as e:
                # Nothing was applied: one message then. A ps without the method (an older
                # one, during a rolling upgrade) gets one message from now on.
                self._streams = not e.never
        # Each gradient copied once, straight into the request's bytes.
        request = encode_push_request(arrays, header)
        return list(self._call("Push", request, timeout, activity).versions)

    def _push_streamed(self, arrays: Mapping[str, np.ndarray], header: ps_pb2.PushRequest,
                       timeout: float | None, activity: str) -> list[int]:
        """:meth:`push` as a ``PushChunks`` stream; raises :class:`_StreamRefused` when the
        server has no place for a stream (it read nothing: a retry in one message is safe)."""
        writers = push_chunk_messages(arrays, header, CHUNK_BYTES)  # checks every gradient
        # gRPC takes the messages from its own thread, writing each as the last goes out.
        messages = (write() for write in writers)
        return list(self._call("PushChunks", messages, timeout, activity).versions)

    def assign(self, name: str, value: Any, mode: AssignMode = AssignMode.ASSIGN, *,
               timeout: float | None = None) -> int:
        """:meth:`VariableStore.assign` on the task; returns the new version."""
        request = ps_pb2.AssignRequest(mode=int(mode))
        request.value.name = name
        fill_chunk(request.value.value, np.asarray(value), f"value of {name}")
        return self._call("Assign", request, timeout, f"assign to {name}").version

    def read_slots(self, names: Iterable[str], *, timeout: float | None = None
                   ) -> dict[str, tuple[OptimizerSpec | None, int, dict[str, np.ndarray]]]:
        """:meth:`VariableStore.read_slots` of each of ``names`` on the task, in one call."""
        names = list(names)
        reply = self._call("ReadSlots", ps_pb2.ReadSlotsRequest(names=names), timeout,
                           f"read of the optimizer slots of {len(names)} variables")
        return {v.name: (optimizer_from_proto(v.optimizer), v.iterations,
                         {s.name: from_chunk(s.value, f"slot {s.name} of {v.name}")
                          for s in v.slots})
                for v in reply.variables}

    def write_slots(self, name: str, optimizer: OptimizerSpec, *, iterations: int | None = None,
                    slots: Mapping[str, Any] | None = None, timeout: float | None = None) -> None:
        """:meth:`VariableStore.write_slots` on the task."""
        request = ps_pb2.WriteSlotsRequest()
        entry = request.variables.add(name=name, optimizer=optimizer_to_proto(optimizer))
        if iterations is not None:
            entry.iterations = int(iterations)
        for slot, value in (slots or {}).items():
            fill_chunk(entry.slots.add(name=slot).value, np.asarray(value),
                       f"slot {slot} of {name}")
        self._call("WriteSlots", request, timeout, f"write of the optimizer slots of {name}")


class PsWatch:
    """Watches the heartbeats of parameter-server tasks ``peers`` on behalf of task ``me``:
    ``on_gone(peer, error)`` once per peer when it is lost (``error``) or shuts down
    (``None``). Starts at construction; :meth:`close` stops watching and releases the channels.
    """

    def __init__(self, peers: Sequence[PeerInfo], token: Token, *, me: str,
                 on_gone: Callable[[PeerInfo, PeerUnavailableError | None], None],
                 interval: float, timeout: float) -> None:
        self._channels = {p.rank: open_channel(p.address, CHANNEL_OPTIONS, token.tls)
                          for p in peers}
        self._monitor = HeartbeatMonitor(
            PeerInfo(-1, me, ""), list(peers), self._channels, token,
            on_lost=on_gone, on_departed=lambda peer: on_gone(peer, None),
            interval=interval, timeout=timeout)
        self._monitor.start()

    def close(self) -> None:
        self._monitor.close()
        close_channels(self._channels.values(), what="parameter-server watch channel")
