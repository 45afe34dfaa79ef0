"""One task's presence in its cluster: its server, its services, its peers and its group.

A :class:`TaskRuntime` binds the task's gRPC server on the address the cluster spec gives it,
installs the Collective and Control services (and any others the entry point adds), and joins
the cluster's coordination service (:mod:`~cluster.transport.coordination`, hosted by the chief,
or worker 0 when there is none): it registers, heartbeats, and hears of every loss and failure
from there, so its control-plane cost does not grow with the cluster. It waits for its peers
(:meth:`TaskRuntime.wait_for_peers`), creates the collective transport on first use
(:meth:`TaskRuntime.collective_transport`; routes to peers open lazily, where an algorithm sends),
and tells the cluster when this task fails (:meth:`TaskRuntime.report_failure`) so every task
stops within seconds naming the root cause; in an elastic cluster the group re-forms instead
(:attr:`TaskRuntime.elastic`, :mod:`cluster._elastic_group`). Preemption notices are
informational: the coordinator's ``PreemptionCheckpointHandler`` reads them
(:attr:`TaskRuntime.preemption_notices`); a serving task reports its own and waits for the
coordinator to finish (:meth:`TaskRuntime.wait_for_coordinator_exit`). :mod:`cluster.runtime`
keeps the one runtime of a task process; several can live in one process (tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster._elastic_group import ElasticGroup
from cluster._latch import Latch
from cluster._losses import Losses
from cluster._notices import Notices
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
from cluster.transport.coordination import SERVICE as COORDINATION_SERVICE
from cluster.transport.coordination import CoordinationService
from cluster.transport.coordination_plan import CoordinationPlan
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.membership import Event, EventKind
from cluster.transport.network import NetworkTransport
from cluster.transport.server import ServiceHandlers, TaskServer, message_limit
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
            self._server = TaskServer(placement.address, token,
                                      max_message_bytes=message_limit(services or {}))
        except OSError as e:
            raise AddressInUseError(
                f"{self.task}: cannot serve on {self.address}: the port is taken or the host is "
                "not an address of this machine", task=self.task, address=self.address) from e
        self._endpoint = CollectiveEndpoint.install(
            self._server, self.task, heartbeat_interval=self.settings.heartbeat_interval)
        for service, handlers in (services or {}).items():
            self._server.add_handlers(service, dict(handlers))
        plan = CoordinationPlan(tuple(placement.tasks()),
                                tuple(t for t, _ in collective_members(self.cluster_spec)),
                                self.settings)
        self.coordinator = plan.coordinator
        self._service: CoordinationService | None = None
        if self.coordinator == self.task:
            self._service = plan.service()
            self._server.add_handlers(COORDINATION_SERVICE, self._service.handlers())
        self.control = self._endpoint.control
        self.control.on_failure_report = self._on_failure_report
        self.control.on_shutdown = self._on_shutdown
        self._lock = threading.Lock()  # creation of the transport, shutdown
        self._state = threading.Lock()  # small state updates from RPC threads
        self._transport: NetworkTransport | None = None
        self._control = ControlClient(self.task, token)
        self._peer_failure: PeerFailedError | None = None
        self._failed = threading.Event()
        self._shutdown_requested = Latch()  # main-thread waits: signals raise there
        self.shutdown_reason = ""
        self._failure_listeners: list[Callable[[PeerFailedError], None]] = []
        self._closed = False
        self._close_hooks: list[Callable[[TaskRuntime], None]] = []
        self._losses = Losses()  # the tasks known lost, and why
        # Preemption notices, and why a serving task in its preemption grace may stop (the
        # coordinator's task left or was lost, or shutdown was requested).
        self._notes = Notices()
        self._join_lock = threading.Lock()
        self._joined = False
        self._coordination = plan.client(self.task, self.control.incarnation, token,
                                         on_event=self._on_event,
                                         on_coordinator_lost=self._on_coordinator_lost)
        self.elastic: ElasticGroup | None = None  # CLUSTER_ELASTIC: this task's elastic group
        if self.settings.elastic is not None:
            self.elastic = ElasticGroup(
                self.task, self.settings.elastic, ask=self._coordination.regroup,
                open_group=self._open_group, close_group=self._close_group,
                news=lambda: (self._coordination.generation, self._coordination.joining),
                close_timeout=self.settings.report_timeout)
        self._server.start()
        if self._service is not None:
            self._service.on_event = self._on_event
            self._service.start()
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

    def join(self, deadline: Deadline | None = None) -> None:
        """Register with the coordination service and start heartbeating (once; later calls
        return at once). Raises as :meth:`wait_for_peers` does when the service never answers.
        """
        with self._join_lock:
            if self._joined:
                return
            budget = self.settings.connect_timeout
            deadline = deadline or Deadline.after(budget)
            try:
                self._coordination.register(deadline)
            except PeersNotReadyError as e:
                # Without the service nothing is known of the others: every peer is listed.
                status = dict.fromkeys((t for t, _ in self.peers()),
                                       "unknown: the coordination service never answered")
                status[self.coordinator] = e.missing[0][2] if e.missing else "no answer"
                raise self._not_ready(self.peers(), status, budget) from e
            self._coordination.start()
            self._joined = True

    def _not_ready(self, wanted: list[tuple[str, str]], status: dict[str, str],
                   budget: float) -> PeersNotReadyError:
        """The error listing ``wanted`` tasks (those in ``status``: why) that never came up."""
        missing = [(t, a, status[t]) for t, a in wanted if t in status]
        listed = ", ".join(f"{t} ({a}) [{s}]" for t, a, s in missing)
        return PeersNotReadyError(
            f"{self.task}: {len(missing)} of {len(wanted)} peers never came up within "
            f"{budget:g} s: {listed}", missing=missing)

    def wait_for_peers(self, deadline: Deadline | None = None,
                       tasks: list[tuple[str, str]] | None = None) -> None:
        """Block until every peer has joined the cluster, or until each of ``tasks`` serves.

        With no ``tasks`` (the start-up barrier), this task joins the coordination service and
        waits until every other task has registered with it: one call per heartbeat, whatever
        the cluster's size. With ``tasks`` (a few peers to be sure of now, e.g. a restarted
        worker or the parameter servers), each is asked directly and must answer a health check
        as itself, SERVING.

        Raises:
            PeersNotReadyError: listing each task that never came up, with its address and the
                last status seen, once ``deadline`` (default ``settings.connect_timeout``)
                passes; when the coordination service itself never answered, every peer is
                listed, the service with the status of its last call.
            PeerFailedError: a peer reported a failure meanwhile.
            ClusterSpecMismatchError: a peer (or the coordination service) was given another
                cluster.
            UnauthenticatedError: a peer refused our token.
        """
        budget = self.settings.connect_timeout
        deadline = deadline or Deadline.after(budget)
        if tasks is not None:
            self._check_serving(list(tasks), deadline, budget)
            return
        self._wait_registered(self.peers(), deadline)

    def _wait_registered(self, wanted: list[tuple[str, str]], deadline: Deadline) -> None:
        budget = self.settings.connect_timeout
        try:
            self.join(deadline)
        except PeersNotReadyError as e:  # listing every peer: keep those waited for
            raise self._not_ready(wanted, {t: s for t, _, s in e.missing}, budget) from None
        missing = self._coordination.wait_for([t for t, _ in wanted], deadline,
                                              self._raise_if_peer_failed)
        if missing:
            raise self._not_ready(wanted, dict.fromkeys(missing, "not registered"), budget)

    def _check_serving(self, tasks: list[tuple[str, str]], deadline: Deadline,
                       budget: float) -> None:
        """Ask each of ``tasks`` directly until all answer as themselves, SERVING."""
        pending = dict(tasks)
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
                raise self._not_ready(tasks, {t: status[t] for t in pending}, budget)
            # Calls that fail fast (NOT_SERVING) must not spin; a failure report wakes us at once.
            self._failed.wait(min(0.2, deadline.remaining()))

    # -- collectives ------------------------------------------------------------------------

    def collective_transport(self, deadline: Deadline | None = None) -> Transport:
        """The connected transport of the collective group (chief, then workers by index).

        Created on first use (once every member has registered with the coordination service)
        and cached; a closed one is replaced. Raises :class:`TaskConfigError` for a task outside
        the group (ps, evaluator), ``PeersNotReadyError`` naming the members that never came up
        by ``deadline`` (default ``settings.connect_timeout``), :class:`PeerFailedError` after a
        peer's failure report. In an elastic cluster use :meth:`elastic_transport`.
        """
        with self._lock:
            if self._closed:
                raise TransportClosedError(f"{self.task}: the task runtime is shut down")
            if self._transport is not None and not self._transport.closed:
                return self._transport
            self._raise_if_peer_failed()
            members = self._group_members()
            deadline = deadline or Deadline.after(self.settings.connect_timeout)
            self._wait_registered([m for m in members if m[0] != self.task], deadline)
            transport = self._open_group([t for t, _ in members], 0, deadline)
        return self._catch_up(transport)

    def elastic_transport(self, deadline: Deadline | None = None) -> Transport | None:
        """Elastic clusters: the transport of the first generation this task trains in, or None
        for a task that joins a running group (see :mod:`cluster._elastic_group`); later ones
        come from ``self.elastic.regroup``."""
        if self.elastic is None:
            raise TaskConfigError(f"{self.task}: not an elastic cluster (CLUSTER_ELASTIC unset)")
        members = self._group_members()
        deadline = deadline or Deadline.after(self.settings.connect_timeout)
        if self.elastic.generation == 0 and not self.elastic.joining:
            self._wait_registered([m for m in members if m[0] != self.task], deadline)
            return self.elastic.first(deadline)
        return self._transport

    def _group_members(self) -> list[tuple[str, str]]:
        members = collective_members(self.cluster_spec)
        if self.task not in [t for t, _ in members]:
            raise TaskConfigError(
                f"{self.task} is not in the collective group (chief and workers: "
                f"{', '.join(t for t, _ in members)})")
        return members

    def _open_group(self, members: list[str] | tuple[str, ...], generation: int,
                    deadline: Deadline) -> NetworkTransport:
        """Open the (lazy) transport of ``members`` (rank order), generation ``generation`` of
        an elastic group (0: not elastic), and make it this task's."""
        addresses = dict(self.placement.tasks())
        peers = [PeerInfo(r, t, addresses[t]) for r, t in enumerate(members)]
        if generation:
            self._losses.new_generation(generation, members)
        transport = NetworkTransport(
            self._endpoint, list(members).index(self.task), peers, self.token,
            heartbeat_timeout=self.settings.heartbeat_timeout,
            data_plane=self.settings.data_plane, lazy=True,
            route_timeout=self.settings.connect_timeout,
            on_peer_lost=lambda peer, why: self._report_lost(peer, why, generation),
            on_abort=self._report_abort,
            abort_timeout=self.settings.report_timeout, generation=generation)
        transport.connect(deadline)
        self._transport = transport
        if generation:
            self._catch_up(transport)
        return transport

    def _close_group(self, deadline: Deadline) -> None:
        transport = self._transport
        if transport is not None and not transport.closed:
            transport.close(deadline)

    def _catch_up(self, transport: NetworkTransport) -> NetworkTransport:
        """Apply to a new transport what happened while it was being made."""
        for task, why in self._losses.items():  # lost before the group existed
            transport.peer_lost(task, why)
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

    def _on_event(self, event: Event) -> None:
        """An event of the cluster, from the coordination service (its heartbeat thread)."""
        if event.kind is EventKind.FAILED:
            self._on_failure_report(event)
        elif event.kind is EventKind.LOST:
            found = f", as {event.reporter} found" if event.reporter else ""  # else: its silence
            self._on_peer_lost(event.task, (event.message or "lost") + found, event.generation)
        elif event.kind is EventKind.ABORTED:
            transport = self._transport
            if (transport is not None and not transport.closed
                    and event.generation == transport.generation):
                transport.aborted_by_peer(event.task, event.message)
        elif event.kind is EventKind.PREEMPTED:
            self._on_preemption_notice(event)
        elif event.kind is EventKind.LEFT and event.task == self.coordinator:
            self._notes.release(f"{self.coordinator} has finished")
            if self.settings.stop_with_coordinator:
                # The chief finished cleanly: a task that only serves has nothing left to do
                # (only wait_for_shutdown() waits on this; a script-running task goes on).
                self.request_shutdown(f"{self.coordinator} has finished")

    # -- preemption notices -----------------------------------------------------------------

    def _on_preemption_notice(self, event: Event) -> None:
        # Informational: no transport is aborted, nothing stops.
        if self._notes.record(event.task, event.message):
            log.warning("%s: %s received a preemption notice%s", self.task, event.task,
                        f" ({event.message})" if event.message else "")

    @property
    def preemption_notices(self) -> tuple[str, ...]:
        """The other tasks that reported a preemption notice (``PREEMPTED``) so far, in the
        order heard; a local read (the heartbeat thread records them)."""
        return self._notes.tasks

    def wait_for_preemption_notice(self, deadline: Deadline) -> tuple[str, ...]:
        """Block until some other task has reported a preemption notice, or ``deadline``;
        returns :attr:`preemption_notices` (empty if none came)."""
        return self._notes.wait(deadline)

    def report_preemption(self, message: str, deadline: Deadline) -> bool:
        """Tell the cluster that this task received a preemption notice (``PREEMPTED``, with
        ``message``), within ``deadline``; False when the coordination service was not told
        (not joined, known lost, or no answer in time). Never raises."""
        if not self._joined:
            return False
        return self._coordination.report(
            Event(EventKind.PREEMPTED, self.task, self.task, message=message), deadline)

    @property
    def coordinator_exited(self) -> str:
        """Why this task may stop serving ("" while it may not): the coordinator's task left
        or was lost, or shutdown was requested."""
        return self._notes.released_why

    def wait_for_coordinator_exit(self, deadline: Deadline) -> str:
        """Block until the coordinator's task has left (finished, e.g. after its preemption
        save) or is lost, or shutdown is requested, or ``deadline``; returns why ("" when the
        deadline came first)."""
        return self._notes.wait_released(deadline)

    def _on_peer_lost(self, task: str, why: str, found_in: int = 0) -> None:
        """``task`` is lost, as found in elastic generation ``found_in`` (0: not elastic, or
        not known): fail the group naming it, unless the news is stale (:mod:`cluster._losses`).
        """
        if not self._losses.record(task, why, found_in):
            log.debug("%s: ignored news of %s's loss found in generation %d: generation %d took "
                      "it back since", self.task, task, found_in, self._losses.generation)
            return
        transport = self._transport
        if transport is not None:
            transport.peer_lost(task, why)

    def _on_coordinator_lost(self, error: PeerUnavailableError) -> None:
        log.error("%s: %s", self.task, error)
        self._notes.release(f"{self.coordinator} is lost")
        self._on_peer_lost(self.coordinator, str(error).split(" is unavailable: ", 1)[-1])

    def _reachable_peers(self) -> list[tuple[str, str]]:
        """Peers not known lost: the only ones a stopping task still sends anything to."""
        lost = self._losses.tasks()
        return [(t, a) for t, a in self.peers() if t not in lost]

    def _report_lost(self, peer: PeerInfo, why: str, generation: int) -> None:
        """The transport of ``generation`` found ``peer`` lost: the others learn it from the
        coordinator."""
        self._report_soon(Event(EventKind.LOST, peer.task, self.task, message=why,
                                generation=generation))

    def _report_abort(self, reason: str) -> None:
        transport = self._transport
        self._report_soon(Event(EventKind.ABORTED, self.task, self.task, message=reason,
                                generation=transport.generation if transport is not None else 0))

    def _report_soon(self, event: Event) -> None:
        # Called on receiver and collective threads: the (bounded) call must not hold them.
        threading.Thread(target=self._coordination.report,
                         args=(event, Deadline.after(self.settings.report_timeout)),
                         name="coordination-report", daemon=True).start()

    def _on_failure_report(self, report: FailureReport | Event) -> None:
        if self.elastic is not None and report.task != self.task:
            # An elastic group loses the failed task and re-forms without it: nothing sticks.
            self._on_peer_lost(report.task, f"it failed: {report.error_type}: {report.message}",
                               report.generation if isinstance(report, Event) else 0)
            return
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
        root cause. The report goes to the coordination service, which every task hears from
        within one heartbeat interval. Never raises: peers that cannot be told find out by
        heartbeats.
        """
        if isinstance(exc, PeerFailedError) or self._peer_failure is not None:
            return  # the root cause already told everyone
        root, error_type, message = self.task, type(exc).__name__, str(exc)
        if isinstance(exc, (CollectiveAbortedError, PeerUnavailableError)) and exc.task:
            root = exc.task
        # One deadline for everything this stopping task sends; the calls run side by side
        # and skip peers known lost, so a partitioned peer costs at most this deadline.
        deadline = Deadline.after(self.settings.report_timeout)
        event = Event(EventKind.FAILED, root, self.task, error_type, message, exit_code,
                      self._losses.generation)
        told = threading.Event()
        reporter = None
        if self._joined and self._coordination.lost is None:
            def to_coordinator() -> None:
                if self._coordination.report(event, deadline):
                    told.set()
            reporter = threading.Thread(target=to_coordinator, name="failure-report",
                                        daemon=True)
            reporter.start()
        transport = self._transport
        if transport is not None and not transport.closed:
            transport.abort(f"{error_type}: {message}" if root == self.task
                            else f"{root} failed: {error_type}: {message}", deadline=deadline)
        if reporter is not None:
            reporter.join(deadline.timeout())
        if told.is_set() or deadline.expired:
            return
        # No coordination service to tell (never joined, or it is gone): tell each peer.
        errors = self._control.report_failure(
            self._reachable_peers(), deadline, task=root, error_type=error_type,
            message=message, exit_code=exit_code)
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
        self._notes.release(reason)

    def wait_for_shutdown(self, deadline: Deadline | None = None) -> bool:
        """Block until shutdown is requested; False if ``deadline`` passed first."""
        return self._shutdown_requested.wait(None if deadline is None else deadline.timeout())

    def shutdown_tasks(self, tasks: list[tuple[str, str]], reason: str) -> dict[str, str]:
        """Send a Shutdown RPC to ``tasks``; ``{task: error}`` for those not reached."""
        return self._control.shutdown(tasks, Deadline.after(self.settings.report_timeout), reason)

    def shutdown(self, grace: float = 0.5) -> None:
        """Close the transport, end heartbeat streams cleanly, stop serving. Idempotent.

        Bounded whatever the peers do. A task stopping because its group failed (a peer lost
        or failed, or its own failure) sends its goodbyes and departure within one deadline of
        ``settings.report_timeout``, skipping peers known lost, and gives in-flight calls no
        ``grace``; a clean exit allows 2 s (its departure must arrive, or the others would
        take it for a loss). The coordinator's task waits at most two heartbeat intervals for
        the others to hear the last events.
        """
        with self._lock:
            if self._closed:
                return
            with self._state:
                self._closed = True
            transport = self._transport
            failed = (self._failed.is_set() or bool(self._losses)
                      or (transport is not None and transport.failed))
            deadline = Deadline.after(self.settings.report_timeout if failed else 2.0)
            if transport is not None:
                transport.close(deadline)
            self._coordination.close(leave=self._joined, deadline=deadline)
            if self._service is not None:
                # The coordinator's task: what it logged (its own departure, just reported,
                # included) must reach the others before the service stops.
                late = self._service.drain(Deadline.after(self._service.interval * 2))
                if late:
                    log.info("%s: %s did not hear the last events", self.task, ", ".join(late))
            if self._service is not None:
                self._service.stop()
            self.control.stop()
            self._control.close(Deadline.after(max(deadline.remaining(), 0.1)))
            self._server.stop(0.0 if failed else grace)
        for hook in self._close_hooks:
            hook(self)

    def add_close_hook(self, hook: Callable[[TaskRuntime], None]) -> None:
        """Call ``hook(self)`` once :meth:`shutdown` has stopped everything."""
        self._close_hooks.append(hook)

    def __repr__(self) -> str:
        return f"TaskRuntime({self.task} at {self.address})"
