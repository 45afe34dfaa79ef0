"""An elastic strategy double for in-process tests: tasks are threads, each group an
``InProcessHub`` with a real ``MultiWorkerMirroredStrategy`` per task, and a regroup swaps every
member's strategy for one over a new hub of the new members.

The double offers what ``cluster.elastic`` uses of a strategy: ``run``,
``experimental_local_results``, ``num_replicas_in_sync`` and the elastic methods of
``extended`` (``cluster/elastic/_group.py``).
"""

from __future__ import annotations

import threading
from typing import Any

from cluster.deadline import Deadline
from cluster.elastic import ElasticGroupError
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.transport.inproc import InProcessHub

__all__ = ["ElasticDouble", "Membership", "in_threads"]


class Membership:
    """Who is in the group, who left, who waits to join; forms each new group.

    A new group is formed when every member that has not left and every waiting joiner has
    called :meth:`regroup`; joiners take the first ranks (so a fresh joiner is rank 0 and the
    state's root must be chosen among the others), then the members in their old order.
    """

    def __init__(self, names: list[str], *, minimum: int = 1) -> None:
        self._cond = threading.Condition()
        self.members = list(names)
        self.minimum = minimum
        self.hub = InProcessHub(len(names))
        self.generation = 0
        self.history: list[list[str]] = [list(names)]
        self._gone: set[str] = set()
        self._waiting: list[str] = []
        self._arrived: set[str] = set()
        self.heard: set[str] = set()  # members whose _elastic_pending() is True
        self._failure: ElasticGroupError | None = None

    def transport_of(self, name: str) -> Any:
        with self._cond:
            return self.hub.transports[self.members.index(name)]

    def leave(self, name: str) -> None:
        """``name`` dies: marked gone, then its peers' pending collectives fail."""
        with self._cond:
            self._gone.add(name)
            rank = self.members.index(name)
            hub = self.hub
            self._cond.notify_all()
        hub.kill(rank)

    def ask_to_join(self, name: str, *, heard_by: set[str] | None = None) -> None:
        """``name`` waits to join; ``heard_by`` (default: every member) see it pending."""
        with self._cond:
            self._waiting.append(name)
            self.heard |= set(self.members) if heard_by is None else heard_by
            self._cond.notify_all()

    def pending(self, name: str) -> bool:
        with self._cond:
            return name in self.heard

    def regroup(self, name: str, deadline: Deadline) -> Any:
        """Block until the new group is formed; ``name``'s transport in it."""
        with self._cond:
            generation = self.generation
            self._arrived.add(name)
            expected = (set(self.members) - self._gone) | set(self._waiting)
            if self._arrived >= expected:
                survivors = [m for m in self.members if m not in self._gone]
                if len(survivors) + len(self._waiting) < self.minimum:
                    self._failure = ElasticGroupError(
                        f"elastic: {len(survivors)} task(s) left, minimum {self.minimum}; "
                        f"gone: {sorted(self._gone)}", gone=tuple(sorted(self._gone)))
                    self.generation += 1  # wake the others: they fail too
                    self._cond.notify_all()
                    raise self._failure
                self.members = list(self._waiting) + survivors
                self.history.append(list(self.members))
                self.hub = InProcessHub(len(self.members))
                self._gone, self._waiting, self._arrived = set(), [], set()
                self.heard = set()
                self.generation += 1
                self._cond.notify_all()
            elif not self._cond.wait_for(lambda: self.generation != generation,
                                         deadline.timeout()):
                raise TimeoutError(f"{name}: no new group before the deadline")
            if self._failure is not None:
                raise self._failure
            return self.hub.transports[self.members.index(name)]


class _Extended:
    def __init__(self, double: ElasticDouble) -> None:
        self._double = double

    def _elastic_enabled(self) -> bool:
        return self._double.elastic

    def _elastic_pending(self) -> bool:
        return self._double.membership.pending(self._double.name)

    def _elastic_joining(self) -> bool:
        return self._double.joining

    def _elastic_regroup(self, deadline: Deadline) -> None:
        double = self._double
        double.regroups += 1
        double.use(double.membership.regroup(double.name, deadline))
        double.joining = False

    def _elastic_regroup_timeout(self) -> float:
        return 30.0


class ElasticDouble:
    """One task's strategy: a real ``MultiWorkerMirroredStrategy`` over its group's hub,
    replaced at each regroup. ``joining=True`` for a task that joins a running job."""

    def __init__(self, membership: Membership, name: str, *, joining: bool = False,
                 elastic: bool = True) -> None:
        self.membership = membership
        self.name = name
        self.joining = joining
        self.elastic = elastic
        self.regroups = 0
        self.extended = _Extended(self)
        self.inner: MultiWorkerMirroredStrategy | None = None
        if not joining:
            self.use(membership.transport_of(name))

    def use(self, transport: Any) -> None:
        import cluster

        options = cluster.CommunicationOptions(timeout_seconds=20)
        self.inner = MultiWorkerMirroredStrategy._from_transport(
            transport, devices=["/cpu:0"], communication_options=options)

    def run(self, fn: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.inner.run(fn, args=args, kwargs=kwargs)

    def experimental_local_results(self, value: Any) -> Any:
        return self.inner.experimental_local_results(value)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.inner.num_replicas_in_sync


def in_threads(fns: dict[str, Any], *, timeout: float = 60.0) -> dict[str, Any]:
    """Call each ``fns[name]()`` in its own thread; each one's result or exception by name.
    Fails the test if one is still running after ``timeout`` seconds."""
    results: dict[str, Any] = {}

    def body(name: str) -> None:
        try:
            results[name] = fns[name]()
        except BaseException as error:  # handed to the test
            results[name] = error

    threads = {n: threading.Thread(target=body, args=(n,), name=n, daemon=True) for n in fns}
    for t in threads.values():
        t.start()
    deadline = Deadline.after(timeout)
    for t in threads.values():
        t.join(deadline.timeout())
    stuck = [n for n, t in threads.items() if t.is_alive()]
    assert not stuck, f"still running after {timeout} s: {stuck}"
    return results
