"""``cluster.elastic.run``'s control flow on a one-task group (the double of
``tests/elastic/_double.py``): which errors regroup, which propagate, the bound on regroups
without a commit, reset callbacks, the log line, the non-elastic path."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import cluster
from cluster.elastic import (
    MAX_REGROUPS_WITHOUT_COMMIT,
    ElasticGroupError,
    MembershipChanged,
    RegroupLimitError,
    State,
)
from cluster.errors import (
    CollectiveAbortedError,
    CollectiveMismatchError,
    PeerFailedError,
    PeerUnavailableError,
    TransportClosedError,
)
from tests.elastic._double import ElasticDouble, Membership

pytestmark = pytest.mark.timeout(60)


def _task(*, elastic=True, minimum=1):
    membership = Membership(["worker:0"], minimum=minimum)
    return membership, ElasticDouble(membership, "worker:0", elastic=elastic)


@pytest.mark.parametrize("failure", [
    PeerUnavailableError("worker:1 is unavailable", task="worker:1"),
    CollectiveAbortedError("worker:1 aborted the group", task="worker:1"),
    PeerFailedError("worker:1 failed", task="worker:1"),
    TransportClosedError("closed"),
    MembershipChanged("a task waits to join"),
])
def test_a_membership_failure_rolls_back_regroups_and_calls_again(failure, caplog):
    _, strategy = _task()
    w = cluster.Variable(np.zeros(2))
    state = State(w=w, step=0)
    resets, calls = [], []
    state.register_reset_callbacks([lambda: resets.append(strategy.num_replicas_in_sync)])

    @cluster.elastic.run(strategy, state)
    def train(state, stop, *, scale):
        calls.append((state.step, w.numpy().tolist()))
        while state.step < stop:
            w.assign_add(np.full(2, scale))
            state.step += 1
            if state.step == 2 and len(calls) == 1:
                raise failure      # step 2 is not committed: rolled back, step 1 is kept
            state.commit()
        return state.step

    with caplog.at_level(logging.INFO, logger="cluster.elastic"):
        assert train(state, 3, scale=1.0) == 3
    assert calls == [(0, [0.0, 0.0]), (1, [1.0, 1.0])]
    assert w.numpy().tolist() == [3.0, 3.0] and strategy.regroups == 1 and resets == [1]
    lines = [r.getMessage() for r in caplog.records if "regrouped" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("elastic: regrouped: 1 replicas")
    assert type(failure).__name__ in lines[0]


def test_other_errors_propagate_unchanged_without_a_regroup():
    _, strategy = _task()
    state = State(step=0)

    @cluster.elastic.run(strategy, state)
    def train(state):
        raise CollectiveMismatchError("ranks disagree")

    with pytest.raises(CollectiveMismatchError, match="ranks disagree"):
        train(state)
    assert strategy.regroups == 0


def test_a_regroup_that_fails_ends_the_run_with_its_error():
    membership, strategy = _task(minimum=2)
    state = State(step=0)

    @cluster.elastic.run(strategy, state)
    def train(state):
        state.step = 5
        raise PeerUnavailableError("worker:1 is unavailable", task="worker:1")

    with pytest.raises(ElasticGroupError, match="minimum 2") as info:
        train(state)
    assert isinstance(info.value.__context__, PeerUnavailableError)
    assert state.step == 0        # rolled back before the regroup was tried


def test_regroups_without_a_commit_are_bounded():
    _, strategy = _task()
    state = State(step=0)
    calls = []

    @cluster.elastic.run(strategy, state)
    def train(state):
        calls.append(1)
        raise PeerUnavailableError("worker:1 is unavailable", task="worker:1")

    with pytest.raises(RegroupLimitError, match="without a commit") as info:
        train(state)
    assert isinstance(info.value.__cause__, PeerUnavailableError)
    assert len(calls) == MAX_REGROUPS_WITHOUT_COMMIT + 1


def test_a_commit_between_failures_resets_the_bound():
    _, strategy = _task()
    state = State(step=0)

    @cluster.elastic.run(strategy, state)
    def train(state):
        while state.step < 2 * MAX_REGROUPS_WITHOUT_COMMIT:
            state.step += 1
            state.commit()
            raise PeerUnavailableError("worker:1 is unavailable", task="worker:1")
        return state.step

    assert train(state) == 2 * MAX_REGROUPS_WITHOUT_COMMIT


def test_a_joining_task_enters_the_group_before_it_trains():
    membership = Membership(["worker:0"])
    strategy = ElasticDouble(membership, "worker:1", joining=True)
    membership.ask_to_join("worker:1", heard_by=set())
    # worker:0 arrives at the regroup from its own thread in a real run; here it has left, so
    # the joiner alone forms the new group.
    membership.leave("worker:0")
    state = State(step=0)
    seen = []

    @cluster.elastic.run(strategy, state)
    def train(state):
        seen.append((strategy.regroups, strategy.num_replicas_in_sync))

    train(state)
    assert seen == [(1, 1)] and membership.members == ["worker:1"]


def test_without_an_elastic_strategy_the_function_runs_once_and_errors_propagate():
    _, strategy = _task(elastic=False)
    state = State(step=0)
    calls = []

    @cluster.elastic.run(strategy, state)
    def train(state):
        calls.append(state.step)
        state.step += 1
        state.commit()              # no membership agreement: not elastic
        raise PeerUnavailableError("worker:1 is unavailable", task="worker:1")

    with pytest.raises(PeerUnavailableError):
        train()                     # the bound state is passed for the caller
    assert calls == [0] and strategy.regroups == 0 and state.step == 1


def test_a_local_strategy_is_not_elastic():
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    state = State(step=0)

    @cluster.elastic.run(strategy, state)
    def train(state, k):
        state.step += k
        state.commit()
        return state.step

    assert train(state, 2) == 2


def test_run_refuses_another_state():
    _, strategy = _task()
    state = State(step=0)
    with pytest.raises(TypeError, match="another State"):
        cluster.elastic.run(strategy, state)(lambda s: None)(State(step=1))
    with pytest.raises(TypeError, match="must be a cluster.elastic.State"):
        cluster.elastic.run(strategy, {"step": 0})


def test_values_set_after_the_state_was_made_are_what_a_rollback_returns_to():
    _, strategy = _task()
    w = cluster.Variable(np.zeros(2))
    state = State(w=w, step=0)
    w.assign(np.array([3.0, 4.0]))    # e.g. a checkpoint restored after the state was made
    state.step = 7
    seen = []

    @cluster.elastic.run(strategy, state)
    def train(state):
        seen.append((state.step, w.numpy().tolist()))
        w.assign_add(np.ones(2))
        state.step += 1
        if len(seen) == 1:
            raise PeerUnavailableError("worker:1 is unavailable", task="worker:1")

    train(state)
    assert seen == [(7, [3.0, 4.0]), (7, [3.0, 4.0])]
