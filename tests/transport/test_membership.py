"""The coordination service's state machine, without sockets: a table of calls and outcomes."""

from __future__ import annotations

import pytest

from cluster.transport.membership import Event, EventKind, Membership, UnknownTaskError

TASKS = ("chief:0", "worker:0", "worker:1")


def _joined(now: float = 0.0) -> Membership:
    m = Membership(TASKS, timeout=5.0)
    for i, task in enumerate(TASKS):
        m.register(task, incarnation=100 + i, now=now)
    return m


def test_unregistered_tasks_are_listed_in_cluster_order_until_they_join() -> None:
    m = Membership(TASKS, timeout=5.0)
    assert m.unregistered() == TASKS
    m.register("worker:1", 7, now=0.0)
    assert m.unregistered() == ("chief:0", "worker:0")
    answer = m.heartbeat("worker:1", 7, 0, now=0.5)
    assert answer.unregistered == ("chief:0", "worker:0") and answer.events == ()


@pytest.mark.parametrize(("beats", "now", "lost"), [
    ({"chief:0": 4.0, "worker:0": 4.0, "worker:1": 4.0}, 9.0, ()),       # all within 5 s
    ({"chief:0": 4.0, "worker:0": 4.0, "worker:1": 3.9}, 9.0, ("worker:1",)),
    ({"chief:0": 0.0, "worker:0": 0.0, "worker:1": 0.0}, 5.0, ()),       # exactly the timeout
    ({"chief:0": 0.0, "worker:0": 0.0, "worker:1": 0.0}, 5.1, TASKS),
])
def test_a_task_silent_for_longer_than_the_timeout_is_lost(beats, now, lost) -> None:
    m = _joined()
    for task, at in beats.items():
        m.heartbeat(task, 100 + TASKS.index(task), 0, now=at)
    events = m.expire(now)
    assert tuple(e.task for e in events) == lost
    assert all(e.kind is EventKind.LOST and "no heartbeat for" in e.message for e in events)
    later = m.expire(now + 100)
    assert {e.task for e in later} == set(TASKS) - set(lost)  # each task at most once
    assert m.expire(now + 200) == []


def test_a_loss_the_service_finds_carries_the_generation_it_was_found_in() -> None:
    m = _joined()
    m.heartbeat("chief:0", 100, 0, now=4.0)
    m.heartbeat("worker:0", 101, 0, now=4.0)
    events = m.expire(6.0, generation=3)  # worker:1 silent for 6 s
    assert [(e.task, e.generation) for e in events] == [("worker:1", 3)]
    assert m.events == tuple(events)


def test_unregistered_tasks_are_never_declared_lost() -> None:
    m = Membership(TASKS, timeout=1.0)
    m.register("chief:0", 1, now=0.0)
    assert [e.task for e in m.expire(10.0)] == ["chief:0"]


def test_a_clean_departure_is_not_a_loss_and_is_not_logged() -> None:
    m = _joined()
    assert m.report(Event(EventKind.LEFT, "worker:0", reporter="worker:0"), now=1.0) is False
    assert [e.task for e in m.expire(20.0)] == ["chief:0", "worker:1"]
    assert all(e.task != "worker:0" for e in m.events)


def test_an_announced_departure_reaches_every_live_task() -> None:
    m = _joined()
    left = Event(EventKind.LEFT, "chief:0", reporter="chief:0")
    assert m.report(left, now=1.0) is False
    m.announce(left)
    assert set(m.undelivered()) == {"worker:0", "worker:1"}  # the coordinator waits for them
    answer = m.heartbeat("worker:0", 101, 0, now=1.5)
    assert [(e.kind, e.task) for e in answer.events] == [(EventKind.LEFT, "chief:0")]
    assert m.undelivered() == ("worker:1",)


def test_events_reach_every_task_once_in_log_order_and_replies_are_bounded() -> None:
    m = Membership(TASKS, timeout=5.0, max_events=2)
    for i, task in enumerate(TASKS):
        m.register(task, i, now=0.0)
    assert m.report(Event(EventKind.FAILED, "worker:1", "worker:1", "ValueError", "boom", 1), 1.0)
    assert not m.report(Event(EventKind.FAILED, "worker:1", "worker:0", "X", "again"), 1.0)
    assert m.report(Event(EventKind.LOST, "worker:0", "chief:0", message="conn broke"), 1.0)
    assert not m.report(Event(EventKind.LOST, "worker:0", "worker:1"), 1.0)  # once
    m.expire(100.0)  # chief:0 is lost too (silent): the third event
    first = m.heartbeat("chief:0", 0, 0, now=100.0)
    assert [(e.kind, e.task) for e in first.events] == [(EventKind.FAILED, "worker:1"),
                                                       (EventKind.LOST, "worker:0")]
    second = m.heartbeat("chief:0", 0, first.next_event, now=100.0)
    assert [e.task for e in second.events] == ["chief:0"] and second.next_event == 3
    assert m.heartbeat("chief:0", 0, second.next_event, now=100.0).events == ()
    assert m.heartbeat("chief:0", 0, 10**9, now=100.0).next_event == 3  # a bogus index clamps


def test_a_restarted_task_registers_again_and_is_alive() -> None:
    m = _joined()
    m.expire(10.0)
    assert "worker:0" in m.lost()
    m.register("worker:0", incarnation=999, now=10.0)
    assert "worker:0" not in m.lost()
    with pytest.raises(UnknownTaskError, match="incarnation"):
        m.heartbeat("worker:0", 101, 0, now=10.5)  # the old incarnation is gone


@pytest.mark.parametrize("call", [
    lambda m: m.register("worker:7", 1, now=0.0),
    lambda m: m.heartbeat("ps:0", 1, 0, now=0.0),
    lambda m: m.report(Event(EventKind.LOST, "evaluator:0"), now=0.0),
])
def test_a_task_outside_the_cluster_is_refused(call) -> None:
    with pytest.raises(UnknownTaskError, match="not a task of this cluster"):
        call(Membership(TASKS, timeout=1.0))


def test_a_reported_message_is_capped() -> None:
    m = _joined()
    m.report(Event(EventKind.FAILED, "worker:0", message="x" * 100_000), now=0.0)
    assert len(m.events[0].message) <= 2000


def test_a_reply_lists_at_most_max_listed_unregistered_tasks_and_counts_them_all() -> None:
    tasks = tuple(f"worker:{i}" for i in range(10))
    m = Membership(tasks, timeout=5.0, max_listed=3)
    m.register("worker:0", 1, now=0.0)
    answer = m.heartbeat("worker:0", 1, 0, now=0.0)
    assert answer.unregistered == ("worker:1", "worker:2", "worker:3")
    assert answer.unregistered_count == 9
    for i, task in enumerate(tasks):
        m.register(task, i + 1, now=0.0)
    m.register("worker:4", 99, now=0.0)  # a restart counts once
    answer = m.heartbeat("worker:0", 1, 0, now=0.0)
    assert answer.unregistered == () and answer.unregistered_count == 0


@pytest.mark.parametrize(("tasks", "interval", "timeout", "expected"), [
    (64, 1.0, 5.0, (1.0, 5.0)),          # small clusters keep the configured timing
    (1000, 1.0, 5.0, (1.0, 5.0)),
    (2000, 1.0, 5.0, (2.0, 10.0)),       # 1000 calls/s at most, as many beats may be missed
    (4096, 0.5, 3.0, (4.096, 24.576)),
    (4096, 8.0, 30.0, (8.0, 30.0)),      # a slower configured beat is kept
])
def test_large_clusters_stretch_the_heartbeat_to_what_one_coordinator_answers(
        tasks, interval, timeout, expected) -> None:
    from cluster.transport.coordination import coordination_timing

    got = coordination_timing(tasks, interval, timeout)
    assert got == pytest.approx(expected)


def test_until_every_task_registered_silence_is_judged_by_the_startup_timeout() -> None:
    m = Membership(TASKS, timeout=5.0, startup_timeout=60.0)
    m.register("chief:0", 1, now=0.0)
    m.register("worker:0", 2, now=0.0)
    assert m.expire(30.0) == []           # worker:1 not up yet: a starved start is no loss
    assert [e.task for e in m.expire(61.0)] == ["chief:0", "worker:0"]


def test_when_the_last_task_registers_every_silence_counts_from_then() -> None:
    m = Membership(TASKS, timeout=5.0, startup_timeout=60.0)
    m.register("chief:0", 1, now=0.0)
    m.register("worker:0", 2, now=0.0)
    m.register("worker:1", 3, now=40.0)   # start-up ends at 40 s
    assert m.expire(44.0) == []
    assert {e.task for e in m.expire(45.5)} == set(TASKS)


def test_a_preemption_notice_is_logged_once_per_incarnation_and_is_not_a_failure() -> None:
    m = _joined()
    notice = Event(EventKind.PREEMPTED, "worker:1", reporter="worker:1", message="serving 30 s")
    assert m.report(notice, now=1.0) is True
    assert m.report(notice, now=1.5) is False  # the same incarnation: not news again
    assert m.preempted() == ("worker:1",)
    assert m.heartbeat("chief:0", 100, 0, now=2.0).events == (notice,)
    # A notice changes nothing in liveness: still heartbeating, never lost, may fail later.
    m.heartbeat("worker:1", 102, 1, now=4.0)
    assert [e.task for e in m.expire(8.0)] == ["chief:0", "worker:0"]
    assert m.lost() == ("chief:0", "worker:0")
    # A restarted task is a new incarnation: its own notice is news again.
    m.register("worker:1", 202, now=9.0)
    assert m.preempted() == ()
    assert m.report(notice, now=9.5) is True
    assert [e.kind for e in m.events].count(EventKind.PREEMPTED) == 2


@pytest.mark.parametrize("before", [EventKind.LOST, EventKind.FAILED, EventKind.LEFT])
def test_a_notice_from_a_task_already_gone_is_stale_and_dropped(before) -> None:
    m = _joined()
    m.report(Event(before, "worker:0", reporter="worker:0"), now=1.0)
    logged = len(m.events)
    assert m.report(Event(EventKind.PREEMPTED, "worker:0", reporter="worker:0"), 2.0) is False
    assert len(m.events) == logged and m.preempted() == ()


# -- silent but answering: stalled, not lost ---------------------------------------------------

def _stallable(stall: float = 60.0) -> Membership:
    m = Membership(TASKS, timeout=5.0, stall_timeout=stall)
    for i, task in enumerate(TASKS):
        m.register(task, incarnation=100 + i, now=0.0)
    for i, task in enumerate(TASKS[:2]):
        m.heartbeat(task, 100 + i, 0, now=100.0)  # worker:1 is the only silent one
    return m


@pytest.mark.parametrize(("now", "answering", "lost", "stalled"), [
    (4.0, set(), (), ()),                            # within the timeout: not even probed
    (6.0, set(), ("worker:1",), ()),                 # silent, its address does not answer
    (6.0, {"worker:1"}, (), ("worker:1",)),          # silent, its host answers: busy
    (60.0, {"worker:1"}, (), ("worker:1",)),         # exactly the stall timeout
    (60.5, {"worker:1"}, ("worker:1",), ()),         # beyond it, even if its host answers
])
def test_a_silent_task_is_lost_only_when_its_address_does_not_answer(now, answering, lost,
                                                                     stalled) -> None:
    m = _stallable()
    assert m.suspects(now) == (("worker:1",) if now > 5.0 else ())
    events = m.expire(now, answering)
    assert tuple(e.task for e in events) == lost
    assert tuple(m.stalled(now)) == stalled


def test_a_stalled_task_is_probed_again_and_lost_once_its_address_stops_answering() -> None:
    m = _stallable()
    assert m.expire(6.0, {"worker:1"}) == []
    assert m.suspects(6.5) == ()                     # answered less than a second ago
    assert m.expire(6.5) == []                       # its last answer stands
    assert m.suspects(7.0) == ("worker:1",)
    events = m.expire(7.0, set())                    # cut off (or died) while stalled
    assert [e.task for e in events] == ["worker:1"]
    assert "stalled, then its address stopped answering" in events[0].message


def test_a_stalled_task_that_heartbeats_again_is_no_longer_stalled() -> None:
    m = _stallable()
    m.expire(20.0, {"worker:1"})
    assert m.stalled(20.0) == {"worker:1": 20.0}
    m.heartbeat("worker:1", 102, 0, now=21.0)
    assert m.stalled(21.0) == {} and m.suspects(25.0) == ()
    assert m.expire(200.0, set()) and m.lost() == TASKS  # everyone, silent since


def test_refresh_restarts_every_silence() -> None:
    m = _stallable()
    m.refresh(50.0)  # the service's own clock was stalled until 50
    assert m.suspects(54.0) == () and m.expire(54.0) == []
    assert m.suspects(56.0) == TASKS[2:]


def test_the_stall_timeout_is_never_below_the_timeout() -> None:
    with pytest.raises(ValueError, match="stall_timeout must be >= timeout"):
        Membership(TASKS, timeout=5.0, stall_timeout=1.0)
