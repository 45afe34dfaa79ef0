"""A test run killed before its teardown (a CI time limit, ``timeout`` around pytest) leaves no
Slurm daemon behind: they die with the process that started them."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap

import pytest

from cluster.testing import kill_and_wait, processes_with, wait_gone
from cluster.testing.slurm import _remove_hosts, unavailable
from tests.conftest import REPO

pytestmark = [pytest.mark.timeout(120)]

_CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from cluster.testing.slurm import local_slurm
    with local_slurm(Path(sys.argv[1])) as slurm:
        pids = [p.pid for p in slurm._daemons.values()]
        print(json.dumps({"pids": pids, "tag": slurm.marker}), flush=True)
        time.sleep(300)  # killed here, before its teardown
""")


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
        assert wait_gone(started["pids"], 15) == [], processes_with(started["tag"])
        assert processes_with(started["tag"]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if started is not None:
            for pid in processes_with(started["tag"]):
                kill_and_wait(pid, 5)
            _remove_hosts(started["tag"])
        proc.stdout.close()
