"""The caller's side of peers' ``Control`` services: health checks, failure reports, shutdowns.

The runtime asks every peer at once and gets plain answers back, never a gRPC object::

    client = ControlClient("worker:0", token)
    answers = client.check({"chief:0": "10.0.0.1:2222"}, timeout=1.0)   # {task: CheckAnswer}
    undelivered = client.shutdown(peers, deadline, reason="done")         # {task: status}
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc

from cluster.deadline import Deadline
from cluster.errors import UnauthenticatedError
from cluster.transport._closing import close_channels
from cluster.transport._grpc_errors import is_unauthenticated, status_name
from cluster.transport._pb import control_pb2
from cluster.transport.auth import Token
from cluster.transport.control import SERVICE
from cluster.transport.names import NOT_RESOLVED, host_of, peer_names
from cluster.transport.server import CHANNEL_OPTIONS
from cluster.transport.tls import open_channel

__all__ = ["CheckAnswer", "ControlClient"]

_SERVING = control_pb2.HealthCheckResponse.SERVING
_WRONG_TASK = control_pb2.HealthCheckResponse.WRONG_TASK


@dataclass(frozen=True)
class CheckAnswer:
    """One peer's answer to a health check.

    ``status``: ``"SERVING"``, ``"WRONG_TASK"`` (another task answers at the address: ``task``
    says which), another serving status (``"NOT_SERVING"``), the call's failure status
    (``"UNAVAILABLE"``, ``"DEADLINE_EXCEEDED"``...), or
    :data:`~cluster.transport.names.NOT_RESOLVED` (the peer's host name does not resolve yet:
    no call was made).
    """

    status: str
    task: str = ""

    @property
    def serving(self) -> bool:
        return self.status == "SERVING"

    @property
    def wrong_task(self) -> bool:
        return self.status == "WRONG_TASK"


class ControlClient:
    """Calls the Control service of peers on behalf of task ``me``; one channel per peer, kept
    until :meth:`close`. Thread-safe."""

    def __init__(self, me: str, token: Token) -> None:
        self._me = me
        self._token = token
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def _channel(self, task: str, address: str) -> grpc.Channel:
        with self._lock:
            if task not in self._channels:
                self._channels[task] = open_channel(address, CHANNEL_OPTIONS,
                                                      self._token.tls)
            return self._channels[task]

    def check(self, peers: dict[str, str], timeout: float) -> dict[str, CheckAnswer]:
        """Health-check every ``{task: address}`` at once (each call waits for the peer to be
        reachable, up to ``timeout`` s).

        Raises:
            UnauthenticatedError: a peer refused our token (retrying cannot help).
        """
        calls, answers = {}, {}
        for task, address in peers.items():
            # Dial only once the name resolves (a pod not published yet is "not ready").
            if not peer_names.resolves(host_of(address), timeout=min(timeout, 1.0)):
                answers[task] = CheckAnswer(NOT_RESOLVED)
                continue
            method = self._channel(task, address).unary_unary(
                f"/{SERVICE}/Check",
                request_serializer=control_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=control_pb2.HealthCheckResponse.FromString)
            calls[task] = method.future(control_pb2.HealthCheckRequest(expected_task=task),
                                        timeout=timeout, metadata=self._token.metadata,
                                        wait_for_ready=True)
        for task, call in calls.items():
            try:
                reply = call.result()
            except grpc.RpcError as e:
                if is_unauthenticated(e):
                    raise UnauthenticatedError(
                        f"{task} ({peers[task]}) refused {self._me}'s health check: "
                        "missing or wrong cluster token (CLUSTER_TOKEN must be the same on "
                        "every task)") from e
                answers[task] = CheckAnswer(status_name(e))
                continue
            if reply.status == _SERVING:
                answers[task] = CheckAnswer("SERVING", reply.task)
            elif reply.status == _WRONG_TASK:
                answers[task] = CheckAnswer("WRONG_TASK", reply.task)
            else:
                answers[task] = CheckAnswer(
                    control_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), reply.task)
        return answers

    def broadcast(self, method_name: str, request, reply_type, peers: list[tuple[str, str]],
                  deadline: Deadline) -> dict[str, str]:
        """Call ``method_name`` on every ``(task, address)`` at once, all bounded by
        ``deadline``; returns ``{task: status}`` for the calls that failed. Never raises."""
        calls = {}
        for task, address in peers:
            method = self._channel(task, address).unary_unary(
                f"/{SERVICE}/{method_name}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=reply_type.FromString)
            calls[task] = method.future(request, timeout=deadline.remaining(),
                                        metadata=self._token.metadata)
        errors = {}
        for task, call in calls.items():
            try:
                call.result()
            except grpc.RpcError as e:
                errors[task] = status_name(e)
        return errors

    def report_failure(self, peers: list[tuple[str, str]], deadline: Deadline, *, task: str,
                       error_type: str, message: str, exit_code: int) -> dict[str, str]:
        """Tell ``peers`` that ``task`` failed; ``{task: status}`` of those not told."""
        report = control_pb2.FailureReport(task=task, error_type=error_type, message=message,
                                           exit_code=exit_code)
        return self.broadcast("ReportFailure", report, control_pb2.FailureAck, peers, deadline)

    def shutdown(self, peers: list[tuple[str, str]], deadline: Deadline,
                 reason: str) -> dict[str, str]:
        """Ask ``peers`` to shut down; ``{task: status}`` of those not reached."""
        return self.broadcast("Shutdown", control_pb2.ShutdownRequest(reason=reason),
                              control_pb2.ShutdownReply, peers, deadline)

    def close(self, deadline: Deadline | None = None) -> None:
        """Close every channel, waiting until ``deadline`` at most (default
        :data:`~cluster.transport._closing.CLOSE_TIMEOUT` from now)."""
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        close_channels(channels, deadline, what=f"{self._me}'s control channel")
