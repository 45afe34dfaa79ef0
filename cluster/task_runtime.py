"""One task's presence in its cluster: its server, its services, its peers and its group.

A :class:`TaskRuntime` binds the task's gRPC server on the address the cluster spec gives it,
installs the Collective and Control services (and any others the entry point adds), waits for
its peers (:meth:`TaskRuntime.wait_for_peers`), creates the collective transport on first use
(:meth:`TaskRuntime.collective_transport`), and tells every peer when this task fails
(:meth:`TaskRuntime.report_failure`) so they stop within seconds naming the root cause.
:mod:`cluster.runtime` keeps the one runtime of a task process; several can live in one process
(tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster._placement import Placement, collective_members, resolve_placement
from cluster.deadline import Deadline
from cluster.errors import (
    AddressInUseError,
    CollectiveAbortedError,
    PeerFailedError,
    PeersNotReadyError,
    PeerUnavailableError,
    TaskConfigError,
    TransportClosedError,
)
from cluster.settings import TaskSettings
from cluster.transport._grpc_errors import spec_mismatch
from cluster.transport.api import PeerInfo, Transport
from cluster.transport.auth import Token, resolve_token
from cluster.transport.control_client import ControlClient
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.network import NetworkTransport
from cluster.transport.server import ServiceHandlers, TaskServer
from resolver import ClusterResolver, TFConfigClusterResolver

if TYPE_CHECKING:
    from cluster.transport._pb.control_pb2 import FailureReport

__all__ = ["TaskRuntime"]

log = logging.getLogger(__name__)


class TaskRuntime:
    """One task's server and services; see the module docstring.

    Build with :func:`start` (the process-wide runtime) or :meth:`create`. Attributes:
    ``task_type``, ``task_id``, ``task`` (``"worker:1"``), ``address``, ``cluster_spec``,
    ``resolver``, ``token``, ``settings`` (:class:`~cluster.settings.TaskSettings`: what the
    layers below get, instead of reading the environment).

    ``services``: more gRPC services of this task (``{service name: {method: handler}}``),
    served from the start, behind the same token check (``python -m ps`` adds the variable
    store, ``python -m worker`` the coordinator's function service).

    Raises (constructor):
        AddressInUseError: the address is taken or not an address of this host.
    """

    def __init__(self, placement: Placement, resolver: ClusterResolver, token: Token,
                 settings: TaskSettings | None = None,
                 services: ServiceHandlers | None = None
                 ) -> None:
        self.placement = placement
        self.task_type = placement.task_type
        self.task_id = placement.task_id
        self.task = placement.task
        self.address = placement.address
        self.cluster_spec = placement.cluster_spec
        self.resolver = resolver
        self.token = token
        self.settings = settings or TaskSettings()
        try:
            self._server = TaskServer(placement.address, token)
        except OSError as e:
            raise AddressInUseError(
                f"{self.task}: cannot serve on {self.address}: the port is taken or the host is "
                "not an address of this machine", task=self.task, address=self.address) from e
        self._endpoint = CollectiveEndpoint.install(
            self._server, self.task, heartbeat_interval=self.settings.heartbeat_interval)
        for service, handlers in (services or {}).items():
            self._server.add_handlers(service, dict(handlers))
        self.control = self._endpoint.control
        self.control.on_failure_report = self._on_failure_report
        self.control.on_shutdown = self._on_shutdown
        self._lock = threading.Lock()  # creation of the transport, shutdown
        self._state = threading.Lock()  # small state updates from RPC threads
        self._transport: NetworkTransport | None = None
        self._control = ControlClient(self.task, token)
        self._peer_failure: PeerFailedError | None = None
        self._failed = threading.Event()
        self._shutdown_requested = threading.Event()
        self.shutdown_reason = ""
        self._failure_listeners: list[Callable[[PeerFailedError], None]] = []
        self._closed = False
        self._close_hooks: list[Callable[[TaskRuntime], None]] = []
        self._server.start()
        log.debug("%s: serving on %s", self.task, self.address)

    @classmethod
    def create(cls, resolver: ClusterResolver | None = None,
               settings: TaskSettings | None = None) -> TaskRuntime:
        """Validate ``resolver`` strictly, resolve the token from ``settings`` (default: no
        ``CLUSTER_*`` variable set), start serving (not registered as :func:`current`). Raises
        :class:`TaskConfigError`, ``InsecureClusterError``, :class:`AddressInUseError`."""
        resolver = resolver if resolver is not None else TFConfigClusterResolver()
        settings = settings or TaskSettings()
        placement = resolve_placement(resolver)
        token = resolve_token([a for _, a in placement.tasks()], settings)
        return cls(placement, resolver, token, settings)

    # -- peers ------------------------------------------------------------------------------

    def peers(self) -> list[tuple[str, str]]:
        """Every other task of the cluster as ``(task, address)``, in cluster order."""
        return [(t, a) for t, a in self.placement.tasks() if t != self.task]

    def _raise_if_peer_failed(self) -> None:
        failure = self._peer_failure
        if failure is not None:
            raise PeerFailedError(f"{self.task}: {failure}", task=failure.task,
                                  error_type=failure.error_type,
                                  error_message=failure.error_message,
                                  exit_code=failure.exit_code) from None

    def wait_for_peers(self, deadline: Deadline | None = None,
                       tasks: list[tuple[str, str]] | None = None) -> None:
        """Block until every peer (or ``tasks``) answers a health check as itself, SERVING.

        Raises:
            PeersNotReadyError: listing each task that never came up, with its address and the
                last status seen, once ``deadline`` (default ``settings.connect_timeout``) passes.
            PeerFailedError: a peer reported a failure meanwhile.
            ClusterSpecMismatchError: an address answers as another task (the specs differ).
            UnauthenticatedError: a peer refused our token.
        """
        budget = self.settings.connect_timeout
        deadline = deadline or Deadline.after(budget)
        pending = dict(tasks if tasks is not None else self.peers())
        order = list(pending)
        status = dict.fromkeys(pending, "no answer")
        while pending:
            self._raise_if_peer_failed()
            answers = self._control.check(pending, timeout=max(0.05, min(1.0,
                                                                          deadline.remaining())))
            for task, answer in answers.items():
                if answer.serving:
                    del pending[task]
                elif answer.wrong_task:
                    raise spec_mismatch(
                        f"{self.task}: {pending[task]} answers as {answer.task}, expected {task}")
                else:
                    status[task] = answer.status
            if not pending:
                return
            if deadline.expired:
                missing = [(t, pending[t], status[t]) for t in order if t in pending]
                listed = ", ".join(f"{t} ({a}) [{s}]" for t, a, s in missing)
                raise PeersNotReadyError(
                    f"{self.task}: {len(missing)} of {len(order)} peers never came up within "
                    f"{budget:g} s: {listed}", missing=missing)
            # Calls that fail fast (NOT_SERVING) must not spin; a failure report wakes us at once.
            self._failed.wait(min(0.2, deadline.remaining()))

    # -- collectives ------------------------------------------------------------------------

    def collective_transport(self, deadline: Deadline | None = None) -> Transport:
        """The connected transport of the collective group (chief, then workers by index).

        Created on first use and cached; a closed one is replaced. Raises
        :class:`TaskConfigError` for a task outside the group (ps, evaluator),
        ``PeerUnavailableError`` naming the peers that never answered by ``deadline`` (default
        ``settings.connect_timeout``), :class:`PeerFailedError` after a peer's failure report.
        """
        with self._lock:
            if self._closed:
                raise TransportClosedError(f"{self.task}: the task runtime is shut down")
            if self._transport is not None and not self._transport.closed:
                return self._transport
            self._raise_if_peer_failed()
            members = collective_members(self.cluster_spec)
            names = [t for t, _ in members]
            if self.task not in names:
                raise TaskConfigError(
                    f"{self.task} is not in the collective group (chief and workers: "
                    f"{', '.join(names)})")
            peers = [PeerInfo(r, t, a) for r, (t, a) in enumerate(members)]
            transport = NetworkTransport(self._endpoint, names.index(self.task), peers, self.token,
                                      heartbeat_timeout=self.settings.heartbeat_timeout,
                                      data_plane=self.settings.data_plane)
            transport.connect(deadline or Deadline.after(self.settings.connect_timeout))
            self._transport = transport
        failure = self._peer_failure
        if failure is not None:  # reported while we were connecting
            self._abort_transport(str(failure))
        return transport

    # -- failures ---------------------------------------------------------------------------

    @property
    def peer_failure(self) -> PeerFailedError | None:
        """The first failure a peer reported to this task, if any."""
        return self._peer_failure

    def add_failure_listener(self, callback: Callable[[PeerFailedError], None]) -> None:
        """Call ``callback(error)`` (from an RPC thread) when a peer first reports a failure;
        at once, from this thread, if one was reported already."""
        with self._state:
            self._failure_listeners.append(callback)
            failure = self._peer_failure
        if failure is not None:
            callback(failure)

    def _on_failure_report(self, report: FailureReport) -> None:
        error = PeerFailedError(
            f"{report.task} failed: {report.error_type}: {report.message}", task=report.task,
            error_type=report.error_type, error_message=report.message,
            exit_code=report.exit_code)
        with self._state:
            if self._peer_failure is not None or self._closed:
                return
            self._peer_failure = error
            listeners = list(self._failure_listeners)
        log.error("%s: %s", self.task, error)
        self._failed.set()
        self._abort_transport(str(error))
        for callback in listeners:
            callback(error)

    def _abort_transport(self, reason: str) -> None:
        transport = self._transport
        if transport is None or transport.closed:
            return
        # A group that already failed keeps its first error (abort() cannot replace it). Not
        # probed with check(): that re-raises the stored error and grows its traceback.
        # abort() waits (bounded) for peers' acks: never inside the RPC thread that called us.
        threading.Thread(target=transport.abort, args=(reason,), name="abort",
                         daemon=True).start()

    def report_failure(self, exc: BaseException, exit_code: int = 1) -> None:
        """Tell every peer that this task fails because of ``exc`` (bounded by
        ``settings.report_timeout``); their collectives then fail naming the root cause.

        When ``exc`` came from another task (a peer lost, an abort), that task is named as the
        root cause. Never raises: peers that cannot be told find out by heartbeats.
        """
        if isinstance(exc, PeerFailedError) or self._peer_failure is not None:
            return  # the root cause already told everyone
        root, error_type, message = self.task, type(exc).__name__, str(exc)
        if isinstance(exc, (CollectiveAbortedError, PeerUnavailableError)) and exc.task:
            root = exc.task
        transport = self._transport
        if transport is not None and not transport.closed:
            transport.abort(f"{error_type}: {message}" if root == self.task
                            else f"{root} failed: {error_type}: {message}")
        errors = self._control.report_failure(
            self.peers(), Deadline.after(self.settings.report_timeout), task=root,
            error_type=error_type, message=message, exit_code=exit_code)
        if errors:
            log.debug("%s: failure report not delivered to %s", self.task, errors)

    # -- lifecycle --------------------------------------------------------------------------

    def _on_shutdown(self, reason: str) -> None:
        self.request_shutdown(reason or "Shutdown RPC")

    def request_shutdown(self, reason: str) -> None:
        """Ask :meth:`wait_for_shutdown` to return (a Shutdown RPC, SIGTERM)."""
        if not self._shutdown_requested.is_set():
            self.shutdown_reason = reason
            self._shutdown_requested.set()

    def wait_for_shutdown(self, deadline: Deadline | None = None) -> bool:
        """Block until shutdown is requested; False if ``deadline`` passed first."""
        return self._shutdown_requested.wait(None if deadline is None else deadline.timeout())

    def shutdown_tasks(self, tasks: list[tuple[str, str]], reason: str) -> dict[str, str]:
        """Send a Shutdown RPC to ``tasks``; ``{task: error}`` for those not reached."""
        return self._control.shutdown(tasks, Deadline.after(self.settings.report_timeout), reason)

    def shutdown(self, grace: float = 0.5) -> None:
        """Close the transport, end heartbeat streams cleanly, stop serving. Idempotent."""
        with self._lock:
            if self._closed:
                return
            with self._state:
                self._closed = True
            transport = self._transport
            if transport is not None:
                transport.close(Deadline.after(2.0))
            self.control.stop()
            self._control.close()
            self._server.stop(grace)
        for hook in self._close_hooks:
            hook(self)

    def add_close_hook(self, hook: Callable[[TaskRuntime], None]) -> None:
        """Call ``hook(self)`` once :meth:`shutdown` has stopped everything."""
        self._close_hooks.append(hook)

    def __repr__(self) -> str:
        return f"TaskRuntime({self.task} at {self.address})"
