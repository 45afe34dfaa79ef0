"""The synchronous accumulator of a parameter-server store (TF1's ``ConditionalAccumulator``).

Each variable keeps its pending steps (:class:`Pending`); a step is applied, as the **mean** of
its ``N`` contributions summed in contributor order (arrival order for unindexed pushes) and
divided once. :class:`SyncAccumulator` keeps the waiting pushers and wakes them when their step
is applied, superseded or dropped. It works under the store's lock (the lock order of
``cluster.ps.store``: the store lock, then a variable's lock). Pure: no I/O.

**When a complete step is applied.** A step whose contributions all carry a contributor index
and whose pushers do not wait (a coordinator's functions) is *deferred* when its last
contribution arrives: it is marked complete (``var.due``) and applied by :meth:`settle` when the
variable is next used for anything but the reads and pushes of that same step. Why: a function
whose worker died after its push reached some parameter servers but not others is re-run; it
must read the values *as of its step* to compute the same gradient again. Applied at once, the
step would already have changed the variable on the servers the dead push reached, so the
re-run would read a mix of old and new values, push a different gradient to the others, and
the result would differ from the single-process one (seen as a ~1e-3 error on every weight).
Deferred, a read as of the step (``pull(step=s)``) still sees the old value. A read of the
variable that is not tagged with the step (the chief's, a checkpoint's) applies the step first
and keeps the value before it (``var.before``) until the next step applies, so a re-run that
reads after it still sees the old value. Steps with a waiting pusher, or unindexed, are applied
at once, as their pushers wait for (or nobody re-runs) them.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cluster.deadline import Deadline
from cluster.errors import StaleStepError, SyncTimeoutError

__all__ = ["Pending", "SyncAccumulator"]

log = logging.getLogger("cluster.ps.store")


@dataclass(eq=False)
class Pending:
    """The contributions to one synchronous step of one variable; guarded by the store lock."""

    indexed: bool  # keyed by contributor index (else by contribution id, in arrival order)
    # contributor index or contribution id -> (contribution id, private copy of the gradient)
    grads: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)

    def in_order(self) -> list[np.ndarray]:
        """The gradients in combination order: contributor order, or arrival order."""
        keys = sorted(self.grads) if self.indexed else list(self.grads)
        return [self.grads[k][1] for k in keys]


class SyncAccumulator:
    """Synchronous steps of the variables of one store.

    ``lock``: the store's lock, held by every caller. ``where()``: `` on ps:0``, the store's
    name in messages.
    ``update(var, grad)``: one optimizer update of a variable (the caller holds its lock).
    Variables are the store's: ``name``, ``lock``, ``value``, ``version``, ``sync_step``,
    ``applied_by``, ``pending``, ``due`` (the complete step not applied yet, or ``None``) and
    ``before`` (``(step, version, value)`` before a step a read applied early, or ``None``).
    """

    def __init__(self, lock: threading.Lock, where: Callable[[], str],
                 update: Callable[[Any, np.ndarray], int]) -> None:
        self._synced = threading.Condition(lock)  # a synchronous step was applied
        self._where = where
        self._update = update
        self._contributions = itertools.count(1)
        self._waiting: set[int] = set()  # contribution ids whose pusher waits
        self._dropped: dict[int, StaleStepError] = {}  # waiting contribution -> why dropped

    def _stale(self, var: Any, step: int) -> StaleStepError:
        return StaleStepError(
            f"gradient for step {step} of variable {var.name}{self._where()} is stale: the "
            f"variable accepts step {var.sync_step} and later", variable=var.name, step=step,
            current_step=var.sync_step)

    def check(self, checked: list[tuple[Any, np.ndarray]], step: int,
              contributor: int | None) -> None:
        """Raise unless every variable accepts ``step`` from ``contributor``, or already applied
        this contributor's push of it; the caller holds the store lock."""
        for var, _ in checked:
            if step < var.sync_step:
                if not (contributor is not None and step == var.sync_step - 1
                        and contributor in var.applied_by):
                    raise self._stale(var, step)
                continue
            pending = var.pending.get(step)
            if pending is not None and pending.indexed != (contributor is not None):
                have, push = (("indexed", "without") if pending.indexed
                              else ("unindexed", "with"))
                raise ValueError(
                    f"push {push} a contributor index for step {step} of variable "
                    f"{var.name}{self._where()}, which has {have} contributions pending: "
                    "pushes of one step must all give a contributor, or none")

    def push(self, checked: list[tuple[Any, np.ndarray]], step: int, n: int,
             contributor: int | None, wait: bool, deadline: Deadline) -> list[int]:
        """Contribute to ``step`` (after :meth:`check`), and with ``wait`` block until it is
        applied; the caller holds the store lock (the wait releases it)."""
        cid = next(self._contributions)
        if wait:
            self._waiting.add(cid)
        try:
            return self._contribute_and_wait(cid, checked, step, n, contributor, wait,
                                             deadline)
        except (StaleStepError, SyncTimeoutError):
            raise  # superseded, dropped or withdrawn already
        except BaseException:
            # Anything else (no memory for the copy, an interrupted wait): the push failed, so
            # its contribution must not count.
            self._withdraw(cid, checked, step)
            raise
        finally:
            self._waiting.discard(cid)
            self._dropped.pop(cid, None)

    def _contribute_and_wait(self, cid: int, checked: list[tuple[Any, np.ndarray]],
                             step: int, n: int, contributor: int | None, wait: bool,
                             deadline: Deadline) -> list[int]:
        """The body of a synchronous push; the caller holds the store lock and has checked
        that every variable either accepts ``step`` or already applied this contributor's."""
        for var, grad in checked:
            if var.sync_step > step:
                log.debug("variable %s%s: contributor %s re-pushed step %d, which was applied "
                          "with its contribution: nothing changed", var.name, self._where(),
                          contributor, step)
                continue
            pending = var.pending.setdefault(step, Pending(indexed=contributor is not None))
            key = cid if contributor is None else contributor
            replaced = pending.grads.get(key)
            if replaced is not None:
                log.debug("variable %s%s: contributor %d pushed step %d again: its earlier "
                          "contribution is replaced", var.name, self._where(), key, step)
                if replaced[0] in self._waiting:
                    self._dropped[replaced[0]] = StaleStepError(
                        f"gradient of contributor {key} for step {step} of variable {var.name}"
                        f"{self._where()} was superseded by a later push of the same "
                        "contributor", variable=var.name, step=step, current_step=var.sync_step)
                    self._synced.notify_all()
            # Keep a private copy: the caller's buffer (a received message) may be reused.
            pending.grads[key] = (cid, np.array(grad, copy=True))
            if len(pending.grads) >= n:
                self._complete(var, step, pending)
        if not wait:
            return [v.version for v, _ in checked]
        while True:
            dropped = self._dropped.pop(cid, None)
            if dropped is not None:
                raise dropped
            if all(var.sync_step > step for var, _ in checked):
                return [v.version for v, _ in checked]
            timeout = deadline.timeout()
            if timeout is not None:  # a far deadline would overflow the platform's time_t
                timeout = min(timeout, threading.TIMEOUT_MAX)
            if deadline.expired or not self._synced.wait(timeout):
                if all(var.sync_step > step for var, _ in checked):
                    continue
                self._withdraw(cid, checked, step)
                missing = [v.name for v, _ in checked if v.sync_step <= step]
                raise SyncTimeoutError(
                    f"synchronous step {step}{self._where()}: fewer than {n} contributions "
                    f"arrived for {', '.join(missing)} before the deadline; this "
                    "contribution was withdrawn", variable=missing[0])

    def _complete(self, var: Any, step: int, pending: Pending) -> None:
        """Every contribution to ``step`` arrived: defer or apply it (see the module docstring);
        the caller holds the store lock."""
        waited = any(c in self._waiting for c, _ in pending.grads.values())
        if pending.indexed and not waited and var.due in (None, step):
            var.due = step
            log.debug("variable %s%s: step %d is complete; applied on next use", var.name,
                      self._where(), step)
        else:
            self._apply_step(var, step)

    def settle(self, var: Any, before: int | None) -> None:
        """Apply ``var``'s deferred step if it is older than ``before`` (``None``: any); the
        caller holds the store lock.

        ``before=None`` (a read or write that is not part of a step) keeps the value before the
        step in ``var.before``, for a re-run of the step that reads after this (see the module
        docstring); a later step (``before`` given) needs no such copy.
        """
        step = var.due
        if step is None or (before is not None and step >= before):
            return
        kept = (step, var.version, var.value.copy()) if before is None else None
        self._apply_step(var, step)
        with var.lock:
            var.before = kept

    def _apply_step(self, var: Any, step: int) -> None:
        """Apply the mean of the contributions to ``step``; the caller holds the store lock."""
        if var.due is not None and var.due <= step:
            var.due = None  # an older deferred step is dropped below, like any overtaken one
        pending = var.pending.pop(step)
        grads = pending.in_order()
        total = grads[0]  # the private copy made on arrival: summed into in place
        for grad in grads[1:]:
            total += grad
        total /= total.dtype.type(len(grads))  # once, after the sum: one rounding
        with var.lock:
            self._update(var, total)
            var.sync_step = step + 1
            var.applied_by = frozenset(pending.grads) if pending.indexed else frozenset()
            var.before = None  # the value before an older step: no re-run can read it now
        for old in sorted(s for s in var.pending if s < var.sync_step):
            dropped = var.pending.pop(old)
            # Pushers that did not wait (a coordinator's) would otherwise never learn of it.
            log.warning("variable %s%s: dropped %d pending contribution(s) to step %d, because "
                        "step %d completed first", var.name, self._where(), len(dropped.grads),
                        old, step)
            for cid, _ in dropped.grads.values():
                if cid in self._waiting:
                    self._dropped[cid] = self._stale(var, old)
        self._synced.notify_all()

    def _withdraw(self, cid: int, checked: list[tuple[Any, np.ndarray]],
                  step: int) -> None:
        for var, _ in checked:
            pending = var.pending.get(step)
            if pending is not None:
                withdrawn = [k for k, (c, _) in pending.grads.items() if c == cid]
                for key in withdrawn:
                    del pending.grads[key]
                if withdrawn and var.due == step:
                    var.due = None  # one contribution short again: no longer complete
                if not pending.grads:
                    del var.pending[step]
