"""A lost peer is named once: another task's error about it, passed on (an Abort naming the lost
task, the coordination service's LOST event), already opens with ``"{peer} is unavailable: "``,
and the rank that learns it says so once, with who found it, never twice."""

from __future__ import annotations

import pytest

from cluster.deadline import Deadline
from cluster.errors import PeerUnavailableError
from cluster.transport.api import MessageKey

from .conftest import NetworkGroup

pytestmark = [pytest.mark.timeout(60)]

WHY = "its data connection broke (EOFError: connection closed)"


@pytest.fixture
def group():
    reported: list[tuple[str, str]] = []
    group = NetworkGroup(3, on_peer_lost=lambda peer, why: reported.append((peer.task, why)))
    group.reported = reported
    try:
        yield group
    finally:
        group.close()


def _error(transport) -> PeerUnavailableError:
    with pytest.raises(PeerUnavailableError) as info:
        transport.recv(1, MessageKey("g", 0, 0), deadline=Deadline.after(5))
    return info.value


def test_a_loss_passed_on_by_a_peer_names_the_lost_task_once(group) -> None:
    a = group.transports[0]
    lost = group.peers[2]
    a.lost_by_peer("worker:1", f"{lost} is unavailable: {WHY}", lost.task, lost.address)
    error = _error(a)
    assert str(error) == f"{lost} is unavailable, as worker:1 found: {WHY}"
    assert error.task == "worker:2"


def test_a_loss_the_coordination_service_relays_names_the_lost_task_once(group) -> None:
    a = group.transports[0]
    lost = group.peers[2]
    a.peer_lost(lost.task, f"{lost} is unavailable: {WHY}, as worker:1 found")
    assert str(_error(a)) == f"{lost} is unavailable: {WHY}, as worker:1 found"


def test_a_reason_without_the_prefix_is_kept_whole(group) -> None:
    a = group.transports[0]
    lost = group.peers[2]
    a.peer_lost(lost.task, "no heartbeat for 3.2 s")
    assert str(_error(a)) == f"{lost} is unavailable: no heartbeat for 3.2 s"


def test_the_rank_that_finds_a_loss_reports_the_reason_alone(group) -> None:
    b = group.transports[1]
    b._peer_lost_by_rank(2, WHY)  # reports at once, on this thread
    # Its peers may report losses of their own meanwhile (b's failure cuts its streams; every
    # transport of the group shares the callback): none repeats the prefix either.
    assert ("worker:2", WHY) in group.reported
    assert not [why for _, why in group.reported if " is unavailable" in why], group.reported
    assert str(_error(b)).startswith(f"{group.peers[2]} is unavailable: {WHY}")


@pytest.mark.parametrize(("reporter", "message", "why"), [
    ("worker:1", WHY, f"{WHY}, as worker:1 found"),          # a peer found it
    ("", "no heartbeat for 3.2 s", "no heartbeat for 3.2 s"),  # the service's own verdict
    ("", "", "lost"),
])
def test_a_lost_event_says_who_found_the_loss(reporter, message, why) -> None:
    from types import SimpleNamespace

    from cluster.task_runtime import TaskRuntime
    from cluster.transport.membership import Event, EventKind

    told: list[tuple[str, str]] = []
    runtime = SimpleNamespace(_on_peer_lost=lambda task, why, found_in: told.append((task, why)))
    TaskRuntime._on_event(runtime, Event(EventKind.LOST, "worker:2", reporter, message=message))
    assert told == [("worker:2", why)]
