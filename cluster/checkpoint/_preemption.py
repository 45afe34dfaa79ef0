"""``PreemptionCheckpointHandler``: save at a step every task agrees on when one is preempted,
then exit with a retryable code so the launcher restarts the job and it resumes with zero steps
lost (``tf.distribute.experimental.PreemptionCheckpointHandler``'s shape).

Protocol (every task runs it at every :meth:`~PreemptionCheckpointHandler.run` call, in the same
order, like any collective):

1. SIGTERM (the preemption notice of Kubernetes, Slurm and ``clusterctl stop``) on any task only
   sets a flag there: the step in progress finishes.
2. At the start of the next ``run`` call every task all-reduces MAX of its flag (one float32
   through the strategy's collectives). If any task was signalled, all of them see it at the
   same call, so they agree on the step without further messages.
3. Every task then calls ``manager.save(checkpoint_number=total_run_calls)`` (a group save: the
   chief writes, every task returns once the checkpoint is complete) and exits with
   :data:`cluster.exitcodes.EXIT_PREEMPTED` (204, retryable). ``fn`` is not called for that
   step. ``clusterctl`` (``restart.policy: exit-code``), TFJob ``restartPolicy: ExitCode`` and
   Slurm ``--requeue`` restart the job; the new handler restores the checkpoint and
   ``total_run_calls``.

Under ParameterServerStrategy (``mode: coordinator``) only the chief runs the script, and the
handler with it; there is no collective to agree through. Instead the tasks that serve (``python
-m ps``, ``python -m worker`` with no script) answer SIGTERM by reporting ``PREEMPTED`` to the
coordination service and serving on for their grace period (:mod:`cluster._serving`). At each
``run`` call the handler reads, locally, whether its task's runtime has heard such a notice
(the heartbeat thread records them; the chief hosts the service, so it hears at once); if so,
or if the chief itself was signalled, it saves (the save pulls the variables from the parameter
servers, still serving) and exits 204. The serving tasks see the chief leave and exit 204 too.
Nothing may be in flight on the workers while the checkpoint is written: ``fn`` must leave no
scheduled function running (schedule and ``join`` inside it), or pass ``coordinator=``, which
the handler joins before saving.

Cost: one 4-byte all-reduce per ``run`` call (a few hundred microseconds over loopback TCP,
small against a training step). Without a multi-worker strategy (one task, or the chief of a
ParameterServerStrategy) there is no collective: the flag and the runtime's notices are read
directly.

Interaction with the task entry point: ``python -m worker`` turns SIGTERM into
:class:`cluster.lifecycle.Terminated` (the script unwinds at once, exit 143). While a handler is
active (from construction until :meth:`~PreemptionCheckpointHandler.close`) its own SIGTERM
handler replaces that one, so the signal is deferred to the next ``run`` call; ``close``
reinstates the previous handler (and re-delivers a signal that came in meanwhile). After the
preemption save the handler stays installed while the process exits, so the launcher's SIGTERM
to tasks still exiting does not interrupt their shutdown. The task entry point does not report
exit 204 to the peers as a failure (they are exiting 204 by themselves).

The grace period is the launcher's: the time from SIGTERM to SIGKILL (``timeouts.grace`` in a
cluster file, ``terminationGracePeriodSeconds`` on Kubernetes, ``--signal``/``KillWait`` on
Slurm) must cover the rest of the current step plus one save. ``clusterctl`` and the renders
pass it to every task as ``CLUSTER_GRACE_PERIOD``; the handler reports how long the notice took
to become a saved checkpoint against it, and warns when that used more than half of it (the
next preemption, in a slower step or with a bigger model, may not fit).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import cluster.runtime
from cluster import _context, exitcodes
from cluster import settings as task_settings
from cluster.checkpoint import _format
from cluster.checkpoint.checkpoint import Checkpoint
from cluster.checkpoint.manager import CheckpointManager
from cluster.collectives.ops import ReduceOp

__all__ = ["PreemptionCheckpointHandler"]

log = logging.getLogger(__name__)

_NUMBERED = re.compile(r"-(\d+)$")


class PreemptionCheckpointHandler:
    """Catches SIGTERM, saves at an agreed step on every task, exits ``EXIT_PREEMPTED``.

    >>> handler = PreemptionCheckpointHandler(strategy.cluster_resolver, manager)  # doctest: +SKIP
    >>> while handler.total_run_calls < steps:                                   # doctest: +SKIP
    ...     handler.run(strategy.run, step_fn, args=(batch,))

    ``checkpoint_or_manager``: a :class:`CheckpointManager`, or a :class:`Checkpoint` plus
    ``checkpoint_dir`` (a manager keeping one checkpoint is made there). Construction restores
    the newest checkpoint, if any, and ``total_run_calls`` with it (the checkpoint's number).
    Every task must construct the handler and call ``run`` the same number of times, like a
    collective. Construct it in the main thread (signal handlers live there).

    ``exit_fn(code)`` ends the process after the save; ``sys.exit`` by default, so ``finally``
    blocks still run. ``signals``: the notices to catch (SIGTERM). ``grace_period``: seconds
    from the notice to SIGKILL, to check the save against; by default the launcher's
    (``CLUSTER_GRACE_PERIOD``, set by ``clusterctl`` and the renders), or ``None`` (unknown).
    ``coordinator``: under ParameterServerStrategy, the
    :class:`~cluster.coordinator.ClusterCoordinator` whose scheduled functions are joined
    before the preemption save (so no gradient lands while the variables are read); not
    needed when ``fn`` joins its own functions.
    """

    def __init__(self, cluster_resolver: Any, checkpoint_or_manager: Checkpoint | CheckpointManager,
                 checkpoint_dir: str | os.PathLike | None = None, *,
                 signals: tuple[int, ...] = (signal.SIGTERM,),
                 exit_fn: Callable[[int], Any] = sys.exit,
                 grace_period: float | None = None, coordinator: Any = None) -> None:
        if isinstance(checkpoint_or_manager, CheckpointManager):
            if checkpoint_dir is not None:
                raise ValueError("PreemptionCheckpointHandler: checkpoint_dir is only for a "
                                 "Checkpoint; the manager already has its directory")
            self._manager = checkpoint_or_manager
        elif isinstance(checkpoint_or_manager, Checkpoint):
            if checkpoint_dir is None:
                raise ValueError("PreemptionCheckpointHandler: a Checkpoint needs "
                                 "checkpoint_dir (or pass a CheckpointManager)")
            self._manager = CheckpointManager(checkpoint_or_manager, checkpoint_dir,
                                              max_to_keep=1)
        else:
            raise TypeError(f"PreemptionCheckpointHandler: expected a Checkpoint or a "
                            f"CheckpointManager, got {type(checkpoint_or_manager).__name__}")
        self._cluster_resolver = cluster_resolver
        self._strategy = self._manager.checkpoint._strategy  # multi-worker, else None
        self._exit_fn = exit_fn
        self._coordinator = coordinator
        self._notices: tuple[str, ...] = ()  # other tasks' notices, when they decided the save
        if grace_period is not None and not grace_period >= 0:
            raise ValueError(f"PreemptionCheckpointHandler: grace_period must be >= 0 seconds, "
                             f"got {grace_period!r}")
        self._grace_period = _launcher_grace_period() if grace_period is None else grace_period
        self._received = threading.Event()
        self._noticed_at: float | None = None  # time.monotonic() of the first notice here
        self._signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._run_calls = self._restore()
        try:
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        except ValueError as e:  # not the main thread
            self.close()
            raise RuntimeError("PreemptionCheckpointHandler: construct it in the main thread "
                               "(signal handlers can only be installed there)") from e

    @property
    def total_run_calls(self) -> int:
        """``run`` calls so far, counted across restarts (restored from the checkpoint)."""
        return self._run_calls

    @property
    def grace_period(self) -> float | None:
        """Seconds from the notice to SIGKILL that the save is checked against (``None``:
        unknown)."""
        return self._grace_period

    @property
    def preemption_received(self) -> bool:
        """Whether this task got a preemption signal (others may have without this one)."""
        return self._received.is_set()

    def _restore(self) -> int:
        path = self._manager.restore_or_initialize()
        if path is None:
            return 0
        step = _format.read_index(path).get("step")
        if step is None:  # saved without a number: take it from the name
            match = _NUMBERED.search(os.path.basename(path))
            step = int(match.group(1)) if match else 0
        # Resuming is the normal path after a preemption or a restart, not a problem: INFO.
        log.info("resumed from %s at run call %d", path, step)
        return int(step)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only set a flag: the step in progress (maybe inside a collective) must finish.
        if self._noticed_at is None:
            self._noticed_at = time.monotonic()
        self._signum = signum
        self._received.set()

    def _agreed(self) -> bool:
        """Whether any task was signalled: MAX of the flags over every task (a collective);
        without a multi-worker strategy, this task's flag or a notice its runtime heard."""
        flag = 1.0 if self._received.is_set() else 0.0
        strategy = self._strategy
        if strategy is None:
            self._notices = _notices_heard()
            return flag > 0.0 or bool(self._notices)
        with _context.push(strategy, None):
            total = strategy.extended.reduce_to_host(ReduceOp.MAX, np.array(flag, np.float32))
        return float(total) > 0.0

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, unless a task was preempted: then save and exit.

        On preemption every task saves checkpoint number ``total_run_calls`` (the calls that
        completed) and calls ``exit_fn(EXIT_PREEMPTED)``; ``fn`` does not run. Returns what
        ``fn`` returns.
        """
        if self._agreed():
            self._save_and_exit()
        result = fn(*args, **kwargs)
        self._run_calls += 1
        return result

    def _save_and_exit(self) -> None:
        # On a task that was not signalled the notice's own time is unknown: count from when
        # this task learned of it (the agreement), a lower bound.
        learned = time.monotonic()
        if self._coordinator is not None:
            self._coordinator.join()  # nothing may update the variables while they are saved
        path = self._manager.save(checkpoint_number=self._run_calls)
        here = self._noticed_at is not None
        took = time.monotonic() - (self._noticed_at if here else learned)
        who = "this task" if here else ", ".join(self._notices) or "another task"
        print(f"preemption notice on {who}: saved {path} at run call {self._run_calls} "
              f"{_timing(took, here, self._grace_period)}; "
              f"exiting {exitcodes.describe(exitcodes.EXIT_PREEMPTED)}",
              file=sys.stderr, flush=True)
        if self._grace_period is not None and took > self._grace_period / 2:
            log.warning(
                "preemption save took %.1f s of the %g s grace period (more than half): the "
                "rest of a step plus a save may not fit next time; raise the grace period "
                "(timeouts.grace in the cluster file: terminationGracePeriodSeconds on "
                "Kubernetes, --signal on Slurm) or save less", took, self._grace_period)
        # The notice is answered by this exit. The flag-only handlers stay installed: the
        # launcher's own SIGTERM to tasks still exiting (fail fast) must not interrupt their
        # shutdown and turn a clean 204 into a traceback.
        self._signum = None
        self._exit_fn(exitcodes.EXIT_PREEMPTED)

    def close(self) -> None:
        """Reinstate the signal handlers that were there before (idempotent). A signal that
        arrived while this handler was active and was not acted on is re-delivered to them."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if self._signum is not None and self._signum in previous:
            pending, self._signum = self._signum, None
            signal.raise_signal(pending)

    def __enter__(self) -> PreemptionCheckpointHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timing(took: float, noticed_here: bool, grace: float | None) -> str:
    """``"3.2 s after the notice (of a 10 s grace period)"``."""
    since = "the notice" if noticed_here else "the agreement"
    budget = f"of a {grace:g} s grace period" if grace is not None else "grace period unknown"
    return f"{took:.1f} s after {since} ({budget})"


def _notices_heard() -> tuple[str, ...]:
    """The tasks whose preemption notice this task's runtime has heard (none without one)."""
    runtime = cluster.runtime.current()
    return runtime.preemption_notices if runtime is not None else ()


def _launcher_grace_period() -> float | None:
    """The grace period the launcher gave this task: its runtime's settings, else the
    process's (:func:`cluster.settings.current`: ``CLUSTER_GRACE_PERIOD``), else ``None``."""
    runtime = cluster.runtime.current()
    settings = runtime.settings if runtime is not None else task_settings.current()
    return settings.grace_period
