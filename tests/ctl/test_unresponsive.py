"""The summary names a frozen task as the root cause: when
worker:1 is stopped with SIGSTOP, its peers exit 201 ("stopped because another task failed")
and the root cause must read "worker:1 unresponsive", not "chief:0 exited 201". Real processes."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import ConsoleWatch, kill_and_wait

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(150)]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "collective_loop.py"


def test_a_frozen_worker_is_named_unresponsive(tmp_path, marker) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"name: frozen\nentrypoint: {SCRIPT}\nargs: [{json.dumps(str(pids))}]\n"
        "cluster: {chief: 1, worker: 2}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        # generous: 2 loaded cores must not make a live task look silent
        "timeouts: {startup: 60, grace: 3, heartbeat: 5, run: 100}\n")
    out = ConsoleWatch("worker:1 all_reduce ->")  # printed after it wrote its pid file
    frozen: list[int] = []

    def freeze() -> None:
        if out.event.wait(90):
            frozen.append(int((pids / "worker-1.pid").read_text()))
            os.kill(frozen[0], signal.SIGSTOP)

    freezer = threading.Thread(target=freeze)
    freezer.start()
    try:
        result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out,
                                 color="never")
    finally:
        out.event.set()
        freezer.join(10)
        for pid in frozen:  # clusterctl SIGKILLs it; this only guards a failed launch
            kill_and_wait(pid, 10)
    assert frozen, out.getvalue()[-3000:]
    assert result.exit_code == launcher.EXIT_RUN_FAILED, out.getvalue()[-3000:]
    assert not result.succeeded
    assert result.root_cause.startswith(
        "worker:1 unresponsive (its process was suspended, e.g. by SIGSTOP): "), result.root_cause
    assert "reported PeerUnavailableError: worker:1" in result.root_cause
    assert f"root cause: {result.root_cause}" in out.getvalue()
    codes = {t.task: t.exit_code for t in result.tasks}
    assert codes["worker:1"] == 128 + signal.SIGKILL  # SIGTERM cannot reach a stopped process
