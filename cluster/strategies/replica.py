"""Replica contexts and running a function once per local replica (``strategy.run``).

With one local replica the function runs in the calling thread. With several, each replica runs
in its own thread, as TensorFlow's MirroredStrategy does, so that ``merge_call`` can stop every
replica at the same point: when all of them have called it, ``merge_fn`` runs once, in the calling
thread and in cross-replica context, on the replicas' arguments regrouped into
:class:`~cluster.values.PerReplica` values; each replica then resumes with its share of the result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cluster import _context
from cluster.collectives.ops import ReduceOp
from cluster.values import regroup, select_replica

if TYPE_CHECKING:
    from cluster.strategies.base import Strategy

__all__ = ["ReplicaContext", "all_reduce_any_op", "call_for_each_replica"]

# The ops of tf.distribute.ReduceOp: what ReplicaContext.all_reduce accepts, as in TensorFlow.
_TF_REDUCE_OPS = (ReduceOp.SUM, ReduceOp.MEAN)


class ReplicaContext:
    """What a replica sees inside ``strategy.run`` (``tf.distribute.ReplicaContext``)."""

    def __init__(self, strategy: Strategy, local_index: int, merge: Callable | None = None) -> None:
        self._strategy = strategy
        self._local_index = local_index
        self._merge = merge

    @property
    def strategy(self) -> Strategy:
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        return self._strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        """This replica's id among all replicas of all workers (0 .. num_replicas_in_sync-1)."""
        return self._strategy.extended.first_replica_id + self._local_index

    def merge_call(self, merge_fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run ``merge_fn(strategy, *args, **kwargs)`` once in cross-replica context.

        Every local replica must call ``merge_call`` the same number of times, in the same order.
        Arguments that differ between replicas arrive as PerReplica values; each replica gets
        its own component of any distributed value in the result.
        """
        kwargs = {} if kwargs is None else kwargs
        if self._merge is not None and _context.get_replica_context() is not self:
            # From another thread or from inside a merge_fn, the rendezvous would wait forever
            # for this replica's share (TF fails an assertion there).
            raise RuntimeError(
                f"merge_call/all_reduce/all_gather of replica {self.replica_id_in_sync_group} "
                "must be called from that replica, inside strategy.run, not from cross-replica "
                "context or another replica; use get_replica_context() where you call it"
            )
        if self._merge is None:  # one replica: run it here
            with _context.push(self._strategy, None):
                return merge_fn(self._strategy, *args, **kwargs)
        return self._merge(self._local_index, merge_fn, args, kwargs)

    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        """``reduce_op`` of ``value`` (a nest) over every replica; each replica gets the result.

        ``reduce_op`` is ``ReduceOp.SUM`` or ``ReduceOp.MEAN`` or their name in any case, as
        ``tf.distribute.ReduceOp`` has only those two.

        Raises:
          ValueError: any other op (``"MAX"``, ``ReduceOp.MIN``, ``"PRODUCT"``...), naming SUM
            and MEAN and where MAX/MIN are (:mod:`cluster.collectives`).
          TypeError: ``reduce_op`` is neither a ``ReduceOp`` nor a string.
        """
        return all_reduce_any_op(self, _tf_reduce_op(reduce_op), value, options)

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """Concatenate ``value`` (a nest) of every replica along ``axis``, in replica order."""
        return self.merge_call(_all_gather, args=(value, axis, options))

    def __repr__(self) -> str:
        return (f"ReplicaContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
                f"num_replicas_in_sync={self.num_replicas_in_sync})")


def all_reduce_any_op(context: ReplicaContext, reduce_op: ReduceOp | str, value: Any,
                      options: Any = None) -> Any:
    """:meth:`ReplicaContext.all_reduce` for every :class:`ReduceOp`, ``MAX`` and ``MIN``
    included: for this package's own callers that offer MAX/MIN inside ``strategy.run``
    (``cluster.jax.all_reduce_tree``). Call it from ``context``'s replica, as ``all_reduce``.

    Raises ``ValueError`` for an unknown op name, ``TypeError`` for anything else not an op.
    """
    op = ReduceOp.parse(reduce_op)
    return context.merge_call(_all_reduce, args=(op, value, options))


def _tf_reduce_op(reduce_op: Any) -> ReduceOp:
    """``reduce_op`` as one of ``tf.distribute.ReduceOp``'s ops; ``ValueError`` for any other."""
    try:
        op = ReduceOp.parse(reduce_op)
    except ValueError:
        got = f"unknown reduce op {reduce_op!r}"
    else:
        if op in _TF_REDUCE_OPS:
            return op
        got = f"ReduceOp.{op.name}"
    raise ValueError(
        f"ReplicaContext.all_reduce supports ReduceOp.SUM and ReduceOp.MEAN (the ops of "
        f"tf.distribute.ReduceOp), got {got}. For MAX or MIN use the collectives: "
        "strategy.extended.collective_group.all_reduce(value, op=\"MAX\") outside strategy.run "
        "(a cluster.collectives.CollectiveGroup, one rank per worker), or inside it "
        "get_replica_context().all_gather(value[None], axis=0).max(axis=0)"
    )


def _all_reduce(strategy: Strategy, op: Any, value: Any, options: Any) -> Any:
    return strategy.extended.all_reduce_nest(op, value, options)


def _all_gather(strategy: Strategy, value: Any, axis: int, options: Any) -> Any:
    return strategy.extended.all_gather_nest(value, axis, options)


class _ReplicaAborted(BaseException):
    """Unwinds a replica thread whose sibling failed (never escapes this module)."""


class _Rendezvous:
    """Where replica threads meet at merge_call, and report being done or failed."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.cond = threading.Condition()
        self.pending: dict[int, tuple[Callable, tuple, dict]] = {}
        self.results: dict[int, Any] = {}
        self.done: dict[int, Any] = {}
        self.error: BaseException | None = None

    def merge(self, index: int, merge_fn: Callable, args: tuple, kwargs: dict) -> Any:
        with self.cond:
            self.pending[index] = (merge_fn, args, kwargs)
            self.cond.notify_all()
            while index not in self.results and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _ReplicaAborted()
            return self.results.pop(index)


def call_for_each_replica(strategy: Strategy, fn: Callable, args: tuple, kwargs: dict) -> list:
    """``fn(*args, **kwargs)`` once per local replica, each with its share of distributed
    arguments; returns the per-replica results in local replica order."""
    extended = strategy.extended
    count = extended.num_local_replicas
    if count == 1:
        context = ReplicaContext(strategy, 0)
        with _context.push(strategy, context), extended.device_scope(0):
            return [fn(*select_replica(0, args), **select_replica(0, kwargs))]
    rendezvous = _Rendezvous(count)
    threads = [
        threading.Thread(target=_replica_main, name=f"replica-{i}", daemon=True,
                         args=(strategy, i, fn, args, kwargs, rendezvous))
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    try:
        _coordinate(strategy, rendezvous)
    finally:
        with rendezvous.cond:
            if rendezvous.error is None and len(rendezvous.done) < count:
                rendezvous.error = RuntimeError("strategy.run was interrupted")
            rendezvous.cond.notify_all()
        for thread in threads:
            thread.join()
    return [rendezvous.done[i] for i in range(count)]


def _replica_main(strategy: Strategy, index: int, fn: Callable, args: tuple, kwargs: dict,
                  rendezvous: _Rendezvous) -> None:
    context = ReplicaContext(strategy, index, rendezvous.merge)
    try:
        with _context.push(strategy, context), strategy.extended.device_scope(index):
            result = fn(*select_replica(index, args), **select_replica(index, kwargs))
    except _ReplicaAborted:
        return
    except BaseException as e:  # handed to the calling thread, which re-raises it
        with rendezvous.cond:
            if rendezvous.error is None:
                rendezvous.error = e
            rendezvous.cond.notify_all()
        return
    with rendezvous.cond:
        rendezvous.done[index] = result
        rendezvous.cond.notify_all()


def _coordinate(strategy: Strategy, rendezvous: _Rendezvous) -> None:
    count = rendezvous.count
    while True:
        with rendezvous.cond:
            while (rendezvous.error is None
                   and len(rendezvous.pending) + len(rendezvous.done) < count):
                rendezvous.cond.wait()
            if rendezvous.error is not None:
                raise rendezvous.error
            if len(rendezvous.done) == count:
                return
            if rendezvous.done:
                finished = sorted(rendezvous.done)
                waiting = sorted(rendezvous.pending)
                rendezvous.error = RuntimeError(
                    f"replicas {finished} returned while replicas {waiting} wait in merge_call "
                    "(or all_reduce); every replica must make the same merge_call/all_reduce calls"
                )
                rendezvous.cond.notify_all()
                raise rendezvous.error
            calls = [rendezvous.pending[i] for i in range(count)]
            rendezvous.pending.clear()
        merge_fn = calls[0][0]
        try:
            args = regroup([c[1] for c in calls], "merge_call arguments")
            kwargs = regroup([c[2] for c in calls], "merge_call keyword arguments")
            with _context.push(strategy, None):
                result = merge_fn(strategy, *args, **kwargs)
            shares = [select_replica(i, result) for i in range(count)]
        except BaseException as e:
            with rendezvous.cond:
                rendezvous.error = e
                rendezvous.cond.notify_all()
            raise
        with rendezvous.cond:
            for i, share in enumerate(shares):
                rendezvous.results[i] = share
            rendezvous.cond.notify_all()
