"""Busy is not dead: a task that holds the GIL far longer than the heartbeat timeout (one long C
call: a slow import, a big unpickle) is reported as stalled, not lost, and the run completes.

Peers tell the cases apart by what answers for the silent task: a dead one's kernel refuses
connections (and its connections reset: tests/processes/test_scale.py), a cut-off one answers
nothing (tests/hosts/test_hosts.py, the silent partition), a busy one's kernel still accepts a
TCP connect. The hold here is 8 s against the default 3 s heartbeat timeout (the mechanism is
the same for 20 s or a minute, up to ``CLUSTER_STALL_TIMEOUT``); and with a stall timeout
shorter than the hold the busy task is lost after it, so the bound is real.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from cluster import exitcodes
from cluster.testing import loopback_cluster, tf_config
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hold_gil.py"
FOREVER = SCRIPT.parent / "reduce_forever.py"
HOLD_S = 8.0  # > 2x the 3 s heartbeat timeout
# Seconds from a SIGKILL to a survivor's exit: detection takes ~0.3 s; the rest is the
# survivor's own shutdown on a loaded machine.
KILL_BOUND_S = 2.0


def _start(task_processes, marker, holder: str, when: str, path: str, **env: str):
    cluster = loopback_cluster(worker=2)
    environ = {"CLUSTER_TEST_MARKER": marker, "CLUSTER_CONNECT_TIMEOUT": "30",
               "CLUSTER_HEARTBEAT_TIMEOUT": "3", "CLUSTER_COLLECTIVE_PATH": path, **env}
    return [task_processes.python("-m", "worker", SCRIPT, holder, f"{HOLD_S:g}", when,
                                  cwd=REPO, env=environ,
                                  tf_config=tf_config(cluster, "worker", r))
            for r in range(2)]


@pytest.mark.parametrize(("holder", "when", "path"), [
    ("worker:1", "before", "network"),   # a task whose peers wait for it in a collective
    ("worker:0", "before", "network"),   # the coordination service's own task
    ("worker:1", "join", "auto"),        # right after joining, like `import torch, jax`
])
def test_a_task_holding_the_gil_for_seconds_is_stalled_not_lost(task_processes, marker, holder,
                                                                 when, path) -> None:
    tasks = _start(task_processes, marker, holder, when, path)
    outputs = []
    for task in tasks:
        code, out = task.finish(HOLD_S + 60)
        assert code == 0, out[-4000:]
        assert "DONE 24" in out, out[-4000:]  # 3 steps of 2 tasks x 4 ones
        outputs.append(out)
    watcher = "worker:0" if holder == "worker:1" else "worker:1"
    seen_by = outputs[int(watcher[-1])]
    assert re.search(rf"{holder} .*is stalled: no (heartbeat|answer)", seen_by), seen_by[-4000:]
    assert "PeerUnavailableError" not in "".join(outputs)


def test_a_task_stalled_beyond_the_stall_timeout_is_lost(task_processes, marker) -> None:
    tasks = _start(task_processes, marker, "worker:1", "before", "network",
                   CLUSTER_STALL_TIMEOUT="4")
    code, out = tasks[0].finish(HOLD_S + 60)
    assert code == exitcodes.EXIT_PEER_FAILED, out[-4000:]
    assert "worker:1" in out and "stalled (its host answers) beyond 4 s" in out, out[-4000:]


def test_kill_9_mid_collective_stops_the_survivors_within_a_second(task_processes,
                                                                     marker) -> None:
    # A dead process's connections reset at once: no probe, no stall, no wait for a timeout.
    cluster = loopback_cluster(worker=3)
    env = {"CLUSTER_TEST_MARKER": marker, "CLUSTER_CONNECT_TIMEOUT": "30",
           "CLUSTER_COLLECTIVE_PATH": "network"}
    tasks = [task_processes.python("-m", "worker", FOREVER, cwd=REPO, env=env,
                                   tf_config=tf_config(cluster, "worker", r))
             for r in range(3)]
    for task in tasks:
        task.read_until("ready", timeout=60)
    killed = time.monotonic()
    tasks[1].kill(signal.SIGKILL)
    for task in (tasks[0], tasks[2]):
        code, out = task.finish(KILL_BOUND_S + 5)
        took = time.monotonic() - killed
        assert code == exitcodes.EXIT_PEER_FAILED, out[-4000:]
        assert re.search(r"PeerUnavailableError: worker:1\b", out), out[-4000:]
        assert took < KILL_BOUND_S, f"exited {took:.2f} s after the SIGKILL:\n{out[-4000:]}"
        print(f"\nexited {took:.2f} s after the SIGKILL")
