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


def _replaced_worker_1(registered_before_regroup: bool):
    """Generation 1 of TASKS; worker:1 dies and its replacement (incarnation 7) registers,
    before or after the survivors formed generation 2."""
    world, gens = World(), Generations(TASKS, 2, 4)
    for t in TASKS:
        gens.registered(t, 1)
    form_first(gens, world)
    world.lose("worker:1")
    if registered_before_regroup:
        world.restart("worker:1", 7)
        gens.registered("worker:1", 7)
    for t in ("chief:0", "worker:0", "worker:2"):
        ask(gens, world, t, 1)
    assert gens.generation == 2
    if not registered_before_regroup:
        world.restart("worker:1", 7)
        gens.registered("worker:1", 7)
    return world, gens


@pytest.mark.parametrize("registered_before_regroup", [True, False])
def test_news_of_a_loss_found_before_the_replacement_registered_predates_it(
        registered_before_regroup) -> None:
    world, gens = _replaced_worker_1(registered_before_regroup)
    # A survivor's report from generation 1, arriving late: about the dead incarnation.
    assert gens.predates("worker:1", 7, found_in=1)
    ask(gens, world, "worker:1", 0)  # the replacement enlists; the members take it in
    for t in ("chief:0", "worker:0", "worker:2"):
        ask(gens, world, t, 2)
    assert (gens.generation, gens.members) == (3, TASKS)
    assert gens.predates("worker:1", 7, found_in=1)
    # Found in a group that held the replacement: about it.
    assert not gens.predates("worker:1", 7, found_in=3)
    assert not gens.predates("worker:1", 7, found_in=4)


def test_news_from_an_older_generation_about_a_member_of_the_current_one_is_stale() -> None:
    world, gens = World(), Generations(TASKS, 2, 4)
    form_first(gens, world)
    for t in TASKS:  # everyone regroups (a joiner's commit): generation 2, same incarnations
        ask(gens, world, t, 1)
    assert gens.generation == 2
    # worker:0's connection to worker:1 broke as generation 1 closed: worker:1 lived on.
    assert gens.predates("worker:1", 1, found_in=1)
    assert not gens.predates("worker:1", 1, found_in=2)


def test_news_without_a_generation_or_about_a_task_not_live_is_always_news() -> None:
    world, gens = _replaced_worker_1(registered_before_regroup=False)
    assert not gens.predates("worker:1", 7, found_in=0)  # not elastic, or not known
    assert not gens.predates("worker:1", None, found_in=1)  # the service decides: not live
    assert not gens.predates("worker:2", 1, found_in=2)  # found in the current generation


@pytest.mark.parametrize(("low", "high"), [(0, 2), (3, 2)])
def test_bounds_are_checked(low, high) -> None:
    with pytest.raises(ValueError, match="1 <= min <= max"):
        Generations(TASKS, low, high)
