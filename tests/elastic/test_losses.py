"""News of a loss in an elastic cluster (cluster/_losses.py): news found in an older generation
than the one a task opened, about a member of it, is about an incarnation the group took back
since, and never fails the new group; any other news does. Also through the task runtime's own
handling of a ``LOST`` event (the coordinator's task hears every event twice: from the service
at once, and again in a heartbeat reply, possibly after it opened the next generation)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster._losses import Losses
from cluster.task_runtime import TaskRuntime
from cluster.transport.membership import Event, EventKind

MEMBERS = ("chief:0", "worker:0", "worker:1", "worker:2")


def test_a_new_generation_forgets_its_members_losses_and_keeps_the_rest() -> None:
    losses = Losses()
    assert losses.record("worker:1", "its connection broke", 1)
    assert losses.record("ps:0", "no heartbeat", 0)
    assert losses.record("worker:1", "again", 1)
    assert dict(losses.items())["worker:1"] == "its connection broke"  # the first reason stays
    losses.new_generation(2, ("chief:0", "worker:0", "worker:2"))
    assert losses.tasks() == {"worker:1", "ps:0"}  # not members: still lost
    losses.new_generation(3, MEMBERS)
    assert losses.tasks() == {"ps:0"} and losses.generation == 3


@pytest.mark.parametrize(("task", "found_in", "news"), [
    ("worker:1", 1, False),  # found before generation 3 took worker:1 (back) in
    ("worker:1", 2, False),
    ("worker:1", 3, True),   # found in the group this task opened
    ("worker:1", 4, True),   # found in a newer one (this task has not got there yet)
    ("worker:1", 0, True),   # not elastic, or not known: always news
    ("ps:0", 1, True),       # not a member: nothing was taken back
])
def test_news_older_than_the_generation_that_took_the_task_back_is_stale(
        task, found_in, news) -> None:
    losses = Losses()
    losses.new_generation(3, MEMBERS)
    assert losses.record(task, "lost", found_in) is news
    assert (task in losses.tasks()) is news


class _Transport:
    def __init__(self) -> None:
        self.lost: list[tuple[str, str]] = []

    def peer_lost(self, task: str, why: str) -> None:
        self.lost.append((task, why))


def test_the_runtime_applies_a_lost_event_only_when_it_is_news() -> None:
    losses = Losses()
    losses.new_generation(3, MEMBERS)
    transport = _Transport()
    runtime = SimpleNamespace(task="chief:0", _losses=losses, _transport=transport)
    runtime._on_peer_lost = lambda *a: TaskRuntime._on_peer_lost(runtime, *a)
    echo = Event(EventKind.LOST, "worker:1", "chief:0", message="its data connection broke",
                 generation=1)
    TaskRuntime._on_event(runtime, echo)  # the old incarnation's loss, heard late
    assert transport.lost == [] and not losses
    died = Event(EventKind.LOST, "worker:1", "worker:2", message="its data connection broke",
                 generation=3)
    TaskRuntime._on_event(runtime, died)
    assert transport.lost == [("worker:1", "its data connection broke, as worker:2 found")]
