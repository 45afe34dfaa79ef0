"""`python -m worker` and `python -m ps` as real processes with TF_CONFIG (no launcher)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from cluster import exitcodes
from cluster.ctl.ports import pick_free_ports
from cluster.runtime import TaskRuntime
from cluster.settings import TaskSettings
from cluster.testing import TaskProcess, loopback_cluster, tf_config
from resolver import ClusterSpec, SimpleClusterResolver
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def start(task_processes, marker):
    """``start(argv, config, **env)``: ``python ARGV`` with ``TF_CONFIG=config``, tagged with the
    test's marker; killed and reaped when the test ends, whatever happened."""
    def start(argv: list[str], config: str, **env: str) -> TaskProcess:
        return task_processes.python(
            *argv, tf_config=config, cwd=REPO,
            env={"CLUSTER_TEST_MARKER": marker, "CLUSTER_CONNECT_TIMEOUT": "20", **env})
    return start


def one_worker() -> str:
    return tf_config(loopback_cluster(worker=1), "worker", 0)


def test_script_runs_as_main_with_its_argv_and_its_exit_code(start) -> None:
    code, out = start(["-m", "worker", str(SCRIPTS / "behave.py"), "exit", "3"],
                      one_worker()).finish()
    assert code == 3, out
    assert f"name=__main__ argv=['{SCRIPTS / 'behave.py'}', 'exit', '3']" in out


def test_module_form_runs_like_python_dash_m(start) -> None:
    code, out = start(["-m", "worker", "-m", "tests.processes.scripts.behave_module", "a", "b"],
                      one_worker()).finish()
    assert code == 7, out
    assert "module name=__main__ argv=['a', 'b']" in out


def test_uncaught_exception_exits_1_with_the_traceback(start) -> None:
    code, out = start(["-m", "worker", str(SCRIPTS / "behave.py"), "raise"],
                      one_worker()).finish()
    assert code == exitcodes.EXIT_FAILURE
    assert "ValueError: boom from the script" in out


@pytest.mark.parametrize(("config", "expected"), [
    (tf_config({"worker": ["127.0.0.1:1"]}, "worker", 3), "task worker:3 is not in the cluster"),
    (tf_config({"worker": ["localhost"]}, "worker", 0), 'expected "host:port"'),
    (json.dumps({"sparseCluster": {"worker": {"0": "127.0.0.1:1"}},
                 "task": {"type": "worker", "index": 0}}), "sparseCluster"),
    ("{not json", "TF_CONFIG: invalid JSON"),
])
def test_bad_tf_config_exits_2_with_a_clear_message(start, config, expected) -> None:
    code, out = start(["-m", "worker", str(SCRIPTS / "behave.py")], config).finish()
    assert code == exitcodes.EXIT_USAGE, out
    assert expected in out


def test_missing_peers_are_listed_by_task_and_address(start) -> None:
    ports = pick_free_ports("127.0.0.1", 3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    started = time.monotonic()
    code, out = start(["-m", "worker", str(SCRIPTS / "behave.py")],
                      tf_config(cluster, "worker", 0), CLUSTER_CONNECT_TIMEOUT="1.5").finish()
    assert code == exitcodes.EXIT_PEERS_NOT_READY, out
    assert time.monotonic() - started < 15
    assert f"chief:0 (127.0.0.1:{ports[0]})" in out
    assert f"worker:1 (127.0.0.1:{ports[2]})" in out
    assert "never came up within 1.5 s" in out


def test_sigterm_unwinds_the_script_and_exits_143(start) -> None:
    proc = start(["-m", "worker", str(SCRIPTS / "behave.py"), "wait"], one_worker())
    proc.read_until("ready")
    proc.kill(signal.SIGTERM)
    code, out = proc.finish()
    assert code == 128 + signal.SIGTERM
    assert "finally ran" in out


def test_ps_and_serving_worker_stop_on_shutdown_rpc_and_sigterm(start) -> None:
    cluster = loopback_cluster(chief=1, worker=1, ps=1)
    worker = start(["-m", "worker"], tf_config(cluster, "worker", 0))
    ps = start(["-m", "ps"], tf_config(cluster, "ps", 0))
    chief = TaskRuntime.create(
        SimpleClusterResolver(ClusterSpec(cluster), task_type="chief", task_id=0),
        TaskSettings(connect_timeout=20))
    try:
        chief.wait_for_peers()
        assert chief.shutdown_tasks([("worker:0", cluster["worker"][0])], "done") == {}
        ps.kill(signal.SIGTERM)
        (wcode, wout), (pcode, pout) = worker.finish(), ps.finish()
    finally:
        chief.shutdown(grace=0)
    assert wcode == 0 and "worker:0: shutting down (done)" in wout
    assert pcode == 0 and "ps:0: shutting down (received SIGTERM" in pout


def test_ps_refuses_a_worker_task(start) -> None:
    code, out = start(["-m", "ps"], one_worker()).finish()
    assert code == exitcodes.EXIT_USAGE
    assert "run it with `python -m worker SCRIPT`" in out


def test_a_failing_peer_stops_a_task_that_is_not_in_a_collective(start, tmp_path) -> None:
    """worker:1 raises; worker:0 waits on nothing collective and still stops within seconds."""
    cluster = loopback_cluster(worker=2)
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    waiting = start(["-m", "worker", str(SCRIPTS / "behave.py"), "wait"],
                    tf_config(cluster, "worker", 0))
    failing = start(["-m", "worker", str(SCRIPTS / "behave.py"), "raise-when-told", str(fifo)],
                    tf_config(cluster, "worker", 1))
    waiting.read_until("ready")
    started = time.monotonic()
    os.close(os.open(fifo, os.O_WRONLY))  # worker:1 raises now
    fcode, _ = failing.finish()
    wcode, wout = waiting.finish()
    assert fcode == exitcodes.EXIT_FAILURE
    assert wcode == exitcodes.EXIT_PEER_FAILED, wout
    assert "PeerFailedError: stopping: worker:1 failed: ValueError: boom from the script" in wout
    assert "finally ran" in wout
    assert time.monotonic() - started < 10


# `python -m worker`, with the runtime's shutdown made to receive SIGTERM first: the launcher's
# fail-fast signal reaching a task that is already exiting on its own.
_SIGNAL_IN_SHUTDOWN = """
import os, signal, sys
from cluster.task_runtime import TaskRuntime
original = TaskRuntime.shutdown
def shutdown(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    print("signalled during shutdown", flush=True)
    return original(self, *args, **kwargs)
TaskRuntime.shutdown = shutdown
from worker.process import run
sys.exit(run(sys.argv[1:]))
"""


def test_sigterm_during_shutdown_keeps_the_exit_code_and_prints_no_traceback(start) -> None:
    code, out = start(["-c", _SIGNAL_IN_SHUTDOWN, str(SCRIPTS / "behave.py"), "exit", "3"],
                      one_worker()).finish()
    assert "signalled during shutdown" in out
    assert code == 3, out
    assert "Traceback" not in out, out


def test_an_error_raised_while_unwinding_a_sigterm_still_exits_143(start) -> None:
    # A SIGTERM landing inside Condition.wait breaks its lock: the `with` exit raises
    # RuntimeError with the Terminated as context. That is a termination, not a script failure.
    proc = start(["-m", "worker", str(SCRIPTS / "behave.py"), "lock-broken-by-sigterm"],
                 one_worker())
    code, out = proc.finish()
    assert code == 128 + signal.SIGTERM, out
    assert "received SIGTERM: stopped" in out, out
