"""The ``ParameterServer`` gRPC service of a ``ps`` task: :class:`VariableStore` on the wire.

Requests are authenticated by the task server's token interceptor before any byte reaches these
handlers. Tensors are decoded with ``np.frombuffer`` (never pickle); the two messages that carry
a step's tensors, ``PullReply`` and ``PushRequest``, are written and parsed by
``cluster.transport._ps_codec`` around the raw bytes (same wire format, fewer copies). A store
error is answered with its status code and its type name in trailing metadata, a malformed
request with INVALID_ARGUMENT (both decided by ``cluster.transport._grpc_errors``); the server
keeps serving either way.

Limits, so that no request can exhaust the task (each refusal names its limit):

- A ``Pull`` may name a variable once (INVALID_ARGUMENT), and a ``Pull`` of several variables
  whose reply would exceed :data:`MAX_PULL_REPLY_BYTES` is refused with RESOURCE_EXHAUSTED
  before anything is copied (``PsClient.pull`` then asks for halves; one variable is always
  served, whatever its size).
- A synchronous ``Push`` that waits for its step must carry a gRPC deadline of at most
  :data:`MAX_SYNC_WAIT_SECONDS` (INVALID_ARGUMENT otherwise, before it counts), may name at most
  ``max_contributors`` contributors (the workers and chief of the cluster; INVALID_ARGUMENT), and
  at most ``max_waiting`` such pushes wait at once (RESOURCE_EXHAUSTED for more), so that
  Check, Pull and heartbeats always find one of the server's RPC threads.
- A ``PushChunks`` stream must carry such a deadline too, and holds one of the same
  ``max_waiting`` places from its first message to its answer (RESOURCE_EXHAUSTED before a
  byte is read when none is free; ``PsClient`` then pushes in one message). Each chunk is checked
  as it arrives (:class:`~cluster.ps._pieces.PieceAssembler`): its variable must exist with the
  tensor's size, so what a stream makes the task hold is bounded by the variables it names.
"""

from __future__ import annotations

import collections
import math
import threading

import grpc
import numpy as np

from cluster.deadline import Deadline
from cluster.errors import VariableMismatchError, VariableStoreError
from cluster.ps._pieces import PieceAssembler
from cluster.ps.store import AssignMode, VariableStore
from cluster.transport._grpc_errors import abort_exhausted, abort_invalid, abort_store_error
from cluster.transport._pb import ps_pb2
from cluster.transport._ps_codec import (
    MIN_PIECE_BYTES,
    decode_push_pieces,
    decode_push_request,
    encode_value_entry,
)
from cluster.transport._ps_wire import fill_chunk, from_chunk
from cluster.transport.ps_client import SERVICE, optimizer_from_proto, optimizer_to_proto
from cluster.transport.server import TaskServer

__all__ = ["MAX_PULL_REPLY_BYTES", "MAX_SYNC_WAIT_SECONDS", "MAX_WAITING_PUSHES", "PsService"]

# A synchronous push answers this long before the caller's deadline, so the caller gets
# SyncTimeoutError (its step is late) rather than DEADLINE_EXCEEDED (the task looks dead).
_REPLY_MARGIN = 0.5

#: The largest reply to a Pull of several variables (one variable is served whatever its size).
MAX_PULL_REPLY_BYTES = 64 << 20
#: The longest a synchronous push may wait for its step (its gRPC deadline).
MAX_SYNC_WAIT_SECONDS = 24 * 3600.0
#: Synchronous pushes that may wait at once: the task server has 32 RPC threads, and Check,
#: Pull and heartbeats must always find one.
MAX_WAITING_PUSHES = 24
#: Contributors a push may name before the task knows its cluster (``max_contributors``).
_MAX_CONTRIBUTORS_UNKNOWN_CLUSTER = 1024


def _bounded_deadline(context: grpc.ServicerContext) -> float | None:
    """The call's remaining seconds, or ``None`` when it has no gRPC deadline (its remaining
    time is then unbounded, or absent) or one beyond :data:`MAX_SYNC_WAIT_SECONDS`."""
    remaining = context.time_remaining()
    if remaining is None or not math.isfinite(remaining) or remaining > MAX_SYNC_WAIT_SECONDS:
        return None
    return remaining


class _OverLimit(Exception):
    """A well-formed request the service refuses for one of its limits (RESOURCE_EXHAUSTED)."""


class PsService:
    """Serves ``store`` as task ``task``; :meth:`install` adds it to a :class:`TaskServer`.

    ``max_contributors``: the most contributors a synchronous push may name (the cluster's
    workers and chief; ``python -m ps`` sets it once it knows the cluster). ``max_waiting``: how
    many synchronous pushes may wait at once (see the module docstring).
    """

    def __init__(self, store: VariableStore, task: str = "", *,
                 max_contributors: int = _MAX_CONTRIBUTORS_UNKNOWN_CLUSTER,
                 max_waiting: int = MAX_WAITING_PUSHES) -> None:
        self.store = store
        self.task = task
        self.max_contributors = max_contributors
        self.max_waiting = max_waiting
        self._waiting = threading.BoundedSemaphore(max_waiting)

    def _where(self) -> str:
        return f" on {self.task}" if self.task else ""

    def install(self, server: TaskServer) -> None:
        server.add_handlers(SERVICE, self.handlers())

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        # A type of None: the handler takes (or returns) the serialized bytes and parses (or
        # writes) them with _ps_codec, so a malformed push is answered INVALID_ARGUMENT by
        # _guard (gRPC would answer a failing deserializer INTERNAL) and tensors skip protobuf.
        def unary(fn, request_type, reply_type):
            return grpc.unary_unary_rpc_method_handler(
                self._guard(fn),
                request_deserializer=request_type and request_type.FromString,
                response_serializer=reply_type and reply_type.SerializeToString)

        return {
            "CreateVariable": unary(self._create, ps_pb2.CreateVariableRequest,
                                    ps_pb2.CreateVariableReply),
            "Pull": unary(self._pull, ps_pb2.PullRequest, None),
            "Push": unary(self._push, None, ps_pb2.PushReply),
            "PushChunks": grpc.stream_unary_rpc_method_handler(
                self._guard(self._push_chunks),
                response_serializer=ps_pb2.PushReply.SerializeToString),
            "Assign": unary(self._assign, ps_pb2.AssignRequest, ps_pb2.AssignReply),
            "ReadSlots": unary(self._read_slots, ps_pb2.ReadSlotsRequest,
                               ps_pb2.ReadSlotsReply),
            "WriteSlots": unary(self._write_slots, ps_pb2.WriteSlotsRequest,
                                ps_pb2.WriteSlotsReply),
        }

    @staticmethod
    def _guard(fn):
        def handler(request, context):
            try:
                return fn(request, context)
            except VariableStoreError as e:
                abort_store_error(context, e)
            except (ValueError, TypeError) as e:
                abort_invalid(context, str(e))
            except _OverLimit as e:
                abort_exhausted(context, str(e))
        return handler

    def _create(self, request, context):
        value = from_chunk(request.initial_value, f"variable {request.name}")
        version = self.store.create(request.name, value, trainable=request.trainable,
                                    optimizer=optimizer_from_proto(request.optimizer),
                                    exist_ok=request.exist_ok)
        return ps_pb2.CreateVariableReply(version=version)

    def _pull(self, request, context) -> bytes:
        names = list(request.names)
        if len(set(names)) != len(names):
            twice = sorted(n for n, k in collections.Counter(names).items() if k > 1)
            raise ValueError(f"pull{self._where()}: variables named more than once: "
                             f"{', '.join(twice[:5])}; name each variable once")
        if len(names) > 1:
            size = sum(self.store.nbytes(n) for n in names)
            if size > MAX_PULL_REPLY_BYTES:
                raise _OverLimit(f"pull of {len(names)} variables{self._where()}: the reply "
                                 f"would hold {size} bytes, over the limit of "
                                 f"{MAX_PULL_REPLY_BYTES} bytes per Pull of several variables; "
                                 "ask for fewer at a time")
        newer_than = list(request.newer_than) or None
        # Each value is copied once, under its lock, straight into its serialized entry; a
        # reply of one variable (one per ps in a sharded step) is that entry, not copied again.
        step = request.step if request.HasField("step") else None
        at = 0  # where the next entry starts in the reply: its data is aligned from there

        def encode(name: str, version: int, value: np.ndarray) -> bytes:
            nonlocal at
            entry = encode_value_entry(name, version, value, at)
            at += len(entry)
            return entry

        entries = self.store.pull_with(names, newer_than, encode, step=step)
        return entries[0] if len(entries) == 1 else b"".join(entries)

    def _push(self, data: bytes, context):
        request, gradients = decode_push_request(data)  # views of data: no copy
        grads = {}
        for name, grad in gradients:
            if name in grads:
                raise ValueError(f"push: two gradients for variable {name}")
            grads[name] = grad
        return self._push_grads(request, grads, context, holding=False)

    def _push_chunks(self, messages, context):
        """A ``PushChunks`` stream: its chunks are checked as they arrive and kept as views of
        their messages; nothing is applied before the last one (a caller that dies mid-stream
        changes nothing). The stream holds one of ``max_waiting`` places from its first message
        to its answer, so streams and waiting pushes together leave RPC threads free."""
        if _bounded_deadline(context) is None:
            raise ValueError(f"PushChunks{self._where()} needs a gRPC deadline of at most "
                             f"{MAX_SYNC_WAIT_SECONDS:.0f} s (a call timeout); this one has "
                             "none, or a longer one: nothing read")
        if not self._waiting.acquire(blocking=False):
            raise _OverLimit(f"PushChunks{self._where()}: {self.max_waiting} streams and "
                             "synchronous pushes already hold the server's places (the limit, "
                             "so that health checks and pulls keep RPC threads); nothing read: "
                             "push in one message, or retry later")
        try:
            header = None
            assembler = PieceAssembler(MIN_PIECE_BYTES)
            try:
                for data in messages:
                    request, pieces = decode_push_pieces(data)  # views of data: no copy
                    if header is None:
                        header = request
                    elif request.ByteSize():
                        raise ValueError("PushChunks: a message after the first holds header "
                                         "fields; only the first may (later ones: gradients)")
                    for name, (dtype, shape, start, flat) in pieces:
                        nbytes = math.prod(shape) * dtype.itemsize
                        if name not in assembler and self.store.nbytes(name) != nbytes:
                            # Checked at once: what a stream may make us hold is bounded by the
                            # sizes of the variables it names.
                            raise VariableMismatchError(
                                f"gradient of shape {shape} and dtype {dtype} ({nbytes} bytes) "
                                f"for variable {name}{self._where()} of "
                                f"{self.store.nbytes(name)} bytes", variable=name)
                        assembler.add(name, shape, dtype, start, flat)
            except grpc.RpcError:
                return None  # the caller cancelled, or its deadline passed: nothing applied
            if header is None:
                raise ValueError("PushChunks: an empty stream; send at least one message")
            return self._push_grads(header, assembler.finish(), context, holding=True)
        finally:
            self._waiting.release()

    def _push_grads(self, request, grads, context, *, holding: bool):
        """The push ``request``'s header asks for, of ``grads``; ``holding``: the caller holds
        one of the ``max_waiting`` places already."""
        contributor = request.contributor if request.HasField("contributor") else None
        contributors = max(1, request.num_contributors)
        synchronous = contributors > 1 or contributor is not None
        if synchronous and contributors > self.max_contributors:
            raise ValueError(
                f"push for step {request.step}{self._where()} names {contributors} contributors, "
                f"but the cluster has {self.max_contributors} tasks that can push (workers and "
                "chief); num_contributors must be at most that")
        wait = synchronous and not request.no_wait
        deadline = None
        if wait:
            remaining = _bounded_deadline(context)
            if remaining is None:
                raise ValueError(
                    f"synchronous push for step {request.step}{self._where()} waits for its "
                    f"step, so it needs a gRPC deadline of at most {MAX_SYNC_WAIT_SECONDS:.0f} "
                    "s (a call timeout); this one has none, or a longer one: not counted")
            deadline = Deadline.after(max(0.0, remaining - _REPLY_MARGIN))
            if not holding and not self._waiting.acquire(blocking=False):
                raise _OverLimit(f"synchronous push for step {request.step}{self._where()}: "
                                 f"{self.max_waiting} synchronous pushes already wait for their "
                                 "steps (the limit, so that health checks and pulls keep RPC "
                                 "threads); not counted: push without waiting, or retry later")
        try:
            versions = self.store.push(grads, step=request.step, num_contributors=contributors,
                                       contributor=contributor, wait=wait,
                                       optimizer=optimizer_from_proto(request.optimizer),
                                       deadline=deadline)
        finally:
            if wait and not holding:
                self._waiting.release()
        return ps_pb2.PushReply(versions=versions)

    def _assign(self, request, context):
        value = from_chunk(request.value.value, f"value of {request.value.name}")
        version = self.store.assign(request.value.name, value, AssignMode(request.mode))
        return ps_pb2.AssignReply(version=version)

    def _read_slots(self, request, context):
        reply = ps_pb2.ReadSlotsReply()
        for name in request.names:
            optimizer, iterations, slots = self.store.read_slots(name)
            entry = reply.variables.add(name=name, optimizer=optimizer_to_proto(optimizer),
                                        iterations=iterations)
            for slot, array in slots.items():
                fill_chunk(entry.slots.add(name=slot).value, array, f"slot {slot} of {name}")
        return reply

    def _write_slots(self, request, context):
        for entry in request.variables:
            optimizer = optimizer_from_proto(entry.optimizer)
            if optimizer is None:
                raise ValueError(f"write_slots: no optimizer given for {entry.name}")
            slots = {s.name: from_chunk(s.value, f"slot {s.name} of {entry.name}")
                     for s in entry.slots}
            iterations = entry.iterations if entry.HasField("iterations") else None
            self.store.write_slots(entry.name, optimizer, iterations=iterations, slots=slots)
        return ps_pb2.WriteSlotsReply()
