"""``State``: the values an elastic run rolls back to and hands to the tasks that join."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from cluster.elastic import _broadcast, _group, _plain
from cluster.elastic._errors import MembershipChanged
from cluster.elastic._tracked import Tracked

__all__ = ["State", "commits_of", "running_under", "snapshot"]

# The strategy of the cluster.elastic.run this thread is in (None outside every run): the group
# whose membership commit() agrees on. A context variable, so that threads (in-process groups)
# and nested runs each see their own.
_RUNNING: ContextVar[Any] = ContextVar("cluster.elastic.run strategy", default=None)


@contextmanager
def running_under(strategy: Any) -> Iterator[None]:
    """Within this block, :meth:`State.commit` agrees on membership with ``strategy``'s group
    (what :func:`cluster.elastic.run` wraps the training function in)."""
    token = _RUNNING.set(strategy)
    try:
        yield
    finally:
        _RUNNING.reset(token)


def commits_of(state: State) -> int:
    """How many commits ``state`` has made (its construction and each sync count as one)."""
    return state._commits


def snapshot(state: State) -> None:
    """Take ``state``'s values as its last commit, without the membership agreement (what
    :func:`cluster.elastic.run` does on entry, so that values set after the construction, such
    as a checkpoint restored, are what the group starts from)."""
    state._take_snapshot()


class State:
    """Training state that survives a change of membership: trackables and plain values.

    >>> import numpy as np, cluster
    >>> w = cluster.Variable(np.zeros(2))
    >>> state = cluster.elastic.State(w=w, step=0)
    >>> state.step += 1
    >>> _ = w.assign(np.ones(2))
    >>> state.restore()          # back to the last commit: the construction
    >>> state.step, w.numpy().tolist()
    (0, [0.0, 0.0])

    Values, by keyword:

    - trackables, as :class:`cluster.checkpoint.Checkpoint` takes them: ``cluster.Variable``
      (distributed ones too), ``cluster.optimizers`` optimizers (slots and iterations),
      ``cluster.metrics`` metrics, ``cluster.torch.StateDict(module_or_optimizer)``,
      ``numpy.random.Generator``, ``random.Random``, and dicts/lists/tuples of them. They are
      changed in place: the objects the program holds stay the ones it trains.
    - plain values: ``None``, bool, int, float, str, NumPy arrays and scalars, and
      lists/tuples/dicts of them. Read and assign them as attributes (``state.step += 1``).

    A name whose value is a nest mixing the two kinds is refused (``TypeError``): give each
    kind its own name.

    Methods:

    - :meth:`commit`: snapshot every value (private in-memory copies), then, when the strategy
      is elastic and the call is inside :func:`cluster.elastic.run`, agree with the group
      whether a task waits to join (a small collective every member must call at the same
      commit) and raise :class:`MembershipChanged` on every member if so. Constructing the
      state is the first commit, and :func:`cluster.elastic.run` takes one on entry (both
      without the agreement).
    - :meth:`restore`: put the last commit back.
    - :meth:`sync`: every member of the current group takes the committed state of one member
      that held it before the group formed (a collective).
    - :meth:`register_reset_callbacks`: functions called after each regroup.
    """

    def __init__(self, **values: Any) -> None:
        tracked = {n: v for n, v in values.items() if not _plain.is_plain(v)}
        for name in values:
            if name.startswith("_") or hasattr(State, name):
                raise ValueError(f"elastic.State: {name!r} cannot name a value (it starts with "
                                 "'_' or is a method of State); choose another name")
        object.__setattr__(self, "_names", frozenset(values))
        object.__setattr__(self, "_tracked_values", tracked)
        object.__setattr__(self, "_tracked", Tracked(tracked))
        object.__setattr__(self, "_plain", {n: v for n, v in values.items() if n not in tracked})
        object.__setattr__(self, "_callbacks", [])
        object.__setattr__(self, "_commits", 0)
        # True once this task's values are a group's: after a commit inside a group, or after
        # taking the group's state in sync(). A task that joined with its initial values only
        # has False, and is never the root of a sync while a task with True is in the group.
        object.__setattr__(self, "_holds_group_state", False)
        self._take_snapshot()

    # -- the values ------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Called only for names that are not attributes of the object itself: the values.
        plain, tracked = self.__dict__.get("_plain", {}), self.__dict__.get("_tracked_values", {})
        if name in plain:
            return plain[name]
        if name in tracked:
            return tracked[name]
        names = sorted(self.__dict__.get("_names", ()))
        raise AttributeError(f"elastic.State has no value {name!r} (it has "
                             f"{', '.join(names) or 'none'}); pass it to State(...)")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._tracked_values:
            raise AttributeError(
                f"elastic.State: {name} is tracked in place; change the object itself (e.g. "
                f"state.{name}.assign(...)) rather than the name")
        if name not in self._names:
            raise AttributeError(f"elastic.State has no value {name!r}; pass it to "
                                 "State(...) so that it is committed and restored")
        if not _plain.is_plain(value):
            raise TypeError(f"elastic.State: {name} is a plain value; it cannot become a "
                            f"{type(value).__name__}")
        self._plain[name] = value

    def __repr__(self) -> str:
        return f"State({', '.join(sorted(self._names))}; {self._commits} commit(s))"

    # -- commit, restore, sync -------------------------------------------------------------------

    def _take_snapshot(self) -> None:
        object.__setattr__(self, "_snapshot", self._tracked.snapshot())
        object.__setattr__(self, "_plain_snapshot", _plain.encode(self._plain, "the state"))
        object.__setattr__(self, "_commits", self._commits + 1)

    def commit(self) -> None:
        """Snapshot every value, then :meth:`check_membership`.

        Copies, in host memory: later changes to the values do not reach the snapshot. Cheap
        for models that fit in host memory twice; commit every k steps when a step is shorter
        than a copy of the state. Every member of the group must call it at the same point
        (it may hold a collective: sync-on-read variables, the membership agreement).

        Raises:
          MembershipChanged: on every member at once, when a task waits to join or left.
        """
        self._take_snapshot()
        object.__setattr__(self, "_holds_group_state", True)
        self.check_membership()

    def check_membership(self, strategy: Any = None) -> None:
        """Agree across the group whether the membership changes here; raise
        :class:`MembershipChanged` on every member if it does.

        ``strategy`` defaults to the one of the :func:`cluster.elastic.run` this is called in.
        No collective (and never raises) outside a run or when the strategy is not elastic.
        """
        strategy = strategy if strategy is not None else _RUNNING.get()
        if strategy is None or not _group.enabled(strategy):
            return
        mine = np.array([1 if _group.pending(strategy) else 0], np.int64)
        total = _broadcast.run_collective(strategy, lambda ctx: ctx.all_reduce("SUM", mine))
        if int(np.asarray(total).reshape(-1)[0]):
            raise MembershipChanged(
                f"elastic: the membership changes at commit {self._commits} (a task waits to "
                "join or has left); regrouping", commits=self._commits)

    def restore(self) -> None:
        """Put the last commit back: trackables in place, plain values as fresh copies."""
        self._tracked.apply(self._snapshot)
        object.__setattr__(self, "_plain", _plain.decode(self._plain_snapshot))

    def sync(self, strategy: Any) -> None:
        """Make every member of ``strategy``'s current group hold the same committed state.

        The root is the lowest replica whose task held committed state before this group
        formed (rank 0 when none did, at the start of a run); a task that joined fresh is never
        the root while such a task is present. Every member then restores the root's last
        commit, which becomes its own last commit. Bitwise exact (see
        :mod:`cluster.elastic._broadcast`). A collective: every member calls it.
        """
        root = _broadcast.choose_root(strategy, self._holds_group_state)
        payload = _broadcast.Payload(self._snapshot, self._plain_snapshot)
        received = _broadcast.broadcast(strategy, root, payload)
        self._tracked.apply(received.tensors)
        object.__setattr__(self, "_snapshot", received.tensors)
        object.__setattr__(self, "_plain_snapshot", received.plain)
        object.__setattr__(self, "_plain", _plain.decode(received.plain))
        object.__setattr__(self, "_holds_group_state", True)
        object.__setattr__(self, "_commits", self._commits + 1)

    # -- callbacks -------------------------------------------------------------------------------

    def register_reset_callbacks(
            self, callbacks: Callable[[], Any] | Iterable[Callable[[], Any]]) -> None:
        """Call ``callbacks`` (one function or several), in order, after every regroup, when
        the state has been synced: e.g. to rebuild a data pipeline for the new
        ``strategy.num_replicas_in_sync``."""
        found = [callbacks] if callable(callbacks) else list(callbacks)
        for fn in found:
            if not callable(fn):
                raise TypeError(f"elastic.State: a reset callback must be callable, got {fn!r}")
        self._callbacks.extend(found)

    def on_reset(self) -> None:
        """Run the reset callbacks (:func:`cluster.elastic.run` does, after a regroup)."""
        for fn in self._callbacks:
            fn()
