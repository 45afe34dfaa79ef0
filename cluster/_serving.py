"""The serving loop of a task that runs no script (``python -m ps``, ``python -m worker`` with no
script): serve until shut down, and answer a preemption notice by serving on for the grace
period, so that the coordinator can save a checkpoint that still holds this task's part.

Protocol (:func:`serve`), once the task has joined the coordination service:

1. Serve until a Shutdown RPC (or, with ``CLUSTER_STOP_WITH_COORDINATOR=1``, the coordinator's
   clean exit): exit 0, as before.
2. SIGTERM or SIGINT (the preemption notice of Kubernetes, Slurm, ``clusterctl stop``):

   - exit 0 at once when there is nothing to serve for: no grace period known
     (``CLUSTER_GRACE_PERIOD`` unset, or 0), the coordinator's task already left or is lost,
     this task hosts the coordination service itself, or the notice cannot be delivered
     (bounded by ``report_timeout``: a coordinator that does not answer cannot save either);
   - otherwise report ``PREEMPTED`` to the coordination service (the coordinator's
     ``PreemptionCheckpointHandler`` saves at its next ``run`` call and exits 204) and keep
     serving until the first of:

     * the coordinator's task left (it saved and exited) or was lost, or a Shutdown RPC came:
       exit :data:`~cluster.exitcodes.EXIT_PREEMPTED` (204, retryable: the run resumes from
       the coordinator's checkpoint). Not 0: a launcher that sees this exit before the
       chief's must not take the preempted run for a finished one;
     * the grace period ran out first: exit 128 + the signal (143 for SIGTERM; retryable,
       nothing is known saved);
     * a second SIGTERM or SIGINT: exit 128 + that signal at once.

Every step is printed to stderr (``ps:0: preemption notice (received SIGTERM): serving up to
30 s for the coordinator's checkpoint``).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from cluster import exitcodes, lifecycle
from cluster.deadline import Deadline

__all__ = ["SERVING_SIGNALS", "serve"]

SERVING_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _say(rt: Any, text: str) -> None:
    print(f"{rt.task}: {text}", file=sys.stderr, flush=True)


def serve(rt: Any) -> int:
    """Serve until shut down (see the module docstring); returns the exit code.

    ``rt`` is the task's joined :class:`~cluster.task_runtime.TaskRuntime`. Expects
    :func:`cluster.lifecycle.install_termination_handlers` for :data:`SERVING_SIGNALS` to be in
    place (the entry points install them first); a signal before this call is the caller's.
    """
    try:
        rt.wait_for_shutdown()
    except lifecycle.Terminated as notice:
        return _on_notice(rt, notice)
    _say(rt, f"shutting down ({rt.shutdown_reason})")
    return exitcodes.EXIT_OK


def _nothing_to_serve_for(rt: Any) -> str:
    """Why this task stops at once on a notice ("" when it serves on for the grace)."""
    grace = rt.settings.grace_period
    if not grace:
        return "no grace period (CLUSTER_GRACE_PERIOD)"
    if rt.coordinator == rt.task:
        return "this task is the coordinator"
    return rt.coordinator_exited


def _on_notice(rt: Any, notice: lifecycle.Terminated) -> int:
    grace = rt.settings.grace_period
    deadline = Deadline.after(grace)  # the launcher's SIGKILL comes at about this time
    why = _nothing_to_serve_for(rt)
    if why:
        _say(rt, f"shutting down ({notice}; {why})")
        return exitcodes.EXIT_OK
    # A second signal ends the wait at once: a fresh handler, the first one fired already.
    lifecycle.install_termination_handlers(SERVING_SIGNALS)
    try:
        told = rt.report_preemption(f"serving up to {grace:g} s",
                                    Deadline.after(rt.settings.report_timeout))
        if not told:
            _say(rt, f"shutting down ({notice}; the coordinator {rt.coordinator} could not be "
                     "told of the preemption notice)")
            return exitcodes.EXIT_OK
        _say(rt, f"preemption notice ({notice}): serving up to {grace:g} s for the "
                 f"coordinator's checkpoint")
        released = rt.wait_for_coordinator_exit(deadline)
    except lifecycle.Terminated as again:
        _say(rt, f"shutting down now ({again} again during the preemption grace period)")
        return again.exit_code
    if not released:
        _say(rt, f"shutting down: the grace period of {grace:g} s ran out before "
                 f"{rt.coordinator} finished")
        return notice.exit_code
    _say(rt, f"shutting down after the preemption notice ({released})")
    return exitcodes.EXIT_PREEMPTED
