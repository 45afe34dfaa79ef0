"""The multi-process test harness itself (cluster/testing.py): output read against deadlines,
typed errors naming the task, every process reaped, the leak check's helpers."""

from __future__ import annotations

import signal
import sys

import pytest

from cluster.testing import (
    ConsoleWatch,
    TaskExitedError,
    TaskProcess,
    TaskTimeoutError,
    kill_and_wait,
    processes_with,
    tf_config,
    wait_gone,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]

# Prints "ready" and waits for a signal (SIGTERM exits 0 after printing "bye"); each line in one
# write, so a signal cannot land between a word and its newline.
WAITS = ("import signal, sys\n"
         "signal.signal(signal.SIGTERM, lambda *a: (sys.stdout.write('bye\\n'), sys.exit(0)))\n"
         "sys.stdout.write('ready\\n')\n"
         "while True: signal.pause()\n")


@pytest.fixture
def start(task_processes, marker):
    def start(code: str, **kwargs) -> TaskProcess:
        return task_processes.python("-c", code, env={"CLUSTER_TEST_MARKER": marker}, **kwargs)
    return start


def test_read_until_then_finish_returns_the_exit_code_and_all_output(start) -> None:
    proc = start(WAITS, tf_config=tf_config({"worker": ["127.0.0.1:1"]}, "worker", 0))
    assert proc.read_until("ready\n") == "ready\n"
    assert proc.returncode is None
    proc.kill(signal.SIGTERM)
    assert proc.finish(timeout=20) == (0, "ready\nbye\n")


def test_read_until_counts_and_its_errors_name_the_task(start) -> None:
    proc = start(WAITS, name="worker:7")
    proc.read_until("ready", count=1)
    with pytest.raises(TaskTimeoutError, match=r"worker:7: no 'ready' 2 times within 0.2 s"):
        proc.read_until("ready", timeout=0.2, count=2)
    done = start("print('only this')", name="worker:8")
    with pytest.raises(TaskExitedError, match="worker:8: output ended before 'never'"):
        done.read_until("never", timeout=20)


def test_finish_past_its_timeout_kills_the_task(start) -> None:
    proc = start(WAITS, name="ps:0")
    proc.read_until("ready")
    with pytest.raises(TaskTimeoutError, match="ps:0: still running after 0.2 s; killed"):
        proc.finish(timeout=0.2)
    assert proc.returncode == -signal.SIGKILL


def test_close_kills_what_the_task_started(start, marker) -> None:
    child = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {WAITS!r}])"
    proc = start(child + "\n" + WAITS)
    proc.read_until("ready\nready", timeout=30)  # its own, then its child's
    started = [pid for pid in processes_with(marker) if pid != proc.pid]
    assert len(started) == 1
    proc.close()
    assert proc.returncode == -signal.SIGKILL
    assert wait_gone(started, 10) == []


def test_stderr_apart_and_a_log_file(start, tmp_path) -> None:
    log = tmp_path / "task.log"
    # One write per line: the log interleaves the two streams by the chunks read from them.
    proc = start("import sys; sys.stdout.write('out\\n'); sys.stderr.write('err\\n')",
                 merge_stderr=False, log=log)
    assert proc.finish(timeout=20) == (0, "out\nerr\n")
    assert proc.stdout == "out\n"
    assert sorted(log.read_text().split()) == ["err", "out"]


def test_stop_with_grace_lets_tasks_exit_on_sigterm(task_processes, marker) -> None:
    procs = [task_processes.python("-c", WAITS, env={"CLUSTER_TEST_MARKER": marker})
             for _ in range(2)]
    for proc in procs:
        proc.read_until("ready")
    task_processes.stop(grace=20)
    assert [(p.returncode, p.output) for p in procs] == [(0, "ready\nbye\n")] * 2


def test_processes_with_every_needle_and_kill_and_wait(start, marker) -> None:
    a = start(WAITS, tf_config="first")
    b = start(WAITS, tf_config="second")
    a.read_until("ready")
    b.read_until("ready")
    assert sorted(processes_with(marker)) == sorted([a.pid, b.pid])
    assert processes_with(marker, "TF_CONFIG=second") == [b.pid]
    assert kill_and_wait(b.pid, 10)
    assert b.wait(10) == -signal.SIGKILL
    assert processes_with(marker) == [a.pid]


def test_console_watch_sees_text_split_over_writes() -> None:
    watch = ConsoleWatch("every peer serves")
    watch.write("chief: every peer ")
    assert not watch.event.is_set()
    watch.write("serves: ps:0\n")
    assert watch.event.is_set()
    assert watch.getvalue() == "chief: every peer serves: ps:0\n"


def test_python_runs_this_interpreter() -> None:
    with TaskProcess.python("-c", "import sys; print(sys.executable)") as proc:
        assert proc.finish(timeout=20) == (0, sys.executable + "\n")
