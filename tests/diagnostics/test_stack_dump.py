"""A run stopped at ``timeouts.run`` leaves every task's Python stacks in its log: clusterctl
sends SIGUSR2 (``cluster._stacks``), waits a second, then stops the tasks. Real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import ConsoleWatch
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(150)]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hang.py"


def test_a_run_over_time_dumps_every_tasks_stacks_into_its_log(tmp_path, marker) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"name: hung\nentrypoint: {SCRIPT}\ncluster: {{chief: 1, worker: 1}}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}}}\nlog_dir: {tmp_path / 'runs'}\n"
        # generous: both tasks must be in the script when the run's time is up
        "timeouts: {startup: 60, grace: 5, run: 25}\n")
    out = ConsoleWatch("")
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    console = out.getvalue()
    assert result.exit_code == launcher.EXIT_RUN_TIMEOUT, console[-3000:]
    assert "asking every task for its Python stacks" in console
    for task in ("chief-0", "worker-0"):
        log = (result.run_dir / f"{task}.log").read_text()
        assert f"{task.replace('-', ':')} ready" in log, log[-2000:]
        # faulthandler's dump: the main thread's stack, innermost call first
        assert "most recent call first" in log, log[-2000:]
        assert 'in wait_here_forever' in log, log[-2000:]
    codes = {t.task: t.exit_code for t in result.tasks}
    assert codes == {"chief:0": 128 + signal.SIGTERM, "worker:0": 128 + signal.SIGTERM}, codes


def test_the_signal_dumps_the_stacks_and_the_process_goes_on() -> None:
    code = ("import os, sys\n"
            "from cluster._stacks import DUMP_SIGNAL, enable_stack_dumps\n"
            "enable_stack_dumps(); enable_stack_dumps()  # idempotent\n"
            "def here(): os.kill(os.getpid(), DUMP_SIGNAL)\n"
            "here(); print('still running', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "still running\n"
    assert "most recent call first" in done.stderr and "in here" in done.stderr, done.stderr
