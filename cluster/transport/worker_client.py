"""``WorkerClient``: what a coordinator calls on one serving worker, over gRPC.

The ``Worker`` service's ``Run`` (``proto/coordinator.proto``) and the worker's ``Control``
service (its health and heartbeats). Calls are asynchronous: each returns a :class:`PendingCall`
whose done-callback wakes the caller, so a dispatcher waits on one event for "the call ended"
or "the worker was lost" instead of polling. Failures come back as typed errors, translated in
``cluster.transport._grpc_errors``; nothing above this module sees gRPC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

import grpc

from cluster.errors import PeerUnavailableError
from cluster.transport._closing import close_channels
from cluster.transport._grpc_errors import translate, translate_run
from cluster.transport._pb import control_pb2, coordinator_pb2
from cluster.transport.api import PeerInfo
from cluster.transport.auth import Token
from cluster.transport.control import SERVICE as CONTROL_SERVICE
from cluster.transport.control import HeartbeatMonitor
from cluster.transport.server import CHANNEL_OPTIONS
from cluster.transport.tls import open_channel

__all__ = ["SERVICE", "Health", "PendingCall", "WorkerClient"]

SERVICE = "cluster_runtime.v1.Worker"

T = TypeVar("T")


class Health(NamedTuple):
    """A worker's answer to a health check: ``status`` is ``"SERVING"``, ``"NOT_SERVING"`` or
    ``"WRONG_TASK"`` (the address belongs to another task: the cluster spec differs between
    tasks); ``incarnation`` changes when a new process serves the task."""

    status: str
    task: str
    incarnation: int


class PendingCall(Generic[T]):
    """One call in flight. :meth:`result` returns its value or raises its typed error."""

    def __init__(self, future: grpc.Future, error: Callable[[grpc.RpcError], Exception],
                 convert: Callable[[Any], T]) -> None:
        self._future = future
        self._error = error
        self._convert = convert

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when the call ends (at once if it has); ``fn`` must not block."""
        self._future.add_done_callback(lambda _: fn())

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        self._future.cancel()

    def result(self) -> T:
        """The reply (blocks until the call ended); raises the call's typed error."""
        try:
            return self._convert(self._future.result())
        except grpc.RpcError as e:
            raise self._error(e) from e


class WorkerClient:
    """Calls the worker task ``task`` at ``address`` on behalf of task ``me`` (the chief).

    Thread-safe; :meth:`close` releases the channel (and ends the calls in flight).
    """

    def __init__(self, task: str, address: str, token: Token, *, me: str) -> None:
        self.peer = PeerInfo(-1, task, address)
        self._token = token
        self._me = me
        self._channel = open_channel(address, CHANNEL_OPTIONS, token.tls)
        self._run = self._channel.unary_unary(
            f"/{SERVICE}/Run", request_serializer=coordinator_pb2.RunRequest.SerializeToString,
            response_deserializer=coordinator_pb2.RunReply.FromString)
        self._check = self._channel.unary_unary(
            f"/{CONTROL_SERVICE}/Check",
            request_serializer=control_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=control_pb2.HealthCheckResponse.FromString)

    def __repr__(self) -> str:
        return f"WorkerClient({self.peer})"

    def check(self, timeout: float) -> PendingCall[Health]:
        """Ask whether the worker serves. The call waits (up to ``timeout`` s) for the worker to
        be reachable, so a dead worker's check ends when a new process answers on its address
        (the channel reconnects on its own backoff). Errors: ``UnauthenticatedError`` for a
        refused token, ``PeerUnavailableError`` when it is still unreachable."""
        future = self._check.future(
            control_pb2.HealthCheckRequest(expected_task=self.peer.task), timeout=timeout,
            metadata=self._token.metadata, wait_for_ready=True)
        return PendingCall(
            future, lambda e: translate(e, self.peer, "the coordinator's health check",
                                        seconds=timeout),
            lambda r: Health(control_pb2.HealthCheckResponse.ServingStatus.Name(r.status),
                             r.task, r.incarnation))

    def run(self, request: coordinator_pb2.RunRequest, *, timeout: float, activity: str,
            setting: str) -> PendingCall[coordinator_pb2.RunReply]:
        """Send one function run. Errors (:func:`~cluster.transport._grpc_errors.translate_run`):
        ``PeerUnavailableError`` when the run was lost with the worker, ``FunctionTimeoutError``
        past ``timeout`` s (``setting`` names the variable that sets it),
        ``UnauthenticatedError``, else ``ClusterError``."""
        future = self._run.future(request, timeout=timeout, metadata=self._token.metadata)
        return PendingCall(
            future, lambda e: translate_run(e, self.peer, activity, seconds=timeout,
                                            setting=setting),
            lambda reply: reply)

    def watch(self, on_gone: Callable[[PeerUnavailableError | None], None], *,
              interval: float, timeout: float,
              stall_timeout: float | None = 60.0) -> HeartbeatMonitor:
        """Start watching the worker's heartbeats: ``on_gone(error)`` once when it is lost
        (``error``) or shuts down (``None``); silent but still answering at its address, it is
        stalled until ``stall_timeout`` (see :class:`HeartbeatMonitor`). Close the returned
        monitor to stop watching."""
        monitor = HeartbeatMonitor(
            PeerInfo(-1, self._me, ""), [PeerInfo(0, self.peer.task, self.peer.address)],
            {0: self._channel}, self._token,
            on_lost=lambda _, error: on_gone(error), on_departed=lambda _: on_gone(None),
            interval=interval, timeout=timeout, stall_timeout=stall_timeout)
        monitor.start()
        return monitor

    def on_disconnect(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` whenever the connection to the worker's address is not (or stops
        being) ready: the process that answered is gone, so a check may find a new one. Returns
        the function that stops these calls. ``fn`` must not block."""
        def changed(state: grpc.ChannelConnectivity) -> None:
            if state != grpc.ChannelConnectivity.READY:
                fn()

        self._channel.subscribe(changed)  # also called at once with the current state
        return lambda: self._channel.unsubscribe(changed)

    def close(self) -> None:
        """Close the channel, waiting at most
        :data:`~cluster.transport._closing.CLOSE_TIMEOUT`."""
        close_channels([self._channel], what="channel to a worker")

