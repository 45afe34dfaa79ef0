"""The coordination service over real gRPC on loopback: a few clients, one service.

Start-up (register, wait for everyone), events reaching every task, a silent task declared lost
to every other task within ``timeout + 1.5 interval`` (plus slack for a loaded machine), a task
given another cluster refused, and a dead coordinator detected by every client. Scale figures
are in ``bench/coordination.py``, never here.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest

from cluster.deadline import Deadline
from cluster.errors import ClusterSpecMismatchError, PeerUnavailableError
from cluster.transport.coordination import (
    SERVICE,
    CoordinationClient,
    CoordinationService,
    cluster_digest,
)
from cluster.transport.generations import Status
from cluster.transport.membership import Event, EventKind
from cluster.transport.server import TaskServer

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)

TASKS = ["chief:0", "worker:0", "worker:1", "worker:2"]
INTERVAL = 0.2
# Long enough that a live task's heartbeat thread, starved on a loaded 2-core machine, is not
# taken for a silent one; the tests wait for the timeout only where a loss is the point.
TIMEOUT = 2.0
SLACK = 5.0  # s: generous upper bounds; the lower bounds are exact


class Cluster:
    """A service on a TaskServer and one client per task, all in this process."""

    def __init__(self, tasks: list[str] = TASKS, elastic: tuple[int, int] | None = None) -> None:
        self.tasks = tasks
        self.addresses = {t: f"127.0.0.1:{30000 + i}" for i, t in enumerate(tasks)}
        self.digest = cluster_digest(list(self.addresses.items()))
        self.server = TaskServer("127.0.0.1:0", TOKEN)
        self.service = CoordinationService(tasks[0], tasks, self.digest, interval=INTERVAL,
                                           timeout=TIMEOUT, elastic=elastic, group=tasks)
        self.server.add_handlers(SERVICE, self.service.handlers())
        self.server.start()
        self.service.start()
        self.events: dict[str, queue.Queue[tuple[float, Event]]] = {}
        self.lost: dict[str, queue.Queue[tuple[float, PeerUnavailableError]]] = {}
        self.clients: dict[str, CoordinationClient] = {}

    def client(self, task: str, digest: bytes | None = None,
               incarnation: int | None = None) -> CoordinationClient:
        events: queue.Queue = queue.Queue()
        lost: queue.Queue = queue.Queue()
        client = CoordinationClient(
            task, incarnation=hash(task) & 0xFFFF if incarnation is None else incarnation,
            coordinator=(self.tasks[0], self.server.address),
            digest=self.digest if digest is None else digest, token=TOKEN, interval=INTERVAL,
            timeout=TIMEOUT, on_event=lambda e: events.put((time.monotonic(), e)),
            on_coordinator_lost=lambda e: lost.put((time.monotonic(), e)))
        self.events[task], self.lost[task], self.clients[task] = events, lost, client
        return client

    def join_all(self) -> None:
        for task in self.tasks:
            self.client(task).register(Deadline.after(10))
            self.clients[task].start()
        for client in self.clients.values():
            assert client.wait_for(self.tasks, Deadline.after(10)) == ()

    def close(self) -> None:
        for client in self.clients.values():
            client.close(leave=False, deadline=Deadline.after(1))
        self.service.stop()
        self.server.stop(0)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.close()


def _next(q: queue.Queue, seconds: float):
    try:
        return q.get(timeout=seconds)
    except queue.Empty:
        pytest.fail(f"nothing arrived within {seconds} s")


def test_every_task_registers_and_a_reported_failure_reaches_every_other_task(cluster) -> None:
    cluster.join_all()
    failed = Event(EventKind.FAILED, "worker:1", reporter="worker:1", error_type="ValueError",
                   message="bad batch", exit_code=1)
    assert cluster.clients["worker:1"].report(failed, Deadline.after(5))
    for task in cluster.tasks:
        if task == "worker:1":
            continue
        _, event = _next(cluster.events[task], SLACK)
        assert (event.kind, event.task, event.error_type, event.exit_code) == (
            EventKind.FAILED, "worker:1", "ValueError", 1)
        assert "bad batch" in event.message
    assert cluster.events["worker:1"].empty()  # a task is not told about itself


def test_a_silent_task_is_declared_lost_to_every_other_task_within_the_bound(cluster) -> None:
    cluster.join_all()
    silent = cluster.clients.pop("worker:2")
    stopped = time.monotonic()
    silent.close(leave=False)  # no goodbye: to the service, the task just went quiet
    for task in cluster.clients:
        at, event = _next(cluster.events[task], TIMEOUT + 1.5 * INTERVAL + SLACK)
        assert (event.kind, event.task) == (EventKind.LOST, "worker:2")
        assert "no heartbeat" in event.message
        assert at > stopped  # never while it was still heartbeating
    assert all(cluster.lost[t].empty() for t in cluster.clients)


def test_a_clean_departure_is_not_reported_as_a_loss(cluster) -> None:
    cluster.join_all()
    cluster.clients.pop("worker:0").close(leave=True, deadline=Deadline.after(5))
    time.sleep(TIMEOUT + 4 * INTERVAL)  # let the expiry clock pass the timeout: nothing may come
    assert all(cluster.events[t].empty() for t in cluster.clients)


def test_a_task_given_another_cluster_is_refused(cluster) -> None:
    other = cluster_digest([("chief:0", "10.0.0.1:2222")])
    with pytest.raises(ClusterSpecMismatchError, match="worker:1"):
        cluster.client("worker:1", digest=other).register(Deadline.after(10))


def test_a_task_not_in_the_cluster_is_refused(cluster) -> None:
    cluster.tasks = [*TASKS, "worker:9"]  # the client believes in a task the service lacks
    with pytest.raises(ClusterSpecMismatchError, match="worker:9"):
        cluster.client("worker:9").register(Deadline.after(10))


def test_a_dead_coordinator_is_detected_by_every_task(cluster) -> None:
    cluster.join_all()
    stopped = time.monotonic()
    cluster.server.stop(0)
    cluster.service.stop()
    for task in cluster.tasks:
        at, error = _next(cluster.lost[task], TIMEOUT + INTERVAL + SLACK)
        assert isinstance(error, PeerUnavailableError)
        assert error.task == "chief:0" and "coordination service" in str(error)
        assert at > stopped


def test_the_hosting_task_hears_new_events_from_the_service_itself(cluster) -> None:
    heard: queue.Queue[Event] = queue.Queue()
    cluster.service.on_event = heard.put  # the runtime of the coordinator's own task
    cluster.join_all()
    failed = Event(EventKind.FAILED, "worker:1", reporter="worker:1", error_type="ValueError")
    assert cluster.clients["worker:1"].report(failed, Deadline.after(5))
    assert (_next(heard, SLACK).kind, failed.task) == (EventKind.FAILED, "worker:1")
    cluster.clients.pop("worker:2").close(leave=False)
    event = _next(heard, TIMEOUT + INTERVAL + SLACK)
    assert (event.kind, event.task) == (EventKind.LOST, "worker:2")
    assert cluster.clients["worker:1"].report(failed, Deadline.after(5))  # no news: not again
    lost_host = Event(EventKind.LOST, "chief:0", reporter="worker:0")
    assert cluster.clients["worker:0"].report(lost_host, Deadline.after(5))
    assert heard.empty()  # neither a repeat nor news about the hosting task itself


def _regroup(cluster: Cluster, tasks: list[str], after: int) -> int:
    """Every one of ``tasks`` asks for the generation after ``after``; returns the one formed."""
    for task in tasks:
        cluster.clients[task].regroup(after, enlist=True, deadline=Deadline.after(5), wait=False)
    answer = cluster.clients[tasks[0]].regroup(after, enlist=True, deadline=Deadline.after(5))
    assert answer.status is Status.FORMED, answer
    return answer.generation


def test_a_late_report_of_a_replaced_tasks_loss_does_not_lose_its_replacement() -> None:
    cluster = Cluster(elastic=(2, 4))
    try:
        cluster.join_all()
        assert _regroup(cluster, TASKS, 0) == 1
        survivors = ["chief:0", "worker:0", "worker:2"]
        found = Event(EventKind.LOST, "worker:1", reporter="chief:0", generation=1)
        cluster.clients.pop("worker:1").close(leave=False)  # it died
        assert cluster.clients["chief:0"].report(found, Deadline.after(5))
        assert _regroup(cluster, survivors, 1) == 2
        for task in survivors:  # the loss reached everyone
            assert _next(cluster.events[task], SLACK)[1].task == "worker:1"
        replacement = cluster.client("worker:1", incarnation=7)
        replacement.register(Deadline.after(5))
        replacement.start()
        # worker:0 found the old worker:1 lost in generation 1; its report comes only now.
        late = Event(EventKind.LOST, "worker:1", reporter="worker:0", generation=1)
        assert cluster.clients["worker:0"].report(late, Deadline.after(5))
        answer = replacement.regroup(0, enlist=True, deadline=Deadline.after(5), wait=False)
        assert answer.status is Status.WAITING, answer  # not REFUSED: not counted lost
        assert _regroup(cluster, survivors, 2) == 3
        assert replacement.regroup(0, enlist=True, deadline=Deadline.after(5)).members == \
            tuple(TASKS)
        time.sleep(4 * INTERVAL)  # several beats: nobody heard of a second loss
        assert all(cluster.events[t].empty() for t in TASKS)
        # A loss found in generation 3 is news: the replacement is lost now.
        now = Event(EventKind.LOST, "worker:1", reporter="worker:0", generation=3)
        assert cluster.clients["worker:0"].report(now, Deadline.after(5))
        assert _next(cluster.events["chief:0"], SLACK)[1] == now
    finally:
        cluster.close()


def test_a_preemption_notice_reaches_every_task_and_the_host_at_once(cluster) -> None:
    heard: queue.Queue[Event] = queue.Queue()
    cluster.service.on_event = heard.put
    cluster.join_all()
    notice = Event(EventKind.PREEMPTED, "worker:2", reporter="worker:2", message="serving 30 s")
    assert cluster.clients["worker:2"].report(notice, Deadline.after(5))
    assert _next(heard, SLACK) == notice  # the hosting task: from the service, not a beat
    for task in ("chief:0", "worker:0", "worker:1"):
        assert _next(cluster.events[task], SLACK)[1] == notice  # the kind survives the wire
    assert cluster.clients["worker:2"].report(notice, Deadline.after(5))  # told, not news
    time.sleep(4 * INTERVAL)  # several beats: a repeated notice must not be logged again
    assert heard.empty() and all(cluster.events[t].empty() for t in cluster.clients)
    assert all(cluster.lost[t].empty() for t in cluster.clients)


def test_an_event_kind_this_version_does_not_know_is_ignored_not_taken_for_a_loss() -> None:
    from cluster.transport._coordination_wire import from_wire
    from cluster.transport._pb import coordination_pb2

    unknown = coordination_pb2.ClusterEvent(kind=99, task="worker:0")  # a newer peer's kind
    assert from_wire(unknown) is None
    known = coordination_pb2.ClusterEvent(kind=coordination_pb2.ClusterEvent.PREEMPTED,
                                          task="worker:0")
    assert from_wire(known).kind is EventKind.PREEMPTED


def test_closing_never_waits_on_a_silent_coordinator() -> None:
    import socket

    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        client = CoordinationClient(
            "worker:0", 1, ("chief:0", f"127.0.0.1:{silent.getsockname()[1]}"), b"d", TOKEN,
            interval=5.0, timeout=30.0, on_event=lambda e: None,
            on_coordinator_lost=lambda e: None)
        client.start()  # its first heartbeat waits up to one interval (5 s) for an answer
        deadline = Deadline.after(10)
        while client._in_flight is None and not deadline.expired:
            time.sleep(0.01)
        assert client._in_flight is not None
        started = time.monotonic()
        client.close(leave=True, deadline=Deadline.after(0.5))
        assert time.monotonic() - started < 2.5  # the call in flight is cancelled, not awaited
        assert client._thread is not None and not client._thread.is_alive()
