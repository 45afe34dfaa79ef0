"""The coordination service and its client: one task tracks the liveness of every task.

One task of the cluster hosts :class:`CoordinationService` (the chief, or worker 0 when there
is no chief: :func:`coordinator_task`); every task, that one included, runs a
:class:`CoordinationClient`. So each task holds one connection and one thread for the control
plane whatever the cluster's size, and the coordinator serves N small unary calls per heartbeat
interval (no call holds a server thread between heartbeats).

- Start-up: a task registers (naming the coordinator it expects and a digest of its cluster, so
  a task given another cluster is refused, never joined), then :meth:`CoordinationClient.wait_for`
  waits until the tasks it needs have registered.
- Shut-down: a clean exit reports ``LEFT`` (never a loss); the coordinator's own task waits,
  bounded, until every live task has been sent every event (:meth:`CoordinationService.drain`),
  so a failure it reported reaches everyone before it exits.
- Preemption: a task that only serves reports ``PREEMPTED`` when it gets SIGTERM and serves
  on for its grace period; every task hears of it like any event (the coordinator's task at
  once), and nothing stops because of it.
- Liveness: a task heartbeats every ``interval``; one silent for ``timeout`` is probed
  (:mod:`~cluster.transport._reachable`: a TCP connect to its server, answered by its kernel)
  and declared lost when its address does not answer: dead or cut off. One whose host answers
  is alive but busy (a long call holding the GIL): it is reported as stalled, with a warning
  naming it, and declared lost only after ``stall_timeout`` seconds of silence
  (:class:`~cluster.transport.membership.Membership`). A task that finds a peer's connection
  broken, or fails, reports it. Every reply carries the events the caller has not seen, so every
  task learns of a loss or failure within one interval of the coordinator knowing.
- The coordinator itself: a task whose heartbeats have failed for ``timeout`` seconds probes
  the coordinator's address the same way, and treats the coordinator as lost
  (``on_coordinator_lost``) when it does not answer, or after ``stall_timeout`` when it does.
- A clock of its own that was stalled (this process held the GIL longer than ``timeout``)
  measured its own silence, not the peers': the service restarts every task's silence then.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import grpc

from cluster.deadline import Deadline
from cluster.errors import PeersNotReadyError, PeerUnavailableError
from cluster.transport._closing import close_channels
from cluster.transport._grpc_errors import fails_at_connect, status_name, translate
from cluster.transport._pb import coordination_pb2
from cluster.transport._reachable import answering
from cluster.transport._still_waiting import StillWaiting, describe_unregistered
from cluster.transport.auth import Token
from cluster.transport.membership import (
    Event,
    EventKind,
    HeartbeatAnswer,
    Membership,
    UnknownTaskError,
)
from cluster.transport.names import NOT_RESOLVED, host_of, peer_names
from cluster.transport.server import CONTROL_CHANNEL_OPTIONS
from cluster.transport.tls import open_channel

__all__ = [
    "MAX_HEARTBEATS_PER_SECOND",
    "SERVICE",
    "CoordinationClient",
    "CoordinationService",
    "cluster_digest",
    "coordination_timing",
    "coordinator_task",
]

log = logging.getLogger(__name__)

SERVICE = "cluster_runtime.v1.Coordination"
_KINDS = {
    EventKind.LOST: coordination_pb2.ClusterEvent.LOST,
    EventKind.FAILED: coordination_pb2.ClusterEvent.FAILED,
    EventKind.LEFT: coordination_pb2.ClusterEvent.LEFT,
    EventKind.ABORTED: coordination_pb2.ClusterEvent.ABORTED,
    EventKind.PREEMPTED: coordination_pb2.ClusterEvent.PREEMPTED,
}
_FROM_WIRE = {v: k for k, v in _KINDS.items()}


def coordinator_task(tasks: Sequence[str]) -> str:
    """The task that hosts the service: the chief, else worker 0, else the first task."""
    for candidate in ("chief:0", "worker:0"):
        if candidate in tasks:
            return candidate
    return tasks[0]


MAX_HEARTBEATS_PER_SECOND = 1000.0
"""What one coordinator is asked to answer at most (measured: ~1000 calls/s on one core here)."""


def coordination_timing(tasks: int, interval: float, timeout: float) -> tuple[float, float]:
    """The heartbeat interval and timeout for a cluster of ``tasks``: the configured ones, but
    with the interval stretched so the coordinator answers at most
    :data:`MAX_HEARTBEATS_PER_SECOND` calls, and the timeout stretched by the same factor (so
    as many beats may be missed). Every task computes the same from the same cluster and
    settings.

    >>> coordination_timing(64, 1.0, 5.0), coordination_timing(4096, 1.0, 5.0)
    ((1.0, 5.0), (4.096, 20.48))
    """
    scaled = max(interval, tasks / MAX_HEARTBEATS_PER_SECOND)
    return scaled, max(timeout, timeout * scaled / interval)


def cluster_digest(tasks: Sequence[tuple[str, str]]) -> bytes:
    """A digest of the cluster (every ``(task, address)``): equal on tasks given the same one."""
    return hashlib.sha256(json.dumps(sorted(tasks)).encode()).digest()[:16]


def _to_wire(event: Event) -> coordination_pb2.ClusterEvent:
    return coordination_pb2.ClusterEvent(
        kind=_KINDS[event.kind], task=event.task, reporter=event.reporter,
        error_type=event.error_type, message=event.message, exit_code=event.exit_code)


def _from_wire(event: coordination_pb2.ClusterEvent) -> Event | None:
    """The event, or ``None`` for a kind this version does not know (a newer peer's): ignored,
    never mistaken for a loss."""
    kind = _FROM_WIRE.get(event.kind)
    if kind is None:
        return None
    return Event(kind, event.task, event.reporter, event.error_type, event.message,
                 event.exit_code)


class CoordinationService:
    """The ``Coordination`` service, hosted by one task; see the module docstring.

    ``tasks`` are every task of the cluster; ``me`` is the hosting task; ``digest`` its
    :func:`cluster_digest`. With ``addresses`` (``{task: "host:port"}``) and ``stall_timeout``,
    a silent task whose address answers ``probe`` is stalled, not lost, until ``stall_timeout``;
    without them a silent task is lost after ``timeout``. :meth:`start` runs the expiry clock,
    :meth:`stop` ends it.
    """

    def __init__(self, me: str, tasks: Sequence[str], digest: bytes, *, interval: float,
                 timeout: float, startup_timeout: float | None = None,
                 addresses: Mapping[str, str] | None = None,
                 stall_timeout: float | None = None,
                 probe: Callable[[Mapping[str, str]], set[str]] = answering,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.me = me
        self.incarnation = int.from_bytes(os.urandom(8), "little")
        self._digest = digest
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._addresses = dict(addresses or {})
        self._probe = probe
        if stall_timeout is not None:
            stall_timeout = max(stall_timeout, timeout)
        self._membership = Membership(tuple(tasks), timeout, startup_timeout=startup_timeout,
                                      stall_timeout=stall_timeout if self._addresses else None)
        self._stalled: set[str] = set()  # the tasks a stall warning named
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._expire_loop, name="coordination-clock",
                                        daemon=True)
        # The hosting task hears of each new event at once (not at its next heartbeat): it is
        # often the one whose collectives must stop first (the leader of its host).
        self.on_event: Callable[[Event], None] | None = None

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register,
                request_deserializer=coordination_pb2.RegisterRequest.FromString,
                response_serializer=coordination_pb2.RegisterReply.SerializeToString),
            "Heartbeat": grpc.unary_unary_rpc_method_handler(
                self._heartbeat,
                request_deserializer=coordination_pb2.CoordinationHeartbeatRequest.FromString,
                response_serializer=coordination_pb2.CoordinationHeartbeatReply.SerializeToString),
            "Report": grpc.unary_unary_rpc_method_handler(
                self._report,
                request_deserializer=coordination_pb2.ReportRequest.FromString,
                response_serializer=coordination_pb2.ReportReply.SerializeToString),
        }

    @property
    def interval(self) -> float:
        """The heartbeat interval tasks use (the most a live task takes to call again)."""
        return self._interval

    def start(self) -> None:
        self._thread.start()

    def drain(self, deadline: Deadline) -> tuple[str, ...]:
        """Wait (until ``deadline``) for every live task to have been sent every event, so a
        failure reported to the coordinator's own task reaches them before it exits; returns
        the tasks still not told."""
        while True:
            with self._lock:
                pending = self._membership.undelivered()
            if not pending or deadline.expired:
                return pending
            # Heartbeats deliver; one interval is the most a live task takes to ask again.
            self._stopping.wait(min(self._interval / 4, deadline.remaining()))

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _expire_loop(self) -> None:
        # A clock, not a poll: silence is only visible by looking at the time.
        last = self._clock()
        while not self._stopping.wait(self._interval / 2):
            self.tick(last)
            last = self._clock()

    def tick(self, last: float) -> None:
        """One turn of the expiry clock, whose previous turn ended at ``last``: probe the
        suspects (outside the lock: a cut-off host takes the probe's whole timeout), expire,
        warn of new stalls."""
        now = self._clock()
        if now - last > self._membership.timeout:
            log.warning("%s: the coordination service itself was stalled for %.1f s (this "
                        "process held the GIL?): every task's silence restarts", self.me,
                        now - last)
            with self._lock:
                self._membership.refresh(now)
        with self._lock:
            suspects = self._membership.suspects(now)
        answered: set[str] = set()
        if suspects and self._membership.stall_timeout is not None:
            answered = self._probe({t: self._addresses[t] for t in suspects
                                    if t in self._addresses})
        with self._lock:
            # The same ``now``: only the tasks just probed can be found silent (a heartbeat
            # that arrived meanwhile only shortens a silence).
            events = self._membership.expire(now, answered)
            stalled = self._membership.stalled(now)
        self._warn_stalls(stalled)
        for event in events:
            log.warning("%s: %s is lost: %s", self.me, event.task, event.message)
            self._tell_host(event)

    def _warn_stalls(self, stalled: dict[str, float]) -> None:
        for task, silent in stalled.items():
            if task not in self._stalled:
                self._stalled.add(task)
                log.warning(
                    "%s: %s is stalled: no heartbeat for %.1f s, but its host answers (alive "
                    "but busy: a long call holding the GIL, or stopped); it is lost after %g s "
                    "of silence (CLUSTER_STALL_TIMEOUT)", self.me, task, silent,
                    self._membership.stall_timeout)
        for task in self._stalled - set(stalled):
            self._stalled.discard(task)
            with self._lock:
                lost = task in self._membership.lost()
            if not lost:
                log.warning("%s: %s answers again after its stall", self.me, task)

    def _tell_host(self, event: Event) -> None:
        if self.on_event is not None and event.task != self.me:
            self.on_event(event)

    def _register(self, request, context):
        if request.coordinator != self.me or request.cluster_digest != self._digest:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{request.task or 'a task'} was given another cluster than "
                          f"{self.me} (the coordination service)")
        try:
            with self._lock:
                self._membership.register(request.task, request.incarnation, self._clock())
        except UnknownTaskError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return coordination_pb2.RegisterReply(coordinator_incarnation=self.incarnation)

    def _heartbeat(self, request, context):
        try:
            with self._lock:
                answer = self._membership.heartbeat(request.task, request.incarnation,
                                                    request.events_seen, self._clock())
        except UnknownTaskError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return coordination_pb2.CoordinationHeartbeatReply(
            events=[_to_wire(e) for e in answer.events], next_event=answer.next_event,
            unregistered=answer.unregistered, unregistered_count=answer.unregistered_count,
            coordinator_incarnation=self.incarnation)

    def _report(self, request, context):
        event = _from_wire(request.event)
        if event is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown event kind {request.event.kind} (a newer peer?)")
        try:
            with self._lock:
                news = self._membership.report(event, self._clock())
                if event.kind is EventKind.LEFT and event.task == self.me:
                    self._membership.announce(event)  # the run is over: servers may stop
        except UnknownTaskError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if news:
            log.info("%s: %s reports %s %s", self.me, event.reporter, event.task,
                     event.kind.value)
            self._tell_host(event)
        return coordination_pb2.ReportReply()


class CoordinationClient:
    """One task's side of the coordination service; see the module docstring.

    ``on_event(event)`` is called (from the heartbeat thread) for each event about another task,
    in log order; ``on_coordinator_lost(error)`` once, when the coordinator has not answered for
    ``timeout`` seconds and its address does not answer ``probe`` either (with
    ``stall_timeout``: else at once), or has not answered for ``stall_timeout`` seconds. Call
    :meth:`register`, then :meth:`start`; :meth:`close` reports a clean departure
    (``leave=True``) and stops the thread.
    """

    def __init__(self, me: str, incarnation: int, coordinator: tuple[str, str], digest: bytes,
                 token: Token, *, interval: float, timeout: float,
                 startup_timeout: float | None = None, cluster_size: int = 1,
                 stall_timeout: float | None = None,
                 probe: Callable[[Mapping[str, str]], set[str]] = answering,
                 on_event: Callable[[Event], None],
                 on_coordinator_lost: Callable[[PeerUnavailableError], None]) -> None:
        self.me = me
        self.incarnation = incarnation
        self.coordinator, self.address = coordinator
        self._digest = digest
        self._token = token
        self._interval = interval
        self._timeout = timeout
        self._startup_timeout = max(timeout, startup_timeout or 0.0)
        self._stall_timeout = stall_timeout
        self._probe = probe
        self._stalled = False  # the coordinator is silent but its host answers
        self._on_event = on_event
        self._on_lost = on_coordinator_lost
        # Small messages only: no bulk-transfer buffers (they cost ~250 KiB per connection).
        self._channel = open_channel(self.address, CONTROL_CHANNEL_OPTIONS, token.tls)
        self._register_call = self._method("Register", coordination_pb2.RegisterRequest,
                                           coordination_pb2.RegisterReply)
        self._heartbeat_call = self._method(
            "Heartbeat", coordination_pb2.CoordinationHeartbeatRequest,
            coordination_pb2.CoordinationHeartbeatReply)
        self._report_call = self._method("Report", coordination_pb2.ReportRequest,
                                         coordination_pb2.ReportReply)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._events_seen = 0
        # Not registered yet, as the last reply said: (first names, count); None: no answer yet.
        self._unregistered: tuple[tuple[str, ...], int] | None = None
        self._tasks = cluster_size  # for the join poll's period
        self._last_answer = time.monotonic()
        self._lost: PeerUnavailableError | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_flight: grpc.Future | None = None  # the heartbeat call close() cancels

    def _method(self, name: str, request_type, reply_type):
        return self._channel.unary_unary(
            f"/{SERVICE}/{name}", request_serializer=request_type.SerializeToString,
            response_deserializer=reply_type.FromString)

    def _peer(self) -> str:
        return f"{self.coordinator} ({self.address}, the coordination service)"

    # -- start-up ---------------------------------------------------------------------------

    def register(self, deadline: Deadline) -> None:
        """Join the cluster, waiting (until ``deadline``) for the coordinator to come up.

        Raises ``PeersNotReadyError`` naming the coordinator when it never answered,
        ``ClusterSpecMismatchError`` when it was given another cluster (or does not know this
        task), ``UnauthenticatedError`` when it refuses our token.
        """
        request = coordination_pb2.RegisterRequest(
            task=self.me, incarnation=self.incarnation, coordinator=self.coordinator,
            cluster_digest=self._digest)
        status = "no answer"
        host = host_of(self.address)
        still = StillWaiting(self.me, deadline)
        while True:
            # Dial only once the name resolves (a pod not published yet is "not ready").
            if not peer_names.resolves(host, timeout=min(1.0, deadline.remaining())):
                status = NOT_RESOLVED
            else:
                try:
                    self._register_call(request,
                                        timeout=max(0.05, min(2.0, deadline.remaining())),
                                        metadata=self._token.metadata, wait_for_ready=True)
                    break
                except grpc.RpcError as e:
                    if fails_at_connect(e):
                        raise translate(e, self._peer(), f"{self.me}'s registration") from e
                    status = status_name(e)
            if deadline.expired:
                raise PeersNotReadyError(
                    f"{self.me}: the coordination service {self._peer()} never answered "
                    f"[{status}]", missing=[(self.coordinator, self.address, status)])
            still.tick(lambda status=status: f"the coordination service {self._peer()} [{status}]")
            self._stopping.wait(min(0.1, deadline.remaining()))
        with self._lock:
            self._last_answer = time.monotonic()

    def start(self) -> None:
        """Start heartbeating (after :meth:`register`)."""
        self._thread = threading.Thread(target=self._run, name="coordination-heartbeat",
                                        daemon=True)
        self._thread.start()

    def wait_for(self, tasks: Sequence[str], deadline: Deadline,
                 check: Callable[[], None] = lambda: None) -> tuple[str, ...]:
        """Block until every task of ``tasks`` has registered, or ``deadline``; returns the ones
        that have not (in ``tasks`` order). ``check()`` runs at every change and may raise (a
        failure reported meanwhile). Raises the coordinator's loss as ``PeerUnavailableError``.
        """
        wanted = set(tasks)
        self._tasks = max(self._tasks, len(tasks) + 1)
        still = StillWaiting(self.me, deadline)  # a line every few seconds: whom we wait for
        with self._changed:
            while True:
                if self._lost is not None:
                    raise self._lost
                check()
                known = self._unregistered
                if known is not None:
                    names, count = known
                    if count == 0 or (count == len(names) and not wanted & set(names)):
                        return ()
                if deadline.expired:
                    if known is None:
                        return tuple(tasks)
                    listed = tuple(t for t in tasks if t in known[0])
                    # More are missing than a reply lists: which of ``tasks`` is unknown.
                    return listed or (tuple(tasks) if known[1] > len(known[0]) else ())
                still.tick(lambda: describe_unregistered(list(tasks), self._unregistered))
                self._changed.wait(still.timeout(deadline.timeout()))

    # -- the heartbeat thread -------------------------------------------------------------------

    def _period(self) -> float:
        """Until everyone has registered, ask more often (the start-up barrier waits on it), but
        no more than ~500 calls/s for the whole cluster; then every interval, jittered by 10%
        so that tasks which joined together do not beat together."""
        known = self._unregistered
        if known is None or known[1]:
            return min(self._interval, max(0.1, self._tasks / 500))
        return self._interval * random.uniform(0.9, 1.1)

    @property
    def lost(self) -> PeerUnavailableError | None:
        """The coordinator's loss, once this task has declared it (then nothing more is sent
        to it: reports and the goodbye are skipped)."""
        return self._lost

    def _suspect_after(self) -> float:
        """The silence after which the coordinator is probed: the start-up deadline until every
        task has registered (a coordinator starved while interpreters start), then
        ``timeout``."""
        known = self._unregistered
        return self._startup_timeout if known is None or known[1] > 0 else self._timeout

    def _bound(self) -> float:
        """How long the coordinator may stay silent: :meth:`_suspect_after`, or
        ``stall_timeout`` once its host answered a probe."""
        bound = self._suspect_after()
        if self._stalled and self._stall_timeout is not None:
            return max(bound, self._stall_timeout)
        return bound

    def _until_lost(self) -> float:
        """Seconds until the coordinator's silence reaches :meth:`_bound` (may be <= 0)."""
        return self._last_answer + self._bound() - time.monotonic()

    def _run(self) -> None:
        joined = False
        # The waits end at the bound too, so a silent coordinator is declared lost when its
        # silence reaches the timeout, not up to one period plus one call later.
        while True:
            wait = max(0.0, min(self._period(), self._until_lost()))
            started = time.monotonic()
            if self._stopping.wait(wait):
                return
            if self._lost is not None:
                return  # nothing more to hear from it
            late = time.monotonic() - started - wait
            if late > self._timeout:
                # This process was stalled (a call holding the GIL): the silence is our own.
                with self._changed:
                    self._last_answer = time.monotonic()
            self.beat()
            known = self._unregistered
            if not joined and known is not None and known[1] == 0:
                joined = True  # start the steady beat at a random phase: no bursts of N calls
                if self._stopping.wait(self._interval * random.random()):
                    return

    def beat(self) -> HeartbeatAnswer | None:
        """One heartbeat (the thread calls this); events are handed to ``on_event``.

        The call waits at most one interval (0.5 s at least), and never past the moment the
        coordinator's silence reaches the timeout.
        """
        request = coordination_pb2.CoordinationHeartbeatRequest(
            task=self.me, incarnation=self.incarnation, events_seen=self._events_seen)
        timeout = max(0.05, min(max(self._interval, 0.5), self._until_lost() + 0.01))
        sent = time.monotonic()
        try:
            call = self._heartbeat_call.future(request, timeout=timeout,
                                               metadata=self._token.metadata)
            self._in_flight = call
            if self._stopping.is_set():
                call.cancel()
            reply = call.result()
        except grpc.RpcError as e:
            if time.monotonic() - sent > timeout + self._timeout:
                # This process was stalled during the call: the silence is our own.
                with self._changed:
                    self._last_answer = time.monotonic()
                return None
            self._no_answer(status_name(e))
            return None
        except grpc.FutureCancelledError:
            return None  # close() cancelled it
        finally:
            self._in_flight = None
        events = tuple(e for e in map(_from_wire, reply.events) if e is not None)
        if self._stalled:
            log.warning("%s: %s answers again after its stall", self.me, self._peer())
        with self._changed:
            self._stalled = False
            self._last_answer = time.monotonic()
            self._events_seen = reply.next_event
            self._unregistered = (tuple(reply.unregistered), reply.unregistered_count)
        for event in events:
            if event.task != self.me:
                self._on_event(event)
        with self._changed:  # after the events: a waiter re-checks what they changed
            self._changed.notify_all()
        return HeartbeatAnswer(events, reply.next_event, tuple(reply.unregistered),
                               reply.unregistered_count)

    def _no_answer(self, status: str) -> None:
        with self._changed:
            silent = time.monotonic() - self._last_answer
            if self._lost is not None or silent < self._suspect_after() or self._stopping.is_set():
                return
            stall_bound = max(self._suspect_after(), self._stall_timeout or 0.0)
        why = ""
        if self._stall_timeout is not None:
            if silent >= stall_bound:
                why = f": stalled (its host answers) beyond {stall_bound:g} s"
            elif self._probe({self.coordinator: self.address}):
                if not self._stalled:
                    log.warning(
                        "%s: %s is stalled: no answer for %.1f s [%s], but its host answers "
                        "(alive but busy: a long call holding the GIL, or stopped); it is lost "
                        "after %g s of silence (CLUSTER_STALL_TIMEOUT)", self.me, self._peer(),
                        silent, status, stall_bound)
                with self._changed:
                    self._stalled = True
                return
            else:
                why = " and its address does not answer"
        with self._changed:
            if self._lost is not None or self._stopping.is_set():
                return
            silent = time.monotonic() - self._last_answer
            self._lost = PeerUnavailableError(
                f"{self._peer()} is unavailable: no answer for {silent:.1f} s [{status}]{why}",
                task=self.coordinator, address=self.address)
            error = self._lost
            self._changed.notify_all()
        self._on_lost(error)

    # -- reports ----------------------------------------------------------------------------

    def report(self, event: Event, deadline: Deadline) -> bool:
        """Tell the coordinator ``event`` (bounded by ``deadline``); False if it was not told,
        at once when the coordinator is known lost."""
        if self._lost is not None:
            return False
        try:
            self._report_call(coordination_pb2.ReportRequest(event=_to_wire(event)),
                              timeout=max(deadline.remaining(), 0.05),
                              metadata=self._token.metadata)
        except grpc.RpcError as e:
            log.debug("%s: could not report %s to %s: %s", self.me, event, self._peer(),
                      status_name(e))
            return False
        return True

    def close(self, *, leave: bool = True, deadline: Deadline | None = None) -> None:
        """Stop heartbeating (a call in flight is cancelled: closing never waits on a silent
        coordinator); with ``leave``, tell the coordinator this is a clean exit, within
        ``deadline`` (default 1 s), unless it is known lost."""
        self._stopping.set()
        call = self._in_flight
        if call is not None:
            call.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        deadline = deadline or Deadline.after(1.0)
        if leave and self._lost is None:
            self.report(Event(EventKind.LEFT, self.me, reporter=self.me), deadline)
        close_channels([self._channel], Deadline.after(max(deadline.remaining(), 0.1)),
                       what=f"{self.me}'s coordination channel")
