"""A test run killed before its teardown (a CI time limit, ``timeout`` around pytest) leaves no
Slurm daemon behind: they die with the process that started them."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap
import time

import pytest

from cluster.testing import kill_and_wait, processes_with, wait_gone
from cluster.testing.slurm import _remove_hosts, unavailable
from tests.conftest import REPO

pytestmark = [pytest.mark.timeout(120)]

_CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from cluster.testing import processes_with
    from cluster.testing.slurm import local_slurm
    with local_slurm(Path(sys.argv[1])) as slurm:
        pids = [p.pid for p in slurm._daemons.values()]
        # every process of this Slurm: the daemons and their own children (slurmctld forks
        # slurmscriptd, which has no parent-death signal and exits when slurmctld's pipe closes)
        every = processes_with(slurm.marker)
        print(json.dumps({"pids": pids, "every": every, "tag": slurm.marker}), flush=True)
        time.sleep(300)  # killed here, before its teardown
""")


def _left_after(tag: str, timeout: float) -> list[int]:
    """The processes carrying ``tag`` still alive after at most ``timeout`` s: one that a dying
    daemon forked at the last moment gets the time to see its parent gone."""
    deadline = time.monotonic() + timeout
    left = processes_with(tag)
    while left and time.monotonic() < deadline:
        wait_gone(left, deadline - time.monotonic())
        left = processes_with(tag)
    return left


def test_daemons_die_with_a_killed_test_run(tmp_path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "slurm")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        assert ready, "the local Slurm did not start within 90 s"
        line = proc.stdout.readline()
        started = json.loads(line)
        assert len(started["pids"]) == 4, line  # munged, slurmctld, two slurmd
        proc.kill()  # no teardown runs: only the parent-death signal can stop them
        proc.wait(10)
        # the daemons die of the signal; their children follow once they see them gone, so wait
        # for all, not only the daemons, before looking for anything left
        assert set(started["pids"]) <= set(started["every"]), line
        assert wait_gone(started["every"], 15) == [], processes_with(started["tag"])
        assert _left_after(started["tag"], 15) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if started is not None:
            for pid in processes_with(started["tag"]):
                kill_and_wait(pid, 5)
            _remove_hosts(started["tag"])
        proc.stdout.close()
