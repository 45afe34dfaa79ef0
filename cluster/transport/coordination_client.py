"""One task's side of the coordination service (:mod:`~cluster.transport.coordination` says
what the service does): registration, the heartbeat thread, reports, the goodbye; and the
coordinator's own liveness as this task sees it (silent for ``timeout``: probed; lost when its
address does not answer, stalled when it does, lost after ``stall_timeout``)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import grpc

from cluster.deadline import Deadline
from cluster.errors import PeersNotReadyError, PeerUnavailableError
from cluster.transport._closing import close_channels
from cluster.transport._coordination_wire import SERVICE, from_wire, to_wire
from cluster.transport._grpc_errors import fails_at_connect, status_name, translate
from cluster.transport._pb import coordination_pb2
from cluster.transport._reachable import answering
from cluster.transport._still_waiting import StillWaiting, describe_unregistered
from cluster.transport.auth import Token
from cluster.transport.generations import Answer, Status
from cluster.transport.membership import Event, EventKind, HeartbeatAnswer
from cluster.transport.names import NOT_RESOLVED, host_of, peer_names
from cluster.transport.server import CONTROL_CHANNEL_OPTIONS
from cluster.transport.tls import open_channel

__all__ = ["CoordinationClient"]

log = logging.getLogger(__name__)


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
        # Its own generator: drawing from the global one would change a user's seeded sequence
        # (Keras' default seeds come from it) depending on when the heartbeat thread runs.
        self._jitter = random.Random()
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
        self._regroup_call = self._method("Regroup", coordination_pb2.RegroupRequest,
                                          coordination_pb2.RegroupReply)
        # Elastic clusters, as the last heartbeat said: the group's generation, and how many
        # tasks wait to join it.
        self.generation = 0
        self.joining = 0
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
        return self._interval * self._jitter.uniform(0.9, 1.1)

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
                self._stalled_here(late)
            self.beat()
            known = self._unregistered
            if not joined and known is not None and known[1] == 0:
                joined = True  # start the steady beat at a random phase: no bursts of N calls
                if self._stopping.wait(self._interval * self._jitter.random()):
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
            late = time.monotonic() - sent - timeout
            if late > self._timeout:
                self._stalled_here(late)
                return None
            self._no_answer(status_name(e))
            return None
        except grpc.FutureCancelledError:
            return None  # close() cancelled it
        finally:
            self._in_flight = None
        events = tuple(e for e in map(from_wire, reply.events) if e is not None)
        if self._stalled:
            log.warning("%s: %s answers again after its stall", self.me, self._peer())
        with self._changed:
            self._stalled = False
            self._last_answer = time.monotonic()
            self._events_seen = reply.next_event
            self._unregistered = (tuple(reply.unregistered), reply.unregistered_count)
            self.generation, self.joining = reply.generation, reply.joining
        for event in events:
            if event.task != self.me:
                self._on_event(event)
        with self._changed:  # after the events: a waiter re-checks what they changed
            self._changed.notify_all()
        return HeartbeatAnswer(events, reply.next_event, tuple(reply.unregistered),
                               reply.unregistered_count)

    def _stalled_here(self, seconds: float) -> None:
        """This process was stalled (a call holding the GIL): the silence was our own, so the
        coordinator's silence counts from now; peers saw this task as stalled meanwhile."""
        log.warning("%s: this task could not heartbeat for %.1f s (a call held the GIL: a slow "
                    "import, a long C call?); peers reported it as stalled, and lose it after "
                    "CLUSTER_STALL_TIMEOUT", self.me, seconds)
        with self._changed:
            self._last_answer = time.monotonic()

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
            self._report_call(coordination_pb2.ReportRequest(event=to_wire(event)),
                              timeout=max(deadline.remaining(), 0.05),
                              metadata=self._token.metadata)
        except grpc.RpcError as e:
            log.debug("%s: could not report %s to %s: %s", self.me, event, self._peer(),
                      status_name(e))
            return False
        return True

    # -- elastic groups ---------------------------------------------------------------------

    _STATUS = {coordination_pb2.RegroupReply.WAITING: Status.WAITING,
               coordination_pb2.RegroupReply.FORMED: Status.FORMED,
               coordination_pb2.RegroupReply.BELOW_MIN: Status.BELOW_MIN,
               coordination_pb2.RegroupReply.REFUSED: Status.REFUSED}

    def regroup(self, after: int, *, enlist: bool, deadline: Deadline,
                wait: bool = True) -> Answer:
        """Ask the service for the elastic group's generation after ``after``
        (:mod:`~cluster.transport.generations`); with ``wait``, ask again every 50 ms until
        the answer is not ``WAITING`` or ``deadline`` passes (then the last ``WAITING`` answer
        is returned). Raises the coordinator's loss as ``PeerUnavailableError``."""
        request = coordination_pb2.RegroupRequest(task=self.me, incarnation=self.incarnation,
                                                  after_generation=after, enlist=enlist)
        status = "no answer"
        answer = Answer(Status.WAITING, 0, ())
        while True:
            if self._lost is not None:
                raise self._lost
            try:
                reply = self._regroup_call(request, timeout=max(0.05, min(
                    2.0, deadline.remaining())), metadata=self._token.metadata)
                answer = Answer(self._STATUS.get(reply.status, Status.WAITING), reply.generation,
                                tuple(reply.members), reply.message, tuple(reply.gone))
                if answer.status is not Status.WAITING or not wait:
                    return answer
            except grpc.RpcError as e:
                if fails_at_connect(e):
                    raise translate(e, self._peer(), f"{self.me}'s regroup") from e
                status = status_name(e)
                log.debug("%s: regroup: %s [%s]", self.me, self._peer(), status)
            if deadline.expired:
                return answer
            self._stopping.wait(min(0.05, deadline.remaining()))

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
