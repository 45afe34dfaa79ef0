"""A task's exit code, once decided, survives a SIGTERM during the interpreter's teardown.

The teardown puts back the default action of every signal with a Python handler before it
destroys modules; a launcher's fail-fast SIGTERM landing then killed a task that had already
recorded its own failure (exit 1 read 143). :func:`cluster.lifecycle.exit_with` ignores the
stop signals first. The child here sends itself SIGTERM from a finalizer that runs in that
window (a module global's ``__del__``).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

_CHILD = """
import os, signal, sys, time
from cluster import lifecycle

lifecycle.install_termination_handlers()
lifecycle.absorb_termination()  # as python -m worker does once its exit code is decided


class Late:
    def __del__(self):  # runs after the teardown has reset the signal handlers
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)


late = Late()
if sys.argv[1] == "exit_with":
    lifecycle.exit_with(1)
sys.exit(1)
"""


def _run(how: str) -> int:
    return subprocess.run([sys.executable, "-c", _CHILD, how], cwd=REPO, timeout=30).returncode


def test_a_sigterm_during_teardown_leaves_the_decided_exit_code() -> None:
    assert _run("exit_with") == 1


def test_without_it_the_same_sigterm_kills_the_process() -> None:
    # What the interpreter does on its own: the case exit_with exists for.
    assert _run("sys.exit") == -signal.SIGTERM
