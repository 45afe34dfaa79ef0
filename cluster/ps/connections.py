"""``PsConnections``: one client per ``ps`` task, and pulls/pushes spread over all of them.

A step touches variables on several parameter servers; :meth:`PsConnections.pull` and
:meth:`~PsConnections.push` send one request per task, all at once, and wait for every answer,
so a step costs one round trip, not one per task. Errors are the clients' typed errors; a task
that is dead or unreachable raises :class:`~cluster.errors.PsUnavailableError` naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cluster._ps_values import Pulled
from cluster.errors import PeerUnavailableError, PsUnavailableError
from cluster.transport import _malloc
from cluster.transport.auth import Token
from cluster.transport.ps_client import DEFAULT_TIMEOUT, PsClient

__all__ = ["PsConnections", "connections_for"]

T = TypeVar("T")


class PsConnections:
    """Clients of ``ps_tasks`` (``[("ps:0", "host:port"), ...]``, in task order).

    ``timeout``: seconds per call. Thread-safe; :meth:`close` releases every channel.
    """

    def __init__(self, ps_tasks: Sequence[tuple[str, str]], token: Token | str | None, *,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if not ps_tasks:
            raise ValueError("PsConnections: no ps tasks")
        _malloc.tune_for_large_buffers()  # tensor-sized messages: no page faults per call
        self.tasks = tuple(ps_tasks)
        self.clients = tuple(PsClient(address, token, task=task, timeout=timeout)
                             for task, address in self.tasks)
        self._pool = ThreadPoolExecutor(max_workers=len(self.clients),
                                        thread_name_prefix="ps-call")

    def __len__(self) -> int:
        return len(self.clients)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self.clients:
            client.close()

    def _each(self, calls: Mapping[int, Callable[[PsClient], T]]) -> dict[int, T]:
        """Run ``calls[ps](client)`` for every ps at once; the first error (in task order)."""
        if len(calls) == 1:
            (ps, call), = calls.items()
            return {ps: _named(self.clients[ps], call)}
        futures = {ps: self._pool.submit(_named, self.clients[ps], call)
                   for ps, call in calls.items()}
        results, first_error = {}, None
        for ps in sorted(futures):
            try:
                results[ps] = futures[ps].result()
            except Exception as e:  # noqa: BLE001 - re-raised below, after every call ended
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return results

    def pull(self, requests: Mapping[int, Sequence[tuple[str, int]]], *,
             step: int | None = None) -> dict[str, Pulled]:
        """``{ps: [(name, newer_than), ...]}`` -> ``{name: Pulled}`` for the variables that were
        newer (one request per task, concurrently); ``step``: values as of that synchronous step
        (a coordinator's function, see :meth:`VariableStore.pull`)."""
        calls = {ps: (lambda c, items=items: c.pull([n for n, _ in items],
                                                    [v for _, v in items], step=step))
                 for ps, items in requests.items() if items}
        return {p.name: p for pulled in self._each(calls).values() for p in pulled}

    def push(self, grads: Mapping[int, Mapping[str, Any]], **options: Any) -> None:
        """``{ps: {name: gradient}}``: one :meth:`PsClient.push` per task, concurrently, each
        with ``options`` (``step``, ``num_contributors``, ``contributor``, ``wait``,
        ``optimizer``)."""
        calls = {ps: (lambda c, g=g: c.push(g, **options)) for ps, g in grads.items() if g}
        self._each(calls)

    def read_slots(self, requests: Mapping[int, Sequence[str]]) -> dict[str, tuple]:
        """``{ps: [name, ...]}`` -> ``{name: (optimizer, iterations, slots)}`` (one request per
        task, concurrently; for checkpoints)."""
        calls = {ps: (lambda c, names=names: c.read_slots(names))
                 for ps, names in requests.items() if names}
        return {n: v for got in self._each(calls).values() for n, v in got.items()}

    def write_slots(self, ps: int, name: str, optimizer: Any, **options: Any) -> None:
        _named(self.clients[ps], lambda c: c.write_slots(name, optimizer, **options))

    def assign(self, ps: int, name: str, value: Any, mode: Any) -> int:
        return _named(self.clients[ps], lambda c: c.assign(name, value, mode))

    def create(self, ps: int, name: str, value: Any, **options: Any) -> int:
        return _named(self.clients[ps], lambda c: c.create(name, value, **options))


def _named(client: PsClient, call: Callable[[PsClient], T]) -> T:
    """``call(client)``, turning an unreachable task into :class:`PsUnavailableError`."""
    try:
        return call(client)
    except PsUnavailableError:
        raise
    except PeerUnavailableError as e:
        raise PsUnavailableError(
            f"{e}; parameter server {client.task} holds variables of this job, so training "
            "cannot continue (restart the job, from a checkpoint if you have one)",
            task=client.task, address=client.address) from e


_lock = threading.Lock()
_shared: dict[tuple, PsConnections] = {}


def connections_for(ps_tasks: Sequence[tuple[str, str]], token: Token) -> PsConnections:
    """The process-wide :class:`PsConnections` to ``ps_tasks`` (created on first use), so every
    strategy and variable handle unpickled in a worker shares one channel per task."""
    key = (tuple(ps_tasks), token.value)
    with _lock:
        connections = _shared.get(key)
        if connections is None:
            connections = _shared[key] = PsConnections(ps_tasks, token)
        return connections
