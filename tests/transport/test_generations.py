"""The elastic group's generations (cluster/transport/generations.py), table-tested: who forms
the next group, when, and what a loss, a restart, a joiner or too few tasks do."""

from __future__ import annotations

import pytest

from cluster.transport.generations import Generations, Status

TASKS = ("chief:0", "worker:0", "worker:1", "worker:2")


class World:
    """The coordination service's view the state machine reads: live incarnations."""

    def __init__(self, tasks=TASKS, registered=True) -> None:
        self.live_incarnations = {t: 1 for t in tasks} if registered else {}
        self.ever = set(self.live_incarnations)

    def live(self, task):
        return self.live_incarnations.get(task)

    def registered(self, task):
        return task in self.ever

    def lose(self, task):
        self.live_incarnations.pop(task)

    def restart(self, task, incarnation):
        self.live_incarnations[task] = incarnation
        self.ever.add(task)


def ask(gens, world, task, after, enlist=True):
    return gens.ask(task, world.live(task), after, enlist=enlist, live=world.live,
                    registered=world.registered)


def form_first(gens, world, tasks=TASKS):
    answers = [ask(gens, world, t, 0, enlist=False) for t in tasks]
    assert answers[-1].status is Status.FORMED
    return answers


def test_generation_one_forms_when_every_configured_task_has_asked() -> None:
    world, gens = World(registered=False), Generations(TASKS, 2, 4)
    for t in TASKS[:3]:
        world.restart(t, 1)
        assert ask(gens, world, t, 0, enlist=False).status is Status.WAITING
    # worker:2 has not even registered: generation 0 waits for it (start-up)
    assert gens.generation == 0
    world.restart("worker:2", 1)
    answer = ask(gens, world, "worker:2", 0, enlist=False)
    assert (answer.status, answer.generation, answer.members) == (Status.FORMED, 1, TASKS)
    # the others hear it when they ask again
    assert ask(gens, world, "chief:0", 0).status is Status.FORMED


def test_survivors_form_the_next_generation_without_the_lost_task() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    world.lose("worker:1")
    assert ask(gens, world, "chief:0", 1).status is Status.WAITING
    assert ask(gens, world, "worker:0", 1).status is Status.WAITING
    answer = ask(gens, world, "worker:2", 1)
    assert (answer.status, answer.generation) == (Status.FORMED, 2)
    assert answer.members == ("chief:0", "worker:0", "worker:2")  # ranks follow cluster order


def test_a_member_that_has_not_asked_holds_the_group_until_it_is_gone() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    world.lose("worker:1")
    for t in ("chief:0", "worker:0"):
        assert ask(gens, world, t, 1).status is Status.WAITING
    world.lose("worker:2")  # it never asked: it died too
    answer = ask(gens, world, "chief:0", 1)
    assert (answer.status, answer.members) == (Status.FORMED, ("chief:0", "worker:0"))


def test_a_joiner_looks_without_holding_anyone_then_enters_at_the_members_regroup() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    world.lose("worker:1")
    for t in ("chief:0", "worker:0", "worker:2"):
        ask(gens, world, t, 1)
    assert gens.generation == 2
    world.restart("worker:1", 7)  # a new incarnation registers
    look = ask(gens, world, "worker:1", 0, enlist=False)
    assert (look.status, look.generation) == (Status.WAITING, 2)
    assert gens.joining() == 0  # only looked
    assert ask(gens, world, "worker:1", 0).status is Status.WAITING
    assert gens.joining() == 1  # members hear it and regroup at their next commit
    for t in ("chief:0", "worker:0"):
        assert ask(gens, world, t, 2).status is Status.WAITING
    answer = ask(gens, world, "worker:2", 2)
    assert (answer.generation, answer.members) == (3, TASKS)
    assert gens.joining() == 0
    assert ask(gens, world, "worker:1", 0).status is Status.FORMED


def test_a_restarted_member_is_gone_and_its_new_incarnation_joins() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    world.restart("worker:0", 9)  # restarted before anyone saw it lost
    assert gens.joining() == 0
    ask(gens, world, "worker:0", 0)
    assert gens.joining() == 1
    for t in ("chief:0", "worker:1"):
        assert ask(gens, world, t, 1).status is Status.WAITING
    answer = ask(gens, world, "worker:2", 1)
    assert (answer.status, answer.members) == (Status.FORMED, TASKS)


def test_fewer_than_the_minimum_ends_the_run_naming_who_is_gone() -> None:
    world, gens = World(), Generations(TASKS, 3, 4)
    form_first(gens, world)
    world.lose("worker:1")
    world.lose("worker:2")
    ask(gens, world, "chief:0", 1)
    answer = ask(gens, world, "worker:0", 1)
    assert answer.status is Status.BELOW_MIN
    assert "fewer than the elastic minimum of 3" in answer.message
    assert "gone: worker:1, worker:2" in answer.message
    assert ask(gens, world, "chief:0", 1).status is Status.BELOW_MIN  # it stays


def test_at_most_the_maximum_enter_and_the_rest_wait() -> None:
    world, gens = World(), Generations(TASKS, 1, 2)
    answers = [ask(gens, world, t, 0, enlist=False) for t in TASKS]
    assert answers[-1].status is Status.WAITING  # worker:2 is beyond the maximum
    assert gens.members == ("chief:0", "worker:0")
    assert ask(gens, world, "chief:0", 0).status is Status.FORMED
    assert gens.joining() == 2


def test_a_task_the_service_counts_lost_is_refused() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    answer = gens.ask("worker:1", 1, 1, enlist=True, live=lambda t: None if t == "worker:1"
                      else 1, registered=world.registered)
    assert answer.status is Status.REFUSED and "restart it" in answer.message
    assert ask(gens, world, "ps:0", 0).status is Status.REFUSED


def test_nobody_asking_forms_nothing() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    for t in TASKS:
        world.lose(t)
    world.restart("worker:2", 5)
    # every member left (the run is over): a late joiner's look is no verdict on the run
    assert ask(gens, world, "worker:2", 0, enlist=False).status is Status.WAITING


@pytest.mark.parametrize(("low", "high"), [(0, 2), (3, 2)])
def test_bounds_are_checked(low, high) -> None:
    with pytest.raises(ValueError, match="1 <= min <= max"):
        Generations(TASKS, low, high)
