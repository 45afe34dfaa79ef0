"""`python -m worker` and `python -m ps` as real processes with TF_CONFIG (no launcher)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from cluster import exitcodes
from cluster.ctl.ports import pick_free_ports
from cluster.runtime import TaskRuntime
from cluster.settings import TaskSettings
from resolver import ClusterSpec, SimpleClusterResolver
from tests.processes.conftest import REPO, SCRIPTS

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]


def tf_config(cluster: dict, task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _reap(marker):
    """Kill whatever a test started and did not finish (before the marker's leak check)."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def start(marker: str, argv: list[str], config: str, **env: str) -> subprocess.Popen:
    full_env = {**os.environ, "TF_CONFIG": config, "CLUSTER_TEST_MARKER": marker,
                "PYTHONUNBUFFERED": "1", "CLUSTER_CONNECT_TIMEOUT": "20", **env}
    proc = subprocess.Popen([sys.executable, *argv], env=full_env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    _started.append(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running after {timeout} s:\n{out}")
    return proc.returncode, out


def read_until(proc: subprocess.Popen, text: str, timeout: float = 20) -> str:
    """Output until it contains ``text`` (read raw against a deadline, no sleeps); the rest of
    the output stays readable through ``proc.stdout``."""
    seen = b""
    fd = proc.stdout.fileno()
    end = time.monotonic() + timeout
    while text.encode() not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            pytest.fail(f"no {text!r} within {timeout} s: {seen!r}")
        chunk = os.read(fd, 4096)
        if not chunk:
            pytest.fail(f"output ended before {text!r}: {seen!r}")
        seen += chunk
    return seen.decode()


def one_worker() -> str:
    port = pick_free_ports("127.0.0.1", 1)[0]
    return tf_config({"worker": [f"127.0.0.1:{port}"]}, "worker", 0)


def test_script_runs_as_main_with_its_argv_and_its_exit_code(marker) -> None:
    code, out = finish(start(marker, ["-m", "worker", str(SCRIPTS / "behave.py"), "exit", "3"],
                             one_worker()))
    assert code == 3, out
    assert f"name=__main__ argv=['{SCRIPTS / 'behave.py'}', 'exit', '3']" in out


def test_module_form_runs_like_python_dash_m(marker) -> None:
    code, out = finish(start(marker, ["-m", "worker", "-m", "tests.processes.scripts."
                                      "behave_module", "a", "b"], one_worker()))
    assert code == 7, out
    assert "module name=__main__ argv=['a', 'b']" in out


def test_uncaught_exception_exits_1_with_the_traceback(marker) -> None:
    code, out = finish(start(marker, ["-m", "worker", str(SCRIPTS / "behave.py"), "raise"],
                             one_worker()))
    assert code == exitcodes.EXIT_FAILURE
    assert "ValueError: boom from the script" in out


@pytest.mark.parametrize(("config", "expected"), [
    (tf_config({"worker": ["127.0.0.1:1"]}, "worker", 3), "task worker:3 is not in the cluster"),
    (tf_config({"worker": ["localhost"]}, "worker", 0), 'expected "host:port"'),
    (json.dumps({"sparseCluster": {"worker": {"0": "127.0.0.1:1"}},
                 "task": {"type": "worker", "index": 0}}), "sparseCluster"),
    ("{not json", "TF_CONFIG: invalid JSON"),
])
def test_bad_tf_config_exits_2_with_a_clear_message(marker, config, expected) -> None:
    code, out = finish(start(marker, ["-m", "worker", str(SCRIPTS / "behave.py")], config))
    assert code == exitcodes.EXIT_USAGE, out
    assert expected in out


def test_missing_peers_are_listed_by_task_and_address(marker) -> None:
    ports = pick_free_ports("127.0.0.1", 3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    started = time.monotonic()
    code, out = finish(start(marker, ["-m", "worker", str(SCRIPTS / "behave.py")],
                             tf_config(cluster, "worker", 0), CLUSTER_CONNECT_TIMEOUT="1.5"))
    assert code == exitcodes.EXIT_PEERS_NOT_READY, out
    assert time.monotonic() - started < 15
    assert f"chief:0 (127.0.0.1:{ports[0]})" in out
    assert f"worker:1 (127.0.0.1:{ports[2]})" in out
    assert "never came up within 1.5 s" in out


def test_sigterm_unwinds_the_script_and_exits_143(marker) -> None:
    proc = start(marker, ["-m", "worker", str(SCRIPTS / "behave.py"), "wait"], one_worker())
    read_until(proc, "ready")
    os.kill(proc.pid, signal.SIGTERM)
    code, out = finish(proc)
    assert code == 128 + signal.SIGTERM
    assert "finally ran" in out


def test_ps_and_serving_worker_stop_on_shutdown_rpc_and_sigterm(marker) -> None:
    ports = pick_free_ports("127.0.0.1", 3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
               "ps": [f"127.0.0.1:{ports[2]}"]}
    worker = start(marker, ["-m", "worker"], tf_config(cluster, "worker", 0))
    ps = start(marker, ["-m", "ps"], tf_config(cluster, "ps", 0))
    chief = TaskRuntime.create(
        SimpleClusterResolver(ClusterSpec(cluster), task_type="chief", task_id=0),
        TaskSettings(connect_timeout=20))
    try:
        chief.wait_for_peers()
        assert chief.shutdown_tasks([("worker:0", cluster["worker"][0])], "done") == {}
        os.kill(ps.pid, signal.SIGTERM)
        (wcode, wout), (pcode, pout) = finish(worker), finish(ps)
    finally:
        chief.shutdown(grace=0)
    assert wcode == 0 and "worker:0: shutting down (done)" in wout
    assert pcode == 0 and "ps:0: shutting down (received SIGTERM)" in pout


def test_ps_refuses_a_worker_task(marker) -> None:
    code, out = finish(start(marker, ["-m", "ps"], one_worker()))
    assert code == exitcodes.EXIT_USAGE
    assert "run it with `python -m worker SCRIPT`" in out


def test_a_failing_peer_stops_a_task_that_is_not_in_a_collective(marker, tmp_path) -> None:
    """worker:1 raises; worker:0 waits on nothing collective and still stops within seconds."""
    ports = pick_free_ports("127.0.0.1", 2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    waiting = start(marker, ["-m", "worker", str(SCRIPTS / "behave.py"), "wait"],
                    tf_config(cluster, "worker", 0))
    failing = start(marker, ["-m", "worker", str(SCRIPTS / "behave.py"), "raise-when-told",
                             str(fifo)], tf_config(cluster, "worker", 1))
    read_until(waiting, "ready")
    started = time.monotonic()
    os.close(os.open(fifo, os.O_WRONLY))  # worker:1 raises now
    fcode, _ = finish(failing)
    wcode, wout = finish(waiting)
    assert fcode == exitcodes.EXIT_FAILURE
    assert wcode == exitcodes.EXIT_PEER_FAILED, wout
    assert "PeerFailedError: stopping: worker:1 failed: ValueError: boom from the script" in wout
    assert "finally ran" in wout
    assert time.monotonic() - started < 10
