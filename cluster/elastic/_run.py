"""``run``: call a training function, and after a change of membership roll back, regroup and
call it again."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from cluster.elastic import _group
from cluster.elastic._errors import MEMBERSHIP_FAILURES, RegroupLimitError
from cluster.elastic._state import State, commits_of, running_under, snapshot

__all__ = ["MAX_REGROUPS_WITHOUT_COMMIT", "run"]

_log = logging.getLogger("cluster.elastic")

T = TypeVar("T")

MAX_REGROUPS_WITHOUT_COMMIT = 10
"""Regroups in a row with no commit between them before :func:`run` gives up. A group that keeps
failing before its first commit (a task that dies on every start, a state that cannot be
restored) would otherwise regroup forever without training a step; a real run regroups a
handful of times at most between two commits (several tasks lost one after the other)."""


def run(strategy: Any, state: State) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a training function ``fn(state, *args, **kwargs)`` to survive membership changes.

    Example (in a task of a launched cluster)::

        @run(strategy, state)
        def train(state):
            while state.step < STEPS:
                strategy.run(replica_step, args=global_batch(state.step))
                state.step += 1
                state.commit()

        train(state)

    Call it as ``train(state, ...)`` or ``train(...)``: it gets the bound ``state`` first.

    When ``strategy`` is elastic (``clusterctl launch --elastic MIN:MAX``):

    - on entry, the state's current values become its last commit (a checkpoint restored after
      the state was made counts), or, in a task that joins a running job, the task first
      enters the group; then every member :meth:`State.sync`\\ s, so all hold the same state;
    - when ``fn`` raises a membership failure (a peer died or left: ``PeerUnavailableError``,
      ``CollectiveAbortedError``, ``PeerFailedError``, ``TransportClosedError``; or a task waits
      to join: :class:`MembershipChanged` from a commit), the state is restored to its last
      commit, the group re-forms (new ``strategy.num_replicas_in_sync``), every member syncs,
      the reset callbacks run, and ``fn`` is called again;
    - any other exception propagates unchanged.

    Raises:
      ElasticGroupError: (or another ``ClusterError`` from the strategy) the group cannot
        re-form, e.g. fewer tasks than the minimum remain; chained to the failure that led to
        the regroup.
      RegroupLimitError: :data:`MAX_REGROUPS_WITHOUT_COMMIT` regroups in a row without a
        commit between them.

    When ``strategy`` is not elastic, ``fn`` is called once and every error propagates: the same
    program runs without ``--elastic``.
    """
    if not isinstance(state, State):
        raise TypeError(f"elastic.run: state must be a cluster.elastic.State, got "
                        f"{type(state).__name__}")

    def decorator(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            if args and isinstance(args[0], State):
                if args[0] is not state:
                    raise TypeError("elastic.run: called with another State than the one given "
                                    "to run(strategy, state)")
                args = args[1:]
            with running_under(strategy):
                if not _group.enabled(strategy):
                    return fn(state, *args, **kwargs)
                return _run_elastic(strategy, state, fn, args, kwargs)

        return wrapper

    return decorator


def _run_elastic(strategy: Any, state: State, fn: Callable[..., T], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> T:
    cause = ""
    if _group.joining(strategy):
        _group.regroup(strategy)
        cause = "joined a running job"
    else:
        snapshot(state)  # the values as the program left them (e.g. restored from a checkpoint)
    in_a_row = 0
    while True:
        commits = commits_of(state)
        try:
            state.sync(strategy)
            if cause:
                state.on_reset()
                _log.info("elastic: regrouped: %d replicas (%s)", strategy.num_replicas_in_sync,
                          cause)
            return fn(state, *args, **kwargs)
        except MEMBERSHIP_FAILURES as failure:
            # commits_of counts the sync too: more than one more means fn committed.
            in_a_row = 0 if commits_of(state) > commits + 1 else in_a_row + 1
            if in_a_row > MAX_REGROUPS_WITHOUT_COMMIT:
                raise RegroupLimitError(
                    f"elastic: the group re-formed {MAX_REGROUPS_WITHOUT_COMMIT} times in a row "
                    f"without a commit; the last failure: {type(failure).__name__}: "
                    f"{failure}") from failure
            state.restore()
            # Its errors (below the minimum...) end the run, chained to this failure.
            _group.regroup(strategy)
            cause = f"after {type(failure).__name__}: {failure}"
