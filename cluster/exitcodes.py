"""Exit codes of task processes: the contract between ``python -m worker``/``ps`` and launchers.

Kubeflow's convention (TFJob ``restartPolicy: ExitCode``) decides what a code means: 1-127 are
permanent failures (a bug, a bad configuration: restarting would fail the same way), 128 and above
are retryable (killed by a signal, 128 + signal number; or one of the codes below, which say that
the task stopped because of something outside it). ``clusterctl`` and Kubernetes read them alike.

==========================  =====  ==========================================================
name                        code   meaning
==========================  =====  ==========================================================
``EXIT_OK``                 0      the script returned (or called ``sys.exit(0)``)
``EXIT_FAILURE``            1      the script raised an uncaught exception (permanent)
``EXIT_USAGE``              2      bad arguments, ``TF_CONFIG`` or cluster file (permanent)
``EXIT_PEER_FAILED``        201    stopped because another task failed (retryable)
``EXIT_PEERS_NOT_READY``    202    peers never came up before the start-up deadline (retryable)
``EXIT_ADDRESS_IN_USE``     203    could not bind the task's address (retryable)
``EXIT_PREEMPTED``          204    saved a checkpoint after a preemption notice (retryable)
128 + N                            killed by signal N, e.g. 137 = SIGKILL, 143 = SIGTERM
==========================  =====  ==========================================================
"""

from __future__ import annotations

import signal

__all__ = [
    "EXIT_ADDRESS_IN_USE",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_PEERS_NOT_READY",
    "EXIT_PEER_FAILED",
    "EXIT_PREEMPTED",
    "EXIT_USAGE",
    "describe",
    "is_retryable",
    "normalize",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PEER_FAILED = 201
EXIT_PEERS_NOT_READY = 202
EXIT_ADDRESS_IN_USE = 203
EXIT_PREEMPTED = 204

_NAMED = {
    EXIT_OK: "succeeded",
    EXIT_FAILURE: "uncaught exception",
    EXIT_USAGE: "bad arguments or configuration",
    EXIT_PEER_FAILED: "stopped because another task failed",
    EXIT_PEERS_NOT_READY: "peers never came up",
    EXIT_ADDRESS_IN_USE: "address in use",
    EXIT_PREEMPTED: "preempted: checkpoint saved",
}

# Codes that say "another task is the root cause", so launchers look elsewhere for it.
SECONDARY = frozenset({EXIT_PEER_FAILED})


def normalize(returncode: int) -> int:
    """A ``subprocess`` return code as a shell/Kubernetes exit code: ``-9`` becomes ``137``."""
    return 128 - returncode if returncode < 0 else returncode


def is_retryable(code: int) -> bool:
    """Kubeflow's rule: 128 and above (signals, transient conditions) may succeed on a restart."""
    return normalize(code) >= 128


def describe(code: int) -> str:
    """``"137 (SIGKILL)"``, ``"1 (uncaught exception)"``: a code and what it means."""
    code = normalize(code)
    if code in _NAMED:
        return f"{code} ({_NAMED[code]})"
    if 128 < code < 128 + 65:
        try:
            return f"{code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return str(code)
