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
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import grpc

from cluster.deadline import Deadline
from cluster.transport._coordination_wire import SERVICE, from_wire, to_wire
from cluster.transport._pb import coordination_pb2
from cluster.transport._reachable import answering
from cluster.transport.coordination_client import CoordinationClient
from cluster.transport.generations import Generations, Status
from cluster.transport.membership import Event, EventKind, Membership, UnknownTaskError

__all__ = [
    "MAX_HEARTBEATS_PER_SECOND",
    "SERVICE",
    "SERVICE_HOST",
    "CoordinationClient",
    "CoordinationService",
    "cluster_digest",
    "coordination_timing",
    "coordinator_task",
]

log = logging.getLogger(__name__)

SERVICE_HOST = "coordination-service"
"""The coordinator's name when the service runs in a process of its own (``python -m
coordination_service``, ``CLUSTER_COORDINATION_SERVICE``) rather than in a task."""


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


class CoordinationService:
    """The ``Coordination`` service, hosted by one task; see the module docstring.

    ``tasks`` are every task of the cluster; ``me`` is the hosting task; ``digest`` its
    :func:`cluster_digest`. With ``addresses`` (``{task: "host:port"}``) and ``stall_timeout``,
    a silent task whose address answers ``probe`` is stalled, not lost, until ``stall_timeout``;
    without them a silent task is lost after ``timeout``. :meth:`start` runs the expiry clock,
    :meth:`stop` ends it. With ``elastic`` (``(min, max)``) and ``group`` (the collective
    tasks, in cluster order) it also answers ``Regroup``: the generations of the elastic group
    (:mod:`~cluster.transport.generations`).
    """

    def __init__(self, me: str, tasks: Sequence[str], digest: bytes, *, interval: float,
                 timeout: float, startup_timeout: float | None = None,
                 addresses: Mapping[str, str] | None = None,
                 stall_timeout: float | None = None,
                 elastic: tuple[int, int] | None = None, group: Sequence[str] = (),
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
        self._generations = (Generations(tuple(group), *elastic)
                             if elastic is not None and group else None)
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
            "Regroup": grpc.unary_unary_rpc_method_handler(
                self._regroup,
                request_deserializer=coordination_pb2.RegroupRequest.FromString,
                response_serializer=coordination_pb2.RegroupReply.SerializeToString),
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
            events = self._membership.expire(now, answered, self._elastic_view()[0])
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
                if self._generations is not None:
                    self._generations.registered(request.task, request.incarnation)
        except UnknownTaskError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return coordination_pb2.RegisterReply(coordinator_incarnation=self.incarnation)

    def _heartbeat(self, request, context):
        try:
            with self._lock:
                answer = self._membership.heartbeat(request.task, request.incarnation,
                                                    request.events_seen, self._clock())
            generation, joining = self._elastic_view()
        except UnknownTaskError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return coordination_pb2.CoordinationHeartbeatReply(
            events=[to_wire(e) for e in answer.events], next_event=answer.next_event,
            unregistered=answer.unregistered, unregistered_count=answer.unregistered_count,
            coordinator_incarnation=self.incarnation, generation=generation, joining=joining)

    def _elastic_view(self) -> tuple[int, int]:
        """(generation, tasks waiting to join) of the elastic group; (0, 0) without one.
        Called under the lock."""
        if self._generations is None:
            return 0, 0
        return self._generations.generation, self._generations.joining()

    def _predates(self, event: Event) -> bool:
        """``event`` is a loss or failure of an earlier incarnation of its task than the live
        one (see :meth:`Generations.predates`): not news. Called under the lock."""
        if self._generations is None or event.kind not in (EventKind.LOST, EventKind.FAILED):
            return False
        return self._generations.predates(event.task, self._membership.live(event.task),
                                          event.generation)

    def _regroup(self, request, context):
        if self._generations is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self.me}: this cluster is not elastic (CLUSTER_ELASTIC is unset)")
        with self._lock:
            before = self._generations.generation
            answer = self._generations.ask(
                request.task, request.incarnation, request.after_generation,
                enlist=request.enlist, live=self._membership.live,
                registered=self._membership.registered)
            formed = self._generations.generation != before
        if formed:
            log.info("%s: elastic group generation %d: %d replica(s): %s", self.me,
                     answer.generation, len(answer.members), ", ".join(answer.members))
        status = {Status.WAITING: coordination_pb2.RegroupReply.WAITING,
                  Status.FORMED: coordination_pb2.RegroupReply.FORMED,
                  Status.BELOW_MIN: coordination_pb2.RegroupReply.BELOW_MIN,
                  Status.REFUSED: coordination_pb2.RegroupReply.REFUSED}[answer.status]
        return coordination_pb2.RegroupReply(status=status, generation=answer.generation,
                                             members=answer.members, message=answer.message,
                                             gone=answer.gone)

    def _report(self, request, context):
        event = from_wire(request.event)
        if event is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown event kind {request.event.kind} (a newer peer?)")
        try:
            with self._lock:
                stale = self._predates(event)
                news = not stale and self._membership.report(event, self._clock())
                if event.kind is EventKind.LEFT and event.task == self.me:
                    self._membership.announce(event)  # the run is over: servers may stop
        except UnknownTaskError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if stale:
            log.debug("%s: %s reports %s %s in generation %d, an earlier incarnation's: "
                      "ignored", self.me, event.reporter, event.task, event.kind.value,
                      event.generation)
        if news:
            log.info("%s: %s reports %s %s", self.me, event.reporter, event.task,
                     event.kind.value)
            self._tell_host(event)
        return coordination_pb2.ReportReply()
