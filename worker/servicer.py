"""The ``Worker`` gRPC service of a serving worker: runs what a ClusterCoordinator sends.

Requests are authenticated by the task server's token interceptor before any byte reaches this
handler; only then is the payload unpickled (``cluster.coordinator._calls.WorkerState.run``).
The reply is MAC'd with the cluster token over the request's nonce and run id
(``cluster.coordinator._reply_mac``), so the coordinator can authenticate it before unpickling.
"""

from __future__ import annotations

import logging
import threading

import grpc

from cluster.coordinator._calls import WorkerState
from cluster.coordinator._reply_mac import reply_mac
from cluster.strategies._ps_variables import SyncSlot
from cluster.transport._grpc_errors import abort_invalid, abort_unavailable
from cluster.transport._pb import coordinator_pb2
from cluster.transport.auth import Token
from cluster.transport.worker_client import SERVICE

__all__ = ["SERVICE", "WorkerService"]

log = logging.getLogger(__name__)


_BIND_WAIT = 10.0  # seconds a call that arrives while the process starts waits for bind()


class WorkerService:
    """Runs coordinator functions; :meth:`handlers` for ``TaskRuntime(services=...)``.

    The handlers exist before the server starts, the token and task name only after
    (``TaskRuntime`` resolves them): :meth:`bind` supplies them, and a call that arrives before
    waits for it (bounded).
    """

    def __init__(self) -> None:
        self.token = Token(None)
        self.state = WorkerState()
        self._bound = threading.Event()

    @property
    def task(self) -> str:
        return self.state.task

    def bind(self, task: str, token: Token) -> None:
        self.state.task, self.token = task, token
        self._bound.set()

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {"Run": grpc.unary_unary_rpc_method_handler(
            self._run, request_deserializer=coordinator_pb2.RunRequest.FromString,
            response_serializer=coordinator_pb2.RunReply.SerializeToString)}

    def _run(self, request: coordinator_pb2.RunRequest, context) -> coordinator_pb2.RunReply:
        if not self._bound.wait(_BIND_WAIT):
            abort_unavailable(context, "worker still starting")
        sync = None
        if request.num_contributors:
            if request.contributor >= request.num_contributors:
                abort_invalid(context,
                              f"contributor {request.contributor} out of range for "
                              f"{request.num_contributors} contributors")
            sync = SyncSlot(request.sync_step, request.contributor, request.num_contributors)
        outcome = self.state.run(request.payload, sync)
        if not outcome.ok:
            log.info("%s: function run %d raised %s: %s", self.task, request.run_id,
                     outcome.error_type, outcome.error_message)
        code = coordinator_pb2.RunReply.OK if outcome.ok else coordinator_pb2.RunReply.FAILED
        return coordinator_pb2.RunReply(
            outcome=code, payload=outcome.payload,
            mac=reply_mac(self.token, request.nonce, request.run_id, code, outcome.payload),
            error_type=outcome.error_type, error_message=outcome.error_message,
            traceback=outcome.traceback)
